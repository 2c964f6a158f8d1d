"""Pacing: which tokens of a stream to send now, and when to look again (pure).

A token is sent when emulated time reaches its time (`rack.serve.gateway`: planned by
the engine, the truth once the record is in). Tokens due within one pacing quantum go
in one chunk, as a real server sends one chunk per iteration: when the first unsent
token is due at t, the chunk holds every following known token due by t + quantum and
leaves when the last of them is due. A token therefore leaves at most one quantum
after its time (plus the host's lateness), never before it.
"""

from __future__ import annotations

import math

import numpy as np


def next_chunk(times: np.ndarray, sent: int, now: float, quantum: float) -> tuple[int, float]:
    """(end, wait) for a stream that has sent tokens [0, sent) of `times` (emulated s,
    NaN unknown): send tokens [sent, end) now if end > sent; else look again at
    emulated time `wait` (inf: when the times change)."""
    n = times.shape[0]
    if sent >= n:
        return sent, math.inf
    t = times[sent]
    if t != t:                       # NaN: not planned yet
        return sent, math.inf
    if t > now:
        return sent, float(t)
    horizon = t + quantum
    j = sent + 1
    while j < n:
        x = times[j]
        if x != x or x > horizon:
            break
        j += 1
    last = float(times[j - 1])
    if last > now:
        return sent, last
    return j, math.inf


#: `rack serve` warns when the pacing lateness's p99 exceeds this share of the ITL it
#: emulates (in wall seconds): a client then measures ITLs more than 5 % off rack's
#: own, the tolerance docs/serve.md's agreement figures are stated in.
LATENESS_WARN_SHARE = 0.05


def lateness_line(window: dict, period_s: float, share: float = LATENESS_WARN_SHARE) -> str | None:
    """The line `rack serve` prints for a `LiveFront.pacing_window()` (None when no
    streamed response was recorded in it); it starts with "WARNING" when the p99
    lateness exceeds `share` of the emulated ITL x dilation."""
    if not window.get("chunks"):
        return None
    ms = lambda x: f"{x * 1e3:.2f} ms"  # noqa: E731
    itl = window.get("itl_wall_s")
    line = (f"pacing over the last {period_s:g} s: {window['chunks']} chunks of {window['responses']} streamed "
            f"response(s) left the front late by p50 {ms(window['p50_s'])}, p99 {ms(window['p99_s'])}, "
            f"max {ms(window['max_s'])}" + (f" (the emulated ITL is {ms(itl)} of wall time)" if itl else ""))
    if itl and window["p99_s"] > share * itl:
        return (f"WARNING: {line}; p99 is more than {share:.0%} of the ITL: clients measure the host's delays, "
                "raise --dilation (docs/serve.md: choosing a dilation)")
    return line


__all__ = ["LATENESS_WARN_SHARE", "lateness_line", "next_chunk"]
