"""What the study's runs say: deployments compared pairwise at capacity, at equal
offered load, and the ratios behind the vendor claim and the GPU disaggregation claim.

Pure functions of the experiments' data (`rack.experiments.study.experiments`); nothing here runs.
Verdicts: "wins" / "loses" when the ratio is beyond `rack.experiments.sweep.TIE_TOLERANCE` of 1,
"tie" within it, "undetermined" when the runs cannot order the two (both sustained
every rate tried, or neither sustained any).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from rack.experiments.equal_interactivity import ratio_bracket, widen
from rack.experiments.study.config import GPU72, GPU_ONLY, SPLIT, SPLIT72, WAFER

#: (split deployment, deployment it is held against).
PAIRS = ((SPLIT, WAFER), (SPLIT72, WAFER), (SPLIT, GPU_ONLY), (SPLIT72, GPU72))
#: Figures compared at capacity; for each, whether more is better.
METRICS = {"capacity": True, "tokens_per_joule": True, "usd_per_mtok": False}
VERDICTS = ("wins", "loses", "tie", "undetermined")


def at_capacity(cap: dict, name: str) -> dict:
    """A deployment's figures at its maximum sustained rate in capacity sweep `cap`:
    {"rate" (req/s, None if no rate held), "held_all" (every rate tried held: the rate is
    a lower bound), "goodput", "attainment", "tokens_per_joule", "usd_per_mtok",
    "output_tokens_per_s", "mean_power_w"}."""
    p = cap["at_max"].get(name)
    held = bool(cap["summary"]["held_every_rate"].get(name))
    if p is None:
        return {"rate": None, "held_all": False, "goodput": None, "attainment": None, "tokens_per_joule": None,
                "usd_per_mtok": None, "output_tokens_per_s": None, "mean_power_w": None, "boot_tokens": None,
                "next_rung": None, "next": None}
    above = sorted((q for q in cap["points"]
                    if q.get("scenario") == name and "error" not in q and q["rate_scale"] > p["rate_scale"]),
                   key=lambda q: q["rate_scale"])
    nxt = above[0] if above else None
    return {"rate": p["rate_per_s"], "held_all": held, "goodput": p["goodput_rps"],
            "attainment": p["slo_attainment"], "tokens_per_joule": p["tokens_per_joule"],
            "usd_per_mtok": p["usd_per_mtok"], "output_tokens_per_s": p["output_tokens_per_s"],
            "mean_power_w": p["mean_power_w"], "boot_tokens": p.get("boot_tokens"),
            "next_rung": nxt["rate_scale"] / p["rate_scale"] if nxt else None,
            "next": {m: nxt.get(m) for m in ("tokens_per_joule", "usd_per_mtok")} if nxt else None}


#: Two-sided coverage of the intervals of ratios of tokens/J and $/Mtok at capacity.
COVERAGE = 0.90


def ratio_interval(ratio: float, a: dict, b: dict, metric: str) -> Optional[list[float]]:
    """The interval of a pair_metric ratio.

    capacity: the bracket the rate ladder allows (each capacity lies between its rung
    and the next rung tried, which it failed); one-sided when one of them held every
    rate tried (its capacity is only a lower bound: [lo, inf] when it is a, [0, hi]
    when it is b); None when both did.

    tokens/J and $/Mtok, two parts taken together at their worst: the requests drawn
    (the 90 % interval over the two runs' bootstrap replicates: their requests
    resampled, output tokens move, energy and cost stay; `rack.measure.bootstrap`) and
    the rung (the capacity lies between the rung held and the next one tried, so its
    figure lies between the figures measured at those two rates: a's at one end over
    b's at the other). None when neither part exists."""
    import numpy as np

    if metric == "capacity":
        fa, fb = a.get("next_rung"), b.get("next_rung")
        if not fa and not fb:
            return None
        return [ratio / fb if fb else 0.0, ratio * fa if fa else math.inf]
    sampled = None
    ta, tb = a.get("boot_tokens"), b.get("boot_tokens")
    if ta and tb:
        n = min(len(ta), len(tb))
        r = ratio * np.asarray(ta[:n]) / np.asarray(tb[:n])
        tail = (1 - COVERAGE) / 2 * 100
        sampled = [float(np.percentile(r, tail)), float(np.percentile(r, 100 - tail))]
    # each figure between its values at the rung held and at the next one (if measured)
    ends = [(v, v) if not v or not nxt else (min(v, nxt), max(v, nxt))
            for v, nxt in ((side.get(metric), (side.get("next") or {}).get(metric)) for side in (a, b))]
    rung = None
    if any(lo != hi for lo, hi in ends) and all(x for e in ends for x in e):
        # more is better (tokens/J): a / b; less is better ($/Mtok): b / a
        rung = ratio_bracket(*(ends if METRICS[metric] else ends[::-1]))
    return widen(ratio, sampled, rung)


def verdict(ratio: Optional[float], tol: Optional[float] = None) -> str:
    """"wins" (ratio > 1 + tol), "loses" (< 1 - tol), "tie", or "undetermined" (None)."""
    from rack.experiments.sweep import TIE_TOLERANCE

    tol = TIE_TOLERANCE if tol is None else tol
    if ratio is None:
        return "undetermined"
    return "wins" if ratio > 1 + tol else ("loses" if ratio < 1 - tol else "tie")


def pair_metric(a: dict, b: dict, metric: str) -> dict:
    """Deployment `a` against `b` (both `at_capacity` dicts) on `metric`: {"ratio" (> 1:
    a is better; for $/Mtok b's cost over a's; None, with "why", when either sustains
    no rate tried: a capacity ratio against a deployment that holds no rate is
    unbounded, never a number), "interval" (`ratio_interval`; None where there is none),
    "verdict", "why"}."""
    if a["rate"] is None or b["rate"] is None:
        if a["rate"] is None and b["rate"] is None:
            return {"ratio": None, "verdict": "undetermined", "why": "neither sustains a rate tried"}
        if a["rate"] is None:
            return {"ratio": None, "verdict": "loses", "why": "only the other sustains a rate tried"}
        return {"ratio": None, "verdict": "wins", "why": "the other sustains no rate tried"}
    if metric == "capacity":
        ratio = a["rate"] / b["rate"]
        iv = ratio_interval(ratio, a, b, metric)
        if a["held_all"] and b["held_all"]:
            return {"ratio": ratio, "interval": iv, "verdict": "undetermined", "why": "both sustain every rate tried"}
        v = verdict(ratio)
        if a["held_all"] and v != "wins":
            v = "undetermined"     # a's capacity is only a lower bound
        if b["held_all"] and v != "loses":
            v = "undetermined"
        return {"ratio": ratio, "interval": iv, "verdict": v, "why": ""}
    va, vb = a[metric], b[metric]
    if not va or not vb:
        return {"ratio": None, "verdict": "undetermined", "why": "no figure"}
    ratio = va / vb if METRICS[metric] else vb / va
    iv = ratio_interval(ratio, a, b, metric)
    v = verdict(ratio)
    # A deployment that held every rate tried was read below its capacity, where its
    # idle hardware still weighs on tokens/J and $/Mtok: a loss of its is not proven.
    if (a["held_all"] and v == "loses") or (b["held_all"] and v == "wins"):
        return {"ratio": ratio, "interval": iv, "verdict": "undetermined", "why": "read below a capacity not reached"}
    return {"ratio": ratio, "interval": iv, "verdict": v, "why": ""}


def present_pairs(names: Iterable[str]) -> list[tuple[str, str]]:
    """The `PAIRS` whose two deployments both ran."""
    have = set(names)
    return [p for p in PAIRS if p[0] in have and p[1] in have]


def axis_rows(caps: dict, names: Iterable[str]) -> list[dict]:
    """For every value of an axis ({label: capacity sweep}) and every present pair:
    {"x", "a", "b", metric: pair_metric(...)}."""
    rows = []
    pairs = present_pairs(names)
    for x, cap in caps.items():
        for a, b in pairs:
            ca, cb = at_capacity(cap, a), at_capacity(cap, b)
            rows.append({"x": x, "a": a, "b": b, **{m: pair_metric(ca, cb, m) for m in METRICS}})
    return rows


def where(rows: list[dict], a: str, b: str, metric: str) -> dict[str, list]:
    """{verdict: [x values]} of pair (a, b) on `metric` along an axis (`axis_rows`)."""
    out: dict[str, list] = {v: [] for v in VERDICTS}
    for r in rows:
        if r["a"] == a and r["b"] == b:
            out[r[metric]["verdict"]].append(r["x"])
    return out


def ratio_range(rows: list[dict], a: str, b: str, metric: str) -> Optional[tuple[float, float]]:
    """(min, max) of the pair's measured ratios on `metric` along the axis, or None."""
    v = [r[metric]["ratio"] for r in rows if r["a"] == a and r["b"] == b and r[metric]["ratio"] is not None]
    return (min(v), max(v)) if v else None


def equal_load(cap: dict, a: str, b: str) -> list[dict]:
    """At each rate tried: both deployments' goodput, SLO attainment and tokens/J, and
    the verdicts of a against b on goodput and on tokens/J (same offered load);
    "tpj_interval": the tokens/J ratio's interval over the two runs' requests
    (`ratio_interval`)."""
    by = {}
    for p in cap["points"]:
        if "error" not in p and p["scenario"] in (a, b):
            by.setdefault(p["rate_scale"], {})[p["scenario"]] = p
    out = []
    for r in sorted(by):
        pa, pb = by[r].get(a), by[r].get(b)
        if pa is None or pb is None:
            continue
        gp = pa["goodput_rps"] / pb["goodput_rps"] if pb["goodput_rps"] else None
        tj = (pa["tokens_per_joule"] / pb["tokens_per_joule"]
              if pa["tokens_per_joule"] and pb["tokens_per_joule"] else None)
        tj_iv = ratio_interval(tj, pa, pb, "tokens_per_joule") if tj is not None else None
        out.append({"rate_scale": r, "rate_per_s": pa.get("rate_per_s"), "a": pa, "b": pb,
                    "goodput_ratio": gp, "goodput": verdict(gp) if gp is not None else
                    ("wins" if pa["goodput_rps"] > 0 else "tie"),
                    "tpj_ratio": tj, "tpj_interval": tj_iv, "tokens_per_joule": verdict(tj)})
    return out


def vendor_ratios(results: dict) -> list[dict]:
    """Tokens/J of each split rack over the wafer alone, each at its own capacity, for
    every workload the study ran: [{"condition", "split", "ratio" (None when either
    sustains no rate), "split_rate", "wafer_rate", "why"}]."""
    conds: list[tuple[str, dict, str, str]] = []
    if "load" in results:
        conds.append(("Mooncake trace, TPOT SLO as shipped", results["load"], SPLIT, WAFER))
        conds.append(("Mooncake trace, TPOT SLO as shipped", results["load"], SPLIT72, WAFER))
    for key, label in (("prompt", "prompt tokens"), ("output", "output tokens")):
        for x, cap in results.get(key, {}).get("values", {}).items():
            for s in (SPLIT, SPLIT72):
                conds.append((f"{int(x):,} {label}", cap, s, WAFER))
    if "agentic" in results:
        for s in (SPLIT, SPLIT72):
            conds.append(("agentic sessions", results["agentic"], s, WAFER))
    for t, cap in results.get("tpot", {}).get("values", {}).items():
        names = cap["names"]
        for s in (SPLIT, SPLIT72):
            if s in names and WAFER in names:
                conds.append((f"Mooncake trace, TPOT SLO {t} ms", cap, names[s], names[WAFER]))
    out = []
    for label, cap, s, w in conds:
        if s not in cap["at_max"] or w not in cap["at_max"]:
            continue
        cs, cw = at_capacity(cap, s), at_capacity(cap, w)
        m = pair_metric(cs, cw, "tokens_per_joule")
        out.append({"condition": label, "split": s, "wafer": w, "ratio": m["ratio"], "interval": m.get("interval"),
                    "verdict": m["verdict"],
                    "why": m["why"], "split_rate": cs["rate"], "wafer_rate": cw["rate"],
                    "split_held_all": cs["held_all"], "wafer_held_all": cw["held_all"]})
    return out


#: z of the two-sided `COVERAGE` interval of a normal approximation (Wilson's interval).
Z90 = 1.6449


def attainment_interval(share: float, n: int) -> tuple[float, float]:
    """Wilson's `COVERAGE` interval of a share of n requests (the SLO attainment of a
    run of n submitted requests): (lo, hi) in [0, 1]. Every request meets the SLO or
    not, so how many of n do is binomial; Wilson's interval stays inside [0, 1] and
    is not nil at 0 % or 100 % (Wilson 1927)."""
    if n <= 0:
        return 0.0, 1.0
    z2 = Z90 * Z90
    mid = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z90 / (1 + z2 / n) * (share * (1 - share) / n + z2 / (4 * n * n)) ** 0.5
    return max(0.0, mid - half), min(1.0, mid + half)


def goodput_per_power(cap: dict, a: str, b: str) -> list[dict]:
    """At each rate tried: goodput per MW of mean power of a and of b and their ratio
    (requests meeting the SLO per second per megawatt; both measured per run), with
    "interval": the ratio with each run's SLO attainment at the ends of its Wilson
    interval (`attainment_interval`: a's low over b's high and back; goodput is the
    attainment times the offered rate, the power is the run's), None where either run
    met the SLO for no request."""
    out = []
    for row in equal_load(cap, a, b):
        ga = row["a"]["goodput_rps"] / (row["a"]["mean_power_w"] / 1e6)
        gb = row["b"]["goodput_rps"] / (row["b"]["mean_power_w"] / 1e6)
        ratio = ga / gb if gb > 0 else None
        iv = None
        if ratio and row["a"]["slo_attainment"] and row["b"]["slo_attainment"]:
            # each goodput per MW with its attainment at the ends of its Wilson interval
            ends = [tuple(g * e / row[k]["slo_attainment"]
                          for e in attainment_interval(row[k]["slo_attainment"], int(row[k].get("submitted") or 0)))
                    for g, k in ((ga, "a"), (gb, "b"))]
            iv = ratio_bracket(*ends)
            iv = list(iv) if iv is not None else None
        out.append({"rate_scale": row["rate_scale"], "rate_per_s": row["rate_per_s"], "a": ga, "b": gb,
                    "ratio": ratio, "interval": iv})
    return out


def pd_gains(case: dict) -> list[dict]:
    """Per TPOT target of a GPU disaggregation case: the colocated deployment's
    capacity, each disaggregated split's, the best one and the ratio best / colocated."""
    out = []
    for t, cap in case["values"].items():
        col = at_capacity(cap, cap["colocated"])
        pds = {n: at_capacity(cap, n) for n in cap["disaggregated"]}
        ranked = sorted((n for n in pds if pds[n]["rate"] is not None), key=lambda n: pds[n]["rate"], reverse=True)
        best = ranked[0] if ranked else None
        m = pair_metric(pds[best], col, "capacity") if best else {"ratio": None, "verdict": "loses" if col["rate"]
                                                                  else "undetermined", "why": ""}
        out.append({"tpot_ms": t, "colocated": cap["colocated"], "colocated_cap": col, "pd": pds,
                    "best": best, "ratio": m["ratio"], "interval": m.get("interval"), "verdict": m["verdict"],
                    "why": m["why"]})
    return out


__all__ = ["METRICS", "PAIRS", "Z90", "at_capacity", "attainment_interval", "axis_rows", "equal_load",
           "goodput_per_power", "pair_metric", "pd_gains", "present_pairs", "ratio_interval", "ratio_range",
           "vendor_ratios", "verdict", "where"]
