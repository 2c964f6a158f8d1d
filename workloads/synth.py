"""Synthetic workloads: arrivals x lengths -> `Request`s, and closed-loop sources.

Seeding: one integer seed makes a workload reproducible bit for bit. It is split
(numpy ``SeedSequence.spawn``) into independent streams for arrivals and lengths, so
changing the length distribution does not move the arrival times and vice versa.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrivals import (ArrivalProcess, ConstantArrivals, GammaArrivals, PoissonArrivals,
                       arrival_times)
from .lengths import (EmpiricalLengths, FixedLengths, LengthDistribution, LogNormalLengths,
                      UniformLengths)
from .request import Request


def _streams(seed: int, k: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]


def synthesize(arrivals: ArrivalProcess, lengths: LengthDistribution, *, n: int | None = None,
               duration_s: float | None = None, seed: int = 0, block_size: int = 512,
               tenant: str | None = None, slo_class: str | None = None) -> list[Request]:
    """Requests with arrival times from `arrivals` and lengths from `lengths`.

    Give `n` and/or `duration_s` (see `arrival_times`). Ids are 0..count-1 in arrival
    order; the first request arrives at 0 s; no block hashes (see
    `workloads.prefix.shared_prefix_requests` for prefix sharing). Raises ValueError
    on bad parameters.
    """
    rng_arrivals, rng_lengths = _streams(seed, 2)
    times = arrival_times(arrivals, n=n, duration_s=duration_s, seed=rng_arrivals)
    prompt, output = lengths.sample(times.size, rng_lengths)
    return [Request(i, t, p, o, None, block_size, tenant, slo_class)
            for i, (t, p, o) in enumerate(zip(times.tolist(), prompt.tolist(), output.tolist()))]


class ClosedLoopSource:
    """Closed-loop (fixed concurrency) arrivals: `concurrency` simulated users, each
    sending its next request `think_time_s` after its previous one completes.

    The runtime drives it: `start(t)` returns the first requests (all arriving at t),
    then every completion at time t calls `on_complete(t)`, which returns the next
    request (arriving at t + think time) or None when `n_requests` have been issued.
    Lengths and think times are drawn up front per request index, so the workload
    does not depend on completion order. think_time_s is the mean of an exponential
    think time, or a fixed one with ``think_time="fixed"``.
    """

    def __init__(self, concurrency: int, lengths: LengthDistribution, n_requests: int, *,
                 think_time_s: float = 0.0, think_time: str = "exponential", seed: int = 0,
                 block_size: int = 512, tenant: str | None = None,
                 slo_class: str | None = None) -> None:
        if int(concurrency) != concurrency or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency}")
        if int(n_requests) != n_requests or n_requests < 1:
            raise ValueError(f"n_requests must be an integer >= 1, got {n_requests}")
        if not think_time_s >= 0:
            raise ValueError(f"think_time_s must be >= 0, got {think_time_s}")
        if think_time not in ("exponential", "fixed"):
            raise ValueError(f"think_time must be 'exponential' or 'fixed', got {think_time!r}")
        self.concurrency = int(concurrency)
        self.n_requests = int(n_requests)
        rng_lengths, rng_think = _streams(seed, 2)
        prompt, output = lengths.sample(self.n_requests, rng_lengths)
        self._prompt, self._output = prompt.tolist(), output.tolist()
        if think_time_s == 0:
            self._think = [0.0] * self.n_requests
        elif think_time == "fixed":
            self._think = [float(think_time_s)] * self.n_requests
        else:
            self._think = rng_think.exponential(think_time_s, self.n_requests).tolist()
        self._block_size, self._tenant, self._slo = block_size, tenant, slo_class
        self.issued = 0
        self.completed = 0
        self._started = False

    @property
    def outstanding(self) -> int:
        """Requests issued and not yet completed."""
        return self.issued - self.completed

    @property
    def done(self) -> bool:
        """True when every request has been issued and completed."""
        return self.completed >= self.n_requests

    def _issue(self, t: float) -> Request:
        i = self.issued
        self.issued += 1
        return Request(i, t, self._prompt[i], self._output[i], None, self._block_size,
                       self._tenant, self._slo)

    def start(self, t: float = 0.0) -> list[Request]:
        """The first min(concurrency, n_requests) requests, all arriving at `t` (s).
        Raises RuntimeError if called twice."""
        if self._started:
            raise RuntimeError("ClosedLoopSource.start() was already called")
        self._started = True
        return [self._issue(t) for _ in range(min(self.concurrency, self.n_requests))]

    def on_complete(self, t: float) -> Request | None:
        """Record one completion at time `t` (s); return the user's next request
        (arriving at t + think time) or None if all have been issued.
        Raises RuntimeError if more completions than issued requests are reported."""
        if self.completed >= self.issued:
            raise RuntimeError("on_complete() called more often than requests were issued")
        self.completed += 1
        if self.issued >= self.n_requests:
            return None
        return self._issue(t + self._think[self.issued])


_ARRIVALS = {"poisson": PoissonArrivals, "gamma": GammaArrivals, "constant": ConstantArrivals}
_LENGTHS = {"fixed": FixedLengths, "uniform": UniformLengths, "lognormal": LogNormalLengths}


def make_arrivals(kind: str, **params: Any) -> ArrivalProcess:
    """An arrival process from a config: ``make_arrivals("gamma", rate_per_s=5, cv=2)``.

    Kinds: poisson(rate_per_s), gamma(rate_per_s, cv), constant(rate_per_s).
    Raises ValueError for an unknown kind or bad parameters.
    """
    cls = _ARRIVALS.get(kind.lower())
    if cls is None:
        raise ValueError(f"unknown arrival process {kind!r}; known: {', '.join(_ARRIVALS)} "
                         "(closed-loop: ClosedLoopSource)")
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"arrival process {kind!r}: {e}") from None


def make_lengths(kind: str, **params: Any) -> LengthDistribution:
    """A length distribution from a config: ``make_lengths("lognormal", prompt_mean=...)``.

    Kinds: fixed(prompt_tokens, output_tokens), uniform(prompt_min, prompt_max,
    output_min, output_max), lognormal(prompt_mean, prompt_cv, output_mean, output_cv
    [, prompt_max, output_max]), empirical(trace=NAME|PATH[, format, mapping]).
    Raises ValueError for an unknown kind or bad parameters, TraceError for a bad trace.
    """
    kind = kind.lower()
    if kind == "empirical":
        params = dict(params)
        trace = params.pop("trace", None)
        if trace is None:
            raise ValueError("empirical lengths need trace=NAME|PATH")
        return EmpiricalLengths.from_trace(trace, **params)
    cls = _LENGTHS.get(kind)
    if cls is None:
        raise ValueError(f"unknown length distribution {kind!r}; known: "
                         f"{', '.join([*_LENGTHS, 'empirical'])}")
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"length distribution {kind!r}: {e}") from None
