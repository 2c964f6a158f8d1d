"""The study's experiments on interactivity curves (`rack.experiments.interactivity`):
closed-loop concurrency ladders per workload, the same ladders with one uncertain term
at each end of its range (the tornado), and over one term x the input/output ratio of
a synthetic workload (the break-even map). Each returns plain, JSON-ready data; the
readings (ratios at equal interactivity) are taken later, from the saved points
(`rack.experiments.study.breakeven`).
"""

from __future__ import annotations

from typing import Callable, Optional

from rack.experiments.study import terms as TM

Log = Callable[[str], None]


def _sweep(cfg, scenarios, plan, section) -> dict:
    from rack.experiments.interactivity import interactivity_sweep

    return interactivity_sweep(scenarios, plan, section.concurrencies, per_slot=section.per_slot,
                               workers=cfg.workers, address=getattr(cfg, "address", None), progress=cfg.progress)


def _scenarios(names, router_policy: Optional[str] = None) -> dict:
    from rack.wiring.load import load_scenario

    out = {}
    for n in dict.fromkeys(names):
        s = load_scenario(n)
        out[n] = s.with_router(policy=router_policy) if router_policy else s
    return out


def _labels(section) -> list[str]:
    """Unique labels of a section's workloads (a repeated name gets its index)."""
    names = [w.name() for w in section.workloads]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


def interactivity(section, cfg, log: Log) -> dict:
    """Every deployment's curve on every workload: {"workloads": {label: the sweep's
    curves}, "pairs", "metric", "tolerance"}."""
    out = {}
    for label, w in zip(_labels(section), section.workloads):
        scs = _scenarios(section.deployments, w.router_policy)
        log(f"{section.key}: {len(scs)} deployments x concurrency {section.concurrencies} on {label}")
        out[label] = _sweep(cfg, list(scs.values()), w.plan(), section)
    return {"workloads": out, "pairs": [list(p) for p in section.pairs], "metric": section.metric,
            "tolerance": section.tolerance, "at": section.at}


def _variant_name(name: str, key: str, value: float) -> str:
    return f"{name}|{key}={value:g}"


def _split(curves: dict, names, suffix: str) -> dict:
    """{deployment: points} of the variants named `<name>|<suffix>` in a sweep."""
    return {n: curves["deployments"][f"{n}|{suffix}"]["points"] for n in names
            if f"{n}|{suffix}" in curves["deployments"]}


def tornado(section, cfg, log: Log) -> dict:
    """The pairs' deployments as shipped (the baseline) and with each uncertain term at
    the low and the high end of its range, on one workload: {"workload", "terms": [term
    dicts], "baseline": {name: points}, "runs": {key: {"low": {name: points}, "high":
    ...}}, "errors", "pairs", "metric", "tolerance", "at"}. One sweep runs them all
    (the variants in parallel)."""
    terms = TM.resolve(section.terms)
    w = section.workloads[0]
    base = _scenarios([n for p in section.pairs for n in p], w.router_policy)
    variants = list(base.values())
    for t in terms:
        for end in ("low", "high"):
            variants += [TM.apply(s, t["key"], t[end], _variant_name(n, t["key"], t[end])) for n, s in base.items()]
    common = {"workload": w.name(), "terms": terms, "pairs": [list(p) for p in section.pairs],
              "metric": section.metric, "tolerance": section.tolerance, "at": section.at,
              "reading": section.reading or "at_least_interactivity"}
    if section.reading == "at_capacity":
        return {**common, **_tornado_at_capacity(section, cfg, log, terms, base, variants)}
    log(f"{section.key}: {len(terms)} terms x 2 ends x {len(base)} deployments x concurrency "
        f"{section.concurrencies} on {w.name()}")
    curves = _sweep(cfg, variants, w.plan(), section)
    runs = {t["key"]: {end: _split(curves, base, f"{t['key']}={t[end]:g}") for end in ("low", "high")}
            for t in terms}
    return {**common, "baseline": {n: curves["deployments"][n]["points"] for n in base}, "runs": runs,
            "errors": curves["errors"], "concurrencies": curves["concurrencies"], "per_slot": section.per_slot}


def _tornado_at_capacity(section, cfg, log: Log, terms, base: dict, variants: list) -> dict:
    """The tornado's variants through one capacity sweep (`experiments.capacity`):
    "baseline" and "runs" hold each deployment's figures at its capacity
    (`analysis.at_capacity`), "capacity" the sweep."""
    from rack.experiments.study import experiments as E
    from rack.experiments.study.analysis import at_capacity

    w = section.workloads[0]
    wl, reqs = E._trace_workload(w.trace, tuple(w.window) if w.window else (0.0, 1e9))
    rates = section.rates.as_tuple()
    log(f"{section.key}: {len(terms)} terms x 2 ends x {len(base)} deployments x {len(rates)} rates on {w.name()}")
    cap = E.capacity(variants, wl, rates, cfg, E._base_rate(reqs))
    at = {v.name: at_capacity(cap, v.name) for v in variants}
    runs = {t["key"]: {end: {n: at[_variant_name(n, t["key"], t[end])] for n in base} for end in ("low", "high")}
            for t in terms}
    return {"baseline": {n: at[n] for n in base}, "runs": runs, "capacity": cap,
            "errors": [p for p in cap["points"] if "error" in p], "rates": list(rates), "requests": len(reqs)}


def _prefill_rate(scenario, prompt_tokens: int) -> Optional[float]:
    """The wafer's per-request prefill rate (tokens/s) of `scenario` at `prompt_tokens`
    (`devices.uncertainty.wafer_prefill_rate`), or None where it is not available."""
    try:
        from devices.uncertainty import wafer_prefill_rate
    except ImportError:
        return None
    try:
        return float(wafer_prefill_rate(scenario, int(prompt_tokens)))
    except (ValueError, KeyError):
        return None


def breakeven_map(section, cfg, log: Log) -> dict:
    """The pairs' deployments over the values of one uncertain term (x) and the
    input/output ratios of `parameter.values` (y; vLLM's random dataset with
    `options.output_tokens` out, default 256, and ratio x that in): {"term", "output_tokens",
    "cells": [{"x", "io_ratio", "prompt_tokens", "prefill_rate" (tokens/s per request on
    the pair's second deployment, None if unknown), "points": {name: points}}], ...}."""
    from workloads.load import LoadControls, LoadPlan

    term = TM.resolve(section.terms)[0]
    xs = TM.values(term)
    out_tokens = int(section.options.get("output_tokens", 256))
    names = [n for p in section.pairs for n in p]
    base = _scenarios(names)
    ref = section.pairs[0][1]
    cells, errors = [], []
    for y in section.parameter.values:
        prompt = max(1, int(round(float(y) * out_tokens)))
        plan = LoadPlan("random", input_len=prompt, output_len=out_tokens,
                        controls=LoadControls(num_prompts=section.per_slot * max(section.concurrencies), seed=0))
        variants = {(x, n): TM.apply(s, term["key"], x, _variant_name(n, term["key"], x))
                    for x in xs for n, s in base.items()}
        log(f"{section.key}: io ratio {y:g} ({prompt} in, {out_tokens} out): {len(xs)} values of {term['key']} x "
            f"{len(base)} deployments x concurrency {section.concurrencies}")
        curves = _sweep(cfg, list(variants.values()), plan, section)
        errors += curves["errors"]
        for x in xs:
            cells.append({"x": x, "io_ratio": float(y), "prompt_tokens": prompt, "output_tokens": out_tokens,
                          "prefill_rate": _prefill_rate(variants[(x, ref)], prompt),
                          "points": _split(curves, base, f"{term['key']}={x:g}")})
    return {"term": term, "values": xs, "io_ratios": [float(y) for y in section.parameter.values],
            "output_tokens": out_tokens, "cells": cells, "errors": errors, "pairs": [list(p) for p in section.pairs],
            "metric": section.metric, "tolerance": section.tolerance, "at": section.at}


__all__ = ["breakeven_map", "interactivity", "tornado"]
