"""Interactivity curves: throughput per device, per kW and per $/h against tokens/s per
user, one curve per deployment, from closed-loop concurrency ladders (InferenceX's
axes); and the ratio of two deployments' curves read at equal interactivity.

A point is one virtual-time run of a deployment at one concurrency C: a pure closed
loop (vLLM `bench serve --max-concurrency C --request-rate inf`, as InferenceX
measures), C requests in the rack at once, or for a workload of sessions replayed turn
by turn (`Request.turn`) C sessions looping at once (C agents; `workloads.sessions`).
The point replays the first `per_slot` x C units (requests, or whole sessions) of the
workload recipe, so every slot serves several of them and the ramp at the start and
the drain at the end are a small part of the run (a workload file of sessions is
generated longer when it has too few; a trace that has too few is used whole, and the
point says so: `units` < `units_wanted`).

Per point (`point_metrics`):
- tokens/s per user: per completed request with >= 2 output tokens, 1 / TPOT
  (InferenceX's "interactivity"); `tps_user_p50` is their median, `tps_user_p90` the
  speed 90 % of those requests reach or beat (their 10th percentile, linear
  interpolation as numpy's default), `tps_user_mean` their mean;
- output tokens/s: completed requests' output tokens over the run's energy window (from
  0 to its last request event, `rack.measure.energy`), and per device (every
  accelerator the deployment provisions: GPUs and wafer systems alike), per kW (output
  tokens over the devices' energy of the run, idle included, x 1000: tokens/s per kW
  = tokens per kJ), per MW, and per $/h (the deployment's `cost.usd_per_hour`);
- TTFT p50 / p90, TPOT p50, SLO attainment, completed / refused requests, and the
  mean number of units in flight over the run (below C by the ramp and the drain);
- the KV cache's work: prefix hit ratio (hit / looked-up full blocks), recomputed
  tokens (`results.json` `prefix_cache.recomputed_tokens`: blocks an earlier request
  also held that were computed again), prompt tokens computed and served from cache
  (summed over the engines), and KV shipped per turn (logical KV bytes over the KV
  link per completed request; 0 for a colocated deployment).

Reading two curves at equal interactivity (`ratio_at_equal_interactivity`): each
curve's metric is interpolated linearly in tokens/s per user between neighbouring
concurrency points (where several segments of one curve cover the same x, the best
of them: the curve's frontier); a value outside a curve's measured range is never
extrapolated: the reading says which curve does not reach it. The "at_least" reading
takes each curve's best operating point that gives every user x tokens/s or more
(InferenceX's Pareto reading), which stays well defined where a curve is nearly
vertical. Definitions also in docs/interactivity.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from rack.experiments.equal_interactivity import DEFAULT_METRIC, FLAT, X_KEY

from rack.measure.bootstrap import bootstrap

#: Units (requests or sessions) per slot of a point: enough that the closed loop's ramp
#: (C first sends at t = 0) and drain (the last C in flight) are a small part of it.
DEFAULT_PER_SLOT = 4
#: Metrics a curve can be read at (y axes).
METRICS = ("output_tps", "output_tps_per_device", "output_tps_per_kw", "output_tps_per_mw",
           "output_tps_per_usd_per_hour")
#: "Comparable interactivity" of the at_least reading in reports: within 1 % of x.
DEFAULT_TOLERANCE = 0.01
#: Most times a session workload is generated longer to give a point enough sessions.
_MAX_EXTEND = 64


@dataclass(frozen=True)
class LadderTask:
    """One point (picklable): a scenario as a dict, the workload recipe (a
    `workloads.LoadPlan`), the concurrency, how many units (requests or sessions) it
    replays, the think time between a slot's units, and labels copied into the point."""

    scenario: dict
    plan: Any
    concurrency: int
    units: int
    think_time_s: float = 0.0
    labels: dict = field(default_factory=dict)


def point_requests(plan: Any, units: int) -> tuple[list, int]:
    """(the requests of the first `units` units of `plan`, units available).

    The plan's arrival times are replaced by a pure closed loop's (every unit ready at
    0 s, `request_rate` inf; the router sends them as slots free). A workload file that
    generates fewer units is generated over a longer duration (up to 64x); a trace is
    used as it is. Raises what `LoadPlan.requests` raises for bad input."""
    from workloads import count_sessions, take_sessions

    controls = replace(plan.controls, request_rate=math.inf, burstiness=1.0,
                       max_concurrency=None, think_time_s=0.0)
    base = replace(plan, controls=controls)
    reqs = base.requests()
    have = count_sessions(reqs)
    if have < units and plan.source == "workload":
        from workloads import load_workload

        end = controls.duration_s or load_workload(plan.name).end_s
        factor = min(_MAX_EXTEND, math.ceil(1.1 * units / max(have, 1)))
        reqs = replace(base, controls=replace(controls, duration_s=end * factor)).requests()
        have = count_sessions(reqs)
    return take_sessions(reqs, units), have


def _percentile(v: np.ndarray, q: float) -> Optional[float]:
    return float(np.percentile(v, q)) if v.size else None


def mean_concurrency(cols: Mapping[str, np.ndarray], requests: Sequence[Any], window_s: float) -> Optional[float]:
    """Units in flight on average over [0, window_s]: the sum over units (a session, or
    a request without a turn) of the time from its first request's send to its last
    request's end, over the window. Below the point's concurrency by the ramp and the
    drain (slots that ran out of units)."""
    if not window_s > 0:
        return None
    pos = {int(i): k for k, i in enumerate(cols["id"])}
    t0, t1 = np.asarray(cols["t_arrival"]), np.asarray(cols["t_end"])
    span: dict = {}
    for r in requests:
        k = pos.get(r.id)
        if k is None or not (np.isfinite(t0[k]) and np.isfinite(t1[k])):
            continue
        key = r.turn.session if r.turn is not None else ("request", r.id)
        a, b = span.get(key, (math.inf, -math.inf))
        span[key] = (min(a, float(t0[k])), max(b, float(t1[k])))
    return sum(b - a for a, b in span.values()) / window_s


def point_metrics(out: Any, requests: Optional[Sequence[Any]] = None) -> dict:
    """The figures of one closed-loop run (a `rack.run.runner.RunOutput`), flat and
    JSON-ready (see the module docstring for the definitions). None where a figure is
    undefined (no completed request with two tokens; no price). With the run's
    `requests`, also `mean_concurrency` (`mean_concurrency`)."""
    res, cols, stats = out.results, out.columns, out.stats
    done = cols["outcome"] == "completed"
    tpot = np.asarray(cols["tpot_s"], dtype=np.float64)
    speed = 1.0 / tpot[done & np.isfinite(tpot) & (tpot > 0)]
    with np.errstate(divide="ignore", invalid="ignore"):
        done_speed = np.where(np.isfinite(tpot[done]) & (tpot[done] > 0), 1.0 / tpot[done], np.nan)
    ttft = np.asarray(cols["ttft_s"], dtype=np.float64)[done]
    energy, cost = res["energy"], res["cost"]
    window = float(energy["window_s"])
    out_tokens = int(np.asarray(cols["output_tokens"])[done].sum())
    tps = out_tokens / window if window > 0 else None
    joules = float(energy["joules"])
    devices = int(sum(p["devices"] for p in energy["pools"].values()))
    usd_h = cost.get("usd_per_hour")
    per_kw = 1e3 * out_tokens / joules if joules > 0 else None
    pc = res.get("prefix_cache") or {}
    kv = res["kv_transfer"]
    completed = int(res["requests"]["completed"])
    engines = [s for s in stats.values() if s.get("role") in ("prefill", "both")]
    return {
        "submitted": int(res["requests"]["submitted"]), "completed": completed,
        "rejected": int(res["requests"]["rejected"]), "failed": int(res["requests"]["failed"]),
        "rejected_by_reason": dict(res["requests"].get("rejected_by_reason") or {}),
        "tps_user_p50": _percentile(speed, 50), "tps_user_p90": _percentile(speed, 10),
        "tps_user_mean": float(speed.mean()) if speed.size else None,
        "ttft_p50_s": _percentile(ttft, 50), "ttft_p90_s": _percentile(ttft, 90),
        "tpot_p50_s": res["latency"]["tpot_s"]["p50"],
        "slo_attainment": res["goodput"]["slo_attainment"],
        "output_tokens": out_tokens, "window_s": window, "output_tps": tps,
        "devices": devices, "output_tps_per_device": tps / devices if tps is not None and devices else None,
        "joules": joules, "mean_power_w": energy["mean_power_w"],
        "output_tps_per_kw": per_kw, "output_tps_per_mw": per_kw * 1e3 if per_kw is not None else None,
        "usd_per_hour": usd_h,
        "output_tps_per_usd_per_hour": tps / usd_h if tps is not None and usd_h else None,
        "prefix_hit_ratio": pc.get("hit_ratio"), "ideal_prefix_hit_ratio": pc.get("ideal_hit_ratio"),
        "recomputed_tokens": pc.get("recomputed_tokens"), "evicted_blocks": pc.get("evicted_blocks"),
        "prompt_tokens_computed": int(sum(s.get("tokens_computed", 0) for s in engines)),
        "prompt_tokens_cached": int(sum(s.get("tokens_cached", 0) for s in engines)),
        "kv_transfers": int(kv["transfers"]), "kv_bytes_logical": int(kv["bytes_logical"]),
        "kv_bytes_per_turn": kv["bytes_logical"] / completed if completed else None,
        "mean_concurrency": mean_concurrency(cols, requests, window) if requests is not None else None,
        "prompt_tokens": int(np.asarray(cols["prompt_tokens"])[done].sum()),
        "energy_boundary": energy.get("boundary", "devices"),
        "device_joules": float(energy.get("devices_joules", joules)),
        "overhead_w_by_device": (energy.get("overhead") or {}).get("per_device_w", {}),
        "output_tps_per_kw_devices": (1e3 * out_tokens / float(energy["devices_joules"])
                                      if energy.get("devices_joules") else per_kw),
        **bootstrap(done_speed, np.asarray(cols["output_tokens"], dtype=np.float64)[done],
                    prompt=np.asarray(cols["prompt_tokens"], dtype=np.float64)[done]),
    }


def run_point(task: LadderTask) -> dict:
    """Run one point on the virtual runtime: labels + `point_metrics`, or labels +
    {"error": message} when the scenario is refused or the run fails (one bad point
    must not sink the sweep)."""
    from rack.run.runner import run_scenario
    from rack.wiring.scenario import Scenario

    out = {**task.labels, "concurrency": task.concurrency, "units_wanted": task.units}
    try:
        sc = Scenario.model_validate(task.scenario)
        reqs, have = point_requests(task.plan, task.units)
        from workloads import count_sessions

        out.update(units=count_sessions(reqs), units_available=have, requests=len(reqs))
        run = run_scenario(sc, reqs, runtime="virtual", max_concurrency=task.concurrency,
                           think_time_s=task.think_time_s, kv_payload="account", timeseries=False)
        out.update(point_metrics(run, reqs))
    except Exception as exc:  # reported with the point, the other points still run
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


#: Points already run in this process, by `_task_key`: a study's sections that run the
#: same deployment on the same workload at the same concurrency and units (a tornado's
#: as-shipped curves and an interactivity section's; ladders sharing rungs) reuse them.
_POINTS: dict[str, dict] = {}


def _task_key(task: LadderTask) -> str:
    """What determines a point's run: the scenario (less its name), the workload
    recipe, the concurrency, the units and the think time."""
    import hashlib
    import json

    sc = {k: v for k, v in task.scenario.items() if k != "name"}
    text = json.dumps([sc, repr(task.plan), task.concurrency, task.units, task.think_time_s], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def clear_point_cache() -> None:
    """Forget the points this process has run (`interactivity_sweep` reuses them)."""
    _POINTS.clear()


def slo_floor(scenario: Any) -> Optional[float]:
    """The tokens/s per user a deployment's TPOT target implies (1000 / tpot_ms), or
    None when it has no TPOT target."""
    t = getattr(scenario.slo, "tpot_ms", None)
    return 1000.0 / float(t) if t else None


def curve_state(points: Sequence[Mapping[str, Any]], *, floor: Optional[float], rungs_left: int,
                metric: str = DEFAULT_METRIC, patience: int = 1) -> Optional[str]:
    """Why a curve run rung by rung stops, or None while it must go on.

    points: its points so far, by concurrency; floor: the tokens/s per user below which
    it stops (`slo_floor`; None: none); rungs_left: ladder rungs not yet run;
    patience: how many points after its best must all be lower before it has turned
    (1: the first lower point; 2 rides out a one-point dip, e.g. a ramp or drain that
    weighs more at one rung, at the cost of one more rung).
    "turned": the `patience` points after its best `metric` are lower (its knee is behind it);
    "flat": its last point gained less than `FLAT` over its best earlier point (it
    stopped rising: a plateau, e.g. a decode batch cap reached, past which more
    requests only queue);
    "below_slo": its last point's tokens/s per user (p50) fell below `floor`;
    "failed": its last point has no figure (an error, nothing completed);
    "ladder_end": no rung left and neither of the above (its best may be its last point).
    """
    pts = sorted(points, key=lambda p: p["concurrency"])
    if not pts:
        return "ladder_end" if rungs_left <= 0 else None
    last = pts[-1]
    if "error" in last or last.get(metric) is None or last.get(X_KEY) is None:
        return "failed"
    if floor is not None and last[X_KEY] < floor:
        return "below_slo"
    vals = [p[metric] for p in pts if p.get(metric) is not None]
    best = max(range(len(vals)), key=lambda i: vals[i]) if vals else 0
    if len(vals) - 1 - best >= max(1, patience):
        return "turned"
    if len(vals) >= 2 and best == len(vals) - 1 and vals[-1] < (1 + FLAT) * max(vals[:-1]):
        return "flat"
    return "ladder_end" if rungs_left <= 0 else None


def interactivity_sweep(scenarios: Sequence[Any], plan: Any, concurrencies: Sequence[int], *,
                        per_slot: int = DEFAULT_PER_SLOT, think_time_s: float = 0.0,
                        workers: int = 2, address: Optional[str] = None,
                        progress: bool = True, until_turned: bool = False,
                        metric: str = DEFAULT_METRIC, first: int = 3, patience: int = 1) -> dict:
    """Closed-loop concurrency ladders: every scenario at every concurrency, or with
    `until_turned` each curve rung by rung until it turns.

    scenarios: `rack.wiring.scenario.Scenario`s (names unique); plan: the workload
    recipe, a `workloads.LoadPlan` (a trace, vLLM's random dataset or a workload file,
    with its replay and load controls; its request rate is replaced by a pure closed
    loop's); concurrencies: requests (or sessions) in the rack at once, integers >= 1;
    per_slot: units replayed per slot (a point replays per_slot x C of them);
    think_time_s: between a slot's units (a request's or session's end and the next
    one's start on that slot). Points run in parallel (`rack.runtime.parallel`: a
    process pool of `workers`, or Ray tasks at `address`).

    until_turned: the concurrencies are the rungs a curve may climb: each curve runs
    its `first` lowest rungs, then one more rung per round until `curve_state` stops
    it (its `metric` fell at the `patience` points after its best point, or its
    tokens/s per user fell below its TPOT target's, or the ladder ended); each round's points of every curve still
    climbing run in parallel, so a curve that turned early costs no more runs.

    Returns JSON-ready curves: {"kind": "interactivity", "workload": label, "recipe":
    plan.describe(), "concurrencies": [...], "per_slot", "think_time_s", "x": X_KEY,
    "deployments": {name: {"description", "points": [point, ...] sorted by
    concurrency, "stop": why its ladder stopped (`curve_state`; "ladder" when every
    rung ran without `until_turned`), "slo_floor"}}, "errors": [failed points],
    "definitions": [str]}; a point is `run_point`'s dict. Raises ValueError for an
    empty or bad ladder or duplicate names.
    """
    from rack.runtime.parallel import map_virtual_runs

    ladder = sorted({int(c) for c in concurrencies})
    if not ladder or ladder[0] < 1 or any(int(c) != c for c in concurrencies):
        raise ValueError(f"concurrencies: expected integers >= 1, got {list(concurrencies)}")
    if per_slot < 1:
        raise ValueError(f"per_slot must be >= 1, got {per_slot}")
    if first < 1:
        raise ValueError(f"first must be >= 1, got {first}")
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names must be unique, got {names}")
    by_name = {s.name: s for s in scenarios}

    def task(s, c):
        return LadderTask(s.model_dump(mode="json"), plan, c, per_slot * c, float(think_time_s), {"scenario": s.name})

    runs: dict[str, list] = {n: [] for n in names}
    stop: dict[str, Optional[str]] = {n: None for n in names}
    todo = {n: ladder if not until_turned else ladder[:first] for n in names}
    while any(todo.values()):
        batch = [(n, c) for n in names for c in todo[n]]
        tasks = [task(by_name[n], c) for n, c in batch]
        keys = [_task_key(t) for t in tasks]
        new = [i for i, k in enumerate(keys) if k not in _POINTS]
        fresh = map_virtual_runs(run_point, [tasks[i] for i in new], address=address,
                                 max_workers=max(1, workers), progress=progress) if new else []
        for i, p in zip(new, fresh):
            if "error" not in p:
                _POINTS[keys[i]] = p
        got = dict(zip(new, fresh))
        for i, (n, _) in enumerate(batch):
            runs[n].append(got[i] if i in got else {**_POINTS[keys[i]], **tasks[i].labels})
        for n in names:
            done = len(runs[n])
            if not until_turned:
                stop[n], todo[n] = "ladder", []
                continue
            if not todo[n]:
                continue
            state = curve_state([p for p in runs[n] if "error" not in p] or runs[n][-1:],
                                floor=slo_floor(by_name[n]), rungs_left=len(ladder) - done, metric=metric,
                                patience=patience)
            if "error" in runs[n][-1]:
                state = "failed"
            stop[n] = state
            todo[n] = [] if state is not None else [ladder[done]]
    every = [p for n in names for p in runs[n]]
    deployments = {s.name: {"description": s.description, "stop": stop[s.name], "slo_floor": slo_floor(s),
                            "points": sorted((p for p in runs[s.name] if "error" not in p),
                                             key=lambda p: p["concurrency"])}
                   for s in scenarios}
    return {"kind": "interactivity", "workload": plan.label(), "recipe": plan.describe(),
            "concurrencies": ladder, "per_slot": per_slot, "think_time_s": float(think_time_s),
            "until_turned": bool(until_turned), "x": X_KEY, "deployments": deployments,
            "errors": [p for p in every if "error" in p], "definitions": list(DEFINITIONS)}


DEFINITIONS = (
    "point: a pure closed loop of C requests (or sessions, replayed turn by turn) in the rack at once, "
    "per_slot x C of them per run, on the virtual runtime",
    "tokens/s per user: 1 / TPOT per completed request with >= 2 output tokens (InferenceX's interactivity); "
    "p50 their median, p90 the speed 90% of them reach (their 10th percentile)",
    "output tokens/s: completed output tokens over the run's energy window (0 to the last request event); "
    "per device: over every accelerator provisioned (GPUs and wafer systems)",
    "tokens/s per kW: output tokens over the devices' energy of the run (idle included) x 1000; per MW x 1e6",
    "tokens/s per $/h: output tokens/s over the deployment's cost per hour (results.json cost.usd_per_hour)",
    "ratio at equal interactivity: each curve interpolated linearly in tokens/s per user between neighbouring "
    "concurrency points (the best segment where several cover it); never extrapolated past a curve's ends",
    "ratio at least x: each curve's best operating point (measured, or on a segment crossing x) that gives every "
    "user x tokens/s or more (within a tolerance: 1% in reports); none above a curve's fastest point",
)


# ---------------------------------------------------------------------------- reading curves
def _measured(points: Sequence[Mapping[str, Any]], x_key: str, metric: str) -> list[tuple]:
    """(concurrency, x, y) of the points that have both values, by concurrency."""
    return sorted(((p["concurrency"], float(p[x_key]), float(p[metric])) for p in points
                   if p.get(x_key) is not None and p.get(metric) is not None), key=lambda t: t[0])


def measured_range(points: Sequence[Mapping[str, Any]], x_key: str = X_KEY,
                   metric: str = DEFAULT_METRIC) -> Optional[list[float]]:
    """[lowest, highest] `x_key` of a curve's points that have `metric`, or None."""
    xs = [px for _, px, _ in _measured(points, x_key, metric)]
    return [min(xs), max(xs)] if xs else None


#: How a curve is read at an interactivity x (`interpolate`, `ratio_at_equal_interactivity`).
READINGS = ("equal", "at_least")


def interpolate(points: Sequence[Mapping[str, Any]], x: float, *, x_key: str = X_KEY,
                metric: str = DEFAULT_METRIC, reading: str = "equal") -> dict:
    """`metric` of one measured curve at interactivity `x`, by linear interpolation
    between neighbouring points (in concurrency order), never extrapolated.

    points: the curve's points (dicts with "concurrency", `x_key` and `metric`; points
    missing either value are left out). reading: "equal", the curve's value at x
    exactly; "at_least", the best value among the curve's operating points that give
    x or more (its measured points at or above x, and the segments crossing x): what
    the deployment delivers when every user must get at least x (InferenceX's Pareto
    reading), defined for every x up to the curve's highest, none above.

    Returns {"value": float or None, "status": "measured" (the value is a point's),
    "interpolated", "below_range" / "above_range" (x outside the curve's measured
    [lo, hi]: no value; "at_least" has no below_range), or "no_points"; "range": [lo,
    hi] of the curve's x; "between": [C0, C1] the concurrencies of the value's segment
    (C0 = C1 for a point); "segments": the candidates}. Where several candidates cover
    x (a curve that turns back), the highest value is taken (the curve's frontier).
    Raises ValueError for an unknown reading.
    """
    if reading not in READINGS:
        raise ValueError(f"reading: expected one of {', '.join(READINGS)}, got {reading!r}")
    pts = _measured(points, x_key, metric)
    if not pts:
        return {"value": None, "status": "no_points", "range": None}
    lo, hi = measured_range(points, x_key, metric)
    if x > hi or (x < lo and reading == "equal"):
        return {"value": None, "status": "below_range" if x < lo else "above_range", "range": [lo, hi]}
    cands = [(py, [c, c], "measured") for c, px, py in pts
             if px == x or (reading == "at_least" and px >= x)]
    for (c0, x0, y0), (c1, x1, y1) in zip(pts, pts[1:]):
        if min(x0, x1) < x < max(x0, x1):
            cands.append((y0 + (x - x0) / (x1 - x0) * (y1 - y0), [c0, c1], "interpolated"))
    value, between, status = max(cands, key=lambda t: t[0])
    return {"value": value, "status": status, "range": [lo, hi], "between": between, "segments": len(cands)}


def _curve(curves: Mapping[str, Any], name: str) -> list:
    deps = curves["deployments"] if "deployments" in curves else curves
    if name not in deps:
        raise KeyError(f"no curve named {name!r}; curves: {', '.join(deps)}")
    d = deps[name]
    return d["points"] if isinstance(d, Mapping) else list(d)


def ratio_at_equal_interactivity(curves: Mapping[str, Any], a: str, b: str, *,
                                 metric: str = DEFAULT_METRIC, x_key: str = X_KEY,
                                 at: Optional[Sequence[float]] = None, reading: str = "equal",
                                 tolerance: float = 0.0) -> dict:
    """The ratio metric(a) / metric(b) of two curves read at equal tokens/s per user.

    curves: `interactivity_sweep`'s result (or {name: {"points": [...]}} / {name:
    [points]}); a, b: deployment names; metric: one of `METRICS`; reading: "equal"
    (each curve at x exactly) or "at_least" (each curve's best operating point giving
    x or more, `interpolate`); at: interactivity values (tokens/s per user) to read at;
    None: every measured x of either curve where both curves can be read ("equal":
    inside their overlap, both ends included; "at_least": up to the lower of the two
    curves' highest x). tolerance ("at_least" only, a fraction >= 0): a point gives x
    when it gives x (1 - tolerance) or more, a "comparable interactivity point" (0.01:
    within 1 %).

    Returns {"a", "b", "metric", "x", "reading", "overlap": [lo, hi] or None (the
    curves share no interactivity), "readings": [{"x", "a", "b", "ratio", "a_status",
    "b_status"}], "ratio_min", "ratio_max" (over the readings that have both values),
    "note"}. A reading where either curve has no value has no ratio (never
    extrapolated), and its status says which curve it lies beyond. Raises KeyError for
    an unknown name, ValueError for an unknown metric or reading.
    """
    if metric not in METRICS:
        raise ValueError(f"metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    if reading not in READINGS:
        raise ValueError(f"reading: expected one of {', '.join(READINGS)}, got {reading!r}")
    if not (0.0 <= tolerance < 1.0) or (tolerance and reading == "equal"):
        raise ValueError(f"tolerance: expected a fraction in [0, 1) with reading 'at_least', got {tolerance!r} "
                         f"with {reading!r}")
    pa, pb = _curve(curves, a), _curve(curves, b)
    ra, rb = measured_range(pa, x_key, metric), measured_range(pb, x_key, metric)
    overlap = None
    if ra and rb and max(ra[0], rb[0]) <= min(ra[1], rb[1]):
        overlap = [max(ra[0], rb[0]), min(ra[1], rb[1])]
    if at is None:
        top = min(ra[1], rb[1]) if ra and rb else -math.inf
        bottom = overlap[0] if reading == "equal" and overlap else -math.inf
        if reading == "equal" and overlap is None:
            top = -math.inf
        at = sorted({float(p[x_key]) for p in (*pa, *pb) if p.get(x_key) is not None
                     and bottom <= p[x_key] <= top})
    readings = []
    for x in at:
        ia = interpolate(pa, float(x) * (1 - tolerance), x_key=x_key, metric=metric, reading=reading)
        ib = interpolate(pb, float(x) * (1 - tolerance), x_key=x_key, metric=metric, reading=reading)
        va, vb = ia["value"], ib["value"]
        readings.append({"x": float(x), "a": va, "b": vb,
                         "ratio": va / vb if va is not None and vb not in (None, 0) else None,
                         "a_status": ia["status"], "b_status": ib["status"]})
    ratios = [r["ratio"] for r in readings if r["ratio"] is not None]
    how = ("each curve interpolated linearly in tokens/s per user between neighbouring concurrency points"
           if reading == "equal" else
           f"each curve's best operating point giving at least x{f' (1 - {tolerance:g})' if tolerance else ''} "
           "tokens/s per user (measured points, or interpolated on a segment crossing it)")
    return {"a": a, "b": b, "metric": metric, "x": x_key, "reading": reading, "tolerance": tolerance,
            "overlap": overlap,
            "readings": readings, "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "note": how + "; no value beyond a curve's measured range (never extrapolated)"}


# ---------------------------------------------------------------------------- reporting
_COLS = (("concurrency", "C", "{:d}"), ("units", "units", "{:d}"), ("mean_concurrency", "mean in flight", "{:.3g}"),
         ("tps_user_p50", "tok/s/user p50", "{:.4g}"), ("tps_user_p90", "p90", "{:.4g}"),
         ("output_tps_per_device", "tok/s/device", "{:.4g}"), ("output_tps_per_kw", "tok/s/kW", "{:.4g}"),
         ("output_tps_per_usd_per_hour", "tok/s per $/h", "{:.4g}"),
         ("ttft_p50_s", "TTFT p50 (s)", "{:.3g}"), ("ttft_p90_s", "TTFT p90 (s)", "{:.3g}"),
         ("prefix_hit_ratio", "prefix hit", "{:.3f}"), ("recomputed_tokens", "recomputed tok", "{:,d}"),
         ("kv_bytes_per_turn", "KV/turn (GB)", "{:.3g}"))


def points_table(curves: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): one row per point, by deployment then concurrency."""
    heads = ["deployment"] + [c[1] for c in _COLS]
    rows = []
    for name, d in curves["deployments"].items():
        for p in d["points"]:
            row = [name]
            for key, _, fmt in _COLS:
                v = p.get(key)
                if key == "kv_bytes_per_turn" and v is not None:
                    v = v / 1e9
                row.append("-" if v is None else fmt.format(int(v) if fmt.endswith("d}") else v))
            rows.append(row)
    for p in curves.get("errors", ()):
        rows.append([p["scenario"], str(p["concurrency"]), "error: " + p["error"][:80]] + [""] * (len(_COLS) - 2))
    return heads, rows


def summary_lines(curves: Mapping[str, Any], pairs: Sequence[tuple[str, str]] = (),
                  metric: str = DEFAULT_METRIC, tolerance: float = DEFAULT_TOLERANCE) -> list[str]:
    """Sentences: each curve's interactivity range, each pair's ratio at equal
    interactivity (its range over the overlap) and at comparable interactivity (each
    at its best point within `tolerance` of x or faster), points short of units or
    with refused requests."""
    out = []
    for name, d in curves["deployments"].items():
        xs = [p["tps_user_p50"] for p in d["points"] if p.get("tps_user_p50") is not None]
        if xs:
            out.append(f"{name}: {min(xs):.4g} to {max(xs):.4g} tokens/s per user (p50) over concurrency "
                       f"{d['points'][0]['concurrency']}-{d['points'][-1]['concurrency']}")
        for p in d["points"]:
            if p.get("units", 0) < p.get("units_wanted", 0):
                out.append(f"{name} C={p['concurrency']}: only {p['units']} of the {p['units_wanted']} units wanted "
                           f"(the workload has {p['units_available']}): ramp and drain weigh more")
            if p.get("rejected") or p.get("failed"):
                out.append(f"{name} C={p['concurrency']}: {p.get('rejected', 0)} rejected, {p.get('failed', 0)} failed "
                           f"{p.get('rejected_by_reason') or ''}")
    for a, b in pairs:
        r = ratio_at_equal_interactivity(curves, a, b, metric=metric)
        if r["overlap"] is None:
            out.append(f"{a} / {b} ({metric}): the curves share no tokens/s per user: no ratio at equal "
                       "interactivity (never extrapolated)")
        elif r["ratio_min"] is not None:
            lo, hi = r["overlap"]
            out.append(f"{a} / {b} ({metric}) at equal tokens/s per user, over their overlap {lo:.4g}-{hi:.4g}: "
                       f"{r['ratio_min']:.3g}x to {r['ratio_max']:.3g}x (interpolated along each curve)")
        if a in curves["deployments"] and b in curves["deployments"]:
            from rack.experiments.equal_interactivity import branches_of, interval_text, pair_readings

            da, db = curves["deployments"][a], curves["deployments"][b]
            rd = pair_readings(branches_of(da), branches_of(db), metric, floor_a=da.get("slo_floor"),
                               floor_b=db.get("slo_floor"), names=(a, b))
            cells = [f"{n['name']}" + (f" ({n['x']:,.0f})" if "knee" in n["name"] and n.get("x") else "")
                     + f": {interval_text(n) if n.get('ratio') is not None else '-'}" for n in rd["named"]]
            out.append(f"{a} / {b} ({metric}) at exactly equal tokens/s per user, interval in brackets "
                       "(90% bootstrap and the ladder's bracket): " + "; ".join(cells))
        q = ratio_at_equal_interactivity(curves, a, b, metric=metric, reading="at_least", tolerance=tolerance)
        if q["ratio_min"] is not None:
            xs = [x["x"] for x in q["readings"] if x["ratio"] is not None]
            out.append(f"{a} / {b} ({metric}), each at its best point giving every user at least x tokens/s "
                       f"(within {tolerance:.0%}), x from {min(xs):.4g} to {max(xs):.4g}: "
                       f"{q['ratio_min']:.3g}x to {q['ratio_max']:.3g}x")
    for p in curves.get("errors", ()):
        out.append(f"point {p['scenario']} C={p['concurrency']} failed: {p['error']}")
    return out


def write_interactivity(curves: Mapping[str, Any], out_dir: Any, *, pairs: Sequence[tuple[str, str]] = (),
                        plots: bool = True, metric: str = DEFAULT_METRIC,
                        tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """Write interactivity.json (the curves, plus the pairs' ratios, both readings), interactivity.csv
    (one row per point), interactivity.png (`plots.interactivity_curves`) and
    report.md/.html into `out_dir`; returns {what: path}."""
    import csv

    from rack.measure import plots as P
    from rack.experiments import report
    from rack.measure.results import to_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {**curves, "ratios": [ratio_at_equal_interactivity(curves, a, b, metric=metric, reading=how,
                                                             tolerance=tolerance if how == "at_least" else 0.0)
                                for a, b in pairs for how in READINGS]}
    (out / "interactivity.json").write_text(to_json(doc))
    pts = [{"deployment": n, **p} for n, d in curves["deployments"].items() for p in d["points"]]
    # one row per point: the bootstrap replicates and per-device watts stay in the JSON
    keys = sorted({k for p in pts for k in p if not k.startswith("boot_") and k != "overhead_w_by_device"})
    with open(out / "interactivity.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(pts)
    paths = {"json": out / "interactivity.json", "csv": out / "interactivity.csv"}
    png = None
    if plots and pts:
        png = P.interactivity_curves({n: d["points"] for n, d in curves["deployments"].items()},
                                     out / "interactivity.png", title=curves["workload"])
        paths["png"] = png
    heads, rows = points_table(curves)
    lines = [f"# Interactivity: {curves['workload']}", "",
             f"Concurrency ladder {curves['concurrencies']}, {curves['per_slot']} units per slot.", "",
             "## Summary", ""] + [f"- {s}" for s in summary_lines(curves, pairs, metric, tolerance)]
    lines += ["", "## Points", "", report.md_table(heads, rows), ""]
    if png is not None:
        lines += ["## Curves", "", "![interactivity curves](interactivity.png)", ""]
    lines += ["## Definitions", ""] + [f"- {d}" for d in curves["definitions"]]
    md, html = report.write_report(out, "\n".join(lines) + "\n", "rack sweep interactivity")
    paths.update(report_md=md, report_html=html)
    return paths


__all__ = ["DEFAULT_METRIC", "FLAT", "DEFAULT_PER_SLOT", "DEFAULT_TOLERANCE", "DEFINITIONS", "LadderTask", "METRICS", "READINGS", "X_KEY",
           "clear_point_cache", "curve_state", "interactivity_sweep", "interpolate", "mean_concurrency", "measured_range", "point_metrics", "point_requests", "points_table",
           "ratio_at_equal_interactivity", "run_point", "slo_floor", "summary_lines", "write_interactivity"]
