"""Killing a Ray daemon of a run's own Ray (its GCS server, its raylet) during the
replay: one line naming the daemon within seconds, results of what finished written
(status aborted), exit code 1, and no process of that Ray left (issue 37;
docs/robustness.md, "A lost Ray daemon"). Each test starts `rack run` in a subprocess
with a Ray of its own and cleans up by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RACK = [sys.executable, "-c", "from rack.cli import main; main()"]


def _actors(pid: int) -> list[psutil.Process]:
    out = []
    for c in psutil.Process(pid).children(recursive=True):
        try:
            if "CoreHost" in " ".join(c.cmdline()):
                out.append(c)
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("daemon, name", [("gcs_server", "GCS server"), ("raylet", "raylet")])
def test_a_killed_ray_daemon_is_named_and_what_finished_is_written(tmp_path, daemon, name):
    ray_tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")       # Ray's socket paths are length-limited
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RACK_RAY_TMP": ray_tmp}
    out = tmp_path / "run"
    proc = subprocess.Popen([*RACK, "run", "--runtime", "ray", "--dilation", "20", "--window", "0:3",
                             "--no-plots", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while len(_actors(proc.pid)) < 5:                       # the topology is up
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)
            time.sleep(0.5)
        time.sleep(12)                                          # part of the replay has run
        kids = psutil.Process(proc.pid).children(recursive=True)
        family = {k.pid for k in kids}
        (target,) = [k for k in kids if k.name().startswith(daemon)]
        t_kill = time.monotonic()
        target.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
        left = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if not left:
                break
            time.sleep(0.5)
        for p in left:                                          # clean up by PID whatever the outcome
            try:
                psutil.Process(p).kill()
            except psutil.Error:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 1, (stdout, stderr)
    assert took < 15, took
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"the Ray {name} of this run" in lines[0], stderr
    assert "[state-dump]" not in stdout + stderr and "Raylet is terminated" not in stdout + stderr
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "aborted" and res["error"]["component"] == f"ray:{daemon}"
    q = res["requests"]
    assert q["completed"] + q["rejected"] + q["failed"] + q["unfinished"] == q["submitted"] == 10
    assert left == [], left
