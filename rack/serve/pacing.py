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


__all__ = ["next_chunk"]
