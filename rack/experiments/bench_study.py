"""`rack bench --study-cost`: what the study itself costs, this code beside another
version's, measured in the same run.

Each side runs study experiments (`rack.experiments.study.run.EXPERIMENTS`, the full
configuration, `StudyConfig.full`) in a fresh interpreter importing its own checkout,
alternately: baseline, current, baseline, current, ... (`repeat` rounds). Per
experiment it reports the wall time, the capacity searches it made (one per
deployment and workload point) and the runs per capacity search, and compares every
capacity verdict: each deployment's highest sustained rate, whether it held every
rate tried, and tokens/J and $/Mtok at that rate must be the same on both sides.

The host is shared and its speed drifts, so only ratios of figures measured in the
same run mean anything; a subset of experiments stands for the study when the whole
takes too long (the ratio of the subset's summed wall times is reported with the
experiments it covers).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

#: Longest one side's experiments may take (s).
STUDY_TIMEOUT_S = 3600.0

_SCRIPT = r"""
import contextlib, json, sys, time
from rack.experiments.study.config import StudyConfig
from rack.experiments.study.run import EXPERIMENTS
workers, keys, size = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
cfg = (StudyConfig.quick if size == "quick" else StudyConfig.full)(workers=workers, progress=False)
try:
    from rack.runtime.run_pool import shared                 # one pool for the whole study
    ctx = shared(workers)
except ImportError:
    ctx = contextlib.nullcontext()

def caps(obj, path, out):
    if isinstance(obj, dict):
        if "at_max" in obj and "points" in obj and "summary" in obj:
            s = obj["summary"]
            runs = {}
            for p in obj["points"]:
                if "error" not in p:
                    runs[p["scenario"]] = runs.get(p["scenario"], 0) + 1
            out[path] = {n: {"max_rate_scale": s["max_rate_scale"].get(n), "held": s["held_every_rate"].get(n),
                             "tokens_per_joule": (m or {}).get("tokens_per_joule"),
                             "usd_per_mtok": (m or {}).get("usd_per_mtok"), "runs": runs.get(n, 0)}
                         for n, m in obj["at_max"].items()}
            return
        for k, v in obj.items():
            caps(v, f"{path}.{k}", out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            caps(v, f"{path}[{i}]", out)

fns = dict(EXPERIMENTS)
res, out = {}, {}
with ctx:
    for key in keys:
        t = time.perf_counter()
        res[key] = fns[key](cfg, lambda m: None, res["load"]) if key == "bandwidth" else fns[key](cfg, lambda m: None)
        found = {}
        caps(res[key], key, found)
        out[key] = {"wall_s": time.perf_counter() - t, "capacities": found}
import resource
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
# CPU s of this process and its (reaped) worker processes: less sensitive than wall
# time to other work on a shared host
out["_cpu_s"] = sum(r.ru_utime + r.ru_stime for r in ru)
print(json.dumps(out))
"""


def study_in(root: Path, experiments: Sequence[str], workers: int = 2, quick: bool = False) -> dict:
    """Run `experiments` (keys of EXPERIMENTS; "bandwidth" needs "load" before it) with
    the code at `root` in a fresh interpreter, on `StudyConfig.full` (quick: `.quick`,
    a smoke test). Returns {key: {"wall_s", "capacities":
    {sweep path: {deployment: {"max_rate_scale", "held", "tokens_per_joule",
    "usd_per_mtok", "runs"}}}}}. Raises RuntimeError with the last lines of a failure."""
    from rack.experiments.bench_baseline import checkout_env, run_json_in_checkout

    env = checkout_env(root)
    args = [_SCRIPT, str(int(workers)), ",".join(experiments), "quick" if quick else "full"]
    return run_json_in_checkout(root, args, env, STUDY_TIMEOUT_S, f"study experiments {experiments}")


def _verdicts(caps: dict) -> dict:
    """The figures a verdict reads, per sweep and deployment (runs left out)."""
    return {path: {n: {k: v for k, v in d.items() if k != "runs"} for n, d in by.items()}
            for path, by in caps.items()}


def study_cost_section(ref: str, experiments: Sequence[str], *, repeat: int = 1, workers: int = 2,
                       quick: bool = False, progress: Callable[[str], None] = lambda _m: None) -> dict:
    """The study's cost with this code and with `ref`'s (a git revision or a checkout,
    `rack.experiments.bench_baseline.checkout`), alternately, `repeat` rounds.

    Returns {"ref", "experiments", "workers", "per_experiment": {key: {"baseline_wall_s",
    "current_wall_s" (medians), "speedup", "capacity_searches", "runs_per_capacity"
    ({"baseline", "current"}: mean runs per search), "same_verdicts"}}, "total":
    {"baseline_wall_s", "current_wall_s", "speedup", "baseline_cpu_s", "current_cpu_s"
    (the whole subprocess with its worker processes), "cpu_speedup"}, "same_verdicts" (every capacity,
    sustained-every-rate flag, tokens/J and $/Mtok at capacity equal), "differences"
    (the first few that are not)}. Raises ValueError for a bad `ref`, RuntimeError
    if a side fails.
    """
    from rack.experiments.bench_baseline import checkout, project_root

    runs: dict[str, list[dict]] = {"baseline": [], "current": []}
    with checkout(ref) as base:
        for i in range(max(1, int(repeat))):
            for side, root in (("baseline", base), ("current", project_root())):
                progress(f"study cost: {side}, round {i + 1}/{repeat}: {', '.join(experiments)}")
                runs[side].append(study_in(root, experiments, workers, quick))
    per: dict[str, Any] = {}
    diffs: list[str] = []
    for key in experiments:
        b = statistics.median(r[key]["wall_s"] for r in runs["baseline"])
        c = statistics.median(r[key]["wall_s"] for r in runs["current"])
        cb, cc = runs["baseline"][0][key]["capacities"], runs["current"][0][key]["capacities"]
        n = sum(len(v) for v in cc.values())
        rpc = {s: (sum(d["runs"] for v in caps.values() for d in v.values()) / max(1, sum(len(v) for v in caps.values())))
               for s, caps in (("baseline", cb), ("current", cc))}
        same = _verdicts(cb) == _verdicts(cc)
        if not same:
            vb, vc = _verdicts(cb), _verdicts(cc)
            for path in sorted(set(vb) | set(vc)):
                if vb.get(path) != vc.get(path):
                    diffs.append(f"{path}: baseline {vb.get(path)} current {vc.get(path)}")
        per[key] = {"baseline_wall_s": b, "current_wall_s": c, "speedup": b / c if c else None,
                    "baseline_runs_s": [r[key]["wall_s"] for r in runs["baseline"]],
                    "current_runs_s": [r[key]["wall_s"] for r in runs["current"]],
                    "capacity_searches": n, "runs_per_capacity": rpc, "same_verdicts": same}
    cpu = {side: statistics.median(r["_cpu_s"] for r in runs[side]) for side in runs}
    tb = sum(p["baseline_wall_s"] for p in per.values())
    tc = sum(p["current_wall_s"] for p in per.values())
    return {"ref": ref, "experiments": list(experiments), "workers": workers, "repeat": repeat,
            "config": "quick" if quick else "full",
            "per_experiment": per, "total": {"baseline_wall_s": tb, "current_wall_s": tc,
                                             "speedup": tb / tc if tc else None,
                                             "baseline_cpu_s": cpu["baseline"], "current_cpu_s": cpu["current"],
                                             "cpu_speedup": cpu["baseline"] / cpu["current"] if cpu["current"] else None},
            "same_verdicts": not diffs, "differences": diffs[:10]}


__all__ = ["STUDY_TIMEOUT_S", "study_cost_section", "study_in"]
