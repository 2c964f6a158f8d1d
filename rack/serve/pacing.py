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


#: `rack serve` warns when what a client measures (its median TTFT or time per output
#: token) is more than this share off rack's own records x dilation: the tolerance
#: docs/serve.md's agreement figures are stated in.
AGREEMENT_WARN_SHARE = 0.05


def agreement_line(agreement: dict, over: str, share: float = AGREEMENT_WARN_SHARE) -> str:
    """How far what clients measured is from rack's records x dilation
    (`rack.serve.runs.client_agreement`), over `over` ("the last 10 s"); it starts with
    "WARNING" when the median TTFT or time per output token is more than `share` off:
    a client's report then measures the host's delays, not the emulated rack's."""
    pct = lambda x: "n/a" if x is None else f"{x:+.1%}"  # noqa: E731
    line = (f"clients over {over}: {agreement['compared']} streamed response(s) measured TTFT "
            f"{pct(agreement.get('ttft_dev'))}, time per output token {pct(agreement.get('tpot_dev'))} off rack's "
            "records x dilation (medians)")
    worst = max((abs(d) for d in (agreement.get("ttft_dev"), agreement.get("tpot_dev")) if d is not None),
                default=0.0)
    if worst > share:
        return (f"WARNING: {line}; more than {share:.0%} off: clients measure the host's delays, "
                "raise --dilation (docs/serve.md: choosing a dilation)")
    return line


def lateness_line(window: dict, period_s: float, share: float = AGREEMENT_WARN_SHARE) -> str | None:
    """The line `rack serve` prints for a `LiveFront.pacing_window()` (None when no
    streamed response was recorded in it): `agreement_line` over the window, judged
    on what a client can observe (the median TTFT, HTTP receipt to the first chunk, and
    time per output token, first to last chunk over the tokens after the first,
    measured at the front as the chunks leave, against rack's recorded ones x
    dilation), then the chunks' lateness (each chunk's send time after its tokens'
    emulated time) for information: a steady lateness shifts every token alike and
    leaves the gaps a client measures unchanged."""
    if not window.get("chunks"):
        return None
    ms = lambda x: f"{x * 1e3:.2f} ms"  # noqa: E731
    return (agreement_line(window, f"the last {period_s:g} s", share)
            + f"; chunks left late by p50 {ms(window['p50_s'])}, p99 {ms(window['p99_s'])}, max {ms(window['max_s'])}")


__all__ = ["AGREEMENT_WARN_SHARE", "agreement_line", "lateness_line", "next_chunk"]
