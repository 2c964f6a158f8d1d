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

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from workloads.errors import TraceError
from workloads.names import resolve_trace

#: Longest a single replay subprocess may take (s): a whole trace takes ~5-30 s here.
REPLAY_TIMEOUT_S = 1800.0

_SCRIPT = r"""
import json, sys, time
try:
    from rack import load_scenario, run_scenario          # engine-core layout
    run_scenario.__name__
except (ImportError, AttributeError):
    from rack.runner import run_scenario                  # before it
    from rack.scenario import load_scenario
from workloads import load_requests
trace, scenario, scale, w0, w1 = sys.argv[1:6]
window = None if w0 == "" else (float(w0), float(w1))
reqs = load_requests(trace, window=window, output_scale=float(scale))
sc = load_scenario(scenario or None)
run_scenario(sc, reqs[:20], runtime="virtual")
t0 = time.perf_counter()
out = run_scenario(sc, reqs, runtime="virtual")
wall = time.perf_counter() - t0
r = out.results
print(json.dumps({"wall_s": wall, "requests": len(reqs), "completed": r["requests"]["completed"],
                  "ttft_p50_s": r["latency"]["ttft_s"]["p50"],
                  "tpot_p50_s": r["latency"]["tpot_s"]["p50"]}))
"""


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


def replay_in(root: Path, trace: str, scenario: str | None, *, output_scale: float = 1.0,
              window: tuple[float | None, float | None] | None = None) -> dict:
    """One replay timed in a fresh interpreter importing the code at `root`.

    Returns {"wall_s", "requests", "completed", "ttft_p50_s", "tpot_p50_s"}. Raises
    RuntimeError with the subprocess's last lines if it fails or times out."""
    w0, w1 = ("", "") if window is None else (str(window[0] or 0.0), str(window[1]))
    env = dict(os.environ, PYTHONPATH=str(root), RAY_USAGE_STATS_ENABLED="0")
    # a trace name is resolved here: a checkout in a temporary worktree does not see
    # the shared traces folder beside this one
    with contextlib.suppress(TraceError):
        trace = str(resolve_trace(trace))
    cmd = [sys.executable, "-c", _SCRIPT, trace, scenario or "", repr(float(output_scale)), w0, w1]
    try:
        r = subprocess.run(cmd, cwd=str(root), env=env, capture_output=True, text=True,
                           timeout=REPLAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"replay of {trace} in {root} took over {REPLAY_TIMEOUT_S:g} s") from None
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"replay of {trace} in {root} failed (exit {r.returncode}):\n{tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def baseline_section(ref: str, traces: Sequence[str], scenario: str | None, *, repeat: int = 3,
                     window: tuple[float | None, float | None] | None = None,
                     output_scales: Sequence[float] = (1.0, 2.0),
                     progress: Callable[[str], None] = lambda _m: None) -> dict:
    """Replay each of `traces` through `scenario` with this code and with `ref`'s,
    alternately, `repeat` times per version and output scale.

    Returns {"ref", "baseline_root", "current_root", "scenario", "traces": {trace: {
    "x{scale}": {"baseline_wall_s", "current_wall_s" (medians), "speedup" (baseline /
    current), "baseline_runs", "current_runs", "requests", "completed" (per version),
    "ttft_p50_s" (per version)}}}}. Raises ValueError for a bad `ref`, RuntimeError if
    a replay fails.
    """
    current = project_root()
    out: dict[str, Any] = {"ref": ref, "current_root": str(current), "scenario": scenario,
                           "window": list(window) if window else None, "traces": {}}
    with checkout(ref) as base:
        out["baseline_root"] = str(base)
        for trace in traces:
            rows = {}
            for scale in output_scales:
                runs: dict[str, list[dict]] = {"baseline": [], "current": []}
                for i in range(max(1, int(repeat))):
                    for side, root in (("baseline", base), ("current", current)):
                        progress(f"baseline comparison: {trace} x{scale:g}, {side}, run {i + 1}/{repeat}")
                        runs[side].append(replay_in(root, trace, scenario, output_scale=scale, window=window))
                b = statistics.median(r["wall_s"] for r in runs["baseline"])
                c = statistics.median(r["wall_s"] for r in runs["current"])
                rows[f"x{scale:g}"] = {
                    "baseline_wall_s": b, "current_wall_s": c, "speedup": b / c,
                    "baseline_runs": [r["wall_s"] for r in runs["baseline"]],
                    "current_runs": [r["wall_s"] for r in runs["current"]],
                    "requests": runs["current"][0]["requests"],
                    "completed": {s: runs[s][0]["completed"] for s in runs},
                    "ttft_p50_s": {s: runs[s][0]["ttft_p50_s"] for s in runs},
                }
            if "x1" in rows and "x2" in rows:
                rows["doubled_output_ratio"] = {
                    side: rows["x2"][f"{side}_wall_s"] / rows["x1"][f"{side}_wall_s"]
                    for side in ("baseline", "current")}
            out["traces"][trace] = rows
    return out


__all__ = ["REPLAY_TIMEOUT_S", "baseline_section", "check_ref", "checkout", "project_root", "replay_in"]
