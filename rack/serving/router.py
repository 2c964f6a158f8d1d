"""The router core: replays the request stream at its arrival times, admits or rejects
each request, and dispatches it to a prefill instance and a decode target.

Policies (`RouterConfig.policy`):
- "round_robin": prefill instances in turn;
- "least_outstanding_work": the instance with the fewest prompt tokens still to
  prefill. Each prefill-capable instance reports that count whenever it changes
  (`load` messages: on a submission, at the start and at the end of each iteration),
  so the router's table holds what a query would return at that instant; within one
  arrival tick the router adds the prompts it places itself;
- "prefix_aware" (KV-cache-aware, as Dynamo's KV router): the instance with the lowest
  outstanding prompt tokens plus the request's prompt tokens it does not cache, from
  the KV events the instances publish (`kv_events`); see `rack.serving.prefix_routing`
  for the formula and its design.
Admission: a request is rejected ("router_queue_full") when every prefill instance
already has more than `max_outstanding_tokens` prompt tokens of work outstanding.
Before that, at arrival (`rack.serving.admission`): a request over the model's context limit
is rejected ("prompt_exceeds_context", "exceeds_context") or has its output truncated
(`context_overflow = "truncate"`); a request whose KV can never fit any instance it
could go to is rejected ("prompt_exceeds_kv_capacity", "exceeds_decode_kv_capacity"),
so no prefill time is spent on it.
Conditional disaggregation: a prompt of at most `local_prefill_threshold_tokens`
tokens goes to a colocated ("both") instance instead, which prefills and decodes it.
Decode targets are chosen round-robin among those the request fits.

A core (`workloads.core`): the driver starts it with `start(now, requests, ...)`; it
wakes at each arrival tick; the collector tells it of every request's end (`ended`),
which drives the closed loop and fault recovery (`recover`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np

from rack.serving.admission import KVFit, context_verdict, decode_footprint
from rack.serving.prefix_routing import CachedBlockIndex, prefix_aware_choice
from workloads.core import Core


#: Router policies (`RouterConfig.policy`).
POLICIES = ("round_robin", "least_outstanding_work", "prefix_aware")


class Router(Core):
    """Replays requests and routes them.

    Keyword args:
        collector: the collector's name.
        prefill: names of prefill-capable instances (handlers `submit_many(now, [(req,
            decode_target), ...])`; they report `load`).
        decode_targets: names of decode instances a prefill instance may ship KV to.
        local: names of colocated instances, for conditional disaggregation.
        policy: "round_robin", "least_outstanding_work" or "prefix_aware" (the prefill
            instances must publish `kv_events`).
        prefix_weight: "prefix_aware": weight of the uncached prompt tokens against the
            backlog (`rack.serving.prefix_routing`), >= 0.
        max_outstanding_tokens: per-instance outstanding prompt tokens above which an
            arrival is rejected when every instance is above it (>= 1).
        local_prefill_threshold_tokens: prompts up to this length go to `local` (0: off).
        decoders: decode instance names (`holding`), used only by `recover`.
        max_context_tokens: the model's context limit (the scenario's `max_model_len`
            or the model's own); None: no limit.
        context_overflow: "reject" or "truncate" (`rack.serving.admission.context_verdict`).
        kv_fit: `rack.serving.admission.KVFit` of instances by name (prefill, decode and
            colocated); an instance without one is assumed to fit every request.
        name: the core's name ("router").
    Raises ValueError on an unknown policy or overflow rule, or no prefill instance.
    """

    def __init__(self, *, collector: str, prefill: Sequence[str], decode_targets: Sequence[str],
                 local: Sequence[str] = (), policy: str = "least_outstanding_work",
                 max_outstanding_tokens: int = 1 << 40, local_prefill_threshold_tokens: int = 0,
                 decoders: Sequence[str] = (), max_context_tokens: int | None = None,
                 context_overflow: str = "reject", kv_fit: Mapping[str, KVFit] | None = None,
                 prefix_weight: float = 1.0, name: str = "router") -> None:
        super().__init__(name)
        if context_overflow not in ("reject", "truncate"):
            raise ValueError(f"router context_overflow: expected 'reject' or 'truncate', got {context_overflow!r}")
        if policy not in POLICIES:
            raise ValueError(f"router policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        if not (0.0 <= float(prefix_weight) < math.inf):
            raise ValueError(f"router prefix_weight: expected a finite number >= 0, got {prefix_weight!r}")
        self.prefix_weight = float(prefix_weight)
        if not prefill and not local:
            raise ValueError("router: no prefill-capable instance")
        self.collector = collector
        self.max_context_tokens = None if max_context_tokens is None else int(max_context_tokens)
        self.context_overflow = context_overflow
        self.kv_fit = dict(kv_fit or {})
        self.truncated = 0
        self.prefill = sorted(prefill)
        self.local = sorted(local)
        self.decode_targets = list(decode_targets)
        self.policy = policy
        self.max_outstanding_tokens = int(max_outstanding_tokens)
        self.threshold = int(local_prefill_threshold_tokens)
        self._rr = itertools.cycle(self.prefill) if self.prefill else None
        self._rr_local = itertools.cycle(self.local) if self.local else None
        self._rr_decode = itertools.cycle(self.decode_targets) if self.decode_targets else None
        self.dispatched = {n: 0 for n in self.prefill + self.local}
        self.rejected = 0
        # outstanding prompt tokens per prefill instance, as last reported (`load`);
        # an instance that is down counts as full until it reports again
        self._load = {n: 0 for n in self.prefill}
        self._pre_idx = {n: i for i, n in enumerate(self.prefill)}
        # the placement's KV checks (`_tick`, once per request) as token bounds
        # (`KVFit.max_tokens`: a comparison instead of a call per instance and request):
        # the most KV tokens each instance holds (inf: no KVFit, fits every request),
        # (name, bound) of the prefill instances in the order of `_load`, and the largest
        # bound of the decode targets (a request fits some target iff its footprint is
        # at most that)
        self._max_tokens = {n: fit.max_tokens() for n, fit in self.kv_fit.items()}
        self._prompt_max = [(n, self._max_tokens.get(n, math.inf)) for n in self.prefill]
        self._decode_max = max((self._max_tokens.get(n, math.inf) for n in self.decode_targets),
                               default=None)
        self._tie_next = 0                        # round robin among tied instances (`_among_tied`)
        # prefix_aware: what each prefill instance caches, from its KV events
        self._index = CachedBlockIndex(self.prefill) if policy == "prefix_aware" else None
        self.expected_cached_tokens = 0           # prefix_aware: cache hits the router counted on
        # Fault recovery: where each request was sent (rack.wiring.faults, docs/robustness.md).
        self.decoders = list(decoders)
        self._inst_names = self.prefill + self.local
        self._inst_idx = {n: i for i, n in enumerate(self._inst_names)}
        self._dec_names = list(dict.fromkeys([*self.decode_targets, *self.local]))
        self._dec_idx = {n: i for i, n in enumerate(self._dec_names)}
        self._requests: list[Any] = []
        self._pre_of = np.zeros(0, np.int32)     # per request position: instance index, -1 none
        self._dec_of = np.zeros(0, np.int32)     # per request position: decode target index
        self._pos: dict[int, int] = {}            # request id -> position
        self._recoveries: dict[str, int] = {}     # recover() calls per instance
        self._pending: dict[int, dict] = {}       # recoveries waiting for replies, by tag
        self._redispatches = 0                    # re-dispatch rounds so far
        self._redispatched: dict[int, int] = {}   # request id -> round of its last re-dispatch
        self._tags = itertools.count()
        self.recovered = 0
        # replay state
        self._next = 0                            # position of the next request to send
        self._arrivals: Sequence[float] = ()      # arrival times of `start`'s requests, by position
        self._n_replay = 0                        # requests of `start` (live ones follow them)
        self._slots: int | None = None            # closed loop: concurrency, None: open loop
        self._think = 0.0
        self._free: list[float] = []              # closed loop: when each idle slot may send (heap)
        self._in_flight: set[int] = set()         # closed loop: sent, not ended
        # sessions replayed turn by turn (`Request.turn`; `workloads.sessions`): None, or
        # per position the position of the session's next turn (-1: its last)
        self._chain: np.ndarray | None = None
        self._heads: deque[int] = deque()         # closed loop: first turns not yet given a slot
        self._due: list[tuple[float, int]] = []   # (send time, position) of turns due (heap)

    # ------------------------------------------------------------------ replay
    def start(self, now: float, requests: Sequence[Any], max_concurrency: int | None = None,
              think_time_s: float = 0.0) -> None:
        """Replay `requests` (sorted by arrival): each at its arrival time (requests
        sharing an arrival time form one tick: one `arrival` message, one placement
        pass).

        max_concurrency: closed loop (vLLM `bench serve --max-concurrency`, a
            benchmark's "concurrency"): at most this many requests are in the rack at
            once; a request is sent at its arrival time or, if all slots are taken, when
            a slot frees, i.e. `think_time_s` after one of the requests in flight ends
            (completed, rejected or failed). Its arrival (hence TTFT) is when it is
            sent. None: open loop, every request at its arrival time.
        Sessions: when requests carry `Request.turn`, each session is replayed turn by
            turn (`workloads.sessions.session_chains`): its first turn goes at its
            arrival time, every later turn its `turn.think_time_s` after the previous
            turn ended (whatever the outcome), its own arrival time ignored; a request
            without a turn is a session of one turn. With max_concurrency a slot holds
            a session from its first turn's send to its last turn's end (the number of
            agents or users looping at once), and frees `think_time_s` after that.
        Raises ValueError for max_concurrency < 1 or a negative or non-finite think time.
        """
        n = len(requests)
        self._n_replay = n
        # a truncated request replaces its original; a RequestTable (workloads.table)
        # stays columns, its requests built as they are reached, its ids not a dict
        table = hasattr(requests, "overlay")
        self._requests = requests.overlay() if table else list(requests)
        self._pos = requests.positions() if table else {r.id: p for p, r in enumerate(self._requests)}
        # the open loop's ticks are found from the arrival column: a table's request is
        # built (or looked up in its block) only when it is sent
        self._arrivals = requests.arrivals if table else [r.arrival_s for r in self._requests]
        self._pre_of = np.full(n, -1, np.int32)
        self._dec_of = np.full(n, -1, np.int32)
        self._next = 0
        if max_concurrency is not None:
            if int(max_concurrency) < 1:
                raise ValueError(f"router: max_concurrency must be >= 1, got {max_concurrency}")
            if not (0.0 <= float(think_time_s) < math.inf):
                raise ValueError(f"router: think_time_s must be finite and >= 0, got {think_time_s}")
            self._slots = int(max_concurrency)
            self._think = float(think_time_s)
            self._free = [0.0] * self._slots
        if (requests.has_turns if table else any(r.turn is not None for r in self._requests)):
            from workloads.sessions import session_chains

            heads, chain = session_chains(self._requests)
            self._chain = np.asarray(chain, dtype=np.int64)
            if self._slots is None:
                self._due = [(self._requests[p].arrival_s, p) for p in heads]
                heapq.heapify(self._due)
            else:
                self._heads = deque(heads)
        self._pump(now)

    def on_wake(self, now: float) -> None:
        self._pump(now)

    def _pump(self, now: float) -> None:
        """Send every request that is due at `now` and set the next wake-up."""
        reqs, n = self._requests, self._n_replay
        self.wake_at = math.inf
        if self._chain is not None:
            self._pump_sessions(now)
            return
        if self._slots is None:
            arrivals = self._arrivals
            while self._next < n:
                i = self._next
                t = float(arrivals[i])
                if t > now:
                    self.wake_at = t
                    return
                j = i + 1
                while j < n and arrivals[j] == t:
                    j += 1
                self._tick(now, [reqs[i]] if j == i + 1 else reqs[i:j], i)
                self._next = j
            return
        while self._next < n and self._free:
            req = reqs[self._next]
            t = max(req.arrival_s, self._free[0])
            if t > now:
                self.wake_at = t
                return
            heapq.heappop(self._free)
            self._in_flight.add(req.id)
            self._next += 1
            self._tick(now, [req], self._next - 1)
        # else: every slot is taken; an `ended` frees one

    def _pump_sessions(self, now: float) -> None:
        """Sessions (`start`): give free slots their next sessions, send every turn due
        at `now` (one tick each), wake at the next one due."""
        reqs, due = self._requests, self._due
        while self._free and self._heads:
            p = self._heads.popleft()
            heapq.heappush(due, (max(reqs[p].arrival_s, heapq.heappop(self._free)), p))
        while due and due[0][0] <= now:
            _, p = heapq.heappop(due)
            self._next += 1                       # sent so far (`is_idle`)
            self._tick(now, [reqs[p]], p)
        self.wake_at = due[0][0] if due else math.inf

    def submit_live(self, now: float, req: Any, reply_to: str) -> None:
        """A live request (an HTTP front, `rack.serve`): admit and place it now, as a
        replayed request at its arrival tick, and reply `reply_to.admitted(request id,
        reason, output_tokens)`: reason None when it was dispatched (output_tokens: the
        tokens it will get, less than asked when the context limit truncates it), else
        the rejection reason (the collector is told as for any rejection).
        Ids must be unique within the run (also against `start`'s requests)."""
        pos = len(self._requests)
        self._requests.append(req)
        self._pos[req.id] = pos
        if pos >= self._pre_of.shape[0]:          # amortised growth of the route columns
            grow = np.full(max(16, pos), -1, np.int32)
            self._pre_of = np.concatenate((self._pre_of, grow))
            self._dec_of = np.concatenate((self._dec_of, grow))
        refused = dict(self._tick(now, [req], pos))
        reason = refused.get(req.id)
        self.send(reply_to, "admitted", req.id, reason,
                  0 if reason is not None else self._requests[pos].output_tokens)

    def ended(self, now: float, request_id: int, t_end: float) -> None:
        """The collector: request `request_id` ended at emulated time `t_end`. Used by
        closed-loop replays and sessions only (an open-loop replay's virtual driver
        does not send it: `rack.runtime.virtual_run`)."""
        if self._chain is not None:
            p = self._pos.get(request_id, self._n_replay)
            if p < self._n_replay:                # not a live request
                nxt = int(self._chain[p])
                if nxt >= 0:                      # the session's next turn, after its think time
                    heapq.heappush(self._due, (t_end + self._requests[nxt].turn.think_time_s, nxt))
                elif self._slots is not None:     # the session is over: its slot frees
                    heapq.heappush(self._free, t_end + self._think)
                self._pump(now)
            return
        if self._slots is not None and request_id in self._in_flight:
            self._in_flight.discard(request_id)
            heapq.heappush(self._free, t_end + self._think)
            self._pump(now)

    def load(self, now: float, instance: str, outstanding_tokens: int) -> None:
        """A prefill-capable instance's outstanding prompt tokens (queued counted whole)."""
        if instance in self._load:
            self._load[instance] = int(outstanding_tokens)

    def kv_events(self, now: float, instance: str, events) -> None:
        """A prefill instance's prefix-cache changes, in order: [("stored" | "removed",
        [(block_size, hash), ...]), ...] (`devices.memory.PrefixCache.journal`)."""
        if self._index is not None:
            self._index.apply(instance, events)

    def peer_lost(self, now: float, name: str) -> None:
        """A core died (a crash): an instance counts as full until it reports again, and
        its prefix cache is gone (it restarts empty)."""
        if name in self._load:
            self._load[name] = math.inf
            if self._index is not None:
                self._index.clear(name)

    def send_failed(self, now: float, dst: str, method: str, args: tuple) -> None:
        """A message could not be delivered (its destination died, Ray driver).

        A recovery's `holding` question then gets its answer here, or the recovery would
        wait for ever: `dst` counts as holding the asked requests routed to it, and
        none of the others (an instance only ever holds requests routed to it). Not
        "nothing": Ray reports the failure up to seconds after the death, and by then
        `dst`'s next incarnation may have received some of them (a prefill instance
        re-sends a KV it still holds to a restarted decode engine); re-dispatching
        those would decode them twice. Every death is followed by a recovery of `dst`
        once it is back (`rack.serving.fault_injector`), which asks that incarnation
        about every open request routed to it, so none is left behind. A lost
        submission needs nothing here either: its request is still open and routed to
        the dead instance, whose recovery re-dispatches it."""
        if method == "holding":
            ids, tag = args[0], args[-1]
            routed = set(self.routed_to(dst))
            self.held(now, tag, dst, [i for i in ids if int(i) in routed])

    def is_idle(self) -> bool:
        return self._next >= self._n_replay and not self._pending

    def waiting_for(self) -> str:
        if self._next < self._n_replay:
            left = self._n_replay - self._next
            if self._chain is not None:
                return (f"{left} turn(s) to send ({len(self._due)} timed, the rest wait for their "
                        f"previous turn's end" + (f"; {len(self._heads)} session(s) wait for a slot"
                                                   if self._heads else "") + ")")
            return (f"{left} request(s) to send" + (f", {len(self._in_flight)} in flight for "
                                                     f"{self._slots} slots" if self._slots else ""))
        return f"{len(self._pending)} recovery(ies) waiting for replies" if self._pending else ""

    def routed_to(self, instance: str) -> list[int]:
        """Ids of the requests routed to `instance`, as prefill instance or as decode
        target (a driver read: what a lost instance may have held)."""
        hit = np.zeros(len(self._pre_of), bool)
        if instance in self._inst_idx:
            hit |= self._pre_of == self._inst_idx[instance]
        if instance in self._dec_idx:
            hit |= self._dec_of == self._dec_idx[instance]
        return [self._requests[p].id for p in np.flatnonzero(hit).tolist()]

    def counts(self) -> dict:
        """{"dispatched": {instance: n}, "rejected": n} (read by the driver at the end)."""
        out = {"dispatched": dict(self.dispatched), "rejected": self.rejected}
        if self._index is not None:
            out.update(kv_events=self._index.events, expected_cached_tokens=self.expected_cached_tokens)
        return out

    # ------------------------------------------------------------------ placement
    def _tick(self, now: float, batch: Sequence[Any], base: int) -> list[tuple[int, str]]:
        """Admit and place `batch` (at positions base.. of the requests); returns the
        refused (request id, reason)."""
        self.send(self.collector, "events", [(r.id, "arrival", now) for r in batch])
        # the prompts placed in this tick are added as they are placed: the instances'
        # own reports (`load`) replace them later
        load = self._load
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
                p = req.prompt_tokens
                cands = [nm for nm, most in self._prompt_max if p <= most]
                if not cands:
                    reason = "prompt_exceeds_kv_capacity"
                elif self._decode_max is not None and \
                        decode_footprint(p, req.output_tokens) > self._decode_max:
                    reason = "exceeds_decode_kv_capacity"
            if reason is not None:
                refused.append((req.id, reason))
                continue
            hit = 0
            if self.policy == "prefix_aware":
                room = [c for c in cands if load[c] <= self.max_outstanding_tokens]
                if not room:
                    refused.append((req.id, "router_queue_full"))
                    continue
                name, hit = prefix_aware_choice(req, room, load, self._index, self.prefix_weight,
                                                self._among_tied)
                self.expected_cached_tokens += hit
            elif self.policy == "least_outstanding_work":
                least = min([load[c] for c in cands])
                name = self._among_tied([c for c in cands if load[c] == least])
            else:
                name = self._next_fitting(self._rr, len(self.prefill), req, both=False)
            if load[name] > self.max_outstanding_tokens:
                # The least-loaded instance is full, so all are (or round-robin hit a full one).
                if self.policy == "round_robin" and min(load[c] for c in cands) <= self.max_outstanding_tokens:
                    name = min(cands, key=lambda nm: (load[nm], nm))
                else:
                    refused.append((req.id, "router_queue_full"))
                    continue
            # as the instance will count it (net of its cache under prefix_aware)
            load[name] += req.prompt_tokens - hit
            target = self._next_fitting(self._rr_decode, len(self.decode_targets), req, both=True) \
                if self._rr_decode is not None else name
            per_instance.setdefault(name, []).append((req, target))
            self._note_route(base + k, name, target)
            self.dispatched[name] += 1
        if truncated:
            self.truncated += len(truncated)
            self.send(self.collector, "note_truncated", truncated)
        for rid, reason in refused:
            self.rejected += 1
            self.send(self.collector, "finish", rid, "rejected", reason, None, now)
        # One message per instance per tick: the tick's requests reach an instance
        # together, so they share its first iteration on Ray as on virtual time.
        for nm, items in per_instance.items():
            self.send(nm, "submit_many", items)
        return refused

    def _among_tied(self, tied: list[str]) -> str:
        """The prefill instance for a request whose routing costs tie on every one of
        `tied` (names of `self.prefill`): round robin among the tied, in name order,
        starting after the last instance a tie went to. Deterministic; without it an
        idle rack sent every request to its first instance (issue 37)."""
        if len(tied) == 1:
            return tied[0]
        idx = sorted([self._pre_idx[t] for t in tied])
        pick = idx[0]
        for i in idx:
            if i >= self._tie_next:
                pick = i
                break
        self._tie_next = pick + 1
        return self.prefill[pick]

    def _fits(self, name: str, req: Any, decode: bool) -> bool:
        """Whether `req` fits instance `name`: its decode footprint (`decode`), else its
        prompt (`rack.serving.admission.KVFit`, as the token bound `_max_tokens`)."""
        most = self._max_tokens.get(name)
        if most is None:
            return True
        return (decode_footprint(req.prompt_tokens, req.output_tokens) if decode else req.prompt_tokens) <= most

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

    def _note_route(self, pos: int, instance: str, target: str | None) -> None:
        self._pre_of[pos] = self._inst_idx[instance]
        self._dec_of[pos] = self._dec_idx.get(target, -1) if target is not None else -1

    # ------------------------------------------------------------------ recovery
    def recover(self, now: float, instance: str, reply_to: str | None = None, tag: Any = None) -> None:
        """Re-dispatch the requests instance `instance` lost when it died (fault recovery,
        docs/robustness.md); sent once the instance is back (restarted, empty).

        Candidates are the open requests routed to it (as prefill instance, or as decode
        target). Those some live component still holds are left alone: a prefill
        instance that still holds a request's KV re-sends it itself after a decode
        restart. For a lost prefill instance, the decode engines first drop the KV
        reservations made for its requests. The rest are lost and go to a prefill
        instance again (another one than `instance` if there is one), keeping their
        decode target: re-prefilled, then decoded from the start. Idempotent. Three
        exchanges: the collector says which candidates are open (`open_ids`), the
        restarted instance and then every other holder say what they hold (`held`),
        the collector says which of the rest are still open; then the re-dispatch.
        When done, replies `recovered(now, tag, {"instance", "role", "candidates",
        "held", "redispatched": [ids]})` to `reply_to` (if given).
        Raises KeyError for an unknown instance.
        """
        if instance in self._inst_idx and instance in self.prefill:
            role, col, idx = "prefill", self._pre_of, self._inst_idx[instance]
        elif instance in self._dec_idx and instance not in self.local:
            role, col, idx = "decode", self._dec_of, self._dec_idx[instance]
        else:
            raise KeyError(f"router.recover: {instance!r} is not a prefill or decode instance; "
                           f"known: {self.prefill} / {self.decode_targets}")
        self._recoveries[instance] = self._recoveries.get(instance, 0) + 1
        if instance in self._load:
            self._load[instance] = 0          # back, restarted empty (`peer_lost` marked it down)
        key = next(self._tags)
        ids = [self._requests[p].id for p in np.flatnonzero(col == idx).tolist()]
        self._pending[key] = {"instance": instance, "role": role, "col": col, "idx": idx,
                              "reply_to": reply_to, "tag": tag, "phase": "open", "cand": [],
                              "held": set(), "waiting": set(), "since": self._redispatches}
        self.send(self.collector, "open_among", ids, self.name, ("recover", key))

    def open_ids(self, now: float, tag: Any, ids: list[int]) -> None:
        """The collector's reply to `open_among` (recovery phases)."""
        _, key = tag
        r = self._pending.get(key)
        if r is None:
            return
        if r["phase"] == "open":
            r["cand"] = list(ids)
            if not ids:
                self._redispatch(now, key, [])
                return
            here = r["instance"] if r["role"] == "prefill" or r["instance"] in self.decoders else None
            if here is not None:          # the restarted instance: requests sent after its restart
                self._ask(r, key, [here], ids, False, "restarted")
            else:
                self._ask_others(r, key)
        else:                              # "final": still open after the holders answered
            self._redispatch(now, key, ids)

    def held(self, now: float, tag: Any, name: str, ids: list[int]) -> None:
        """An instance's reply to `holding`: which of the asked ids it holds."""
        _, key = tag
        r = self._pending.get(key)
        if r is None or name not in r["waiting"]:
            return
        r["waiting"].discard(name)
        r["held"].update(int(i) for i in ids)
        if r["waiting"]:
            return
        if r["phase"] == "restarted":
            self._ask_others(r, key)
        else:
            r["phase"] = "final"
            self.send(self.collector, "open_among", [i for i in r["cand"] if i not in r["held"]],
                      self.name, ("recover", key))

    def _ask(self, r: dict, key: int, names: list[str], ids: list[int], drop_reserved_of: Any,
             phase: str) -> None:
        r["phase"] = phase
        r["waiting"] = set(names)
        for nm in names:
            drop = drop_reserved_of(nm) if callable(drop_reserved_of) else bool(drop_reserved_of)
            self.send(nm, "holding", ids, drop, self.name, ("recover", key))

    def _ask_others(self, r: dict, key: int) -> None:
        """Ask every other prefill instance and decode engine which of the candidates not
        held by the restarted instance they hold (decoders drop the reservations of a
        lost prefill instance's requests)."""
        rest = [i for i in r["cand"] if i not in r["held"]]
        others = [n for n in self.prefill if n != r["instance"]] + \
                 [n for n in self.decoders if n != r["instance"]]
        if not others or not rest:
            r["phase"] = "final"
            self.send(self.collector, "open_among", rest, self.name, ("recover", key))
            return
        drop = (lambda nm: r["role"] == "prefill" and nm in self.decoders)
        self._ask(r, key, others, rest, drop, "others")

    def _redispatch(self, now: float, key: int, lost: list[int]) -> None:
        r = self._pending.pop(key)
        instance, role, col, idx = r["instance"], r["role"], r["col"], r["idx"]
        # only those still routed to `instance` (a later recovery may have moved them),
        # and not re-dispatched by another recovery since this one began: that one's
        # submission may have reached its instance after this one asked it
        lost = [i for i in lost if col[self._pos[i]] == idx and self._redispatched.get(i, -1) <= r["since"]]
        others = [n for n in self.prefill if n != instance] or [instance]
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
            self._redispatches += 1
            for rid in lost:
                self._redispatched[rid] = self._redispatches
            self.recovered += len(lost)
            self.send(self.collector, "note_recovery", {"instance": instance, "t": now, "ids": list(lost)})
            for nm, items in per_instance.items():
                self.send(nm, "submit_many", items)
        if r["reply_to"] is not None:
            self.send(r["reply_to"], "recovered", r["tag"],
                      {"instance": instance, "role": role, "candidates": len(r["cand"]),
                       "held": len(r["held"]), "redispatched": list(lost)})


__all__ = ["POLICIES", "Router"]
