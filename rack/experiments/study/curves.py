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
    from rack.experiments.interactivity import DEFAULT_METRIC, METRICS, interactivity_sweep

    metric = section.metric if section.metric in METRICS else DEFAULT_METRIC
    return interactivity_sweep(scenarios, plan, section.concurrencies, per_slot=section.per_slot,
                               workers=cfg.workers, address=getattr(cfg, "address", None), progress=cfg.progress,
                               until_turned=section.until_turned, metric=metric, patience=section.patience)


def knob_variants(scenario, knobs: dict) -> list[tuple[str, object]]:
    """(label, scenario) for every value of every knob of `scenario` ({"pools.<pool>.
    <field>": [values]}: one variant per value, the other fields as shipped), named
    "<name>|<pool>.<field>=<value>". Raises ValueError for an unknown pool or a value
    the scenario refuses (its own message)."""
    out = []
    for path, values in knobs.items():
        _, pool, field = path.split(".")
        for v in values:
            data = scenario.model_dump()
            hit = [p for p in data["pools"] if p["name"] == pool]
            if not hit:
                raise ValueError(f"knob {path!r}: {scenario.name!r} has no pool {pool!r}")
            hit[0][field] = v
            label = f"{pool}.{field}={v:g}"
            data["name"] = f"{scenario.name}|{label}"
            out.append((label, type(scenario).model_validate(data)))
    return out


def _with_knobs(section, scs: dict) -> tuple[list, dict]:
    """(every scenario to run: the deployments and their knob variants, {deployment:
    [(label, variant name)]})."""
    runs, labels = list(scs.values()), {}
    for name, knobs in section.knobs.items():
        if name in scs:
            vs = knob_variants(scs[name], knobs)
            runs += [v for _, v in vs]
            labels[name] = [(lab, v.name) for lab, v in vs]
    return runs, labels


def _fold_knobs(curves: dict, labels: dict) -> dict:
    """The sweep with each knob variant's points moved under its deployment's
    "variants" ({label: points}, `rack.experiments.equal_interactivity.branches_of`)."""
    deps = curves["deployments"]
    for name, vs in labels.items():
        deps[name]["variants"] = {lab: deps.pop(vname)["points"] for lab, vname in vs if vname in deps}
    return curves


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
        runs, knobs = _with_knobs(section, scs)
        log(f"{section.key}: {len(scs)} deployments ({len(runs) - len(scs)} knob variants) x concurrency "
            f"{section.concurrencies}{' until each curve turns' if section.until_turned else ''} on {label}")
        out[label] = _fold_knobs(_sweep(cfg, runs, _plan(w, section), section), knobs)
    return {"workloads": out, "pairs": [list(p) for p in section.pairs], "metric": section.metric,
            "tolerance": section.tolerance, "at": section.at, "reading": section.reading}


def _plan(w, section):
    """A workload's load plan; vLLM's random dataset gets enough prompts for the
    ladder's top rung (per_slot x the highest concurrency) unless it names its own."""
    if w.random is None or "num_prompts" in w.random:
        return w.plan()
    from workloads.load import LoadControls, LoadPlan

    return LoadPlan("random", **w.random,
                    controls=LoadControls(num_prompts=section.per_slot * max(section.concurrencies), seed=0))


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
    from rack.experiments.interactivity import slo_floor

    terms = TM.resolve(section.terms)
    w = section.workloads[0]
    base = _scenarios([n for p in section.pairs for n in p], w.router_policy)
    at_capacity = section.reading == "at_capacity"
    rerun = [t for t in terms if at_capacity or not TM.rerun_free(t["key"])]
    variants = list(base.values())
    for t in rerun:
        for end in ("low", "high"):
            variants += [TM.apply(s, t["key"], t[end], _variant_name(n, t["key"], t[end])) for n, s in base.items()]
    common = {"workload": w.name(), "terms": terms, "pairs": [list(p) for p in section.pairs],
              "metric": section.metric, "tolerance": section.tolerance, "at": section.at,
              "reading": section.reading or "at_least_interactivity",
              "floors": {n: slo_floor(s) for n, s in base.items()}}
    if at_capacity:
        return {**common, **_tornado_at_capacity(section, cfg, log, terms, base, variants)}
    log(f"{section.key}: {len(rerun)} terms x 2 ends x {len(base)} deployments x concurrency "
        f"{section.concurrencies} on {w.name()} ({len(terms) - len(rerun)} energy terms rescaled, not rerun)")
    curves = _sweep(cfg, variants, _plan(w, section), section)
    baseline = {n: curves["deployments"][n]["points"] for n in base}
    runs = {t["key"]: {end: _split(curves, base, f"{t['key']}={t[end]:g}") for end in ("low", "high")}
            for t in rerun}
    for t in terms:
        if t not in rerun:
            runs[t["key"]] = {end: _rescaled(baseline, t["key"], t[end]) for end in ("low", "high")}
    return {**common, "baseline": baseline, "runs": runs, "rerun_free": [t["key"] for t in terms if t not in rerun],
            "errors": curves["errors"], "concurrencies": curves["concurrencies"], "per_slot": section.per_slot,
            "stops": {n: d.get("stop") for n, d in curves["deployments"].items()}}


def _rescaled(baseline: dict, key: str, value: float) -> dict:
    """{deployment: points} of the as-shipped points with energy boundary term `key` =
    `value` W per device (`rack.experiments.equal_interactivity.rescale_energy`)."""
    from rack.experiments.equal_interactivity import rescale_energy

    device, _, field = key.partition(".")
    return {n: rescale_energy(pts, {device: {field: float(value)}}) for n, pts in baseline.items()}


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
    from rack.experiments.interactivity import slo_floor

    return {"term": term, "values": xs, "io_ratios": [float(y) for y in section.parameter.values],
            "output_tokens": out_tokens, "cells": cells, "errors": errors, "pairs": [list(p) for p in section.pairs],
            "metric": section.metric, "tolerance": section.tolerance, "at": section.at,
            "reading": section.reading or "at_least_interactivity",
            "floors": {n: slo_floor(s) for n, s in base.items()}}


__all__ = ["breakeven_map", "interactivity", "knob_variants", "tornado"]
