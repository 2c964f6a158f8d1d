"""The Ray runtime's pace: which dilations it accepts, how long a replay may take, and
how long an actor may stay silent before the driver calls it hung.

On Ray, emulated time is the wall clock divided by the dilation d (wall seconds per
emulated second, `rack.runtime.ray_runtime`). Three limits follow from that, each with
its reason, all checked before any actor exists:

- `DILATION_MIN`: the emulated clock reads `(time.time() - epoch) / d`. `time.time()` is
  a float64 count of seconds since 1970, spaced 2^-22 s (0.24 us) until January 2038 and
  2^-21 s (0.48 us) from then to 2106; divided by d, that spacing must stay within the
  1 us every run promises (`workloads.clock.RESOLUTION_S`), so d >= 0.48, rounded up
  to 0.5. (`--dilation 1e-320` used to pass "finite > 0" and made every emulated time
  infinite.)
- `DILATION_MAX`: at 10^6 one emulated millisecond (about one decode step) takes 17
  minutes of wall time. Fidelity stops improving long before: an event loop's timers
  are late by ~0.05 ms median and a few ms at worst (`reference/ray-notes.md`), which
  is already under 0.01 us of emulated time at d = 10^6; a larger d only makes a run
  that never ends.
- `MAX_REPLAY_WALL_S`: the arrivals alone take `span x d` wall seconds; a run whose
  arrivals would take more than a week is refused unless a timeout is given (the
  default deadline, `replay_timeout_s`, grows with that product and would otherwise be
  effectively infinite, as `--dilation 1e300` made it).

`liveness_timeout_s` is how long the driver waits for an actor's answer before it
calls the actor hung (`rack.runtime.ray_runtime`): the longer of `LIVENESS_FLOOR_S`
(a loaded host can starve a healthy process for seconds) and `LIVENESS_TPOTS` TPOT
targets of emulated time at the run's dilation (an actor silent that long has already
made every request it serves miss its SLO several times over).

No Ray import here: the scenario's validation and the CLI use these checks.
"""

from __future__ import annotations

import math

from workloads.clock import RESOLUTION_S

DILATION_MIN = 0.5
"""Smallest dilation (wall s per emulated s): the wall clock's float64 spacing until
2106 (2^-21 s) over `RESOLUTION_S`, 0.477, rounded up (module docstring)."""
DILATION_MAX = 1e6
"""Largest dilation: one emulated ms is 17 wall minutes (module docstring)."""
MAX_REPLAY_WALL_S = 7 * 86400.0
"""Wall seconds the arrivals of a Ray run may span without an explicit timeout (a week)."""
LIVENESS_FLOOR_S = 30.0
"""Wall seconds an actor may take to answer the driver, at least."""
LIVENESS_TPOTS = 10
"""TPOT targets of emulated time an actor may stay silent (module docstring)."""

assert DILATION_MIN >= math.ulp(2.0 ** 31) / RESOLUTION_S


def dilation_error(value: float) -> str | None:
    """Why `value` is not an acceptable dilation (one line with the limit's reason,
    without the value: the caller names it), or None when it is."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        return "expected a finite number of wall seconds per emulated second > 0"
    if value < DILATION_MIN:
        return (f"must be at least {DILATION_MIN:g} wall seconds per emulated second: below it the wall clock "
                f"(float64 seconds since 1970, spaced up to {math.ulp(2.0 ** 31) * 1e6:.2f} us) would no "
                f"longer resolve {RESOLUTION_S * 1e6:g} us of emulated time")
    if value > DILATION_MAX:
        return (f"must be at most {DILATION_MAX:g} wall seconds per emulated second: above it one emulated "
                f"millisecond takes more than {DILATION_MAX * 1e-3 / 60:.0f} minutes of wall time, with no gain in "
                "fidelity (host jitter is already negligible at 1,000)")
    return None


def replay_error(span_s: float, dilation: float, timeout_s: float | None) -> str | None:
    """Why a Ray replay whose arrivals span `span_s` emulated seconds at `dilation`
    cannot be run without a deadline (None: it can): more than `MAX_REPLAY_WALL_S` of
    wall time for the arrivals alone, when no `timeout_s` is given."""
    wall = span_s * dilation
    if timeout_s is not None or wall <= MAX_REPLAY_WALL_S:
        return None
    return (f"at dilation {dilation:g} the arrivals ({span_s:.4g} s of emulated time) take "
            f"{wall / 86400:.3g} days of wall time, more than the {MAX_REPLAY_WALL_S / 86400:.0f}-day limit of a "
            "Ray run: lower the dilation, replay part of the trace (--window), use the virtual runtime, or give "
            "a timeout (--timeout) to run it anyway")


def replay_timeout_s(span_s: float, dilation: float) -> float:
    """Default wall-clock limit of a Ray replay: 600 s (start-up, the last requests'
    service, gathering) plus 4x the arrivals' wall span (a rack overloaded by up to
    4x still finishes)."""
    return 600.0 + 4.0 * span_s * dilation


def liveness_timeout_s(dilation: float, tpot_s: float | None) -> float:
    """Wall seconds the driver waits for an actor's answer before calling it hung:
    max(`LIVENESS_FLOOR_S`, `LIVENESS_TPOTS` x `tpot_s` x `dilation`); `tpot_s`: the
    run's TPOT target (None: the floor)."""
    if tpot_s is None or not math.isfinite(tpot_s) or tpot_s <= 0:
        return LIVENESS_FLOOR_S
    return max(LIVENESS_FLOOR_S, LIVENESS_TPOTS * tpot_s * dilation)


__all__ = ["DILATION_MAX", "DILATION_MIN", "LIVENESS_FLOOR_S", "LIVENESS_TPOTS", "MAX_REPLAY_WALL_S",
           "dilation_error", "liveness_timeout_s", "replay_error", "replay_timeout_s"]
