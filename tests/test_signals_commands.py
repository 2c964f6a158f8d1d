"""SIGINT and SIGTERM on the long commands besides `rack run` (issue 37): the first
stops the command and keeps what finished, a second stops at once and still writes
what is held, and no process the command started outlives it (docs/robustness.md,
section 7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

RACK = [sys.executable, "-c", "from rack.cli import main; main()"]
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _wait_cpu(pid: int, cpu_s: float, timeout_s: float = 60.0) -> set[int]:
    """Wait until process `pid` and its children have used `cpu_s` of CPU (past its
    imports: the command's work has started); returns the PIDs of its descendants."""
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout_s
    seen: set[int] = set()
    while time.monotonic() < deadline:
        kids = proc.children(recursive=True)
        seen.update(k.pid for k in kids)
        used = sum(sum(p.cpu_times()[:2]) for p in [proc, *kids] if p.is_running())
        if used >= cpu_s:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"process {pid} did not reach {cpu_s} s of CPU in {timeout_s} s")


def _gone(pids, timeout_s: float = 15.0) -> list[int]:
    """Those of `pids` still running after `timeout_s` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive


SWEEP = ["sweep", "prompt", "gpu-only-kimi-k2", "wafer-only-kimi-k2", "--lengths", "512,1024,2048",
         "--n", "4000", "--no-plots"]


def test_sigint_to_a_sweep_started_as_a_background_job_keeps_its_finished_points(tmp_path):
    # A background job of a non-interactive shell starts with SIGINT ignored; rack's
    # handler is installed over it. One worker: the point running when SIGINT comes
    # finishes (the first signal stops cleanly), so at least one point is kept.
    out = tmp_path / "sw"
    cmd = " ".join([*(f"'{c}'" for c in RACK), *SWEEP, "--workers", "1", "--out", str(out)])
    shell = subprocess.Popen(["bash", "-c", f"{cmd} > {tmp_path}/log 2>&1 & echo $!; wait $!; echo rc=$?"],
                             stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        pid = int(shell.stdout.readline())
        assert psutil.Process(pid).is_running()
        _wait_cpu(pid, 3.0)
        os.kill(pid, signal.SIGINT)
        rest, _ = shell.communicate(timeout=120)
    finally:
        shell.kill()
    log = (tmp_path / "log").read_text()
    assert "rc=130" in rest, (rest, log)
    assert "Traceback" not in log and "interrupted (SIGINT)" in log, log
    points = json.loads((out / "sweep.json").read_text())["points"]
    done = [p for p in points if not p.get("interrupted")]
    cut = [p for p in points if p.get("interrupted")]
    assert len(points) == 6 and done and cut, points
    assert all("error" not in p and p["submitted"] == 4000 for p in done)
    assert f"{len(done)} of 6 points finished" in log


def test_sigterm_twice_to_a_sweep_with_workers_keeps_what_finished_and_leaves_no_process(tmp_path):
    out = tmp_path / "sw"
    proc = subprocess.Popen([*RACK, *SWEEP, "--workers", "2", "--out", str(out)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kids = _wait_cpu(proc.pid, 4.0)
        kids.update(k.pid for k in psutil.Process(proc.pid).children(recursive=True))
        assert len(kids) >= 2, kids                 # the workers (and a resource tracker)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    # 143; or killed by the second SIGTERM itself (-15, also 143 to a shell) when it
    # came after the sweep was written and rack's handlers were gone
    assert proc.returncode in (143, -signal.SIGTERM), (stdout, stderr)
    assert "Traceback" not in stderr and "interrupted (SIGTERM)" in stderr, stderr
    points = json.loads((out / "sweep.json").read_text())["points"]
    assert len(points) == 6 and any(p.get("interrupted") for p in points)
    assert _gone(kids) == []


def _stops_at_once(args: list[str], sig: int, tmp_path) -> None:
    """`rack ARGS` stopped by `sig` once its work is under way: the standard line, exit
    128 + the signal's number, no traceback, none of its processes left."""
    proc = subprocess.Popen([*RACK, *args], env=ENV, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        kids = _wait_cpu(proc.pid, 3.0)
        kids.update(k.pid for k in psutil.Process(proc.pid).children(recursive=True))
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (stdout, stderr)
    assert f"interrupted ({name})" in stderr and "Traceback" not in stderr, stderr
    assert _gone(kids) == []


COMPARE = ["compare", "--dataset", "random", "--num-prompts", "3000", "--request-rate", "20", "--no-plots"]


def test_sigterm_stops_rack_compare_at_once_and_leaves_no_process(tmp_path):
    _stops_at_once([*COMPARE, "--out", str(tmp_path / "cmp")], signal.SIGTERM, tmp_path)


def test_sigint_to_rack_compare_keeps_the_deployments_that_finished(tmp_path):
    out = tmp_path / "cmp"
    proc = subprocess.Popen([*RACK, *COMPARE, "--out", str(out)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:         # the second deployment has started
            line = proc.stderr.readline()
            seen.append(line)
            if line.startswith("[2/4]") or (not line and proc.poll() is not None):
                break
        assert seen[-1].startswith("[2/4]"), seen
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "interrupted (SIGINT): 1 of 4 deployments finished" in stderr, stderr
    doc = json.loads((out / "compare.json").read_text())
    assert doc["interrupted"] == {"signal": "SIGINT", "finished": 1, "deployments": 4}
    assert len(doc["scenarios"]) == 1 and doc["scenarios"][0]["requests"]["submitted"] == 3000



# `rack study` and `rack bench` stop through the same decorator (rack.cli._checks.stops_on_signal);
# their quick modes need the public traces, which a bare clone does not have.
