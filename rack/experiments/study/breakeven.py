"""Readings of the interactivity, tornado and break-even sections: pure functions of
their saved points (nothing here runs).

The headline figure of a pair (a, b) is `headline`: metric(a) / metric(b) read at
equal interactivity with the "at_least" reading (`rack.experiments.interactivity`): at x =
the tokens/s per user of a's best operating point (its highest `metric`; `at =
"a_best"`, or a given x), b's best operating point giving every user at least x (1 -
tolerance). That is the vendors' "comparable interactivity point" read where the split
rack runs best; nothing is extrapolated past a curve's ends.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rack.experiments.study import terms as TM

#: The vendors' "up to 5x tokens per watt" (AMD newsroom 2026-07-23, footnote MI400-021).
CLAIM = 5.0


def headline(pa: Sequence[dict], pb: Sequence[dict], *, metric: str, tolerance: float,
             at="a_best") -> dict:
    """{"ratio" (None where it cannot be read), "x" (tokens/s per user read at),
    "a_value", "b_value" (the two values), "range": [min, max] of the at_least ratio over every measured
    x both curves reach (None if none)} of curves `pa` over `pb`."""
    from rack.experiments.interactivity import X_KEY, ratio_at_equal_interactivity

    curves = {"a": list(pa), "b": list(pb)}
    x = at
    if at == "a_best":
        best = [p for p in pa if p.get(metric) is not None and p.get(X_KEY) is not None]
        if not best:
            return {"ratio": None, "x": None, "a_value": None, "b_value": None, "range": None}
        x = max(best, key=lambda p: p[metric])[X_KEY]
    r = ratio_at_equal_interactivity(curves, "a", "b", metric=metric, reading="at_least", tolerance=tolerance,
                                     at=[float(x)])
    full = ratio_at_equal_interactivity(curves, "a", "b", metric=metric, reading="at_least", tolerance=tolerance)
    rd = r["readings"][0]
    rng = [full["ratio_min"], full["ratio_max"]] if full["ratio_min"] is not None else None
    return {"ratio": rd["ratio"], "x": float(x), "a_value": rd["a"], "b_value": rd["b"], "range": rng}


def equal_headline(pa, pb, *, metric: str, at="a_knee", floor_a: Optional[float] = None,
                   floor_b: Optional[float] = None, names: tuple[str, str] = ("a", "b")) -> dict:
    """The pair's headline read at exactly equal tokens/s per user on both curves
    (`rack.experiments.equal_interactivity.pair_readings`): pa, pb each a point list or
    a curves entry with knob "variants"; at: "a_knee" (at a's knee), "up_to" (the
    highest ratio over the overlap) or tokens/s per user. Returns {"ratio", "x",
    "a_value", "b_value", "interval" (90 %, or None), "range": [min, max] of the ratio
    over the overlap (None if none), "why" (when there is no ratio), "readings": the
    pair's readings}."""
    from rack.experiments import equal_interactivity as EI

    rd = EI.pair_readings(EI.branches_of(pa), EI.branches_of(pb), metric, floor_a=floor_a, floor_b=floor_b,
                          names=names)
    if at == "a_knee":
        pick = next(r for r in rd["named"] if r["name"] == f"{names[0]}'s knee")
    elif at == "up_to":
        pick = rd["up_to"] or {"x": None, "ratio": None, "why": "the curves share no tokens/s per user"}
    else:
        pick = EI.ratio_at(EI.branches_of(pa), EI.branches_of(pb), float(at), metric)
    why = pick.get("why")
    if pick.get("ratio") is None and not why:
        short = pick.get("short")
        why = ("the curves share no tokens/s per user" if rd["curve"]["overlap"] is None else
               f"{names[0] if short == 'a' else names[1] if short == 'b' else 'neither curve'} does not reach "
               f"{pick['x']:,.0f} tokens/s per user" if pick.get("x") is not None else "no reading")
    vals = [r["ratio"] for r in rd["curve"]["readings"] if r["ratio"] is not None]
    return {"ratio": pick.get("ratio"), "x": pick.get("x"), "a_value": pick.get("a"), "b_value": pick.get("b"),
            "interval": pick.get("interval"), "range": [min(vals), max(vals)] if vals else None,
            "why": why if pick.get("ratio") is None else "", "readings": rd}


def _hl(section: dict, points: dict, a: str, b: str) -> dict:
    """The pair's headline in a section's runs: at equal interactivity (`headline`), or
    for a tornado read at capacity the ratio of the two deployments' figures at their
    own capacities (`analysis.pair_metric`; "verdict" and "why" kept)."""
    if a not in points or b not in points:
        return {"ratio": None, "x": None, "a_value": None, "b_value": None, "range": None}
    if section.get("reading") == "at_capacity":
        from rack.experiments.study.analysis import pair_metric

        m = pair_metric(points[a], points[b], section["metric"])
        return {"ratio": m["ratio"], "x": None, "a_value": points[a].get(section["metric"]),
                "b_value": points[b].get(section["metric"]), "range": None, "verdict": m["verdict"], "why": m["why"],
                "interval": m.get("interval")}
    if section.get("reading") == "equal_interactivity":
        floors = section.get("floors") or {}
        fa = floors.get(a, _floor(points[a]))
        fb = floors.get(b, _floor(points[b]))
        return equal_headline(points[a], points[b], metric=section["metric"], at=section.get("at", "a_knee"),
                              floor_a=fa, floor_b=fb, names=(a, b))
    return headline(points[a], points[b], metric=section["metric"], tolerance=section["tolerance"],
                    at=section.get("at", "a_best"))


def _floor(entry) -> Optional[float]:
    """The TPOT target's tokens/s per user a curves entry carries ("slo_floor"), or None."""
    return entry.get("slo_floor") if isinstance(entry, dict) else None


def interactivity_rows(res: dict) -> list[dict]:
    """Per workload and pair of an interactivity section: {"workload", "a", "b",
    **headline, "equal": the "equal" reading's [min, max] over the overlap or None}."""
    from rack.experiments.interactivity import ratio_at_equal_interactivity

    out = []
    for label, curves in res["workloads"].items():
        if res.get("reading") == "equal_interactivity":      # the entries: knob variants and SLO floors
            pts = dict(curves["deployments"])
            for a, b in res["pairs"]:
                if a in pts and b in pts:
                    out.append({"workload": label, "a": a, "b": b, **_hl(res, pts, a, b), "equal": None})
            continue
        pts = {n: d["points"] for n, d in curves["deployments"].items()}
        for a, b in res["pairs"]:
            h = _hl(res, pts, a, b)
            eq = None
            if a in pts and b in pts:
                e = ratio_at_equal_interactivity({"a": pts[a], "b": pts[b]}, "a", "b", metric=res["metric"])
                eq = [e["ratio_min"], e["ratio_max"]] if e["ratio_min"] is not None else None
            out.append({"workload": label, "a": a, "b": b, **h, "equal": eq})
    return out


def tornado_rows(res: dict, a: str, b: str) -> dict:
    """The pair's headline as shipped ("baseline") and with each term at each end:
    {"baseline": headline, "terms": [{term..., "low_ratio", "high_ratio", "low_interval",
    "high_interval" (90 %, None when the reading has none), "span"
    (|ln(high/low)|, None if either is missing), "flips_at": [values where the ratio
    crosses 1 between measured points], "reaches": [values where it crosses CLAIM]}]
    sorted by span (largest first), "range": [min, max] over every run (None if
    none), "range_ends": [{"ratio", "interval"}] of those two, "most_sensitive": the
    first term with a span, or None}."""
    base = _hl(res, res["baseline"], a, b)
    rows = []
    for t in res["terms"]:
        run = res["runs"].get(t["key"], {})
        hl_lo, hl_hi = _hl(res, run.get("low", {}), a, b), _hl(res, run.get("high", {}), a, b)
        lo, hi = hl_lo["ratio"], hl_hi["ratio"]
        span = abs(math.log(hi / lo)) if lo and hi else None
        intervals = {"low_interval": hl_lo.get("interval"), "high_interval": hl_hi.get("interval")}
        xs, ys = [t["low"], t["high"]], [lo, hi]
        if t.get("nominal") is not None and base["ratio"] is not None and t["low"] < t["nominal"] < t["high"]:
            xs.insert(1, t["nominal"])
            ys.insert(1, base["ratio"])
        # at capacity a deployment may sustain no rate tried: no ratio, but a verdict
        notes = {end: (f"{h['verdict']}: {h['why']}" if h.get("verdict") else h["why"])
                 for end, h in (("low", hl_lo), ("high", hl_hi)) if h["ratio"] is None and h.get("why")}
        rows.append({**t, "low_ratio": lo, "high_ratio": hi, "span": span, "notes": notes, **intervals,
                     "flips_at": TM.crossing(xs, ys, 1.0, t.get("scale", "linear")),
                     "reaches": TM.crossing(xs, ys, CLAIM, t.get("scale", "linear"))})
    rows.sort(key=lambda r: -(r["span"] or -1))
    every = [(base["ratio"], base.get("interval"))] + [(r[f"{k}_ratio"], r[f"{k}_interval"]) for r in rows
                                                        for k in ("low", "high")]
    every = [e for e in every if e[0]]
    ends = ([{"ratio": e[0], "interval": e[1]} for e in (min(every), max(every))] if every else None)
    return {"a": a, "b": b, "baseline": base, "terms": rows,
            "range": [ends[0]["ratio"], ends[1]["ratio"]] if ends else None, "range_ends": ends,
            "most_sensitive": next((r for r in rows if r["span"] is not None), None)}


def map_grid(res: dict, a: str, b: str) -> dict:
    """The break-even map of pair (a, b): {"x": term values, "y": io ratios,
    "ratio": [[ratio per x] per y] (None where it cannot be read), "rate": [[prefill
    rate tokens/s or None]], "cells": [{"x", "io_ratio", "prompt_tokens", "prefill_rate",
    "ratio", "read_at"}]}."""
    cells = []
    for c in res["cells"]:
        h = _hl(res, c["points"], a, b)
        cells.append({"x": c["x"], "io_ratio": c["io_ratio"], "prompt_tokens": c["prompt_tokens"],
                      "prefill_rate": c["prefill_rate"], "ratio": h["ratio"], "interval": h.get("interval"),
                      "read_at": h["x"]})
    xs, ys = list(res["values"]), list(res["io_ratios"])
    at = {(c["x"], c["io_ratio"]): c for c in cells}
    return {"x": xs, "y": ys, "cells": cells,
            "ratio": [[at.get((x, y), {}).get("ratio") for x in xs] for y in ys],
            "interval": [[at.get((x, y), {}).get("interval") for x in xs] for y in ys],
            "rate": [[at.get((x, y), {}).get("prefill_rate") for x in xs] for y in ys]}


def settle(results: dict, sections: Sequence[dict]) -> list[dict]:
    """The measurements that would narrow the verdict most: every tornado term, by how
    far it moves the first pair's ratio (span, largest first): {"term", "low_ratio",
    "high_ratio", "span", "pair", "flips"}."""
    out = []
    for s in sections:
        res = results.get(s["key"])
        if s["kind"] != "tornado" or res is None or not res["pairs"] or res.get("reading") == "at_capacity":
            continue
        a, b = res["pairs"][0]
        for t in tornado_rows(res, a, b)["terms"]:
            out.append({"term": t, "pair": f"{a} / {b}", "low_ratio": t["low_ratio"], "high_ratio": t["high_ratio"],
                        "low_interval": t["low_interval"], "high_interval": t["high_interval"],
                        "span": t["span"], "flips": t["flips_at"]})
    out.sort(key=lambda r: -(r["span"] or -1))
    return out


def tornado_for(results: dict, sections: Sequence[dict], a: str, b: str, workload: Optional[str] = None
                ) -> Optional[dict]:
    """The rows of the first tornado section at equal interactivity of pair (a, b) run
    on `workload` (any workload when None), or None."""
    for s in sections:
        res = results.get(s["key"])
        if (s["kind"] == "tornado" and res is not None and res.get("reading") != "at_capacity"
                and [a, b] in [list(p) for p in res["pairs"]]
                and (workload is None or res["workload"] == workload)):
            return {"section": s["key"], "workload": res["workload"], **tornado_rows(res, a, b)}
    return None


__all__ = ["CLAIM", "equal_headline", "headline", "interactivity_rows", "map_grid", "settle", "tornado_for", "tornado_rows"]
