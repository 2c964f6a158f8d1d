"""Uncertain terms as the study uses them: a spec's term references resolved to their
documented ranges, and a scenario with one term set.

Terms come from providers (`PROVIDERS`), each a documented list and the way a scenario
carries a value: the cost model's terms (`devices.uncertainty`, set in the scenario's
`[terms]` table) and the energy boundary's figures (`rack.measure.energy.boundary_terms`,
set in its `[energy]` table; they move the energy only, so a tornado rescales the
as-shipped points instead of running again: `rerun_free`). A term a provider adds
(e.g. a new `devices.uncertainty` entry) is swept by `terms = "all"` with no change
here. A spec may give `low`/`nominal`/`high` inline (a user's own range, or a term such
as `link.bandwidth_GBps` whose nominal is the scenario's own link).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

#: Keys a scenario carries without `devices.uncertainty` (set on its own fields).
SCENARIO_FIELD_TERMS = ("link.bandwidth_GBps",)


def _device_terms() -> list[dict]:
    try:
        from devices.uncertainty import uncertain_terms
    except ImportError:
        return []
    return [_as_dict(t) for t in uncertain_terms()]


def _boundary_terms() -> list[dict]:
    from rack.measure.energy import boundary_terms

    return boundary_terms()


def _set_boundary(scenario, key: str, value: float):
    from rack.measure.energy import with_boundary_term

    return scenario.with_overrides(energy=with_boundary_term(scenario.energy, key, value))


class Provider(NamedTuple):
    """A source of uncertain terms: `terms()` -> term dicts; `apply(scenario, key,
    value)` -> the scenario with the term set, or None to use the default (`[terms]`);
    `rerun_free`: the term changes no run, only figures derived from its points."""

    name: str
    terms: Callable[[], list]
    apply: Optional[Callable] = None
    rerun_free: bool = False


PROVIDERS: tuple[Provider, ...] = (
    Provider("devices.uncertainty", _device_terms),
    Provider("rack.measure.energy", _boundary_terms, _set_boundary, rerun_free=True),
)


def _provider(key: str) -> Optional[tuple[Provider, dict]]:
    for p in PROVIDERS:
        for t in p.terms():
            if t["key"] == key:
                return p, t
    return None


def _documented(key: str) -> Optional[dict]:
    """A provider's term dict for `key`, or None when no provider has it."""
    found = _provider(key)
    return found[1] if found else None


def rerun_free(key: str) -> bool:
    """Whether term `key` moves only figures derived from a run (the energy boundary's
    watts), so the as-shipped points can be rescaled instead of run again."""
    found = _provider(key)
    return bool(found and found[0].rerun_free)


def all_terms() -> list[dict]:
    """Every documented term of every provider, as dicts. Raises ValueError when no
    provider has any (devices.uncertainty missing and no boundary terms)."""
    out = [t for p in PROVIDERS for t in p.terms()]
    if not out:
        raise ValueError("terms = \"all\" needs documented uncertain terms (devices.uncertainty), which this "
                         "checkout does not have; list the terms with their ranges instead")
    return out


def _as_dict(t) -> dict:
    return {"key": t.key, "label": t.label, "unit": t.unit, "low": float(t.low), "nominal": float(t.nominal),
            "high": float(t.high), "sources": list(t.sources), "scale": t.scale, "doc": t.doc}


def resolve(refs) -> list[dict]:
    """Term dicts {key, label, unit, low, nominal (None: the scenario's own), high,
    sources, scale, doc, points} for a section's `terms` ("all" or TermRefs); inline
    fields override the documented ones. Raises ValueError naming a term that has no
    documented range and none given."""
    if refs == "all":
        return [{**t, "points": 3} for t in all_terms()]
    out = []
    for r in refs:
        doc = _documented(r.key)
        base = dict(doc) if doc is not None else {"key": r.key, "label": r.key, "unit": "", "low": None,
                                                       "nominal": None, "high": None, "sources": [],
                                                       "scale": "linear", "doc": ""}
        for f in ("low", "nominal", "high", "label", "unit", "scale"):
            if getattr(r, f) is not None:
                base[f] = getattr(r, f)
        if base["low"] is None or base["high"] is None:
            raise ValueError(f"term {r.key!r}: no documented range (devices.uncertainty) and no low/high given")
        if not base["low"] < base["high"]:
            raise ValueError(f"term {r.key!r}: expected low < high, got {base['low']} and {base['high']}")
        if doc is None and r.key not in SCENARIO_FIELD_TERMS and not _scenario_has_terms():
            raise ValueError(f"term {r.key!r}: scenarios cannot set it (no devices.uncertainty here; the ones they "
                             f"can: {', '.join(SCENARIO_FIELD_TERMS)})")
        base["points"] = r.points
        out.append(base)
    return out


def _scenario_has_terms() -> bool:
    from rack.wiring.scenario import Scenario

    return "terms" in Scenario.model_fields


def values(term: dict, points: Optional[int] = None) -> list[float]:
    """`points` values from the term's low to high, spaced by its scale (log: geometric)."""
    n = points or term.get("points") or 3
    lo, hi = float(term["low"]), float(term["high"])
    if term.get("scale") == "log" and lo > 0:
        v = np.geomspace(lo, hi, n)
    else:
        v = np.linspace(lo, hi, n)
    return [float(f"{x:.4g}") for x in v]


def apply(scenario, key: str, value: float, name: Optional[str] = None):
    """`scenario` with term `key` = `value` (renamed `name`). Uses the scenario's
    `terms` table when it has one; `link.bandwidth_GBps` sets every KV link of a
    scenario that does not. A colocated scenario has no link: it is returned as it is
    (renamed). Raises ValueError for a term the scenario cannot carry."""
    from rack.wiring.scenario import Scenario

    found = _provider(key)
    if found is not None and found[0].apply is not None:
        sc = found[0].apply(scenario, key, float(value))
    elif "terms" in Scenario.model_fields:
        sc = scenario.with_overrides(terms={**dict(scenario.terms), key: float(value)})
    elif key == "link.bandwidth_GBps":
        sc = scenario
        if scenario.links:
            from rack.experiments.sweep import with_link_bandwidth

            sc = with_link_bandwidth(scenario, float(value), None)
    else:
        raise ValueError(f"term {key!r}: this checkout's scenarios have no [terms] table (devices.uncertainty)")
    return sc.with_overrides(name=name) if name else sc


def crossing(xs: Sequence[float], ys: Sequence[float], level: float, scale: str = "linear") -> list[float]:
    """Where the piecewise-linear curve through (xs, ys) (sorted by x) crosses `level`,
    interpolated between the two measured neighbours (in log x for a log term); never
    beyond the measured ends."""
    pts = sorted((float(x), float(y)) for x, y in zip(xs, ys) if y is not None and math.isfinite(y))
    out = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if (y0 - level) * (y1 - level) < 0:
            f = (level - y0) / (y1 - y0)
            if scale == "log" and x0 > 0 and x1 > 0:
                out.append(float(math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))))
            else:
                out.append(x0 + f * (x1 - x0))
        elif y1 == level and (not out or out[-1] != x1):
            out.append(x1)
    if pts and pts[0][1] == level:
        out.insert(0, pts[0][0])
    return out


__all__ = ["PROVIDERS", "Provider", "SCENARIO_FIELD_TERMS", "all_terms", "apply", "crossing", "rerun_free",
           "resolve", "values"]
