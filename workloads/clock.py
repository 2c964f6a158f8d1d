"""Emulated time: seconds since the run's epoch, as float64, and the span over which
that keeps its precision.

Cores never read a clock (`workloads.core`): a driver hands them the emulated time.
The virtual driver's time jumps from event to event; the Ray driver's is the wall
clock divided by a dilation factor (see `rack.runtime`).
"""

from __future__ import annotations

import math

RESOLUTION_S = 1e-6
"""The finest emulated-time step the project promises to keep (1 us): TTFT, TPOT and
ITL are differences of emulated times, and decode steps are milliseconds apart."""

MAX_EMULATED_S = 2.0 ** 33
"""Emulated seconds (8.59e9 s, ~272 years) below which a float64 time resolves
`RESOLUTION_S` or better: the spacing of float64 numbers in [2^32, 2^33) is 2^-20 s
(0.95 us), in [2^33, 2^34) 2^-19 s (1.9 us). A trace converted to seconds from its
first row stays far below it; a timestamp read in the wrong unit may not."""


class TimeSpanError(ValueError):
    """Emulated times too large for float64 to resolve `RESOLUTION_S`."""


def check_time_span(t_s: float, what: str = "the last arrival") -> None:
    """Raise TimeSpanError if emulated time `t_s` (s) is at or beyond `MAX_EMULATED_S`
    (or not finite), where float64 time is coarser than `RESOLUTION_S`: a request
    arriving at 1e15 s would show a TTFT of 0.0 s. The message says the resolution
    there and what to do."""
    if math.isfinite(t_s) and abs(t_s) < MAX_EMULATED_S:
        return
    step = math.ulp(t_s) if math.isfinite(t_s) else math.inf
    raise TimeSpanError(
        f"{what} is at {t_s:.4g} s of emulated time, where float64 seconds resolve only "
        f"{step:.3g} s, coarser than {RESOLUTION_S * 1e6:g} us: TTFT, TPOT and ITL would be "
        f"rounded (the limit is {MAX_EMULATED_S:.4g} s, ~272 years); check the trace's time "
        "unit, or replay part of it (--window)")
