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
Before that, at arrival (`rack.admission`): a request over the model's context limit
is rejected ("prompt_exceeds_context", "exceeds_context") or has its output truncated
(`context_overflow = "truncate"`); a request whose KV can never fit any instance it
could go to is rejected ("prompt_exceeds_kv_capacity", "exceeds_decode_kv_capacity"),
so no prefill time is spent on it.
Conditional disaggregation: a prompt of at most `local_prefill_threshold_tokens`
tokens goes to a colocated ("both") instance instead, which prefills and decodes it.
Decode targets are chosen round-robin among those the request fits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from interconnect.component import PeerLost
from rack.admission import KVFit, context_verdict
from rack.faults import retry_on_peer_lost as _retry


class Router:
    """Replays requests and routes them.

    Keyword args:
        clock: the run's Clock.
        collector: collector handle (`event`, `events`, `finish`).
        prefill: prefill-capable instance handles by name (`submit_many([(req,
            decode_target), ...])`, `outstanding_tokens()`).
        decode_targets: names of decode instances a prefill instance may ship KV to.
        local: colocated instance handles by name, for conditional disaggregation.
        policy: "round_robin" or "least_outstanding_work".
        max_outstanding_tokens: per-instance outstanding prompt tokens above which an
            arrival is rejected when every instance is above it (>= 1).
        local_prefill_threshold_tokens: prompts up to this length go to `local` (0: off).
        decoders: decode instance handles by name (`holding`), used only by `recover`.
        max_context_tokens: the model's context limit (the scenario's `max_model_len`
            or the model's own); None: no limit.
        context_overflow: "reject" or "truncate" (`rack.admission.context_verdict`).
        kv_fit: `rack.admission.KVFit` of instances by name (prefill, decode and
            colocated); an instance without one is assumed to fit every request.
    """

    def __init__(self, *, clock, collector, prefill: Mapping[str, Any], decode_targets: Sequence[str],
                 local: Mapping[str, Any] | None = None, policy: str = "least_outstanding_work",
                 max_outstanding_tokens: int = 1 << 40, local_prefill_threshold_tokens: int = 0,
                 decoders: Mapping[str, Any] | None = None, max_context_tokens: int | None = None,
                 context_overflow: str = "reject", kv_fit: Mapping[str, KVFit] | None = None) -> None:
        if context_overflow not in ("reject", "truncate"):
            raise ValueError(f"router context_overflow: expected 'reject' or 'truncate', got {context_overflow!r}")
        self.max_context_tokens = None if max_context_tokens is None else int(max_context_tokens)
        self.context_overflow = context_overflow
        self.kv_fit = dict(kv_fit or {})
        self.truncated = 0
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
        # Fault recovery: where each request was sent (rack.faults, docs/robustness.md).
        self.decoders = dict(decoders or {})
        self._inst_names = sorted(self.prefill) + sorted(self.local)
        self._inst_idx = {n: i for i, n in enumerate(self._inst_names)}
        self._dec_names = list(dict.fromkeys([*self.decode_targets, *sorted(self.local)]))
        self._dec_idx = {n: i for i, n in enumerate(self._dec_names)}
        self._requests: Sequence[Any] = ()
        self._pre_of = np.zeros(0, np.int32)     # per request position: instance index, -1 none
        self._dec_of = np.zeros(0, np.int32)     # per request position: decode target index
        self._pos: dict[int, int] | None = None  # request id -> position (built on first recovery)
        self._dispatching: set[int] = set()      # submits in flight
        self._recoveries: dict[str, int] = {}     # recover() calls per instance
        self.recovered = 0

    async def run(self, requests: Sequence[Any], max_concurrency: int | None = None,
                  think_time_s: float = 0.0) -> dict:
        """Submit `requests` (sorted by arrival) at their arrival times; returns counts.

        Requests sharing an arrival time form one tick: one wake-up, one batched
        `arrival` message to the collector, one load query per instance.

        max_concurrency: closed loop (vLLM `bench serve --max-concurrency`, a
            benchmark's "concurrency"): at most this many requests are in the rack at
            once; a request is sent at its arrival time or, if all slots are taken, when
            a slot frees, i.e. `think_time_s` after one of the requests in flight ends
            (completed, rejected or failed). Its arrival (hence TTFT) is when it is
            sent. None: open loop, every request at its arrival time.
        Raises ValueError for max_concurrency < 1 or a negative or non-finite think time.
        """
        n = len(requests)
        self._requests = list(requests)       # a truncated request replaces its original
        self._pre_of = np.full(n, -1, np.int32)
        self._dec_of = np.full(n, -1, np.int32)
        if max_concurrency is not None:
            if int(max_concurrency) < 1:
                raise ValueError(f"router: max_concurrency must be >= 1, got {max_concurrency}")
            if not (0.0 <= float(think_time_s) < float("inf")):
                raise ValueError(f"router: think_time_s must be finite and >= 0, got {think_time_s}")
            await self._run_closed(requests, int(max_concurrency), float(think_time_s))
            return {"dispatched": dict(self.dispatched), "rejected": self.rejected}
        i = 0
        while i < n:
            t = requests[i].arrival_s
            j = i
            while j < n and requests[j].arrival_s == t:
                j += 1
            await self.clock.sleep_until(t)
            await self._tick(requests[i:j], i)
            i = j
        return {"dispatched": dict(self.dispatched), "rejected": self.rejected}

    async def _run_closed(self, requests: Sequence[Any], slots: int, think_s: float) -> None:
        """`run`'s closed loop: `slots` concurrent users (see `run`)."""
        free = [0.0] * slots            # when each idle slot may send again (a heap)
        in_flight: set[int] = set()
        for pos, req in enumerate(requests):
            if not free:
                for rid, t_end in await self.collector.wait_ended(sorted(in_flight)):
                    in_flight.discard(rid)
                    heapq.heappush(free, t_end + think_s)
            t = max(req.arrival_s, heapq.heappop(free))
            if t > self.clock.now():
                await self.clock.sleep_until(t)
            in_flight.add(req.id)
            await self._tick([req], pos)

    async def _tick(self, batch: Sequence[Any], base: int = 0) -> None:
        now = self.clock.now()
        names = sorted(self.prefill)
        # The arrival events and the load queries travel together: one round trip, not two.
        _, *values = await _all([
            self.collector.events([(r.id, "arrival", now) for r in batch]),
            *(self.prefill[nm].outstanding_tokens() for nm in names)])
        # an instance that is down (PeerLost, Ray) counts as full until it is back
        load = dict(zip(names, (self.max_outstanding_tokens + 1 if isinstance(v, PeerLost) else int(v)
                                for v in _raise_other(values))))
        per_instance: dict[str, list] = {}
        refused: list[tuple[int, str]] = []
        truncated: list[tuple[int, int]] = []
        for k, req in enumerate(batch):
            served, reason = context_verdict(req.prompt_tokens, req.output_tokens,
                                             self.max_context_tokens, self.context_overflow)
            if reason is None and served != req.output_tokens:
                req = dataclasses.replace(req, output_tokens=served)
                self._requests[base + k] = req
                truncated.append((req.id, served))
            if reason is None and self._rr_local is not None and \
                    (not self.prefill or req.prompt_tokens <= self.threshold):
                name = self._next_fitting(self._rr_local, len(self.local), req, both=True)
                if name is None:
                    reason = self._kv_reason(self.local, req)
                else:
                    per_instance.setdefault(name, []).append((req, name))
                    self._note_route(base + k, name, name)
                    self.dispatched[name] += 1
                    continue
            if reason is None:
                cands = [nm for nm in load if self._fits(nm, req, decode=False)]
                targets = self._decode_candidates(req)
                if not cands:
                    reason = "prompt_exceeds_kv_capacity"
                elif targets is not None and not targets:
                    reason = "exceeds_decode_kv_capacity"
            if reason is not None:
                refused.append((req.id, reason))
                continue
            if self.policy == "least_outstanding_work":
                name = min(cands, key=lambda nm: (load[nm], nm))
            else:
                name = self._next_fitting(self._rr, len(self.prefill), req, both=False)
            if load[name] > self.max_outstanding_tokens:
                # The least-loaded instance is full, so all are (or round-robin hit a full one).
                if self.policy == "round_robin" and min(load[c] for c in cands) <= self.max_outstanding_tokens:
                    name = min(cands, key=lambda nm: (load[nm], nm))
                else:
                    refused.append((req.id, "router_queue_full"))
                    continue
            load[name] += req.prompt_tokens
            target = self._next_fitting(self._rr_decode, len(self.decode_targets), req, both=True) \
                if self._rr_decode is not None else name
            per_instance.setdefault(name, []).append((req, target))
            self._note_route(base + k, name, target)
            self.dispatched[name] += 1
        if truncated:
            self.truncated += len(truncated)
            await self.collector.note_truncated(truncated)
        for rid, reason in refused:
            self.rejected += 1
            await self.collector.finish(rid, "rejected", reason=reason, t=now)
        # One message per instance per tick: the tick's requests reach an instance
        # together, so they share its first iteration on Ray as on virtual time.
        if per_instance:
            await self._submit(per_instance)

    # ------------------------------------------------------------------ admission
    def _fits(self, name: str, req: Any, decode: bool) -> bool:
        fit = self.kv_fit.get(name)
        if fit is None:
            return True
        return fit.fits_decode(req.prompt_tokens, req.output_tokens) if decode else fit.fits(req.prompt_tokens)

    def _decode_candidates(self, req: Any) -> list[str] | None:
        """Decode targets `req` fits (None: no decode targets, a colocated deployment)."""
        if not self.decode_targets:
            return None
        return [d for d in self.decode_targets if self._fits(d, req, decode=True)]

    def _next_fitting(self, cycle, n: int, req: Any, both: bool) -> str | None:
        """The next name of round-robin `cycle` (n names) that `req` fits: its decode
        footprint, and with `both` False its prompt (a prefill instance); None if none."""
        for _ in range(n):
            name = next(cycle)
            if self._fits(name, req, decode=both) and (both is False or name not in self.local
                                                        or self._fits(name, req, decode=False)):
                return name
        return None

    def _kv_reason(self, instances, req: Any) -> str:
        """Why `req` fits none of the colocated `instances`."""
        if not any(self._fits(n, req, decode=False) for n in instances):
            return "prompt_exceeds_kv_capacity"
        return "exceeds_decode_kv_capacity"

    # ------------------------------------------------------------------ recovery
    def _note_route(self, pos: int, instance: str, target: str | None) -> None:
        self._pre_of[pos] = self._inst_idx[instance]
        self._dec_of[pos] = self._dec_idx.get(target, -1) if target is not None else -1

    async def _submit(self, per_instance: dict[str, list]) -> None:
        """submit_many per instance; requests in flight are not candidates of `recover`.
        A submit to an instance that is down (PeerLost) leaves its requests routed there:
        the recovery of that instance re-dispatches them."""
        ids = [req.id for items in per_instance.values() for req, _ in items]
        epochs = {nm: self._recoveries.get(nm, 0) for nm in per_instance}
        self._dispatching.update(ids)
        try:
            results = await _all([(self.prefill.get(nm) or self.local[nm]).submit_many(items)
                                  for nm, items in per_instance.items()])
        finally:
            self._dispatching.difference_update(ids)
        _raise_other(results)
        # An instance that died while these were in flight (PeerLost, or recovered in the
        # meantime without them, as they were in flight) may have lost them: recover it
        # again now that they are not in flight (recover is idempotent).
        for nm, res in zip(per_instance, results):
            if nm in self.prefill and (isinstance(res, PeerLost) or self._recoveries.get(nm, 0) != epochs[nm]):
                await self.recover(nm)

    async def recover(self, instance: str) -> dict:
        """Re-dispatch the requests instance `instance` lost when it died (fault recovery,
        docs/robustness.md); call it once the instance is back (restarted, empty).

        Candidates are the open requests routed to it (as prefill instance, or as decode
        target). Those some live component still holds are left alone: a prefill
        instance that still holds a request's KV re-sends it itself after a decode
        restart. For a lost prefill instance, the decode engines first drop the KV
        reservations made for its requests. The rest are lost and go to a prefill
        instance again (another one than `instance` if there is one), keeping their
        decode target: re-prefilled, then decoded from the start. Idempotent.
        Returns {"instance", "role", "candidates", "held", "redispatched": [ids]}.
        Raises KeyError for an unknown instance.
        """
        if instance in self.prefill:
            role, col, idx = "prefill", self._pre_of, self._inst_idx[instance]
        elif instance in self._dec_idx and instance not in self.local:
            role, col, idx = "decode", self._dec_of, self._dec_idx[instance]
        else:
            raise KeyError(f"router.recover: {instance!r} is not a prefill or decode instance; "
                           f"known: {sorted(self.prefill)} / {self.decode_targets}")
        self._recoveries[instance] = self._recoveries.get(instance, 0) + 1
        ids = [self._requests[p].id for p in np.flatnonzero(col == idx).tolist()]
        cand = [i for i in await self.collector.open_among(ids) if i not in self._dispatching]
        held: set[int] = set()
        if cand:
            here = self.prefill[instance] if role == "prefill" else self.decoders.get(instance)
            if here is not None:          # the restarted instance: requests sent after its restart
                held.update(await _retry(self.clock, lambda: here.holding(cand)))
            rest = [i for i in cand if i not in held]
            for name, h in self.prefill.items():
                if name != instance:
                    held.update(await _retry(self.clock, lambda h=h: h.holding(rest)))
            for name, h in self.decoders.items():
                if name != instance:       # drop reservations only of a lost prefill's requests
                    held.update(await _retry(self.clock, lambda h=h: h.holding(rest, drop_reserved=role == "prefill")))
        lost = await self.collector.open_among([i for i in cand if i not in held])
        if self._pos is None:
            self._pos = {r.id: p for p, r in enumerate(self._requests)}
        # only those still routed to `instance` and not being submitted (no await from here
        # to the submit bookkeeping, so a concurrent tick cannot interleave)
        lost = [i for i in lost if col[self._pos[i]] == idx and i not in self._dispatching]
        others = sorted(n for n in self.prefill if n != instance) or [instance]
        per_instance: dict[str, list] = {}
        for k, rid in enumerate(lost):
            pos = self._pos[rid]
            name = others[k % len(others)] if role == "prefill" else self._inst_names[self._pre_of[pos]]
            if name not in self.prefill:
                name = others[k % len(others)]
            d = int(self._dec_of[pos])
            target = self._dec_names[d] if d >= 0 else name
            per_instance.setdefault(name, []).append((self._requests[pos], target))
            self._note_route(pos, name, target if d >= 0 else None)
        if per_instance:
            self.recovered += len(lost)
            await self.collector.note_recovery({"instance": instance, "t": self.clock.now(), "ids": list(lost)})
            await self._submit(per_instance)
        return {"instance": instance, "role": role, "candidates": len(cand), "held": len(held),
                "redispatched": lost}


async def _all(calls: list) -> list:
    """Await peer calls made together, in order; each result or its exception (as
    `asyncio.gather(*calls, return_exceptions=True)`, without a Task per call).

    Why not gather: on the virtual runtime a peer call is a coroutine of a local object
    that finishes without suspending, and a gather of two costs ~20 us against ~0.2 us
    for awaiting them in turn (a tick makes two); on Ray an `ActorProxy` sends a call
    when it is made, so calls made before the first await still travel concurrently.
    """
    out: list = []
    try:
        for call in calls:
            try:
                out.append(await call)
            except Exception as exc:  # noqa: BLE001 - handed back, as gather does
                out.append(exc)
    finally:
        for call in calls[len(out) + 1:]:     # cancelled midway: no never-awaited warnings
            if asyncio.iscoroutine(call):
                call.close()
    return out


def _raise_other(results: Sequence[Any]) -> Sequence[Any]:
    """`results` of a gather(return_exceptions=True); re-raises any error but PeerLost."""
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, PeerLost):
            raise r
    return results

