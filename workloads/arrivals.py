"""Open-loop arrival processes (seeded): Poisson, Gamma with a burstiness CV, constant rate.

Each process draws inter-arrival gaps; `arrival_times` turns them into times with the
first request at t = 0 s (a replay starts with traffic, not with an idle gap). The
closed-loop (fixed concurrency) source lives in `workloads.synth.ClosedLoopSource`
because its arrivals depend on completions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


@dataclass(frozen=True)
class PoissonArrivals:
    """Poisson arrivals: exponential gaps with mean 1/rate_per_s (CV = 1)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n inter-arrival gaps (s), shape (n,)."""
        return rng.exponential(1.0 / self.rate_per_s, n)


@dataclass(frozen=True)
class GammaArrivals:
    """Gamma-distributed gaps with mean 1/rate_per_s and coefficient of variation `cv`.

    shape k = 1/cv^2, scale = 1/(rate_per_s * k). cv = 1 is Poisson; cv > 1 is bursty
    (BurstGPT fits Gamma gaps, Wang et al. 2024, arXiv:2401.17644); cv < 1 is smoother.
    """

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)
        _positive("cv", self.cv)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n inter-arrival gaps (s), shape (n,)."""
        k = 1.0 / (self.cv * self.cv)
        return rng.gamma(k, 1.0 / (self.rate_per_s * k), n)


@dataclass(frozen=True)
class ConstantArrivals:
    """Evenly spaced arrivals, one every 1/rate_per_s seconds (CV = 0)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n inter-arrival gaps (s), shape (n,)."""
        return np.full(n, 1.0 / self.rate_per_s)


ArrivalProcess = PoissonArrivals | GammaArrivals | ConstantArrivals


def arrival_times(process: ArrivalProcess, *, n: int | None = None,
                  duration_s: float | None = None,
                  seed: int | np.random.Generator = 0) -> np.ndarray:
    """Arrival times (s), non-decreasing, first at 0.0, shape (count,).

    Give `n` (exactly n arrivals), `duration_s` (every arrival before it), or both
    (whichever ends first). Raises ValueError if neither is given or one is negative.
    """
    if n is None and duration_s is None:
        raise ValueError("give n (number of requests) or duration_s (seconds), or both")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if duration_s is not None and not duration_s >= 0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if duration_s is None:
        assert n is not None
        if n == 0:
            return np.zeros(0)
        return np.concatenate(([0.0], np.cumsum(process.gaps(n - 1, rng))))
    times = [np.zeros(1)]
    last, have = 0.0, 1
    chunk = max(16, int(duration_s * process.rate_per_s * 1.1) + 16)
    while last < duration_s and (n is None or have < n):
        t = last + np.cumsum(process.gaps(chunk, rng))
        times.append(t)
        last, have = float(t[-1]), have + chunk
    out = np.concatenate(times)
    out = out[out < duration_s] if duration_s > 0 else out[:0]
    return out if n is None else out[:n]
