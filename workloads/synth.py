"""Synthetic workloads: arrivals x lengths -> `Request`s, and closed loops (`ClosedLoop`,
`ClosedLoopSource`).

Seeding: one integer seed makes a workload reproducible bit for bit. It is split
(numpy ``SeedSequence.spawn``) into independent streams for arrivals and lengths, so
changing the length distribution does not move the arrival times and vice versa.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .arrivals import (ArrivalProcess, ConstantArrivals, GammaArrivals, PoissonArrivals,
                       WeibullArrivals, arrival_times)
from .lengths import (EmpiricalLengths, FixedLengths, LengthDistribution, LogNormalLengths,
                      UniformLengths)
from .request import Request


#: Most requests one synthetic source may generate (about 14 days of the ~1.4 million
#: requests a day of production traffic holds, Azure LLM inference trace 2024): more
#: would not fit in memory before the replay started (each request is a Python object).
MAX_GENERATED_REQUESTS = 20_000_000


def check_generated(expected: float, what: str) -> None:
    """Raise ValueError naming `what` (e.g. "num-prompts 1e9") when `expected` requests
    are more than `MAX_GENERATED_REQUESTS`; called before anything is drawn."""
    if not expected <= MAX_GENERATED_REQUESTS:
        raise ValueError(f"{what} would generate about {expected:.3g} requests; at most "
                         f"{MAX_GENERATED_REQUESTS:,} can be generated")


def _streams(seed: int, k: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]


def synthesize_columns(arrivals: ArrivalProcess | None, lengths: LengthDistribution, *,
                       n: int | None = None, duration_s: float | None = None,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival times s, prompt tokens, output tokens), shape (count,) each: the
    columns of `synthesize`'s requests, drawn the same way, without a `Request` made.
    Raises ValueError on bad parameters."""
    rng_arrivals, rng_lengths = _streams(seed, 2)
    if arrivals is None:
        if n is None:
            raise ValueError("an infinite request rate needs n (the number of requests)")
        times = np.zeros(int(n))
    else:
        times = arrival_times(arrivals, n=n, duration_s=duration_s, seed=rng_arrivals)
    prompt, output = lengths.sample(times.size, rng_lengths)
    return times, prompt, output


def synthesize(arrivals: ArrivalProcess | None, lengths: LengthDistribution, *, n: int | None = None,
               duration_s: float | None = None, seed: int = 0, block_size: int = 512,
               tenant: str | None = None, slo_class: str | None = None) -> list[Request]:
    """Requests with arrival times from `arrivals` and lengths from `lengths`.

    Give `n` and/or `duration_s` (see `arrival_times`); arrivals=None sends all `n`
    at 0 s (an infinite request rate). Ids are 0..count-1 in arrival
    order; the first request arrives at 0 s; no block hashes (see
    `workloads.prefix.shared_prefix_requests` for prefix sharing). Raises ValueError
    on bad parameters.
    """
    times, prompt, output = synthesize_columns(arrivals, lengths, n=n, duration_s=duration_s, seed=seed)
    return [Request(i, t, p, o, None, block_size, tenant, slo_class)
            for i, (t, p, o) in enumerate(zip(times.tolist(), prompt.tolist(), output.tolist()))]


@dataclass(frozen=True)
class ClosedLoop:
    """A closed-loop load: `requests` sent in order with at most `concurrency` of them
    in the rack at once (vLLM `bench serve --max-concurrency`).

    Request i is sent at the later of its own `arrival_s` (its open-loop arrival: all
    0.0 for a pure closed loop, as vLLM's default --request-rate inf) and the moment a
    slot frees: a completion plus a think time (exponential with mean `think_time_s`,
    or fixed with ``think_time="fixed"``; 0 for none). Lengths, hashes and labels are
    the requests'. Plain data (picklable); `source()` gives the stateful cursor a
    runtime drives. Raises ValueError on bad parameters.
    """

    requests: tuple[Request, ...]
    concurrency: int
    think_time_s: float = 0.0
    think_time: str = "exponential"
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError("a closed loop needs at least one request")
        if isinstance(self.concurrency, bool) or int(self.concurrency) != self.concurrency \
                or self.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {self.concurrency}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think_time_s must be a finite number >= 0, got {self.think_time_s}")
        if self.think_time not in ("exponential", "fixed"):
            raise ValueError(f"think_time must be 'exponential' or 'fixed', got {self.think_time!r}")
        times = [r.arrival_s for r in self.requests]
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError("a closed loop's requests must be in arrival order")

    def source(self) -> "ClosedLoopSource":
        """A fresh `ClosedLoopSource` over these requests."""
        return ClosedLoopSource.from_requests(self.requests, self.concurrency,
                                              think_time_s=self.think_time_s,
                                              think_time=self.think_time, seed=self.seed)

    def describe(self) -> dict:
        """JSON-ready summary (for a run's provenance)."""
        return {"max_concurrency": self.concurrency, "think_time_s": self.think_time_s,
                "think_time": self.think_time, "requests": len(self.requests)}


class ClosedLoopSource:
    """Closed-loop (fixed concurrency) arrivals: `concurrency` simulated users, each
    sending its next request `think_time_s` after its previous one completes.

    The runtime drives it: `start(t)` returns the first requests (arriving at t, or
    later when a request's own arrival_s is later), then every completion at time t
    calls `on_complete(t)`, which returns the next request (arriving at t + think
    time, or at its own arrival_s if later) or None when all have been issued.
    Requests (lengths, hashes) and think times are fixed up front per request index,
    so the workload does not depend on completion order. think_time_s is the mean of
    an exponential think time, or a fixed one with ``think_time="fixed"``.

    Build it from a length distribution (`ClosedLoopSource(concurrency, lengths,
    n_requests)`: every request's own arrival is 0) or from given requests in order
    (`from_requests`, or `ClosedLoop.source()`).
    """

    def __init__(self, concurrency: int, lengths: LengthDistribution | None, n_requests: int, *,
                 think_time_s: float = 0.0, think_time: str = "exponential", seed: int = 0,
                 block_size: int = 512, tenant: str | None = None,
                 slo_class: str | None = None,
                 requests: Sequence[Request] | None = None) -> None:
        if int(n_requests) != n_requests or n_requests < 1:
            raise ValueError(f"n_requests must be an integer >= 1, got {n_requests}")
        rng_lengths, rng_think = _streams(seed, 2)
        if requests is None:
            if lengths is None:
                raise ValueError("give a length distribution or the requests")
            prompt, output = lengths.sample(int(n_requests), rng_lengths)
            requests = [Request(i, 0.0, p, o, None, block_size, tenant, slo_class)
                        for i, (p, o) in enumerate(zip(prompt.tolist(), output.tolist()))]
        # ClosedLoop validates the parameters and the order, in one place
        spec = ClosedLoop(tuple(requests), concurrency, think_time_s, think_time, seed)
        self.concurrency = spec.concurrency
        self.n_requests = len(spec.requests)
        self._requests = spec.requests
        if think_time_s == 0:
            self._think = [0.0] * self.n_requests
        elif think_time == "fixed":
            self._think = [float(think_time_s)] * self.n_requests
        else:
            self._think = rng_think.exponential(think_time_s, self.n_requests).tolist()
        self.issued = 0
        self.completed = 0
        self._started = False

    @classmethod
    def from_requests(cls, requests: Sequence[Request], concurrency: int, *,
                      think_time_s: float = 0.0, think_time: str = "exponential",
                      seed: int = 0) -> "ClosedLoopSource":
        """A source that issues `requests` (in arrival order) in order."""
        return cls(concurrency, None, len(requests), think_time_s=think_time_s,
                   think_time=think_time, seed=seed, requests=requests)

    @property
    def outstanding(self) -> int:
        """Requests issued and not yet completed."""
        return self.issued - self.completed

    @property
    def done(self) -> bool:
        """True when every request has been issued and completed."""
        return self.completed >= self.n_requests

    def _issue(self, t: float) -> Request:
        r = self._requests[self.issued]
        self.issued += 1
        if r.arrival_s >= t:
            return r
        return Request(r.id, t, r.prompt_tokens, r.output_tokens, r.block_hashes, r.block_size,
                       r.tenant, r.slo_class, r.reasoning_tokens, r.turn)

    def start(self, t: float = 0.0) -> list[Request]:
        """The first min(concurrency, n_requests) requests, arriving at `t` (s) or at
        their own arrival_s if later. Raises RuntimeError if called twice."""
        if self._started:
            raise RuntimeError("ClosedLoopSource.start() was already called")
        self._started = True
        return [self._issue(t) for _ in range(min(self.concurrency, self.n_requests))]

    def on_complete(self, t: float) -> Request | None:
        """Record one completion at time `t` (s); return the user's next request
        (arriving at t + think time, or its own arrival_s if later) or None if all
        have been issued. Raises RuntimeError if more completions than issued
        requests are reported."""
        if self.completed >= self.issued:
            raise RuntimeError("on_complete() called more often than requests were issued")
        self.completed += 1
        if self.issued >= self.n_requests:
            return None
        return self._issue(t + self._think[self.issued])


_ARRIVALS = {"poisson": PoissonArrivals, "gamma": GammaArrivals, "weibull": WeibullArrivals,
             "constant": ConstantArrivals}
_LENGTHS = {"fixed": FixedLengths, "uniform": UniformLengths, "lognormal": LogNormalLengths}


def make_arrivals(kind: str, **params: Any) -> ArrivalProcess:
    """An arrival process from a config: ``make_arrivals("gamma", rate_per_s=5, cv=2)``.

    Kinds: poisson(rate_per_s), gamma(rate_per_s, cv), weibull(rate_per_s, shape or
    cv), constant(rate_per_s).
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
