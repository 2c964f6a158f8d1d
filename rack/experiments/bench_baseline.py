"""`rack bench --baseline REF`: this code's replay speed beside another version's,
measured in the same run.

This host's speed drifts 20-70% within a day, so a figure measured yesterday cannot
be divided by one measured today. Both versions therefore replay the same trace in
fresh subprocesses (same interpreter, same installed packages), alternately: baseline,
current, baseline, current, ... `repeat` times each; the figures are the medians and
the ratio is baseline / current (> 1: this code is faster). Each subprocess times
`run_scenario` alone (the trace is read and a 20-request warm-up run is done before
the clock starts), so imports and trace parsing are not counted.

REF is a git revision of the checkout this code was imported from (checked out with
`git worktree add --detach` in a temporary directory, removed afterwards) or the path
of another checkout. The script run in the subprocess accepts both layouts the project
has had (`rack.run_scenario` since the engine-core change, `rack.runner` before).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from workloads.names import ENV_VAR as TRACE_DIR_VAR, unpack_shipped

#: Longest a single replay subprocess may take (s): a whole trace takes ~5-30 s here.
REPLAY_TIMEOUT_S = 1800.0

_SCRIPT = r"""
import inspect, json, sys, time
import numpy as np
try:
    from rack import load_scenario, run_scenario          # engine-core layout
    run_scenario.__name__
except (ImportError, AttributeError):
    from rack.runner import run_scenario                  # before it
    from rack.scenario import load_scenario
from workloads import load_requests
trace, scenario, scale, w0, w1, mode, npz, calls_n = sys.argv[1:9]
window = None if w0 == "" else (float(w0), float(w1))
reqs = load_requests(trace, window=window, output_scale=float(scale))
sc = load_scenario(scenario or None)
kw = {}
# sweep mode: the KV payload accounted where the code can (rack.run.runner's kv_payload)
if mode == "sweep" and "kv_payload" in inspect.signature(run_scenario).parameters:
    kw["kv_payload"] = "account"
if mode == "sweep" and "timeseries" in inspect.signature(run_scenario).parameters:
    kw["timeseries"] = False                              # as sweeps run (no gauges over time)
run_scenario(sc, reqs[:20], runtime="virtual", **kw)
t0, c0 = time.perf_counter(), time.process_time()
out = run_scenario(sc, reqs, runtime="virtual", **kw)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
try:
    from rack.runtime.virtual_run import last_run_counters
    events = last_run_counters().get("callbacks")
except ImportError:
    events = None
r = out.results
if npz:
    c = out.columns
    np.savez(npz, **{k: np.asarray(c[k], dtype=np.float64) for k in c
                     if k in ("id", "ttft_s", "tpot_s", "e2e_s") or k.startswith("t_")})
calls = None
if int(calls_n):
    import cProfile, pstats
    part = reqs[:int(calls_n)]
    prof = cProfile.Profile()
    prof.enable()
    run_scenario(sc, part, runtime="virtual", **kw)
    prof.disable()
    calls = pstats.Stats(prof).total_calls / len(part)
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "requests": len(reqs), "completed": r["requests"]["completed"],
                  "ttft_p50_s": r["latency"]["ttft_s"]["p50"], "tpot_p50_s": r["latency"]["tpot_s"]["p50"],
                  "itl_s": r["latency"]["itl_s"],
                  "mode": "sweep (KV payload accounted)" if kw else "run (KV payload built)",
                  "events_per_request": None if events is None else events / len(reqs),
                  "calls_per_request": calls}))
"""

#: Requests of the trace's start replayed under cProfile to count function calls per
#: request (the first run of each version and output scale only; profiling slows a run ~2x).
CALLS_REQUESTS = 2000


def project_root() -> Path:
    """The checkout this code was imported from (the folder holding rack/)."""
    return Path(__file__).resolve().parents[2]


def check_ref(ref: str) -> None:
    """Fail early (before any measurement) if `ref` is neither a checkout nor a git
    revision of `project_root()`: raises ValueError naming it."""
    p = Path(ref).expanduser()
    if p.is_dir():
        if not (p / "rack").is_dir():
            raise ValueError(f"--baseline {ref}: the directory has no rack/ package")
        return
    r = subprocess.run(["git", "-C", str(project_root()), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ValueError(f"--baseline {ref}: neither a directory nor a git revision of {project_root()}")


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A checkout of `ref`: an existing directory holding rack/ is used as is; otherwise
    `ref` is a git revision of `project_root()`, checked out in a temporary worktree
    that is removed on exit. Raises ValueError if `ref` is neither (git's message
    included)."""
    check_ref(ref)
    p = Path(ref).expanduser()
    if p.is_dir():
        yield p.resolve()
        return
    root = project_root()
    tmp = Path(tempfile.mkdtemp(prefix="rack-baseline-"))
    wt = tmp / "checkout"
    r = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(wt), ref],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise ValueError(f"--baseline {ref}: not a directory, and git could not check it out "
                         f"from {root}: {r.stderr.strip() or r.stdout.strip()}")
    try:
        yield wt
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(wt)],
                       capture_output=True, timeout=120)
        with contextlib.suppress(OSError):
            tmp.rmdir()


@functools.cache
def _unpacked_traces() -> Path:
    """This checkout's shipped traces, decompressed once per process into a temporary
    directory removed at exit (`workloads.names.unpack_shipped`)."""
    tmp = Path(tempfile.mkdtemp(prefix="rack-traces-"))
    atexit.register(shutil.rmtree, tmp, True)
    return unpack_shipped(tmp)


def checkout_env(root: Path) -> dict:
    """The environment of a subprocess running the code at `root`: it imports that
    code (PYTHONPATH), sends no Ray usage statistics, and finds the traces by name
    through RACK_TRACE_DIR: the user's directories first, then this checkout's shipped
    traces decompressed, which a checkout of an older revision may not ship or may not
    read compressed."""
    dirs = [os.environ.get(TRACE_DIR_VAR), str(_unpacked_traces())]
    return dict(os.environ, PYTHONPATH=str(root), RAY_USAGE_STATS_ENABLED="0",
                **{TRACE_DIR_VAR: os.pathsep.join(d for d in dirs if d)})


def replay_in(root: Path, trace: str, scenario: str | None, *, output_scale: float = 1.0,
              window: tuple[float | None, float | None] | None = None, mode: str = "sweep",
              columns_to: Path | None = None, count_calls: int = 0) -> dict:
    """One replay timed in a fresh interpreter importing the code at `root`.

    mode: "sweep" (the KV payload accounted, as sweeps, comparisons and the study run,
    where the code at `root` can) or "run" (`rack run --runtime virtual`: built).
    columns_to: write the per-request columns (ids, TTFT, TPOT, E2E, event times) there
    (.npz). count_calls: also replay the first that many requests under cProfile.
    Returns {"wall_s", "requests", "completed", "ttft_p50_s", "tpot_p50_s", "itl_s" (the
    results' ITL summary: mean, min, p50, p90, p99, max, n), "mode",
    "events_per_request" (None before the driver counted them), "calls_per_request"
    (None without count_calls)}. Raises RuntimeError with the subprocess's last lines
    if it fails or times out."""
    w0, w1 = ("", "") if window is None else (str(window[0] or 0.0), str(window[1]))
    env = checkout_env(root)
    if Path(trace).is_file():                 # a path: absolute, as the subprocess runs in `root`
        trace = str(Path(trace).resolve())
    args = [_SCRIPT, trace, scenario or "", repr(float(output_scale)), w0, w1, mode, str(columns_to or ""),
            str(int(count_calls))]
    return run_json_in_checkout(root, args, env, REPLAY_TIMEOUT_S, f"replay of {trace}")


def run_json_in_checkout(root: Path, args: Sequence[str], env: dict, timeout_s: float, what: str):
    """Run `python -c *args` in `root` with `env` and return the JSON its last stdout line
    prints. Raises RuntimeError naming `what` and `root` when it times out after
    `timeout_s` seconds or exits non-zero (with the last 8 lines of its stderr)."""
    try:
        r = subprocess.run([sys.executable, "-c", *args], cwd=str(root), env=env, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} in {root} took over {timeout_s:g} s") from None
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"{what} in {root} failed (exit {r.returncode}):\n{tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def columns_diff(a: Path, b: Path) -> dict:
    """{"max_abs_diff_s": the largest difference between two replays' per-request
    TTFT, TPOT, E2E and event times (NaN where both are NaN counts as equal; inf where
    only one is), "same_ids": whether both hold the same requests in the same order}."""
    import numpy as np

    with np.load(a) as x, np.load(b) as y:
        if x["id"].shape != y["id"].shape or not np.array_equal(x["id"], y["id"]):
            return {"max_abs_diff_s": math.inf, "same_ids": False}
        worst = 0.0
        for k in sorted(set(x.files) & set(y.files) - {"id"}):
            u, v = x[k], y[k]
            nan_u, nan_v = np.isnan(u), np.isnan(v)
            if not np.array_equal(nan_u, nan_v):
                return {"max_abs_diff_s": math.inf, "same_ids": True, "column": k}
            d = np.abs(u[~nan_u] - v[~nan_v])
            worst = max(worst, float(d.max()) if d.size else 0.0)
        return {"max_abs_diff_s": worst, "same_ids": True}


def baseline_section(ref: str, traces: Sequence[str], scenario: str | None, *, repeat: int = 3,
                     window: tuple[float | None, float | None] | None = None,
                     output_scales: Sequence[float] = (1.0, 2.0),
                     progress: Callable[[str], None] = lambda _m: None,
                     count_calls: int = CALLS_REQUESTS) -> dict:
    """Replay each of `traces` through `scenario` with this code in sweep mode (the KV
    payload accounted) and with `ref`'s as `rack run --runtime virtual` runs it,
    alternately, `repeat` times per version and output scale.

    Returns {"ref", "baseline_root", "current_root", "scenario", "modes", "traces":
    {trace: {"x{scale}": {"baseline_wall_s", "current_wall_s" (medians), "speedup"
    (baseline / current), "baseline_runs", "current_runs", "requests", "completed"
    (per version), "ttft_p50_s" (per version), "events_per_request",
    "calls_per_request" (per version; calls: the first `count_calls` requests under
    cProfile, first run only), "metrics": `columns_diff` of the two versions'
    per-request columns (first runs)}}}}. Raises ValueError for a bad `ref`,
    RuntimeError if a replay fails.
    """
    current = project_root()
    out: dict[str, Any] = {"ref": ref, "current_root": str(current), "scenario": scenario,
                           "window": list(window) if window else None, "traces": {},
                           "modes": {"baseline": "run", "current": "sweep"}}
    with checkout(ref) as base, tempfile.TemporaryDirectory(prefix="rack-bench-cols-") as tmp:
        out["baseline_root"] = str(base)
        for trace in traces:
            rows = {}
            for scale in output_scales:
                runs: dict[str, list[dict]] = {"baseline": [], "current": []}
                cols = {side: Path(tmp) / f"{side}.npz" for side in runs}
                for i in range(max(1, int(repeat))):
                    for side, root in (("baseline", base), ("current", current)):
                        progress(f"baseline comparison: {trace} x{scale:g}, {side}, run {i + 1}/{repeat}")
                        runs[side].append(replay_in(root, trace, scenario, output_scale=scale, window=window,
                                                    mode=out["modes"][side],
                                                    columns_to=cols[side] if i == 0 else None,
                                                    count_calls=count_calls if i == 0 else 0))
                b = statistics.median(r["wall_s"] for r in runs["baseline"])
                c = statistics.median(r["wall_s"] for r in runs["current"])
                rows[f"x{scale:g}"] = {
                    "baseline_wall_s": b, "current_wall_s": c, "speedup": b / c,
                    "cpu_s": {s: statistics.median(r.get("cpu_s") or math.nan for r in runs[s]) for s in runs},
                    "baseline_runs": [r["wall_s"] for r in runs["baseline"]],
                    "current_runs": [r["wall_s"] for r in runs["current"]],
                    "requests": runs["current"][0]["requests"],
                    "completed": {s: runs[s][0]["completed"] for s in runs},
                    "ttft_p50_s": {s: runs[s][0]["ttft_p50_s"] for s in runs},
                    "mode": {s: runs[s][0].get("mode") for s in runs},
                    "events_per_request": {s: runs[s][0].get("events_per_request") for s in runs},
                    "calls_per_request": {s: runs[s][0].get("calls_per_request") for s in runs},
                    "metrics": columns_diff(cols["baseline"], cols["current"]),
                }
            if "x1" in rows and "x2" in rows:
                rows["doubled_output_ratio"] = {
                    side: rows["x2"][f"{side}_wall_s"] / rows["x1"][f"{side}_wall_s"]
                    for side in ("baseline", "current")}
            out["traces"][trace] = rows
    return out


__all__ = ["CALLS_REQUESTS", "REPLAY_TIMEOUT_S", "baseline_section", "columns_diff", "check_ref", "checkout", "checkout_env", "project_root", "replay_in"]
