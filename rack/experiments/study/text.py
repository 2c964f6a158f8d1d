"""Number formats and small sentence builders for findings.md: every figure is formatted
from a measured value here, never typed into the text."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence


def num(v: Optional[float], fmt: str = "{:.3g}") -> str:
    """`v` formatted, or "-" for no value."""
    return "-" if v is None else fmt.format(v)


def rate(v: Optional[float]) -> str:
    """A rate in req/s, 3 significant digits."""
    return num(v, "{:.3g}")


def cap(c: dict) -> str:
    """A capacity (`analysis.at_capacity`): "none" when no rate held, ">= r" when every
    rate tried held (a lower bound)."""
    if c["rate"] is None:
        return "none"
    return (">= " if c["held_all"] else "") + rate(c["rate"])


def tpj(v: Optional[float]) -> str:
    return num(v, "{:.4g}")


def usd(v: Optional[float]) -> str:
    return num(v, "{:,.2f}")


def pct(v: Optional[float]) -> str:
    return num(v, "{:.1%}")


def x(v: Optional[float]) -> str:
    """A ratio as "2.31x"."""
    return num(v, "{:.2f}x")


def xi(v: Optional[float], interval: Optional[Sequence[float]]) -> str:
    """A ratio with its interval: "2.31x [2.10-2.52x]"; one-sided where one end is
    unbounded (a capacity that held every rate tried is a lower bound): "2.31x [>=
    1.63x]", "0.50x [<= 0.71x]"; "2.31x [no interval]" when the runs gave none; "-"
    for no ratio."""
    if v is None:
        return "-"
    if not interval:
        return x(v) + " [no interval]"
    lo, hi = interval
    if hi == float("inf"):
        return x(v) + f" [>= {lo:.2f}x]"
    if lo <= 0:
        return x(v) + f" [<= {hi:.2f}x]"
    return x(v) + f" [{lo:.2f}-{hi:.2f}x]"


def ms(v: Optional[float]) -> str:
    """Seconds as milliseconds: 3 significant digits, whole milliseconds from 100 ms
    (as `rack compare`'s table)."""
    if v is None:
        return "-"
    return f"{v * 1e3:,.0f}" if v >= 0.1 else f"{v * 1e3:.3g}"


def secs(v: Optional[float]) -> str:
    return num(v, "{:.3g}")


def code(name: str) -> str:
    return f"`{name}`"


def listing(items: Sequence[str], empty: str = "none") -> str:
    """"a", "a and b", "a, b and c"."""
    items = [str(i) for i in items]
    if not items:
        return empty
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def span(values: Iterable[Optional[float]], fmt=x) -> str:
    """"a" or "a to b" over the values that exist ("-" when none)."""
    v = sorted(u for u in values if u is not None)
    if not v:
        return "-"
    return fmt(v[0]) if fmt(v[0]) == fmt(v[-1]) else f"{fmt(v[0])} to {fmt(v[-1])}"


def spani(items: Iterable[tuple[Optional[float], Optional[Sequence[float]]]]) -> str:
    """Ratios with their intervals, lowest to highest: "a [lo-hi x]" or "a [..] to b [..]"
    over the (ratio, interval) pairs that have both ("-" when none): a ratio without an
    interval (of two capacities that are both lower bounds) is no reading."""
    v = sorted((u for u in items if u[0] is not None and u[1]), key=lambda u: u[0])
    if not v:
        return "-"
    first, last = xi(*v[0]), xi(*v[-1])
    return first if first == last else f"{first} to {last}"


def runs(values: Sequence[str], order: Sequence[str]) -> list[str]:
    """`values` (a subset of `order`) with every run of three or more neighbours in
    `order` written "a to b": ["1x", "2x to 16x"]."""
    pos = {v: i for i, v in enumerate(order)}
    idx = sorted(pos[v] for v in values)
    out, start = [], 0
    for k in range(1, len(idx) + 1):
        if k == len(idx) or idx[k] != idx[k - 1] + 1:
            block = idx[start:k]
            out += ([f"{order[block[0]]} to {order[block[-1]]}"] if len(block) >= 3
                    else [order[i] for i in block])
            start = k
    return out


def verdict_phrase(groups: dict, unit: str, noun: str, order: Optional[Sequence[str]] = None) -> str:
    """A pair's verdicts along an axis ({"wins": [...], ...}) as a clause: "wins at 1024
    and 4096 prompt tokens; loses at 65536 prompt tokens", or "loses at every prompt
    length tried" (`noun`). Every value appears once; "undetermined" values are named
    as such. `order` (every value of the axis in order) shortens runs to "a to b"."""
    parts = []
    total = sum(len(v) for v in groups.values())
    for key, word in (("wins", "wins"), ("loses", "loses"), ("tie", "ties"),
                      ("undetermined", "cannot be ordered")):
        vals = groups.get(key) or []
        if not vals:
            continue
        shown = runs(vals, order) if order else vals
        where = f"at every {noun} tried" if len(vals) == total and total > 1 else \
            "at " + listing(shown) + (f" {unit}" if unit else "")
        parts.append(f"{word} {where}")
    return "; ".join(parts) if parts else "no data"


__all__ = ["cap", "code", "listing", "ms", "num", "pct", "rate", "runs", "secs", "span", "spani", "tpj",
           "usd", "verdict_phrase", "x", "xi"]
