"""Two deployments' curves read at truly equal interactivity, with their uncertainty.

A deployment's curve (`rack.experiments.interactivity`) is one or more *branches*: its
concurrency ladder as shipped, and one ladder per setting of a knob that trades
per-user speed for throughput (a wafer's chunk size or batch cap, `knobs` of a study
section). Its value at x tokens/s per user is the best branch's, each branch
interpolated linearly between neighbouring concurrency points (the frontier); nothing
is read outside a branch's measured range (never extrapolated).

Readings of a pair (a, b), metric(a) / metric(b) at the same x on both curves
(`pair_readings`):
- the ratio curve: at `GRID` x values spaced geometrically over the whole range where
  both curves exist (their overlap), to be plotted against tokens/s per user;
- named points: `NAMED_X` (1,000 tokens/s per user) and each curve's own knee
  (`knee`: its best `metric` among its points that meet its TPOT target, read only
  when a later point of that branch is lower: a knee at a ladder's end is no knee and
  is named instead);
- "up to": the highest ratio over the ratio curve (the vendors' "up to 5x at
  comparable interactivity" is such a reading).
Every reading carries an interval of two parts, taken together at their worst:
- the requests drawn: the ratio recomputed on each bootstrap replicate of the points
  (`rack.measure.bootstrap`: their requests resampled; replicate r of every point of
  both curves), each replicate read at the same operating point as the point estimate
  (the same two points of the same branch, mixed in the same proportion), its 5th and
  95th percentiles;
- the rungs not measured: between two concurrencies of a ladder a curve is known only
  to lie between its chord and its neighbouring segments extended (`bracket_at`);
  a's value at one end of its bracket over b's at the other end. Neighbouring points
  of one curve can differ by tens of percent, so a reading between them is only as
  good as the ladder is fine; at a measured point this part is nil.
A reading outside either curve's range has no value, and says which curve ends first
(`short`).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

#: The x axis of the curves and of their ratio, and the default metric of the ratio.
X_KEY = "tps_user_p50"
DEFAULT_METRIC = "output_tps_per_kw"
#: A rung that raises a curve's metric by less than this share over its best earlier
#: point ends the climb ("flat", `rack.experiments.interactivity.curve_state`); `knee`
#: takes the plateau's first point as the knee.
FLAT = 0.05

#: The named interactivity of every pair's readings (tokens/s per user).
NAMED_X = (1000.0,)
#: x values of a ratio curve over the overlap of two curves.
GRID = 24
#: Two tokens/s per user this close (relative) are the same interactivity: a curve whose
#: readable range ends this close to x is read at that end (`snap_x`). The emulator's
#: per-user speeds of a nearly vertical curve differ by less than this between loads;
#: a point's own 90 % interval of its median tokens/s per user is wider.
EQUAL_WITHIN = 0.005
#: The interval's coverage (two-sided) and the least share of replicates that must read x.
COVERAGE = 0.90
MIN_REPLICATES = 0.5

Branches = list  # list of point lists, each sorted by concurrency


def branches_of(entry: Any) -> Branches:
    """A deployment's branches from a curves entry: {"points", "variants": {label:
    points}} (variants optional), or a plain point list (one branch). Points without
    `X_KEY` are kept (they fail the readings' checks, not this)."""
    if isinstance(entry, Mapping):
        out = [list(entry.get("points", []))]
        out += [list(v) for v in (entry.get("variants") or {}).values()]
    else:
        out = [list(entry)]
    return [sorted(b, key=lambda p: p["concurrency"]) for b in out if b]


def _arrays(branch: Sequence[Mapping], metric: str, boot: bool) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(x, y) of a branch's points that have both values, in concurrency order: shape
    (n,) each; with `boot` y is (R, n), the points' metric over their bootstrap
    replicates ("boot_tokens"), and None when a point has none. None without points."""
    pts = [p for p in branch if p.get(X_KEY) is not None and p.get(metric) is not None]
    if not pts:
        return None
    x = np.array([float(p[X_KEY]) for p in pts])
    if not boot:
        return x, np.array([float(p[metric]) for p in pts])
    if any(not p.get("boot_tokens") for p in pts):
        return None
    r = min(len(p["boot_tokens"]) for p in pts)
    return x, np.array([np.asarray(p["boot_tokens"][:r], dtype=float) * float(p[metric]) for p in pts]).T


def _pick(x: np.ndarray, y: np.ndarray, at: float) -> Optional[tuple[float, int, int]]:
    """A branch's value at `at` and where it comes from: (value, i, j), the best of its
    points at `at` (i = j) and of its segments (i, j = i + 1) crossing it; None outside
    its range. x, y: (n,) in concurrency order.

    The last point of a branch that had not turned (its best value is its last point)
    is never read, nor the segment ending at it: it is a lower bound on what that
    deployment gives there (a higher rung might give more at the same speed), not an
    operating point. A branch that turned is read up to its last point, which lies
    past its knee."""
    n = len(x)
    usable = n if _turned(y) else n - 1
    best = None
    for i in range(usable):
        if x[i] == at and (best is None or y[i] > best[0]):
            best = (float(y[i]), i, i)
    for i in range(usable - 1):
        x0, x1 = x[i], x[i + 1]
        if min(x0, x1) < at < max(x0, x1):
            v = y[i] + (at - x0) / (x1 - x0) * (y[i + 1] - y[i])
            if best is None or v > best[0]:
                best = (float(v), i, i + 1)
    return best


def _turned(y: np.ndarray) -> bool:
    """Whether a branch's values (concurrency order) fall after their best: its last
    point is below an earlier one."""
    return len(y) >= 2 and float(np.max(y[:-1])) > float(y[-1])


def _replicates_at(by: np.ndarray, frac: float, i: int, j: int) -> np.ndarray:
    """Each replicate's value at the operating point the point estimate reads: the same
    two points (i, j; i = j for a measured point) mixed in the same proportion `frac`
    (0 at i, 1 at j), their resampled values. (R,). Holding the mix fixed keeps a
    reading well defined where a curve is nearly vertical (its points' tokens/s per
    user all but equal), where re-reading each replicate at x would divide by a
    difference of two noisy, nearly equal speeds."""
    if i == j:
        return by[:, i]
    return by[:, i] + frac * (by[:, j] - by[:, i])


def _read(branches: Branches, at: float, metric: str) -> Optional[tuple[float, int, int, int]]:
    """(value, branch, i, j) of the best branch at `at` (`_pick`), or None."""
    best = None
    for k, b in enumerate(branches):
        arr = _arrays(b, metric, False)
        got = _pick(*arr, float(at)) if arr is not None else None
        if got is not None and (best is None or got[0] > best[0]):
            best = (got[0], k, got[1], got[2])
    return best


def _bracket(x: np.ndarray, y: np.ndarray, at: float, i: int, j: int) -> tuple[float, float]:
    """Where the curve between two measured rungs may lie at `at`: (lo, hi) around the
    chord of points i and j (i = j: a measured point, (y_i, y_i)).

    The ladder measures a curve at a few concurrencies; between two of them the chord is
    one guess among the curves through those points. Its neighbouring segments, (i - 1,
    i) and (j, j + 1), extended to `at`, bound it on the other side: above the chord on
    a concave stretch (the frontier flattening as batches fill), below it on a convex
    one. The bracket spans the chord and both extensions, kept within [min, max] of the
    two rungs' values (between two rungs the curve is taken as monotone: one more user
    neither adds nor loses more than the next rung does). A finer ladder narrows it; a
    reading at a measured point has none."""
    if i == j:
        return float(y[i]), float(y[i])
    x0, x1 = float(x[i]), float(x[j])
    cands = [float(y[i] + (at - x0) / (x1 - x0) * (y[j] - y[i]))]
    for a, b in ((i - 1, i), (j, j + 1)):
        if 0 <= a and b < len(x) and x[b] != x[a]:
            cands.append(float(y[a] + (at - x[a]) / (x[b] - x[a]) * (y[b] - y[a])))
    low, high = float(min(y[i], y[j])), float(max(y[i], y[j]))
    return max(low, min(cands)), min(high, max(cands))


def ratio_bracket(a: Sequence[float], b: Sequence[float]) -> Optional[tuple[float, float]]:
    """Where a / b lies when a lies in [a0, a1] and b in [b0, b1]: (a0 / b1, a1 / b0),
    a's low end over b's high end and back; None when b0 <= 0."""
    return (a[0] / b[1], a[1] / b[0]) if b[0] > 0 else None


def widen(ratio: float, sampled: Optional[Sequence[float]], bracket: Optional[Sequence[float]]) -> Optional[list[float]]:
    """A ratio's interval from its two parts taken together at their worst: `sampled`
    (the bootstrap's [lo, hi], or None) scaled out by `bracket` ([lo, hi] of the ratio
    over what was not measured, `ratio_bracket`, or None). None when neither exists."""
    if sampled is None and bracket is None:
        return None
    lo, hi = (ratio, ratio) if sampled is None else (min(ratio, sampled[0]), max(ratio, sampled[1]))
    if bracket is not None:
        lo, hi = lo * bracket[0] / ratio, hi * bracket[1] / ratio
    return [float(lo), float(hi)]


def bracket_at(branches: Branches, at: float, metric: str = DEFAULT_METRIC) -> Optional[tuple[float, float]]:
    """The curve's value at `at` as a (lo, hi) bracket over what the ladder leaves
    unmeasured (`_bracket`), on the branch and segment `value_at` reads; None outside
    every branch's range."""
    got = _read(branches, at, metric)
    if got is None:
        return None
    _, k, i, j = got
    x, y = _arrays(branches[k], metric, False)
    return _bracket(x, y, float(at), i, j)


def value_at(branches: Branches, at: float, metric: str = DEFAULT_METRIC, boot: bool = False):
    """The curve's `metric` at `at` tokens/s per user: the best branch, a measured point
    or a segment crossing `at` (the frontier); None outside every branch's range.
    With `boot`: the bootstrap replicates' values (R,) read on the same branch and
    segment (`_replicates_at`), or None when the points carry no replicates."""
    got = _read(branches, at, metric)
    if got is None:
        return None
    v, k, i, j = got
    if not boot:
        return v
    arr = _arrays(branches[k], metric, True)
    if arr is None:
        return None
    x, by = arr
    frac = 0.0 if i == j else float((at - x[i]) / (x[j] - x[i]))
    return _replicates_at(by, frac, i, j)


def curve_range(branches: Branches, metric: str = DEFAULT_METRIC) -> Optional[list[float]]:
    """[lowest, highest] tokens/s per user the curve can be read at (`_pick`: every
    branch's points, less the last of a branch that had not turned), or None."""
    xs = []
    for b in branches:
        arr = _arrays(b, metric, False)
        if arr is not None:
            x, y = arr
            xs += list(x if _turned(y) else x[:-1])
    return [float(min(xs)), float(max(xs))] if xs else None


def knee(branches: Branches, metric: str = DEFAULT_METRIC, floor: Optional[float] = None) -> dict:
    """A curve's knee: its highest `metric` among its points giving at least `floor`
    tokens/s per user (its TPOT target's; None: every point).

    Returns {"status": "knee" (a later point of the same branch is lower: the curve
    turned there; or the branch flattened, its last point less than `FLAT` above the
    point before it, and the knee is the first point within `FLAT` of the best: the
    plateau's start), "at_end" (the best point is its branch's last and the curve was
    still rising: the ladder ended or the SLO stopped it before the curve turned; no
    reading is taken there), or "none" (no point meets the floor), "x", "value",
    "concurrency", "branch" (index)}."""

    best = None
    for i, b in enumerate(branches):
        pts = [p for p in b if p.get(X_KEY) is not None and p.get(metric) is not None]
        ok = [p for p in pts if floor is None or p[X_KEY] >= floor]
        for k, p in enumerate(pts):
            if floor is not None and p[X_KEY] < floor:
                continue
            if best is None or p[metric] > best[0]:
                turned = any(q[metric] < p[metric] for q in pts[k + 1:])
                if not turned and len(ok) >= 2 and p is ok[-1] and p[metric] < (1 + FLAT) * ok[-2][metric]:
                    # a plateau: its first point within FLAT of the best is the knee
                    p = next(q for q in ok if q[metric] >= p[metric] / (1 + FLAT))
                    turned = p is not ok[-1]
                best = (p[metric], p, i, turned)
    if best is None:
        return {"status": "none", "x": None, "value": None, "concurrency": None, "branch": None}
    v, p, i, turned = best
    return {"status": "knee" if turned else "at_end", "x": float(p[X_KEY]), "value": float(v),
            "concurrency": p["concurrency"], "branch": i}


def snap_x(branches: Branches, at: float, metric: str = DEFAULT_METRIC) -> Optional[float]:
    """Where to read a curve asked for `at`: `at` inside its readable range, else the end
    of that range when `at` is within `EQUAL_WITHIN` of it (the same tokens/s per user
    to the readings' resolution), else None."""
    rng = curve_range(branches, metric)
    if rng is None:
        return None
    lo, hi = rng
    if lo <= at <= hi:
        return at
    end = lo if at < lo else hi
    return end if abs(at - end) <= EQUAL_WITHIN * at else None


def ratio_at(ba: Branches, bb: Branches, at: float, metric: str = DEFAULT_METRIC,
             coverage: float = COVERAGE) -> dict:
    """metric(a) / metric(b) at `at` tokens/s per user on both curves, with its interval.

    A curve whose readable range ends within `EQUAL_WITHIN` of x is read at that end
    ("read_at" says where each curve was read then).

    Returns {"x", "a", "b", "ratio" (None where either curve cannot be read at x),
    "interval": [lo, hi] (the requests' share, "sampled": the `coverage` interval over
    the bootstrap replicates, widened by the ladder's, "ladder": each curve's
    `bracket_at` between the rungs it was measured at, a's low end over b's high end and
    back; None when neither applies: no replicates and both read at measured points),
    "replicates" (how many read x), "short": which curve(s) do not reach x ("a", "b",
    "both") or None}."""
    xa, xb = snap_x(ba, at, metric), snap_x(bb, at, metric)
    va = value_at(ba, xa, metric) if xa is not None else None
    vb = value_at(bb, xb, metric) if xb is not None else None
    short = [n for n, v in (("a", va), ("b", vb)) if v is None]
    out = {"x": float(at), "a": va, "b": vb, "ratio": None, "interval": None, "replicates": 0,
           "short": ("both" if len(short) == 2 else short[0]) if short else None}
    if xa is not None and xb is not None and (xa != at or xb != at):
        out["read_at"] = {"a": xa, "b": xb}       # a curve's end, within EQUAL_WITHIN of x
    if short or not vb:
        return out
    out["ratio"] = va / vb
    # the ladder's share (nil where both curves are read at measured points)
    ladder = ratio_bracket(bracket_at(ba, xa, metric), bracket_at(bb, xb, metric))
    if ladder is not None and ladder[0] != ladder[1]:
        out["ladder"] = list(ladder)
    ra, rb = value_at(ba, xa, metric, boot=True), value_at(bb, xb, metric, boot=True)
    if ra is not None and rb is not None:
        n = min(len(ra), len(rb))
        with np.errstate(all="ignore"):
            r = ra[:n] / rb[:n]
        r = r[np.isfinite(r)]
        out["replicates"] = int(r.size)
        if n and r.size >= MIN_REPLICATES * n:
            tail = (1.0 - coverage) / 2 * 100
            out["sampled"] = [float(np.percentile(r, tail)), float(np.percentile(r, 100 - tail))]
    # both at once, worst case: the requests drawn and the rungs not measured
    out["interval"] = widen(out["ratio"], out.get("sampled"), out.get("ladder"))
    return out


def ratio_curve(ba: Branches, bb: Branches, metric: str = DEFAULT_METRIC, points: int = GRID) -> dict:
    """The ratio at `points` x values spaced geometrically over the curves' overlap
    (both ends included): {"overlap": [lo, hi] or None, "readings": [ratio_at ...]}."""
    ra, rb = curve_range(ba, metric), curve_range(bb, metric)
    if not ra or not rb or max(ra[0], rb[0]) > min(ra[1], rb[1]):
        return {"overlap": None, "readings": []}
    lo, hi = max(ra[0], rb[0]), min(ra[1], rb[1])
    xs = [lo] if lo == hi else list(np.geomspace(lo, hi, points))
    return {"overlap": [lo, hi], "readings": [ratio_at(ba, bb, float(x), metric) for x in xs]}


def pair_readings(ba: Branches, bb: Branches, metric: str = DEFAULT_METRIC, *,
                  floor_a: Optional[float] = None, floor_b: Optional[float] = None,
                  named: Sequence[float] = NAMED_X, names: tuple[str, str] = ("a", "b")) -> dict:
    """Every reading of the pair at equal interactivity (module docstring).

    ba, bb: the two curves' branches (`branches_of`); floor_a/floor_b: the tokens/s per
    user each one's TPOT target implies (`interactivity.slo_floor`); names: how the
    notes name the two curves.

    Returns {"metric", "range_a", "range_b", "curve": `ratio_curve`, "named": [{"name",
    **ratio_at}] at each `named` x and at each curve's knee (a knee "at_end" or "none"
    gives {"name", "x", "ratio": None, "why"}), "knees": {"a", "b"}, "up_to": the
    ratio curve's highest reading (None if none), "notes": [str] (which curve ends
    before the other's range)}."""
    ka, kb = knee(ba, metric, floor_a), knee(bb, metric, floor_b)
    out_named = []
    for x in named:
        out_named.append({"name": f"{x:,.0f} tokens/s per user", **ratio_at(ba, bb, x, metric)})
    for who, k in ((names[0], ka), (names[1], kb)):
        label = f"{who}'s knee"
        if k["status"] != "knee":
            why = ("its best point is its ladder's last: the curve had not turned" if k["status"] == "at_end"
                   else "no point meets its TPOT target")
            out_named.append({"name": label, "x": k["x"], "ratio": None, "interval": None, "short": None,
                              "why": why})
        else:
            out_named.append({"name": label, "concurrency": k["concurrency"], **ratio_at(ba, bb, k["x"], metric)})
    curve = ratio_curve(ba, bb, metric)
    have = [r for r in curve["readings"] if r["ratio"] is not None]
    up_to = max(have, key=lambda r: r["ratio"]) if have else None
    ra, rb = curve_range(ba, metric), curve_range(bb, metric)
    notes = []
    if ra and rb:
        for (n1, r1), (n2, r2) in (((names[0], ra), (names[1], rb)), ((names[1], rb), (names[0], ra))):
            if r1[0] > r2[0]:
                notes.append(f"{n1} reaches no lower than {r1[0]:,.0f} tokens/s per user: {n2}'s points below it "
                             "have no ratio (never extrapolated)")
            if r1[1] < r2[1]:
                notes.append(f"{n1} reaches no higher than {r1[1]:,.0f} tokens/s per user: {n2}'s points above it "
                             "have no ratio (never extrapolated)")
    return {"metric": metric, "range_a": ra, "range_b": rb, "curve": curve, "named": out_named,
            "knees": {"a": ka, "b": kb}, "up_to": up_to, "notes": notes}


def interval_text(r: Optional[Mapping]) -> str:
    """"4.2x [3.9-4.6x]" (ratio and its interval, `ratio_at`), "4.2x [no interval]", or "-"."""
    if not r or r.get("ratio") is None:
        return "-"
    iv = r.get("interval")
    return f"{r['ratio']:.3g}x " + (f"[{iv[0]:.3g}-{iv[1]:.3g}x]" if iv else "[no interval]")


def rescale_energy(points: Sequence[Mapping], watts: Mapping[str, Mapping[str, float]]) -> list[dict]:
    """The points with the energy boundary's per-device watts replaced, no rerun: a
    point's joules are its devices' joules plus its window x the per-device watts of
    its "system" boundary (`rack.measure.energy`), so a boundary term moves only the
    metrics per kW (per MW); the run's timing, tokens and cost are unchanged.

    watts: {device key: {"host_w" | "nic_w" | "switch_w": W per device}} replacing
    the points' own (`overhead_w_by_device`; a hardware key also sets its stack
    variants, "mi455x" the "mi455x-sglang" entries, as `[energy]` tables do). A point of a devices-only boundary, or
    without the breakdown, is returned as it is."""
    from rack.measure.energy import for_device

    out = []
    for p in points:
        per = p.get("overhead_w_by_device") or {}
        if p.get("energy_boundary") != "system" or not per or p.get("output_tokens") is None:
            out.append(dict(p))
            continue
        new = {d: {**v, **(for_device(watts, d) or {})} for d, v in per.items()}
        w = sum(v["devices"] * sum(v[k] for k in ("host_w", "nic_w", "switch_w")) for v in new.values())
        joules = float(p["device_joules"]) + float(p["window_s"]) * w
        kw = 1e3 * p["output_tokens"] / joules if joules > 0 else None
        out.append({**p, "overhead_w_by_device": new, "joules": joules,
                    "mean_power_w": joules / p["window_s"] if p["window_s"] else p.get("mean_power_w"),
                    "output_tps_per_kw": kw, "output_tps_per_mw": kw * 1e3 if kw is not None else None})
    return out


__all__ = ["COVERAGE", "EQUAL_WITHIN", "GRID", "NAMED_X", "bracket_at", "branches_of", "curve_range",
           "interval_text", "knee", "pair_readings", "ratio_at", "ratio_bracket", "ratio_curve", "rescale_energy",
           "snap_x", "value_at", "widen"]
