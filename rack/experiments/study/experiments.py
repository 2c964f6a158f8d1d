"""The study's experiments: each runs deployments through the project's own APIs
(`rack.experiments.compare.run_compare`, `rack.experiments.sweep.rate_sweep` / `bandwidth_sweep`) and returns
plain, JSON-ready data (sweep points as `rack.experiments.sweep.point_summary` gives them).

Capacity is DistServe's goodput: the highest rate tried at which a deployment meets its
SLOs for at least `StudyConfig.target` of the requests (`rack.experiments.sweep.max_sustainable_rate`,
a measured point, never interpolated). Tokens per joule and dollars per million output
tokens are read at that rate ("at capacity"), where an idle rack's power no longer
decides them; a deployment that sustains no rate tried has no figure at capacity.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from rack.wiring.scenario import Scenario

from rack.wiring.load import load_scenario
from rack.experiments.study.config import A100, A100_PD, GPU72, GPU_ONLY, GPU_PD, SPLIT, SPLIT72, WAFER, StudyConfig

Log = Callable[[str], None]


# ---------------------------------------------------------------------------- scenarios
def variant(scenario: Scenario, name: str, *, tpot_ms: Optional[float] = None,
            instances: Optional[dict] = None) -> Scenario:
    """`scenario` renamed `name`, with its TPOT target (ms) and pool instance counts
    ({pool: n}) replaced where given; validated again (Scenario rules)."""
    data = scenario.model_dump()
    data["name"] = name
    if tpot_ms is not None:
        data["slo"]["tpot_ms"] = float(tpot_ms)
    for pool in data["pools"]:
        if instances and pool["name"] in instances:
            pool["instances"] = int(instances[pool["name"]])
    return Scenario.model_validate(data)


def _tpot_name(name: str, tpot_ms: float) -> str:
    return f"{name}@tpot{tpot_ms:g}ms"


# ---------------------------------------------------------------------------- capacity
def capacity(scenarios: Sequence[Scenario], workload, rates: Sequence[float], cfg: StudyConfig,
             base_rate: float) -> dict:
    """Each deployment's capacity on `workload` over the ladder `rates` (multiples of
    `base_rate` req/s): `rack.experiments.capacity.capacity_sweep` (bisection with early
    stopping; the same rung as walking the whole ladder when attainment falls with
    rate, else the ladder is walked), plus each deployment's point at its maximum
    sustained rate.

    Returns {"workload", "base_rate", "points" (the rungs run), "summary" (rate_sweep's,
    with "search": how each capacity was found), "at_max": {name: point or None}}; a
    point carries `rate_per_s`.
    """
    from rack.experiments.capacity import capacity_sweep

    res = capacity_sweep(list(scenarios), workload, list(rates), target=cfg.target, base_rate=base_rate,
                         workers=cfg.workers, progress=cfg.progress)
    at_max = {}
    for s in scenarios:
        m = res.summary["max_rate_scale"][s.name]
        at_max[s.name] = next((p for p in res.points if p["scenario"] == s.name and "error" not in p
                               and m is not None and p["rate_scale"] == m), None)
    return {"workload": res.workload, "base_rate": base_rate, "points": res.points,
            "summary": res.summary, "at_max": at_max}


def _trace_workload(trace: str, window: tuple):
    """(Workload recipe, requests) of a trace window; the requests give the base rate."""
    from rack.experiments.sweep import Workload

    wl = Workload(kind="trace", trace=trace, window=tuple(window))
    return wl, wl.requests()


def _base_rate(requests) -> float:
    from workloads import trace_stats

    rate = trace_stats(requests).rate_mean_per_s
    if not rate:
        raise ValueError("the study needs a workload whose arrivals span some time")
    return rate


def provenance(cfg: StudyConfig) -> dict:
    """SHA-256 of every trace and workload file the study reads ({name: {path, sha256}})."""
    from rack.run.runner import trace_info
    from workloads import resolve_trace
    from workloads.workload_spec import resolve_workload

    out = {}
    files = {n: resolve_trace(n) for n in (cfg.excerpt, cfg.trace, cfg.llama_trace)}
    files[cfg.agentic_workload] = resolve_workload(cfg.agentic_workload)
    for name, path in files.items():
        info = trace_info(path)
        out[name] = {"path": info["path"], "sha256": info["sha256"]}
    return out


# ---------------------------------------------------------------------------- experiments
def _entry_summary(entry) -> dict:
    """The figures the study keeps of one `run_compare` entry."""
    from rack.experiments.sweep import point_summary

    r = entry.output.results
    prov = entry.provisioned
    pc = r.get("prefix_cache") or {}
    return {**point_summary(r), "scenario": entry.name,
            "devices": " + ".join(f"{v['devices']} {v['device']}" for v in prov["pools"].values()),
            "peak_w": prov["peak_w"], "usd_per_hour": prov["usd_per_hour"],
            "ttft_p90_s": r["latency"]["ttft_s"]["p90"], "tpot_p90_s": r["latency"]["tpot_s"]["p90"],
            "busy": {p: u["busy_fraction"] for p, u in r["utilization"].items()},
            "prefix_hit_ratio": pc.get("hit_ratio"), "ideal_prefix_hit_ratio": pc.get("ideal_hit_ratio"),
            "usd_per_mtok_total": r["cost"]["usd_per_mtok_total"]}


def _compare(names: Sequence[str], requests, info: dict) -> dict:
    from rack.experiments.compare import run_compare, vendor_claim

    res = run_compare(list(names), requests, trace_info=info)
    return {"entries": [_entry_summary(e) for e in res.entries], "vendor_claim": vendor_claim(res)}


def shipped(cfg: StudyConfig, log: Log) -> dict:
    """The shipped deployments on the shipped excerpt, as `rack compare` runs them."""
    from rack.run.runner import trace_info
    from workloads import load_requests

    reqs = load_requests(cfg.excerpt, window=cfg.excerpt_window)
    log(f"shipped: {len(cfg.shipped)} deployments on {len(reqs)} requests of {cfg.excerpt}")
    return {"trace": cfg.excerpt, "requests": len(reqs),
            **_compare(cfg.shipped, reqs, trace_info(reqs.path, reqs.summary(), window=cfg.excerpt_window))}


def load(cfg: StudyConfig, log: Log) -> dict:
    """Rate sweep of the main deployments on a window of the Mooncake trace."""
    wl, reqs = _trace_workload(cfg.trace, cfg.window)
    log(f"load: {len(cfg.main)} deployments x {len(cfg.rate_scales)} rates, {len(reqs)} requests each")
    return {"requests": len(reqs),
            **capacity([load_scenario(n) for n in cfg.main], wl, cfg.rate_scales, cfg, _base_rate(reqs))}


def _length_axis(cfg: StudyConfig, log: Log, param: str, values: Sequence[int], fixed: dict) -> dict:
    from rack.experiments.sweep import Workload

    scs = [load_scenario(n) for n in cfg.main]
    out = {}
    for v in values:
        lengths = {**fixed, param: int(v)}
        log(f"{param} {v}: {len(scs)} deployments x {len(cfg.synthetic_rates)} rates")
        wl = Workload(kind="synthetic", rate_per_s=1.0, n=cfg.synthetic_n, duration_s=cfg.synthetic_duration_s,
                      seed=0, **lengths)
        out[str(int(v))] = capacity(scs, wl, cfg.synthetic_rates, cfg, base_rate=1.0)
    return {"param": param, "fixed": fixed, "values": out}


def prompt_length(cfg: StudyConfig, log: Log) -> dict:
    """Capacity and cost at capacity against prompt length (synthetic Poisson traffic)."""
    return _length_axis(cfg, log, "prompt_tokens", cfg.prompt_lengths,
                        {"output_tokens": cfg.prompt_output_tokens})


def output_length(cfg: StudyConfig, log: Log) -> dict:
    """Capacity and cost at capacity against output length (synthetic Poisson traffic)."""
    return _length_axis(cfg, log, "output_tokens", cfg.output_lengths,
                        {"prompt_tokens": cfg.output_prompt_tokens})


def bandwidth(cfg: StudyConfig, log: Log, load_result: dict, cases: Optional[Sequence[tuple]] = None) -> dict:
    """KV link bandwidth: the 16-GPU split at the trace's rate against the colocated
    racks of its size, and the 72-GPU split at its own capacity (from `load`) against
    the full Helios rack alone and the wafer alone; or `cases`, [(split, (colocated,
    ...), rate scale)] (a study spec's). `load_result` gives the trace's base rate."""
    from rack.experiments.sweep import Workload, bandwidth_sweep, summary_lines
    from workloads.load import LoadPlan

    if cases is None:
        cap72 = load_result["summary"]["max_rate_scale"].get(SPLIT72)
        cases = [(SPLIT, (GPU_ONLY, WAFER), 1.0), (SPLIT72, (GPU72, WAFER), cap72 or 1.0)]
    out = []
    for split, colocated, scale in cases:
        log(f"bandwidth: {split} at {scale:g}x the trace rate, {len(cfg.bandwidths)} bandwidths")
        wl = Workload(kind="plan", plan=LoadPlan("trace", cfg.trace, window=tuple(cfg.window), rate_scale=scale))
        res = bandwidth_sweep(load_scenario(split), [load_scenario(c) for c in colocated], wl, cfg.bandwidths,
                              workers=cfg.workers, progress=cfg.progress)
        out.append({"split": split, "colocated": list(colocated), "rate_scale": scale,
                    "base_rate": load_result["base_rate"], "points": res.points, "summary": res.summary,
                    "lines": summary_lines(res)})
    return {"cases": out}


def agentic(cfg: StudyConfig, log: Log) -> dict:
    """Long-context agentic sessions (a shipped workload file): every deployment at the
    file's own rate (prefix-cache figures), then capacity against rate scale."""
    from rack.run.runner import trace_info
    from rack.experiments.sweep import Workload
    from workloads import trace_stats
    from workloads.load import LoadControls, LoadPlan

    plan = LoadPlan("workload", cfg.agentic_workload, controls=LoadControls(duration_s=cfg.agentic_duration_s))
    reqs = plan.requests()
    st = trace_stats(reqs)
    log(f"agentic: {len(reqs)} requests of {cfg.agentic_workload}; {len(cfg.main)} deployments")
    at_rate = _compare(cfg.main, reqs, trace_info(reqs.path, reqs.summary(), **plan.describe()))
    cap = capacity([load_scenario(n) for n in cfg.main], Workload(kind="plan", plan=plan),
                   cfg.agentic_rate_scales, cfg, _base_rate(reqs))
    return {"requests": len(reqs), "stats": st.to_dict(), "at_file_rate": at_rate, **cap}


def tpot_slo(cfg: StudyConfig, log: Log) -> dict:
    """Capacity of the wafer alone and the split racks under TPOT targets tighter than
    the scenarios' (the per-user speeds a wafer is bought for)."""
    wl, reqs = _trace_workload(cfg.trace, cfg.window)
    base = _base_rate(reqs)
    out = {}
    for t in cfg.tpot_slos_ms:
        log(f"TPOT SLO {t:g} ms: {len(cfg.tpot_scenarios)} deployments x {len(cfg.tpot_rate_scales)} rates")
        scs = [variant(load_scenario(n), _tpot_name(n, t), tpot_ms=t) for n in cfg.tpot_scenarios]
        res = capacity(scs, wl, cfg.tpot_rate_scales, cfg, base)
        out[f"{t:g}"] = {**res, "names": {n: _tpot_name(n, t) for n in cfg.tpot_scenarios}}
    return {"values": out, "scenarios": list(cfg.tpot_scenarios),
            "shipped_tpot_ms": load_scenario(cfg.tpot_scenarios[0]).slo.tpot_ms}


def _pd_case(cfg: StudyConfig, log: Log, colocated: str, pd: str, ratios: Sequence[tuple],
             tpots: Sequence[float], trace: str, window: tuple, rates: Sequence[float]) -> dict:
    wl, reqs = _trace_workload(trace, window)
    base = _base_rate(reqs)
    col, dis = load_scenario(colocated), load_scenario(pd)
    out = {}
    for t in tpots:
        scs = [variant(col, _tpot_name(colocated, t), tpot_ms=t)]
        for p, d in ratios:
            scs.append(variant(dis, _tpot_name(f"{pd}-{p}p{d}d", t), tpot_ms=t,
                               instances={"prefill": p, "decode": d}))
        log(f"GPU disaggregation, {colocated} vs {pd} at TPOT {t:g} ms: {len(scs)} deployments x {len(rates)} rates")
        out[f"{t:g}"] = {**capacity(scs, wl, rates, cfg, base), "colocated": scs[0].name,
                         "disaggregated": [s.name for s in scs[1:]]}
    devices = {s.name: sum(p.instances * p.devices_per_instance for p in s.pools) for s in (col, dis)}
    return {"colocated": colocated, "pd": pd, "trace": trace, "window": list(window), "requests": len(reqs),
            "ratios": [list(r) for r in ratios], "gpus": devices, "values": out}


def gpu_disaggregation(cfg: StudyConfig, log: Log) -> dict:
    """GPUs alone: prefill and decode pools against colocated serving on the same GPUs
    (Kimi-K2 on 32 MI455X, Mooncake; Llama-2-70B on 16 A100, Azure conversations)."""
    return {"cases": [
        _pd_case(cfg, log, GPU_ONLY, GPU_PD, cfg.pd_ratios, cfg.pd_tpot_ms, cfg.trace, cfg.window,
                 cfg.pd_rate_scales),
        _pd_case(cfg, log, A100, A100_PD, cfg.llama_pd_ratios, cfg.llama_tpot_ms, cfg.llama_trace,
                 cfg.llama_window, cfg.llama_rate_scales),
    ]}


__all__ = ["agentic", "bandwidth", "capacity", "gpu_disaggregation", "load", "output_length",
           "prompt_length", "provenance", "shipped", "tpot_slo", "variant"]
