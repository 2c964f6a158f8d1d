"""Sweeps: goodput, tokens per joule and cost of deployments against request rate, KV
link bandwidth and prompt length, run in parallel.

- Rate (`rate_sweep`): each point's requests at its rate (`Workload.requests`): a
  synthetic load (vLLM's random dataset, or any source re-timed by `--request-rate`)
  draws its own arrivals at the point's rate, for the whole `--duration` when one is
  set; a trace (or workload file) replay keeps its requests, their arrival times
  divided by the rate scale, and each point says its arrivals' emulated span. Each
  point's goodput and offered rate are measured over the run's steady-state window
  (warm-up and drain excluded, `rack.measure.metrics`), so a point where every request meets
  the SLO has goodput = offered rate. For each deployment the maximum sustained rate is
  the highest rate *tried* whose SLO attainment is at least the target (90 % by
  default), scanning up from the lowest until the first miss: DistServe's goodput, "the
  maximum request rate that can be served adhering to the SLO attainment goal" (Zhong
  et al., OSDI 2024), as a measured point, never an interpolation; when every point
  held, the answer is ">= the highest rate tried".
- Link bandwidth (`bandwidth_sweep`): the split deployment's KV links set to each
  bandwidth; colocated deployments (no link) run once. The crossover is the bandwidth
  at which the split deployment's goodput first catches up with a colocated one's
  (`find_crossover`); below it, colocation wins.
- Prompt length (`prompt_sweep`): synthetic requests (Poisson arrivals, fixed lengths)
  at each prompt length.

Execution: every point is an independent virtual-time run. Points run in a process
pool (2 workers by default) or, when a Ray address is given, as Ray tasks on that
cluster, through `rack.runtime.parallel.map_virtual_runs`; a rich progress bar counts
finished points. A worker rebuilds the requests from a small recipe (`Workload`), so
tasks stay small to pickle.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dc_replace
from typing import Any, Optional, Sequence

from rack.runtime.interrupt import current_stop, stop_requested
from rack.runtime.parallel import RunsStopped
from rack.wiring.scenario import Scenario

#: DistServe evaluates goodput at 90 % SLO attainment.
DEFAULT_ATTAINMENT_TARGET = 0.9
#: Two goodputs within 1 % of each other are a tie (run durations differ slightly).
TIE_TOLERANCE = 0.01


@dataclass(frozen=True)
class Workload:
    """A recipe for the requests of a sweep point (picklable, rebuilt in the worker).

    kind "trace": `trace` (name or path) with optional `window` (start_s, end_s),
    `max_requests`, `output_scale`. kind "synthetic": Poisson arrivals at `rate_per_s`,
    every request `prompt_tokens` in and `output_tokens` out, `n` requests, `seed`;
    with `duration_s`, at least that many seconds of arrivals at each point's rate
    (max(n, ceil(rate x duration_s)) requests), so that a point at a high rate is not
    one short burst that a rack absorbs in its queue and still meets the SLO.
    kind "plan": a `workloads.load.LoadPlan` (`plan`: a trace, random dataset or
    workload file through the load options, possibly a closed loop); at a rate scale
    s (`requests(s)`) the random dataset, or a source re-timed by a request rate,
    draws fresh arrivals at s x its request rate (same seed: the same lengths in the
    same order), for its duration when it has one; a workload file with a duration
    generates s x that duration and is compressed into it (its rates x s); a trace
    keeps its requests, arrivals divided by s.
    """

    kind: str = "trace"
    trace: Optional[str] = None
    window: Optional[tuple] = None
    max_requests: Optional[int] = None
    output_scale: float = 1.0
    rate_per_s: Optional[float] = None
    prompt_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    n: Optional[int] = None
    seed: int = 0
    plan: Optional[Any] = None
    duration_s: Optional[float] = None

    def requests(self, rate_scale: float = 1.0, prompt_tokens: Optional[int] = None) -> list:
        """The requests, arrivals divided by `rate_scale`; `prompt_tokens` overrides the
        synthetic prompt length. Raises ValueError / TraceError on bad parameters."""
        if self.kind == "trace":
            from workloads import load_requests

            return list(load_requests(self.trace, window=self.window, rate_scale=rate_scale,
                                      max_requests=self.max_requests, output_scale=self.output_scale))
        if self.kind == "plan":
            from workloads import scale_rate

            plan, c = self.plan, self.plan.controls
            if rate_scale == 1.0:
                return list(plan.requests())
            if plan.source == "random" or (c.request_rate is not None and c.max_concurrency is None):
                if c.request_rate is None or math.isinf(c.request_rate):
                    raise ValueError(f"{plan.label()}: no arrival rate to scale (every request arrives at 0 s "
                                     "without a request rate)")
                return list(dc_replace(plan, controls=dc_replace(c, request_rate=c.request_rate * rate_scale))
                            .requests())
            if plan.source == "workload" and c.duration_s is not None:
                plan = dc_replace(plan, controls=dc_replace(c, duration_s=c.duration_s * rate_scale))
            return list(scale_rate(plan.requests(), rate_scale))
        if self.kind == "synthetic":
            from workloads import FixedLengths, PoissonArrivals, synthesize

            if not (self.rate_per_s and self.n and self.output_tokens and (prompt_tokens or self.prompt_tokens)):
                raise ValueError("synthetic workload: needs rate_per_s, n, prompt_tokens and output_tokens")
            if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
                raise ValueError(f"synthetic workload: duration_s must be a finite number of seconds > 0, "
                                 f"got {self.duration_s}")
            rate = self.rate_per_s * rate_scale
            n = int(self.n)
            if self.duration_s is not None:
                n = max(n, math.ceil(rate * self.duration_s))
            return synthesize(PoissonArrivals(rate),
                              FixedLengths(int(prompt_tokens or self.prompt_tokens), int(self.output_tokens)),
                              n=n, seed=self.seed)
        raise ValueError(f"workload kind: expected 'trace' or 'synthetic', got {self.kind!r}")

    def run_kwargs(self) -> dict:
        """More `run_scenario` keyword arguments (a plan's closed loop), else {}."""
        return self.plan.run_kwargs() if self.plan is not None else {}

    def describe(self) -> str:
        if self.kind == "plan":
            return self.plan.label() + (f" window {self.plan.window}" if self.plan.window else "")
        if self.kind == "trace":
            return f"trace {self.trace}" + (f" window {self.window}" if self.window else "")
        return (f"synthetic: {self.n} requests"
                + (f" or {self.duration_s:g} s of arrivals, whichever is more" if self.duration_s else "")
                + f", Poisson {self.rate_per_s:g} req/s, {self.prompt_tokens} prompt / {self.output_tokens} output tokens")


@dataclass(frozen=True)
class Task:
    """One sweep point: a scenario (as a dict, to pickle), its workload and knobs, and
    the labels copied into the result (scenario name, swept parameter and value)."""

    scenario: dict
    workload: Workload
    rate_scale: float = 1.0
    prompt_tokens: Optional[int] = None
    labels: dict = field(default_factory=dict)
    #: SLO attainment target: stop the run once its verdict against it is decided
    #: (`rack.experiments.slo_watch.SloWatch`, a certain fail only); None: run to the end.
    early_stop: Optional[float] = None


def point_summary(results: dict) -> dict:
    """The figures a sweep keeps from one run's results.json (flat dict)."""
    lat, g, th = results["latency"], results["goodput"], results["throughput"]
    links = results["kv_transfer"]["links"]
    return {
        "submitted": results["requests"]["submitted"],
        "completed": results["requests"]["completed"],
        "rejected": results["requests"]["rejected"],
        "failed": results["requests"]["failed"],
        "rejected_by_reason": dict(results["requests"].get("rejected_by_reason") or {}),
        "failed_by_reason": dict(results["requests"].get("failed_by_reason") or {}),
        "ttft_p50_s": lat["ttft_s"]["p50"], "ttft_p99_s": lat["ttft_s"]["p99"],
        "tpot_p50_s": lat["tpot_s"]["p50"], "tpot_p99_s": lat["tpot_s"]["p99"],
        "e2e_p99_s": lat["e2e_s"]["p99"],
        "requests_per_s": th["requests_per_s"], "output_tokens_per_s": th["output_tokens_per_s"],
        "duration_s": th["duration_s"],
        "goodput_rps": g["requests_per_s"], "offered_rps": g["offered_requests_per_s"],
        "goodput_basis": g["basis"], "slo_attainment": g["slo_attainment"],
        "tokens_per_joule": results["energy"]["tokens_per_joule"],
        "tokens_per_joule_roofline": results["energy"]["sensitivity"]["roofline"]["tokens_per_joule"],
        "mean_power_w": results["energy"]["mean_power_w"],
        "usd_per_mtok": results["cost"]["usd_per_mtok"],
        "kv_bytes_logical": results["kv_transfer"]["bytes_logical"],
        "link_utilization": max((l["utilization"] for l in links.values()), default=None),
    }


def arrival_summary(requests: Sequence) -> dict:
    """A point's arrivals: {"arrivals": count, "arrival_span_s": first to last arrival
    (emulated s), "realised_rps": (count - 1) / span (the rate the gaps realise; None
    for fewer than 2 arrivals or no span)}."""
    t = requests.arrivals.tolist() if hasattr(requests, "arrivals") else [r.arrival_s for r in requests]
    span = (max(t) - min(t)) if t else 0.0
    return {"arrivals": len(t), "arrival_span_s": span,
            "realised_rps": (len(t) - 1) / span if len(t) > 1 and span > 0 else None}


def run_task(task: Task) -> dict:
    """Run one point on the virtual runtime; returns labels + `point_summary`, or labels
    + {"error": message} when the scenario is refused or the rack stalls."""
    from rack.run.runner import RunInterrupted, run_scenario

    out = dict(task.labels)
    try:
        sc = Scenario.model_validate(task.scenario)
        reqs = task.workload.requests(task.rate_scale, task.prompt_tokens)
        watch = None
        if task.early_stop is not None:
            from rack.experiments.slo_watch import SloWatch

            watch = SloWatch.for_scenario(sc, reqs, task.early_stop)
        try:
            # the KV payload accounted, not built: the same numbers (run_scenario's kv_payload)
            res = run_scenario(sc, reqs, runtime="virtual", stop=watch, kv_payload="account", timeseries=False,
                               **task.workload.run_kwargs())
        except RunInterrupted as exc:
            if watch is None or watch.decided is None:
                raise
            res = exc.output
        results = res.results
        out.update(point_summary(results))
        # the run's output tokens over resamples of its requests: intervals of ratios of
        # tokens/J and $/Mtok (rack.experiments.study.analysis.pair_metric)
        from rack.measure.bootstrap import output_token_replicates

        out["boot_tokens"] = output_token_replicates(res.columns)
        out.update(arrival_summary(reqs))
        if watch is not None and watch.decided is not None:
            # figures of a run cut short describe only what ran until the verdict
            out["stopped_early"] = watch.record()
    except Exception as exc:  # one bad point must not sink the sweep; it is reported
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def run_tasks(tasks: Sequence[Task], *, workers: int = 2, address: Optional[str] = None,
              progress: bool = True, description: str = "sweep") -> list[dict]:
    """Run `tasks` in parallel (`rack.runtime.parallel.map_virtual_runs`); results in
    task order.

    address: a Ray cluster address ("auto", host:port or "local"): one Ray task per
    point on that cluster. Otherwise the pool `rack.runtime.run_pool.shared` opened
    (a study's, local or on a cluster), else a process pool of `workers` (1: in this
    process).
    `progress`: a rich progress bar on stderr. A point that fails is returned as its
    labels plus "error" (see `run_task`); the others still run.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rack.runtime import run_pool
    from rack.runtime.parallel import map_virtual_runs

    pool = run_pool.current() if address is None else None
    if stop_requested():            # a signal came: nothing more is started
        return [not_run(t.labels) for t in tasks]
    bar = Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True, disable=not progress)
    try:
        with bar:
            tid = bar.add_task(description, total=len(tasks))
            if pool is not None:        # a study's pool, open across its sweeps (local or Ray)
                return pool.map(run_task, list(tasks), on_done=lambda done, total: bar.update(tid, completed=done))
            return map_virtual_runs(run_task, list(tasks), address=address, max_workers=max(1, workers),
                                    progress=lambda done, total: bar.update(tid, completed=done))
    except RunsStopped as exc:      # keep the points that finished
        return [r if ok else not_run(t.labels) for t, r, ok in zip(tasks, exc.results, exc.done)]


def not_run(labels: dict) -> dict:
    """A point a signal kept from finishing (`rack.runtime.interrupt`): its `labels`,
    "error" saying so, and "interrupted": True (the summary counts them apart)."""
    stop = current_stop()
    name = stop.signal_name if stop is not None and stop.signal_name else "a stop request"
    return {**labels, "error": f"not run: interrupted ({name})", "interrupted": True}


def interrupted_line(result: "SweepResult") -> str | None:
    """"interrupted (SIGINT): 7 of 12 points finished; ..." when a signal cut the
    sweep short, else None."""
    cut = [p for p in result.points if p.get("interrupted")]
    if not cut:
        return None
    stop = current_stop()
    name = stop.signal_name if stop is not None and stop.signal_name else "stop request"
    n = len(result.points)
    return (f"interrupted ({name}): {n - len(cut)} of {n} points finished; the {len(cut)} others were not run "
            "(marked \"interrupted\" in sweep.json)")


@dataclass
class SweepResult:
    """Points (one dict per run), the sweep's kind and parameter, and its summary
    (max sustainable rates, crossovers, ...)."""

    kind: str
    param: str
    points: list[dict]
    summary: dict = field(default_factory=dict)
    workload: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- analysis
def max_sustainable_rate(rates: Sequence[float], attainment: Sequence[float],
                         target: float = DEFAULT_ATTAINMENT_TARGET) -> tuple[Optional[float], bool]:
    """(the highest measured rate meeting `target` SLO attainment, whether every rate
    tried met it) (DistServe goodput, as measured points).

    Points are sorted by rate and scanned up from the lowest until the first one that
    misses the target; the answer is the last rate that met it, never a value between
    points. (None, False) if the lowest rate already misses it. When every point meets
    it the rack sustains *at least* the highest rate tried (True).
    """
    pts = sorted((float(r), float(a)) for r, a in zip(rates, attainment) if a is not None)
    if not pts or pts[0][1] < target:
        return None, False
    for (r0, _), (_, a1) in zip(pts, pts[1:]):
        if a1 < target:
            return r0, False
    return pts[-1][0], True


def find_crossover(xs: Sequence[float], split: Sequence[float], colocated: Sequence[float],
                   tol: float = TIE_TOLERANCE) -> dict:
    """Where the split deployment's metric catches up with a colocated one's along x.

    Returns {"x": crossover or None, "between": [x0, x1] (the measured points around
    it), "below": winner below it, "above": winner above it, "status": "crossover" |
    "split_always" | "colocated_always" | "tie"}. Differences within `tol` (relative to
    the larger value) are ties. The crossover lies between x0, the last x where
    colocated wins, and x1, the next x where split does not lose; "x" is an estimate
    interpolated linearly in log x (bandwidths span decades), not a measured point.
    """
    pts = sorted(zip(xs, split, colocated))
    if not pts:
        return {"x": None, "below": None, "above": None, "status": "tie"}

    def sign(s: float, c: float) -> int:
        scale = max(abs(s), abs(c), 1e-12)
        d = (s - c) / scale
        return 0 if abs(d) <= tol else (1 if d > 0 else -1)

    signs = [sign(s, c) for _, s, c in pts]
    for i in range(1, len(pts)):
        if signs[i - 1] < 0 <= signs[i]:
            (x0, s0, c0), (x1, s1, c1) = pts[i - 1], pts[i]
            d0, d1 = s0 - c0, s1 - c1
            # Where the difference reaches 0; x1 may be a tie (within `tol`) with the
            # difference still negative, and the crossover is then x1 itself, never
            # beyond the points that bracket it.
            f = min(max(d0 / (d0 - d1), 0.0), 1.0) if d0 != d1 else 1.0
            if x0 > 0 and x1 > 0:
                x = math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))
            else:
                x = x0 + f * (x1 - x0)
            return {"x": x, "between": [x0, x1], "below": "colocated",
                    "above": "split" if signs[-1] > 0 else "tie", "status": "crossover"}
    if all(s < 0 for s in signs):
        return {"x": None, "below": "colocated", "above": "colocated", "status": "colocated_always"}
    if all(s >= 0 for s in signs):
        status = "tie" if all(s == 0 for s in signs) else "split_always"
        return {"x": None, "below": "split", "above": "split", "status": status}
    return {"x": None, "below": None, "above": None, "status": "mixed"}


# ---------------------------------------------------------------------------- sweeps
def rate_sweep(scenarios: Sequence[Scenario], workload: Workload, rate_scales: Sequence[float], *,
               target: float = DEFAULT_ATTAINMENT_TARGET, base_rate: Optional[float] = None,
               workers: int = 2, address: Optional[str] = None, progress: bool = True,
               absolute: bool = False) -> SweepResult:
    """Goodput, attainment, tokens/J and $/Mtok of each scenario at each rate scale.

    base_rate: the unscaled workload's rate (req/s) so points also carry `rate_per_s`
    (None: rate_scale only). absolute: the points were asked as rates (req/s, each
    scale = rate / base_rate): the sweep's parameter is then `rate_per_s`. Points carry
    `arrival_summary` (count, span, realised rate) beside the measured offered rate.
    Summary: {"max_rate_scale": {scenario: x or None},
    "max_rate_per_s": {...}, "tokens_per_joule_at_max": {scenario: value at
    `max_rate_scale`, the highest rate below the first miss}, "target": target}.
    """
    tasks = [Task(s.model_dump(mode="json"), workload, rate_scale=float(r),
                  labels={"scenario": s.name, "rate_scale": float(r),
                          "rate_per_s": float(r) * base_rate if base_rate else None})
             for s in scenarios for r in rate_scales]
    points = run_tasks(tasks, workers=workers, address=address, progress=progress, description="rate sweep")
    return SweepResult("rate", "rate_per_s" if absolute else "rate_scale", points,
                       rate_summary(scenarios, points, target, base_rate), workload.describe())


def rate_summary(scenarios: Sequence[Scenario], points: Sequence[dict], target: float,
                 base_rate: Optional[float]) -> dict:
    """A rate sweep's summary (see `rate_sweep`) from its points (any subset of a
    ladder: `rack.experiments.capacity` measures only some rungs)."""
    summary: dict = {"target": target, "max_rate_scale": {}, "max_rate_per_s": {}, "tokens_per_joule_at_max": {},
                     "held_every_rate": {}}
    for s in scenarios:
        mine = [p for p in points if p["scenario"] == s.name and "error" not in p]
        m, held = max_sustainable_rate([p["rate_scale"] for p in mine], [p["slo_attainment"] for p in mine], target)
        summary["max_rate_scale"][s.name] = m
        summary["held_every_rate"][s.name] = held
        summary["max_rate_per_s"][s.name] = m * base_rate if (m is not None and base_rate) else None
        # tokens/J at the very point reported as sustained (a higher rate that met the
        # target again after a miss is not the rack's capacity)
        at_max = [p for p in mine if m is not None and p["rate_scale"] == m]
        summary["tokens_per_joule_at_max"][s.name] = at_max[0]["tokens_per_joule"] if at_max else None
    summary["vendor_ratio"] = _vendor_ratio(scenarios, summary["tokens_per_joule_at_max"])
    return summary


def _vendor_ratio(scenarios: Sequence[Scenario], tpj: dict) -> Optional[dict]:
    """Tokens/J of GPU prefill + wafer decode over wafer alone, each at its highest
    rate meeting the target (the vendor claim's setting), or None without both."""
    from rack.experiments.compare import is_gpu_prefill_wafer_decode, is_wafer_only

    split = next((s.name for s in scenarios if is_gpu_prefill_wafer_decode(s)), None)
    wafer = next((s.name for s in scenarios if is_wafer_only(s)), None)
    if split is None or wafer is None:
        return None
    a, b = tpj.get(split), tpj.get(wafer)
    return {"split": split, "wafer_only": wafer, "ratio": a / b if a and b else None}


def with_link_bandwidth(scenario: Scenario, bandwidth_gbps: float, link: Optional[str] = None) -> Scenario:
    """`scenario` with its KV links (or only `link`) at `bandwidth_gbps` GB/s.
    Raises ValueError if it has no such link."""
    data = scenario.model_dump()
    hit = False
    for l in data["links"]:
        if link is None or l["name"] == link:
            l["bandwidth_GBps"] = float(bandwidth_gbps)
            hit = True
    if not hit:
        raise ValueError(f"scenario {scenario.name!r} has no KV link" + (f" named {link!r}" if link else "")
                         + ": the bandwidth sweep needs a split deployment")
    return Scenario.model_validate(data)


def bandwidth_sweep(split: Scenario, colocated: Sequence[Scenario], workload: Workload,
                    bandwidths_gbps: Sequence[float], *, link: Optional[str] = None, metric: str = "goodput_rps",
                    workers: int = 2, address: Optional[str] = None, progress: bool = True) -> SweepResult:
    """The split deployment at each KV link bandwidth (GB/s) against colocated ones.

    Colocated scenarios run once (no link) and are repeated at every bandwidth in the
    points. Summary: {"crossover": {colocated name: find_crossover(...)}, "metric"}.
    """
    bws = sorted(float(b) for b in bandwidths_gbps)
    tasks = [Task(with_link_bandwidth(split, b, link).model_dump(mode="json"), workload,
                  labels={"scenario": split.name, "bandwidth_gbps": b, "role": "split"}) for b in bws]
    tasks += [Task(c.model_dump(mode="json"), workload, labels={"scenario": c.name, "role": "colocated"})
              for c in colocated]
    raw = run_tasks(tasks, workers=workers, address=address, progress=progress, description="bandwidth sweep")
    points = [p for p in raw if p.get("role") == "split"]
    flat = [p for p in raw if p.get("role") == "colocated"]
    for p in flat:
        for b in bws:
            points.append({**p, "bandwidth_gbps": b})
    split_pts = sorted((p for p in points if p["role"] == "split" and "error" not in p),
                       key=lambda p: p["bandwidth_gbps"])
    summary: dict = {"metric": metric, "crossover": {}}
    for c in colocated:
        cp = next((p for p in flat if p["scenario"] == c.name and "error" not in p), None)
        if cp is None or not split_pts:
            summary["crossover"][c.name] = {"x": None, "status": "error"}
            continue
        summary["crossover"][c.name] = find_crossover([p["bandwidth_gbps"] for p in split_pts],
                                                      [p[metric] for p in split_pts],
                                                      [cp[metric]] * len(split_pts))
    return SweepResult("bandwidth", "bandwidth_gbps", points, summary, workload.describe())


def prompt_sweep(scenarios: Sequence[Scenario], prompt_lengths: Sequence[int], *, rate_per_s: float,
                 output_tokens: int, n: int, seed: int = 0, workers: int = 2,
                 address: Optional[str] = None, progress: bool = True) -> SweepResult:
    """Each scenario on synthetic Poisson traffic at each fixed prompt length.

    Summary: {"best": {prompt length: scenario with the highest goodput, or "tie" when
    the best two are within `TIE_TOLERANCE` of each other}}.
    """
    wl = Workload(kind="synthetic", rate_per_s=rate_per_s, prompt_tokens=int(prompt_lengths[0]),
                  output_tokens=output_tokens, n=n, seed=seed)
    tasks = [Task(s.model_dump(mode="json"), wl, prompt_tokens=int(L),
                  labels={"scenario": s.name, "prompt_tokens": int(L)})
             for s in scenarios for L in prompt_lengths]
    points = run_tasks(tasks, workers=workers, address=address, progress=progress, description="prompt sweep")
    best = {}
    for L in prompt_lengths:
        here = [p for p in points if p["prompt_tokens"] == int(L) and "error" not in p]
        if here:
            ranked = sorted(here, key=lambda p: p["goodput_rps"], reverse=True)
            top = ranked[0]
            tied = len(ranked) > 1 and _within(ranked[1]["goodput_rps"], top["goodput_rps"])
            best[int(L)] = "tie" if tied else top["scenario"]
    desc = f"synthetic: {n} requests, Poisson {rate_per_s:g} req/s, {output_tokens} output tokens"
    return SweepResult("prompt", "prompt_tokens", points, {"best": best}, desc)


def _within(a: float, b: float, tol: float = TIE_TOLERANCE) -> bool:
    """Whether a and b differ by at most `tol` of the larger (a tie: no winner)."""
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def search_lines(result: SweepResult) -> list[str]:
    """Sentences on how each capacity was found (runs per deployment, early stops,
    ladder walks; `rack.experiments.capacity`), for the CLI and reports; [] for a sweep
    without a search."""
    out = []
    for name, s in (result.summary.get("search") or {}).items():
        # points a signal stopped before they ran are listed but were never run
        cut = sum(1 for p in result.points if p.get("scenario") == name and p.get("interrupted"))
        out.append(f"{name}: {s['method']}, {s['runs'] - cut} of {s['rungs']} rungs run"
                   + (f" ({cut} more not run: interrupted)" if cut else "")
                   + (f", {s['stopped_early']} of them stopped once the miss was certain" if s["stopped_early"] else "")
                   + (f"; {s['note']}" if s["note"] else ""))
    return out


def summary_lines(result: SweepResult) -> list[str]:
    """Human sentences for the sweep's summary (printed by the CLI, used in the report)."""
    s, out = result.summary, []
    if result.kind == "rate":
        for name, m in s["max_rate_scale"].items():
            rps = s["max_rate_per_s"].get(name)
            tpj = s["tokens_per_joule_at_max"].get(name)
            held = s.get("held_every_rate", {}).get(name)
            ge = ">= " if held else ""
            # the asked rate names the point; the offered rate is measured there (the
            # table's column), so the two are named apart
            at = next((p for p in result.points if p["scenario"] == name and p.get("rate_scale") == m
                       and "error" not in p), None)
            asked = (f"{ge}{rps:.3g} req/s asked" if result.param == "rate_per_s" and rps else
                     f"{ge}{m:.3g}x the source's rate" + (f" ({ge}{rps:.3g} req/s asked)" if rps else "")) \
                if m is not None else ""
            finished = [p for p in result.points if p["scenario"] == name and not p.get("interrupted")]
            cut = any(p.get("interrupted") for p in result.points if p["scenario"] == name)
            if m is None and cut:
                # a signal stopped the sweep: no verdict where no rate held before it
                out.append(f"{name}: no verdict (interrupted: " + (f"{len(finished)} rate(s) finished, none held "
                           f"the target)" if finished else "no rate finished)"))
                continue
            out.append(f"{name}: " + ("misses the target already at the lowest rate" if m is None else
                                      f"sustains {asked}"
                                      + (f" (offered {at['offered_rps']:.3g} req/s measured there)"
                                         if at and at.get("offered_rps") is not None else "")
                                      + f" at >= {s['target']:.0%} SLO attainment"
                                      + (" (every rate tried held: the highest tried)" if held
                                         else " (the highest rate tried that held)")
                                      + (f"; {tpj:.4g} output tokens/J at that rate" if tpj else "")))
        out += search_lines(result)
        ratio = s.get("vendor_ratio")
        if ratio:
            out.append(f"tokens/J at each one's highest sustained rate, {ratio['split']} vs {ratio['wafer_only']}: "
                       + (f"{ratio['ratio']:.2f}x" if ratio["ratio"] is not None else "n/a"))
    elif result.kind == "bandwidth":
        for name, c in s["crossover"].items():
            st = c.get("status")
            if st == "crossover":
                lo, hi = c.get("between") or (c["x"], c["x"])
                out.append(f"crossover with {name}: between {lo:.3g} and {hi:.3g} GB/s, the bandwidths tried "
                           f"around it (~{c['x']:.3g} GB/s interpolated); below it {name} wins on "
                           f"{s['metric']}, above it the split {'wins' if c['above'] == 'split' else 'ties'}")
            elif st == "split_always":
                out.append(f"no crossover with {name}: the split deployment wins or ties at every bandwidth swept")
            elif st == "colocated_always":
                out.append(f"no crossover with {name}: {name} wins at every bandwidth swept")
            elif st == "tie":
                out.append(f"no crossover with {name}: a tie at every bandwidth swept")
            else:
                out.append(f"crossover with {name}: undetermined ({st})")
    elif result.kind == "prompt":
        for L, name in s["best"].items():
            out.append(f"{L} prompt tokens: " + (f"no winner (the best goodputs are within {TIE_TOLERANCE:.0%})"
                                                 if name == "tie" else f"best goodput {name}"))
    # a point whose requests were refused measured nothing about them: a tie or a
    # winner among such points says so here, with the reasons
    for p in sorted((p for p in result.points if "error" not in p and (p.get("rejected") or p.get("failed"))),
                    key=lambda p: (p["scenario"], p.get(result.param) or 0)):
        lost = [(n, k, p.get(f"{k}_by_reason") or {}) for k, n in (("rejected", p.get("rejected") or 0),
                                                                 ("failed", p.get("failed") or 0)) if n]
        how = "; ".join(f"{'all' if n == p['submitted'] else n} of {p['submitted']} requests {k}"
                        + (" (" + ", ".join(f"{r}: {c}" for r, c in sorted(why.items())) + ")" if why else "")
                        for n, k, why in lost)
        out.append(f"point {p['scenario']} {result.param}={p.get(result.param):g}: {how}")
    for p in sorted((p for p in result.points if p.get("stopped_early")),
                    key=lambda p: (p["scenario"], p.get(result.param) or 0)):
        out.append(f"point {p['scenario']} {result.param}={p.get(result.param):g} stopped early: "
                   f"{p['stopped_early']['reason']} (its other figures cover only the run until then)")
    errors = [p for p in result.points if "error" in p and not p.get("interrupted")]
    for p in errors:
        out.append(f"point {p.get('scenario')} {result.param}={p.get(result.param)} failed: {p['error']}")
    cut = interrupted_line(result)
    if cut:
        out.append(cut)
    return out


_COLS = (("offered_rps", "offered (req/s)", "{:.3g}"), ("goodput_rps", "goodput (req/s)", "{:.3g}"),
         ("slo_attainment", "SLO att.", "{:.1%}"),
         ("tokens_per_joule", "tok/J", "{:.4g}"), ("usd_per_mtok", "$/Mtok out", "{:,.2f}"),
         ("ttft_p99_s", "TTFT p99 (s)", "{:.3g}"), ("tpot_p99_s", "TPOT p99 (s)", "{:.3g}"),
         ("link_utilization", "link util.", "{:.1%}"))


#: A rate sweep's columns of each point's arrivals (`arrival_summary`) and asked rate.
_RATE_COLS = (("rate_per_s", "asked (req/s)", "{:.3g}"), ("arrivals", "arrivals", "{:d}"),
              ("arrival_span_s", "over (s)", "{:.3g}"))


def points_table(result: SweepResult) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the sweep's points, sorted by scenario then parameter. A rate
    sweep's rows also say each point's asked rate and its arrivals (count and emulated
    span); "offered" is measured over the run's steady-state window."""
    cols = _COLS
    if result.kind == "rate":
        cols = tuple(c for c in _RATE_COLS if c[0] != result.param) + _COLS
    heads = ["scenario", result.param] + [c[1] for c in cols]
    rows = []
    for p in sorted(result.points, key=lambda p: (p["scenario"], p.get(result.param) or 0)):
        if "error" in p:
            rows.append([p["scenario"], f"{p.get(result.param)}", "error: " + p["error"][:60]] + [""] * (len(cols) - 1))
            continue
        rows.append([p["scenario"], f"{p.get(result.param):g}" + (" (stopped early)" if p.get("stopped_early") else "")] +
                    ["-" if p.get(k) is None else f.format(p[k]) for k, _, f in cols])
    return heads, rows


def write_sweep(result: SweepResult, out_dir: Any, *, plots: bool = True) -> dict:
    """Write sweep.json, sweep.csv, plots/*.png and report.md/.html into `out_dir`;
    returns {what: path}."""
    import csv
    from pathlib import Path

    from rack.measure import plots as P
    from rack.experiments import report
    from rack.measure.results import to_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(to_json(result.as_dict()))
    keys = sorted({k for p in result.points for k in p})
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for p in result.points:
            w.writerow(p)
    pngs: dict[str, str] = {}
    ok = [p for p in result.points if "error" not in p]
    if plots and ok:
        pd = out / "plots"
        # rates on a linear axis from 0; bandwidths and prompt lengths span decades
        x, logx = result.param, result.kind in ("bandwidth", "prompt")
        colours = P.palette(sorted({p["scenario"] for p in result.points}))
        xlabel = {"rate": "rate scale (x trace rate)", "bandwidth": "KV link bandwidth (GB/s)",
                  "prompt": "prompt tokens"}[result.kind]
        if x == "rate_per_s":
            xlabel = "asked rate (req/s)"
        vlines = None
        if result.kind == "bandwidth":
            vlines = {f"crossover vs {k}": v.get("x") for k, v in result.summary["crossover"].items()}
        elif result.kind == "rate":
            key = "max_rate_per_s" if x == "rate_per_s" else "max_rate_scale"
            vlines = {f"max {k}": v for k, v in result.summary[key].items()}
        for key, label, fname in (("goodput_rps", "goodput (req/s meeting the SLO)", "goodput"),
                                  ("tokens_per_joule", "output tokens per joule", "tokens_per_joule"),
                                  ("slo_attainment", "SLO attainment", "slo_attainment")):
            title = f"{label} vs {xlabel}"
            P.sweep_metric(ok, x, key, pd / f"{fname}_vs_{result.kind}.png", xlabel=xlabel, ylabel=label,
                           title=title, logx=logx, vlines=vlines if key != "tokens_per_joule" else None,
                           colours=colours)
            pngs[title] = f"plots/{fname}_vs_{result.kind}.png"
    heads, rows = points_table(result)
    md = report.sweep_markdown_report(result.as_dict(), report.md_table(heads, rows), pngs, summary_lines(result))
    md_path, html_path = report.write_report(out, md, f"rack sweep {result.kind}")
    return {"json": out / "sweep.json", "csv": out / "sweep.csv", "report_md": md_path,
            "report_html": html_path, **{k: out / v for k, v in pngs.items()}}


def default_workers() -> int:
    """2, or 1 on a one-core machine (the sweep's process pool size)."""
    return 1 if (os.cpu_count() or 1) < 2 else 2


__all__ = ["DEFAULT_ATTAINMENT_TARGET", "SweepResult", "Task", "Workload", "arrival_summary", "bandwidth_sweep",
           "default_workers", "find_crossover", "max_sustainable_rate", "point_summary",
           "prompt_sweep", "rate_summary", "search_lines", "rate_sweep", "run_task", "run_tasks", "with_link_bandwidth"]
