"""Open-loop arrival processes (seeded): Poisson, Gamma (a CV, or vLLM's burstiness),
Weibull and constant rate, stationary or with a piecewise-constant rate schedule.

Every process is a renewal process: independent inter-arrival gaps with mean
1/rate_per_s and a shape that sets their coefficient of variation (CV). Each class
draws `unit_gaps` (mean 1, the shape only); `gaps` divides them by the rate, so one
shape serves every window of a rate schedule (`with_rate`).

`arrival_times` puts the first request at t = 0 s (a replay starts with traffic, not
with an idle gap). `window_times` fills one window [start, end) of a schedule, either
with exactly round(rate x length) arrivals (`exact=True`, as ServeGen and vLLM's
`bench serve` normalise theirs) or as a stationary renewal process whose count varies
with sampling error. The closed-loop (fixed concurrency) source lives in
`workloads.synth.ClosedLoopSource` because its arrivals depend on completions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .bounds import MAX_GAMMA_CV


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


class _Renewal:
    """Shared behaviour: gaps = unit_gaps / rate, the same shape at another rate."""

    rate_per_s: float

    def unit_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def unit_residual(self, rng: np.random.Generator) -> float:  # pragma: no cover
        """One draw of the time from a random instant to the next arrival (mean-1 gaps):
        the equilibrium first gap that makes a renewal process stationary, U x L with L
        the length-biased gap and U uniform on [0, 1) (Cox, Renewal Theory, 1962, 5.2)."""
        raise NotImplementedError

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n inter-arrival gaps (s), shape (n,), mean 1/rate_per_s."""
        return self.unit_gaps(n, rng) / self.rate_per_s

    def with_rate(self, rate_per_s: float):
        """The same gap shape (CV) at another rate (req/s)."""
        return replace(self, rate_per_s=rate_per_s)


@dataclass(frozen=True)
class PoissonArrivals(_Renewal):
    """Poisson arrivals: exponential gaps with mean 1/rate_per_s (CV = 1)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def unit_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.exponential(1.0, n)

    def unit_residual(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(1.0))  # memoryless


@dataclass(frozen=True)
class GammaArrivals(_Renewal):
    """Gamma-distributed gaps with mean 1/rate_per_s and coefficient of variation `cv`.

    shape k = 1/cv^2, scale = 1/(rate_per_s * k). cv = 1 is Poisson; cv > 1 is bursty
    (BurstGPT fits Gamma gaps, Wang et al. 2024, arXiv:2401.17644); cv < 1 is smoother.
    vLLM's `bench serve --burstiness b` is this process with k = b, i.e. cv = 1/sqrt(b)
    (`from_burstiness`).
    """

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)
        if _positive("cv", self.cv) > MAX_GAMMA_CV:
            raise ValueError(f"cv of Gamma gaps must be at most {MAX_GAMMA_CV:g} (shape 1/cv^2 >= 0.01; "
                             f"below it the draws underflow to 0), got {self.cv:g}")

    @classmethod
    def from_burstiness(cls, rate_per_s: float, burstiness: float) -> "GammaArrivals":
        """vLLM's parameterisation (benchmarks/serve.py): gaps Gamma(shape=burstiness,
        scale=1/(rate*burstiness)); burstiness < 1 is burstier than Poisson. Raises
        ValueError below 1/MAX_GAMMA_CV^2 (0.01)."""
        b = _positive("burstiness", burstiness)
        if b < 1.0 / MAX_GAMMA_CV**2:
            raise ValueError(f"burstiness must be at least {1.0 / MAX_GAMMA_CV**2:g} (a Gamma shape below it "
                             f"underflows numpy's draws to 0), got {b:g}")
        return cls(rate_per_s, 1.0 / math.sqrt(b))

    def unit_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        k = 1.0 / (self.cv * self.cv)
        return rng.gamma(k, 1.0 / k, n)

    def unit_residual(self, rng: np.random.Generator) -> float:
        k = 1.0 / (self.cv * self.cv)
        return float(rng.random() * rng.gamma(k + 1.0, 1.0 / k))  # length-biased Gamma(k+1)


def weibull_cv(shape: float) -> float:
    """CV of a Weibull distribution with shape k: sqrt(G(1+2/k) / G(1+1/k)^2 - 1)."""
    k = _positive("shape", shape)
    return math.sqrt(math.expm1(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)))


def weibull_shape(cv: float) -> float:
    """The Weibull shape k whose CV is `cv` (bisection on log k; the CV falls as k grows).
    Raises ValueError outside the representable range (about 0.03 to 500)."""
    cv = _positive("cv", cv)
    lo, hi = 0.05, 1000.0
    if not weibull_cv(hi) <= cv <= weibull_cv(lo):
        raise ValueError(f"a Weibull CV must be between {weibull_cv(hi):.3g} and "
                         f"{weibull_cv(lo):.3g}, got {cv}")
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if weibull_cv(mid) > cv:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


@dataclass(frozen=True)
class WeibullArrivals(_Renewal):
    """Weibull-distributed gaps with mean 1/rate_per_s and shape k (give `shape`, or
    `cv` and k is solved for). k < 1 is bursty (ServeGen fits Weibull or Gamma gaps per
    client and 10-minute window: Xiang et al., NSDI 2026); k = 1 is Poisson.
    scale = 1/(rate_per_s * G(1 + 1/k)) so the mean gap is 1/rate_per_s."""

    rate_per_s: float
    shape: float | None = None
    cv: float | None = None

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)
        if (self.shape is None) == (self.cv is None):
            raise ValueError("Weibull arrivals need exactly one of shape or cv")
        if self.shape is None:
            object.__setattr__(self, "shape", weibull_shape(self.cv))
        else:
            _positive("shape", self.shape)
        object.__setattr__(self, "cv", weibull_cv(self.shape))

    def with_rate(self, rate_per_s: float) -> "WeibullArrivals":
        return WeibullArrivals(rate_per_s, shape=self.shape)

    def unit_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        k = self.shape
        return rng.weibull(k, n) / math.gamma(1 + 1 / k)

    def unit_residual(self, rng: np.random.Generator) -> float:
        # length-biased Weibull: L^k ~ Gamma(1 + 1/k), in units of the Weibull scale
        k = self.shape
        length = rng.gamma(1 + 1 / k) ** (1 / k) / math.gamma(1 + 1 / k)
        return float(rng.random() * length)


@dataclass(frozen=True)
class ConstantArrivals(_Renewal):
    """Evenly spaced arrivals, one every 1/rate_per_s seconds (CV = 0)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def unit_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.ones(n)

    def unit_residual(self, rng: np.random.Generator) -> float:
        return float(rng.random())


ArrivalProcess = PoissonArrivals | GammaArrivals | WeibullArrivals | ConstantArrivals


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


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
    rng = _rng(seed)
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


def window_times(process: ArrivalProcess, start_s: float, end_s: float, *,
                 exact: bool = True, seed: int | np.random.Generator = 0) -> np.ndarray:
    """Arrival times (s) in [start_s, end_s) at `process`'s rate and gap shape, sorted.

    exact=True: exactly round(rate x (end - start)) arrivals; the window is cut into
      that many + 1 gaps drawn from the process and scaled to fill it (for Poisson
      this is a Poisson process conditioned on its count). A schedule's per-window
      rate is then reproduced to within one request, as a characterisation measured
      it; the gap shape is kept, bursts do not cross window edges. ServeGen's
      generator and vLLM's `bench serve` normalise their gaps the same way.
    exact=False: a stationary renewal process (first gap from the equilibrium
      residual, `unit_residual`), so the expected count is exactly rate x length and
      the realised count varies with sampling error (a lot when CV >> 1).
    Raises ValueError if end_s < start_s.
    """
    if not end_s >= start_s:
        raise ValueError(f"window end ({end_s} s) must not be before its start ({start_s} s)")
    rng = _rng(seed)
    length = end_s - start_s
    if exact:
        n = int(round(process.rate_per_s * length))
        if n == 0:
            return np.zeros(0)
        g = process.unit_gaps(n + 1, rng)
        c = np.cumsum(g)
        return start_s + length * c[:-1] / c[-1]
    first = process.unit_residual(rng) / process.rate_per_s
    if first >= length:
        return np.zeros(0)
    rest = arrival_times(process, duration_s=length - first, seed=rng)
    return start_s + first + rest
