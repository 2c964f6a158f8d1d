"""The router component: replays the request stream at its arrival times, admits or
rejects each request, and dispatches it to a prefill instance and a decode target.

Policies (`RouterConfig.policy`):
- "round_robin": prefill instances in turn;
- "least_outstanding_work": the instance with the fewest prompt tokens still to
  prefill (queried from the instances once per arrival tick, then updated locally as
  the tick's requests are placed, so one tick costs one query per instance).
Admission: a request is rejected ("router_queue_full") when every prefill instance
already has more than `max_outstanding_tokens` prompt tokens of work outstanding (the
instances' loads are queried once per arrival tick and updated locally within it).
Conditional disaggregation: a prompt of at most `local_prefill_threshold_tokens`
tokens goes to a colocated ("both") instance instead, which prefills and decodes it.
Decode targets are chosen round-robin.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Mapping, Sequence


class Router:
    """Replays requests and routes them.

    Keyword args:
        clock: the run's Clock.
        collector: collector handle (`event`, `events`, `finish`).
        prefill: prefill-capable instance handles by name (`submit(req, decode_target)`,
            `outstanding_tokens()`).
        decode_targets: names of decode instances a prefill instance may ship KV to.
        local: colocated instance handles by name, for conditional disaggregation.
        policy: "round_robin" or "least_outstanding_work".
        max_outstanding_tokens: per-instance outstanding prompt tokens above which an
            arrival is rejected when every instance is above it (>= 1).
        local_prefill_threshold_tokens: prompts up to this length go to `local` (0: off).
    """

    def __init__(self, *, clock, collector, prefill: Mapping[str, Any], decode_targets: Sequence[str],
                 local: Mapping[str, Any] | None = None, policy: str = "least_outstanding_work",
                 max_outstanding_tokens: int = 1 << 40, local_prefill_threshold_tokens: int = 0) -> None:
        if policy not in ("round_robin", "least_outstanding_work"):
            raise ValueError(f"router policy: expected 'round_robin' or 'least_outstanding_work', got {policy!r}")
        if not prefill and not local:
            raise ValueError("router: no prefill-capable instance")
        self.clock = clock
        self.collector = collector
        self.prefill = dict(prefill)
        self.local = dict(local or {})
        self.decode_targets = list(decode_targets)
        self.policy = policy
        self.max_outstanding_tokens = int(max_outstanding_tokens)
        self.threshold = int(local_prefill_threshold_tokens)
        self._rr = itertools.cycle(sorted(self.prefill)) if self.prefill else None
        self._rr_local = itertools.cycle(sorted(self.local)) if self.local else None
        self._rr_decode = itertools.cycle(self.decode_targets) if self.decode_targets else None
        self.dispatched = {name: 0 for name in list(self.prefill) + list(self.local)}
        self.rejected = 0

    async def run(self, requests: Sequence[Any]) -> dict:
        """Submit `requests` (sorted by arrival) at their arrival times; returns counts.

        Requests sharing an arrival time form one tick: one wake-up, one batched
        `arrival` message to the collector, one load query per instance.
        """
        i, n = 0, len(requests)
        while i < n:
            t = requests[i].arrival_s
            j = i
            while j < n and requests[j].arrival_s == t:
                j += 1
            await self.clock.sleep_until(t)
            await self._tick(requests[i:j])
            i = j
        return {"dispatched": dict(self.dispatched), "rejected": self.rejected}

    async def _tick(self, batch: Sequence[Any]) -> None:
        now = self.clock.now()
        await self.collector.events([(r.id, "arrival", now) for r in batch])
        names = sorted(self.prefill)
        values = await asyncio.gather(*(self.prefill[nm].outstanding_tokens() for nm in names))
        load = dict(zip(names, (int(v) for v in values)))
        submits = []
        for req in batch:
            if self._rr_local is not None and (not self.prefill or req.prompt_tokens <= self.threshold):
                name = next(self._rr_local)
                submits.append(self.local[name].submit(req, name))
                self.dispatched[name] += 1
                continue
            if self.policy == "least_outstanding_work":
                name = min(load, key=lambda nm: (load[nm], nm))
            else:
                name = next(self._rr)
            if load[name] > self.max_outstanding_tokens:
                # The least-loaded instance is full, so all are (or round-robin hit a full one).
                if self.policy == "round_robin" and min(load.values()) <= self.max_outstanding_tokens:
                    name = min(load, key=lambda nm: (load[nm], nm))
                else:
                    self.rejected += 1
                    await self.collector.finish(req.id, "rejected", reason="router_queue_full", t=now)
                    continue
            load[name] += req.prompt_tokens
            target = next(self._rr_decode) if self._rr_decode is not None else name
            submits.append(self.prefill[name].submit(req, target))
            self.dispatched[name] += 1
        if submits:
            await asyncio.gather(*submits)
