"""SIGINT and SIGTERM stop a run and keep what finished: results.json with status
"interrupted", every request counted once (completed + rejected + failed + unfinished =
submitted), Ray shut down with no process of the run left, exit code 130 (SIGINT) or
143 (SIGTERM) and one line that says so; a second signal exits at once, a third too,
never with a traceback (docs/robustness.md, section 7)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rack.measure.results import summary_text
from rack.runtime.interrupt import EXIT_INTERRUPTED, EXIT_TERMINATED, StopRequest
from rack.run.runner import RunInterrupted, run_scenario
from rack.wiring.load import load_scenario
from workloads import load_requests

RACK = [sys.executable, "-c", "from rack.cli import main; main()"]


class StopAfter(StopRequest):
    """Requested at the n-th time a driver looks (as if a signal came then)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    @property
    def requested(self) -> bool:
        self.left -= 1
        if self.left == 0:
            self.request("SIGINT")
        return self.signal_name is not None


def _conserved(r: dict) -> None:
    q = r["requests"]
    assert q["completed"] + q["rejected"] + q["failed"] + q["unfinished"] == q["submitted"]
    assert q["unfinished"] == q["open"]


def test_a_stop_request_ends_a_virtual_run_with_what_finished(tmp_path):
    from rack.measure.results import write_results

    reqs = load_requests("mooncake-excerpt")
    with pytest.raises(RunInterrupted) as err:
        run_scenario(load_scenario(), reqs, runtime="virtual", stop=StopAfter(800))
    out = err.value.output
    r = out.results
    assert r["status"] == "interrupted" and r["interrupted"]["signal"] == "SIGINT"
    assert 0 < r["interrupted"]["t_s"] < max(q.arrival_s for q in reqs)
    _conserved(r)
    assert 0 < r["requests"]["completed"] and r["requests"]["unfinished"] > 0
    assert r["latency"]["ttft_s"]["n"] == r["requests"]["completed"]
    # requests the replay never reached were not offered: counted, but not in the goodput
    arrived = sum(q.arrival_s <= r["interrupted"]["t_s"] for q in reqs)
    assert r["requests"]["not_arrived"] == len(reqs) - arrived > 0
    g = r["goodput"]
    assert g["slo_attainment"] == pytest.approx(g["requests_meeting_slo"] / arrived)
    assert g["window_requests"] <= arrived
    assert g["offered_requests_per_s"] <= arrived / (r["interrupted"]["t_s"] - reqs[0].arrival_s) * 1.5
    assert summary_text(r).startswith("RUN INTERRUPTED (SIGINT at t=")
    assert f"({r['requests']['not_arrived']} of them had not arrived)" in summary_text(r)
    write_results(tmp_path, r, out.columns)
    rows = list(csv.DictReader(open(tmp_path / "requests.csv")))
    assert len(rows) == len(reqs) and sum(row["outcome"] == "open" for row in rows) == r["requests"]["unfinished"]


def test_a_stop_after_every_request_ended_leaves_the_run_complete():
    reqs = load_requests("mooncake-excerpt")[:20]
    stop = StopAfter(10**9)
    out = run_scenario(load_scenario(), reqs, runtime="virtual", stop=stop)
    stop.request("SIGINT")            # too late to matter: nothing was polled after the end
    assert out.results["status"] == "complete"


# ----------------------------------------------------------------- real signals, real processes
def _env() -> dict:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _descendants(pid: int, seen: dict) -> list[psutil.Process]:
    """Processes below `pid` now; `seen` collects (pid -> create time) of all ever seen."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for k in kids:
        try:
            seen[k.pid] = (k.name(), k.create_time())
        except psutil.Error:
            pass
    return kids


def _left(seen: dict) -> list[tuple[int, str]]:
    out = []
    for pid, (name, created) in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out.append((pid, name))
        except psutil.Error:
            pass
    return out


def _kill_all(proc: subprocess.Popen, seen: dict) -> None:
    """Clean-up after a failed test: the child's own processes, by PID."""
    for pid, _ in _left(seen):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if proc.poll() is None:
        proc.kill()


def _wait_gone(seen: dict, timeout_s: float = 20.0) -> list:
    deadline = time.time() + timeout_s
    while time.time() < deadline and _left(seen):
        time.sleep(0.5)
    return _left(seen)


def _signal_a_ray_run(tmp_path, sig: int, times: int, group: bool) -> tuple[subprocess.Popen, str, float, dict]:
    """`rack run` on Ray, `sig` sent `times` times (0.3 s apart) ~1 s of emulated time
    into the replay, to the process group (as a terminal's Ctrl-C) or to the driver
    alone (as `kill`, `timeout` and job schedulers do). Returns the process, its stderr,
    the wall seconds from the first signal to the exit, and every process it started."""
    out = tmp_path / "run"
    proc = subprocess.Popen([*RACK, "run", "--runtime", "ray", "--window", "0:20", "--dilation", "5",
                             "--out", str(out)], start_new_session=True, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            kids = _descendants(proc.pid, seen)
            if sum(1 for k in kids if "CoreHost" in seen.get(k.pid, ("",))[0]) >= 6:
                break           # every component's actor is up: the replay starts within seconds
            time.sleep(0.5)
        else:
            pytest.fail(f"the Ray run did not start its actors (exit {proc.poll()})")
        end = time.time() + 7
        while time.time() < end:            # ~1 s of emulated time at dilation 5
            _descendants(proc.pid, seen)
            time.sleep(0.5)
        t0 = time.time()
        for i in range(times):
            if i:
                time.sleep(0.3)
            (os.killpg if group else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        took = time.time() - t0
    finally:
        _kill_all(proc, seen)
    return proc, err, took, seen


def _check_stopped_ray_run(proc, err: str, seen: dict, code: int) -> None:
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "SIGTERM received" not in err and "PC: @" not in err, err       # no Ray stack dump
    assert _wait_gone(seen) == [], "processes of the run left behind"
    assert any("raylet" in name for name, _ in seen.values())      # Ray's own processes were watched


def _check_interrupted_results(out: Path, name: str) -> None:
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "interrupted" and r["interrupted"]["signal"] == name
    _conserved(r)
    assert r["requests"]["submitted"] == 65 and r["requests"]["unfinished"] > 0
    assert r["emulation"]["runtime"] == "ray"
    assert len(list(csv.DictReader(open(out / "requests.csv")))) == 65


@pytest.mark.ray
def test_sigint_during_a_ray_run(tmp_path):
    proc, err, _, seen = _signal_a_ray_run(tmp_path, signal.SIGINT, 1, group=True)
    _check_stopped_ray_run(proc, err, seen, EXIT_INTERRUPTED)
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted (SIGINT) at t=") and "unfinished of" in last
    _check_interrupted_results(tmp_path / "run", "SIGINT")


@pytest.mark.ray
def test_three_sigints_stop_a_ray_run_at_once_without_a_traceback(tmp_path):
    """The second exits at once; the third finds the command exiting (its handler, or
    Ray's atexit shutdown after the command: rack.runtime.interrupt.quiet_after_command)
    and ends it at once too, without a KeyboardInterrupt traceback."""
    proc, err, took, seen = _signal_a_ray_run(tmp_path, signal.SIGINT, 3, group=True)
    _check_stopped_ray_run(proc, err, seen, EXIT_INTERRUPTED)
    assert err.strip().splitlines()[-1].startswith("interrupted again (SIGINT): ")
    print(f"three SIGINTs: exit {proc.returncode} {took:.1f} s after the first")


@pytest.mark.ray
def test_sigterm_during_a_ray_run_keeps_what_finished(tmp_path):
    """SIGTERM to the driver alone, as `kill` or `timeout` send it: rack's handler runs,
    not Ray's (which printed a stack dump and exited with nothing written)."""
    proc, err, took, seen = _signal_a_ray_run(tmp_path, signal.SIGTERM, 1, group=False)
    _check_stopped_ray_run(proc, err, seen, EXIT_TERMINATED)
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted (SIGTERM) at t=") and "unfinished of" in last
    _check_interrupted_results(tmp_path / "run", "SIGTERM")
    print(f"SIGTERM: exit {proc.returncode} {took:.1f} s after the signal")


@pytest.mark.ray
def test_sigterm_while_ray_starts_stops_the_run_at_once(tmp_path):
    """Before the replay (importing Ray, ray.init, the actors' start) a signal stops at
    once; ray.init's own SIGTERM handlers are kept out (rack.runtime.ray_runtime.init_ray)."""
    proc = subprocess.Popen([*RACK, "run", "--runtime", "ray", "--window", "0:20", "--dilation", "5",
                             "--out", str(tmp_path / "run")], start_new_session=True, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    try:
        first = proc.stderr.readline()
        assert first.startswith("replaying 65 requests"), first
        end = time.time() + 1.5                  # Ray is being imported or started
        while time.time() < end:
            _descendants(proc.pid, seen)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _kill_all(proc, seen)
    assert proc.returncode == EXIT_TERMINATED, err
    assert "Traceback" not in err and "SIGTERM received" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), err
    assert _wait_gone(seen) == [], "processes of the run left behind"


def test_sigterm_during_a_long_virtual_run_keeps_the_streamed_records(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([*RACK, "run", "--runtime", "virtual", "--dataset", "random", "--num-prompts",
                             "400000", "--request-rate", "16", "--out", str(out)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()              # "replaying N requests ...": the replay starts
        assert first.startswith("replaying 400000 requests"), first
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_TERMINATED, err
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGTERM) at t=")
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "interrupted" and r["emulation"]["records"] == "disk"   # auto: 400k requests
    _conserved(r)
    assert r["requests"]["completed"] > 0 and r["requests"]["unfinished"] > 0
    meta = json.loads((out / "records" / "records.json").read_text())
    assert meta["requests"] == 400000 and meta["open"] == r["requests"]["unfinished"]
    with open(out / "requests.csv") as f:
        assert sum(1 for _ in f) == 400001


def test_signal_handlers_stop_a_replay_then_exit_at_once(capsys):
    """In this process: outside a replay a signal stops the command at once; inside,
    the first only asks for a stop and the second stops at once."""
    import typer

    from rack.cli._checks import interruptible

    # what the block must restore: Python's default, or SIG_IGN when this process was
    # started in the background of a non-interactive shell (which ignores SIGINT there)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(typer.Exit) as ex:
        with interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)                                   # the handler raises before this ends
    assert ex.value.exit_code == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted (SIGINT): stopped at once, no results written"
    with pytest.raises(typer.Exit) as ex:
        with interruptible() as stop:
            with stop.replaying():
                os.kill(os.getpid(), signal.SIGTERM)
                assert stop.requested and stop.signal_name == "SIGTERM"     # no exception: a request
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    assert capsys.readouterr().err.strip() == "interrupted again (SIGTERM): stopped at once, no results written"
    assert ex.value.exit_code == EXIT_TERMINATED            # 128 + the first signal's number
    assert signal.getsignal(signal.SIGINT) == before                          # restored


def test_handlers_replaced_by_a_library_are_reclaimed():
    """ray.init replaces SIGTERM's handler; `reclaim_signals` puts rack's back (and does
    nothing once the block has ended)."""
    from rack.runtime.interrupt import exit_code, handle_signals, reclaim_signals, signals_claimed

    def theirs(signum, frame):
        raise AssertionError("the library's handler ran")

    assert not signals_claimed()
    with handle_signals() as stop:
        assert signals_claimed()
        ours = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, theirs)
        reclaim_signals()
        assert signal.getsignal(signal.SIGTERM) is ours
        with stop.replaying():
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal_name == "SIGTERM"
    previous = signal.getsignal(signal.SIGTERM)
    reclaim_signals()
    assert signal.getsignal(signal.SIGTERM) is previous
    assert (exit_code("SIGINT"), exit_code("SIGTERM"), exit_code(None), exit_code("request")) == (130, 143, 130, 130)


def test_a_second_signal_swallowed_by_a_finaliser_still_stops_the_command(capsys):
    """A KeyboardInterrupt raised inside `__del__` (as when Ctrl-C lands while Ray
    drops an actor handle) is printed by Python as "Exception ignored" and lost; the
    handlers raise it again in the main thread, with no traceback printed."""
    import typer

    from rack.cli._checks import interruptible

    hook = sys.unraisablehook

    class Handle:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)     # the second signal arrives in here
            time.sleep(0.2)                         # ... and its KeyboardInterrupt is raised here

    with pytest.raises(typer.Exit) as ex:
        with interruptible() as stop:
            with stop.replaying():
                os.kill(os.getpid(), signal.SIGINT)
                assert stop.requested
                Handle()                            # dropped at once: __del__ runs
                time.sleep(1)                       # the interrupt, raised again, ends this
                pytest.fail("the swallowed interrupt was not raised again")
    assert ex.value.exit_code == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err.strip() == "interrupted again (SIGINT): stopped at once, no results written"
    assert sys.unraisablehook is hook                   # restored


def test_signals_while_writing_the_results_wait_for_the_write():
    """Inside `deferred` (a command writing its results) a first and a second signal
    only ask for a stop; the block runs to its end and `requested` says what came."""
    from rack.runtime.interrupt import handle_signals

    with handle_signals() as stop:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            wrote = True                                    # reached: nothing was raised
        assert wrote and stop.requested and stop.signal_name == "SIGTERM" and stop.count == 2
        assert not stop.absorb_second and not stop.in_replay          # restored after the block


def test_the_replaying_and_deferred_of_a_stop_that_may_be_none():
    """`replaying(stop)` and `deferred(stop)` enter the StopRequest's context, and do
    nothing for a run without one (stop None)."""
    from rack.runtime.interrupt import deferred, replaying

    stop = StopRequest()
    with replaying(stop):
        assert stop.in_replay and not stop.absorb_second
    with deferred(stop):
        assert stop.in_replay and stop.absorb_second
    assert not stop.in_replay and not stop.absorb_second
    for context in (replaying, deferred):
        with context(None) as inside:
            assert inside is None


def test_results_json_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failed write (here os.replace) leaves the earlier results.json as it was and
    no temporary file beside it."""
    from rack.measure import results as res

    target = tmp_path / "results.json"
    target.write_text('{"status": "complete", "old": true}')

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        res.write_text_atomic(target, '{"status": "complete", "new": true}')
    assert json.loads(target.read_text()) == {"status": "complete", "old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_run_clears_the_earlier_runs_files_in_its_folder(tmp_path):
    """A rerun into the same --out removes what the earlier run wrote there before it
    starts: stopped before writing anything, the folder holds no results read as its
    own; --no-plots leaves no earlier timeseries.png behind."""
    import rack.cli
    from typer.testing import CliRunner

    from rack.cli.app import app
    from rack.cli.run import RUN_FILES

    out = tmp_path / "out"
    out.mkdir()
    for name in RUN_FILES:
        (out / name).write_text("an earlier run's")
    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--max-requests", "3", "--no-plots",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert not (out / "timeseries.png").exists() and not (out / "error.log").exists()
    assert json.loads((out / "results.json").read_text())["requests"]["submitted"] == 3
    assert not list(out.glob(".*.tmp"))


def test_a_signal_while_a_finished_run_is_assembled_waits_for_its_results(monkeypatch):
    """Every request ended: a signal while the metrics are computed no longer drops the
    run (a KeyboardInterrupt there lost it whole); the results come, `requested` says a
    signal came (the command then exits with its code)."""
    from rack.run import runner
    from rack.runtime.interrupt import handle_signals

    real = runner.assemble

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "assemble", signalled)
    reqs = load_requests("mooncake-excerpt")[:20]
    with handle_signals() as stop:
        out = run_scenario(load_scenario(), reqs, runtime="virtual", stop=stop)
    assert out.results["status"] == "complete" and out.results["requests"]["completed"] == len(reqs)
    assert stop.requested and stop.signal_name == "SIGINT"
