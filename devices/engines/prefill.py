"""The GPU prefill engine: FCFS queue, chunked prefill, prefix cache, KV handoff.

One engine is one prefill instance (a TP/PP/EP group of GPUs described by its
`CostModel`). Its loop runs one chunked-prefill iteration at a time, as vLLM/SGLang
do with chunked prefill:

- an iteration takes up to `chunk_tokens` new tokens: first the continuing (partly
  prefilled) requests in admission order, then new requests from the head of the FCFS
  queue, the last of which may be cut (a long prompt spans ceil(n / chunk) iterations
  when it runs alone);
- a request is admitted to the running set only when the HBM ledger can hold the KV of
  its whole uncached prompt (paged blocks of `kv_block_tokens`); the prefix cache gives
  up LRU unpinned entries first; otherwise admission waits (head-of-line, FCFS) until a
  handoff frees memory;
- with the prefix cache on, admission looks up the longest leading run of the
  request's full-block hashes (the trace's `block_hashes`, `block_size` tokens each):
  those tokens are not computed but count as context (`cached_tokens` of the cost
  model). At least one token is always computed, since the first output token needs
  the last prompt position's logits (vLLM does the same on a full hit);
- the iteration lasts `cost.prefill(new, cached).time_s`: one timer per iteration, no
  per-token work.

When a request's last chunk ends (`prefill_end`), its KV is complete. Who then sends
the client the first output token is the deployment's `first_token` setting:
"decode" (the default of split scenarios, as vLLM's and Dynamo's disaggregated
serving): the decode engine, with its first step after the KV has landed (so TTFT
includes the KV's wait and transfer); "prefill": this engine, at the end of the
prompt (`first_token` recorded here). A per-request handoff task then pulls the KV to
decode: `decode[target].reserve_kv` (the receiver reserves memory first; meanwhile the
KV stays in this engine's HBM and counts against it), `make_kv_frames`,
`interconnect.transfer(...)`, and finally frees the request's blocks (its full prompt
blocks go into the prefix cache when enabled). The transfer starts when the prompt
ends: it does not overlap the prefill layer by layer. Under "prefill" a request with
one output token is complete at its first token: this engine finishes it itself and
ships nothing; under "decode" it is shipped like any other (its one token is the
decode engine's).

A core (`workloads.core`). The handoff is a small protocol per request: `reserve_kv`
to the decode engine (it replies `kv_reserved` with "granted", "refused" or "lost"),
`transfer` to the interconnect (it replies `transfer_done`), and `abort_kv` after
payloads that stayed bad. The engine reports its outstanding prompt tokens to the
router (`load`) whenever they change, for the least-loaded policy, and with
`kv_events` the changes of its prefix cache (`kv_events(instance, [("stored" |
"removed", keys), ...])`, one message per handler that changed it), for the router's
KV-aware policy (`rack.serving.prefix_routing`). If the decode
engine restarts (`peer_lost`, or a message that could not be delivered) while a
request's KV is still here, it is sent again after a back-off (the collector is asked
first whether the request ended meanwhile).

Outcomes decided here: "rejected"/"prefill_queue_full" when the queue is at
`max_queue`; "failed"/"prompt_exceeds_kv_capacity" when the prompt's KV alone exceeds
the instance's whole KV capacity (it could never be admitted).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np

from devices.engines.common import (
    EventSeries,
    admit_with_prefix,
    attach_host_tier,
    host_load_s,
    host_prefix,
    record_series,
    prefix_lookup,
    plan_chunk,
    enqueue_batch,
    Lateness,
    TimeSeries,
    Utilisation,
    instance_ledger,
    memory_label,
    model_layers,
)
from devices.memory import KVBlockPool, PrefixCache
from interconnect.codec import check_description, describe_kv_frames, make_kv_frames
from workloads.core import Core


class _Job:
    """A request inside the prefill engine (queued, prefilling, then handing off)."""

    __slots__ = ("req", "target", "cached", "computed", "started", "t_first", "state",
                 "attempt", "losses", "expect", "load_s")

    def __init__(self, req, target: str) -> None:
        self.req = req
        self.target = target
        self.cached = 0        # prompt tokens served by the prefix cache
        self.computed = 0      # prompt tokens computed so far
        self.started = False   # prefill_start sent
        self.load_s = 0.0      # its prefix's load from the host tier (s)
        self.t_first = 0.0     # end of the prompt (the first token's time under "prefill")
        self.state = "queued"  # queued, running, reserving, transferring, backoff, checking
        self.attempt = 0       # payloads sent in this handoff (re-sends after bad frames)
        self.losses = 0        # times the decode engine lost the request (restarts)
        self.expect = 0        # queued: prompt tokens its cache held at submission (kv_events)

    @property
    def remaining(self) -> int:
        return self.req.prompt_tokens - self.cached - self.computed


class PrefillEngine(Core):
    """A prefill instance (see the module docstring for the behaviour).

    Keyword args:
        name: instance name (the core's name; `src` of transfers, ledger messages).
        cost: the instance's `devices.costmodel.CostModel`.
        collector: the collector's name.
        interconnect: the interconnect's name.
        decode: names of the decode engines (targets of `submit_many`).
        router: the router's name (told this engine's outstanding prompt tokens,
            `load`), or None.
        chunk_tokens: token budget of one iteration (vLLM's max_num_batched_tokens;
            8192 is a common setting for prefill instances), >= 1.
        max_queue: queued (not yet admitted) requests beyond which `submit` rejects, >= 0.
        kv_block_tokens: tokens per paged KV block (vLLM default 16), >= 1.
        prefix_cache: enable the prefix cache (needs requests with `block_hashes`).
        payload_scale: fraction of the logical KV bytes actually shipped, (0, 1].
        layer_group: layers per KV frame (one frame per group), >= 1.
        memory_reserve_fraction: passed to `planner.plan_memory` as `reserve_fraction`
            (workspace held back from KV); None uses the planner's default.
        memory_plan: overrides the planner: an object with `capacity_bytes`,
            `weight_bytes`, `reserve_bytes` (ints).
        max_resends: times a payload with bad frames is rebuilt and sent again before
            the request fails with reason "kv_checksum", >= 0.
        kv_seed: varies the (deterministic) payload bytes.
        max_peer_retries: times a handoff is tried again after the decode engine lost
            the request (it died or restarted) before the request fails with reason
            "decode_unavailable", >= 0.
        first_token: "decode" or "prefill": who sends the client its first token (module
            docstring); must match the decode engines' setting.
        loading_until_s: no iteration starts before this emulated time (a restarted
            instance reloading its weights, `rack.wiring.faults`); None: ready at once.
        kv_events: publish the prefix cache's changes to the router (`kv_events`
            messages: blocks stored and evicted, as vLLM's KV events feed Dynamo's
            KV router); off by default (no router policy but "prefix_aware" reads them).
        stream_to: a live front's name (`rack.serve`): under first_token "prefill" it is
            told each request's first token (`first_token(request id, t)`); None: nothing.
        kv_verify_every: payload accounting (virtual sweeps, docs/bench.md): None builds
            every KV payload's real frames; N describes them instead (same frame count,
            headers and sizes, no bytes: `interconnect.codec.describe_kv_frames`) and
            builds and checks the real frames of the first payload and one in N after
            it, the description compared with them.
        host_kv_bytes, host_kv_Bps: a host-memory tier for the prefixes the prefix cache
            evicts (`devices.engines.common.attach_host_tier`; 0 bytes: none).
        timeseries: record the gauges over time (memory, `series`) at every event;
            False: none (`run_scenario(timeseries=False)`, a sweep's run).
    Raises ValueError on out-of-range arguments; `planner.ModelDoesNotFit` if the
    weights do not fit the instance.
    """

    def __init__(self, *, name: str, cost: Any, collector: str, interconnect: str,
                 decode: Sequence[str], router: str | None = None, chunk_tokens: int = 8192,
                 max_queue: int = 1024, kv_block_tokens: int = 16, prefix_cache: bool = True,
                 payload_scale: float = 1e-3, layer_group: int = 8,
                 memory_reserve_fraction: float | None = None, memory_plan: Any = None,
                 max_resends: int = 1, kv_seed: int = 0, max_peer_retries: int = 8,
                 first_token: str = "prefill", loading_until_s: float | None = None,
                 kv_events: bool = False, stream_to: str | None = None,
                 kv_verify_every: int | None = None, host_kv_bytes: int = 0,
                 host_kv_Bps: float | None = None, timeseries: bool = True) -> None:
        super().__init__(name)
        if kv_verify_every is not None and int(kv_verify_every) < 1:
            raise ValueError(f"PrefillEngine {name!r}: kv_verify_every must be >= 1 (or None: every "
                             f"payload built), got {kv_verify_every}")
        # payload accounting: None builds every payload; N describes them
        # (`interconnect.codec.describe_kv_frames`) and builds one in N
        self.kv_verify_every = None if kv_verify_every is None else int(kv_verify_every)
        self._payloads = 0
        self.stream_to = stream_to
        if first_token not in ("decode", "prefill"):
            raise ValueError(f"PrefillEngine {name!r}: first_token must be 'decode' or 'prefill', "
                             f"got {first_token!r}")
        self.first_token = first_token
        self.loading_until_s = loading_until_s
        if int(chunk_tokens) < 1:
            raise ValueError(f"PrefillEngine {name!r}: chunk_tokens must be >= 1, got {chunk_tokens}")
        if int(max_queue) < 0:
            raise ValueError(f"PrefillEngine {name!r}: max_queue must be >= 0, got {max_queue}")
        if not 0.0 < float(payload_scale) <= 1.0:
            raise ValueError(f"PrefillEngine {name!r}: payload_scale must be in (0, 1], got {payload_scale}")
        if int(max_resends) < 0:
            raise ValueError(f"PrefillEngine {name!r}: max_resends must be >= 0, got {max_resends}")
        if int(layer_group) < 1:
            raise ValueError(f"PrefillEngine {name!r}: layer_group must be >= 1, got {layer_group}")
        self.cost = cost
        self.collector = collector
        self.interconnect = interconnect
        self.decode = list(decode)
        self.router = router
        self.chunk_tokens = int(chunk_tokens)
        self.max_queue = int(max_queue)
        self.payload_scale = float(payload_scale)
        self.layer_group = int(layer_group)
        self.kv_seed = int(kv_seed)
        self.max_resends = int(max_resends)
        self.n_layers = model_layers(cost)
        self.kv_bytes_per_token = int(cost.kv_bytes_per_token)

        self.ledger, self.plan = instance_ledger(cost, f"{name}/{memory_label(cost)}",
                                                 memory_reserve_fraction, memory_plan)
        self.kv_capacity_bytes = self.ledger.free_bytes
        # a token's KV in memory: all its copies (MLA's latent on every TP device)
        held = int(cost.kv_held_bytes_per_token)
        self.pool = KVBlockPool(self.ledger, kv_block_tokens, held)
        self.prefix = PrefixCache(self.ledger, held) if prefix_cache else None
        attach_host_tier(self, host_kv_bytes, host_kv_Bps)
        if kv_events and self.prefix is not None and router is not None:
            self.prefix.journal = []

        self._queue: deque[_Job] = deque()
        self._running: list[_Job] = []
        self._handoff: dict[int, _Job] = {}   # request id -> job whose KV is held here until handed off
        self.max_peer_retries = max(0, int(max_peer_retries))
        # the iteration in progress: (t0, t1, plan, IterationCost), or None
        self._iter: tuple | None = None
        self._t_free: float | None = None     # end of the previous iteration when back to back
        self._plan_at = math.inf              # when to form the next iteration (idle engine)
        self._retries: list[tuple[float, int, int]] = []   # (t, seq, request id): back-offs
        self._seq = 0
        self._reported: int | None = None     # outstanding tokens last told the router
        # `outstanding_tokens` kept as a running total (ints: the same value as the sum
        # over the queue and the running set, which the router is told up to three
        # times per request): + a queued job's term at submission, its running term
        # less its queued one at admission, - an iteration's tokens at its end; a
        # release recounts
        self._outstanding = 0

        self.util = Utilisation()
        self.lateness = Lateness()
        self.memory = TimeSeries(timeseries)
        self.series = EventSeries(timeseries)  # gauges at events (rack.measure.timeseries); not recorded if False
        self.counts = {"submitted": 0, "rejected": 0, "failed": 0, "prefilled": 0,
                       "completed_at_first_token": 0, "handoffs_done": 0,
                       "handoffs_refused": 0, "transfer_failed": 0, "resends": 0,
                       "peer_lost": 0, "kv_resent_after_restart": 0}
        self.tokens_computed = 0
        self.tokens_cached = 0
        self.queue_peak = 0
        self._report_load()

    # ------------------------------------------------------------------ handlers
    @staticmethod
    def warm_up() -> None:
        """Build the codec's cached payload block now (tens of ms the first time), so
        that the first transfer of a wall-clock run does not stall the engine."""
        make_kv_frames(0, 1, 64, 1, 1, 1.0)

    def submit_many(self, now: float, items) -> None:
        """Queue (request, decode_target) pairs arriving together for prefill; each
        request's KV will go to its decode target.

        Ends a request itself when it is rejected (queue full) or can never fit (prompt
        KV above the instance's KV capacity). Raises KeyError for an unknown decode
        target.
        """
        for req, target in items:
            if target not in self.decode and (req.output_tokens > 1 or self.first_token == "decode"):
                raise KeyError(f"PrefillEngine {self.name!r}: unknown decode target {target!r}; "
                               f"known: {sorted(self.decode)}")
        if enqueue_batch(self, now, items, self._refusal, self._new_job):
            self._poke(now)
            self._sample(now)
        self._report_load()

    def _refusal(self, req, target):
        if self.pool.bytes_for(req.prompt_tokens) > self.kv_capacity_bytes:
            return ("failed", "prompt_exceeds_kv_capacity")
        return None

    def _new_job(self, req, target: str) -> _Job:
        job = _Job(req, target)
        if self.prefix is not None and self.prefix.journal is not None and req.block_hashes:
            # what the cache holds now (its lookup at admission may find less or more)
            job.expect = min(req.prompt_tokens - 1, req.block_size * self.prefix.match(
                req.block_hashes[: req.prompt_tokens // req.block_size], req.block_size))
        self._outstanding += req.prompt_tokens - job.expect     # (it is queued: `enqueue_batch`)
        return job

    def outstanding_tokens(self) -> int:
        """Prompt tokens still to compute (queued + running). Queued ones count whole,
        before any prefix-cache hit; with `kv_events` (a KV-aware router), net of the
        prefix their cache held when they arrived, so the work is in the same terms
        as the router's cost (`rack.serving.prefix_routing`). O(1): a running total
        (`_count_outstanding` is its definition)."""
        return self._outstanding

    def _count_outstanding(self) -> int:
        return sum(j.remaining for j in self._running) + sum(j.req.prompt_tokens - j.expect for j in self._queue)

    def kv_reserved(self, now: float, request_id: int, status: str) -> None:
        """The decode engine's answer to `reserve_kv`: "granted", "refused" (it ended
        the request: it can never fit there, its queue is full, or its KV is there
        already) or "lost" (it dropped the reservation: restarted, or a recovery)."""
        job = self._handoff.get(request_id)
        if job is None or job.state != "reserving":
            return
        if status == "granted":
            self._send_payload(now, job)
        elif status == "refused":
            self.counts["handoffs_refused"] += 1
            self._end_handoff(now, job)
        else:
            self._lost(now, job)

    def transfer_done(self, now: float, request_id: int, result: Any) -> None:
        """The interconnect's report of one payload (`TransferResult`, or None when the
        receiver had restarted and held no reservation)."""
        job = self._handoff.get(request_id)
        if job is None or job.state != "transferring":
            return
        if result is None:
            self._lost(now, job)
            return
        t_end = getattr(result, "end_s", None)
        self.send(self.collector, "event", request_id, "transfer_end", now if t_end is None else float(t_end))
        if not _transfer_failed(result):
            self.counts["handoffs_done"] += 1
            self._end_handoff(now, job)
            return
        if job.attempt < self.max_resends:
            self.counts["resends"] += 1
            job.attempt += 1
            self._send_payload(now, job)
            return
        # Still bad after the re-sends: the receiver drops its reservation and ends the
        # request (a bad frame is never used).
        self.counts["transfer_failed"] += 1
        self.send(job.target, "abort_kv", job.req, "kv_checksum")
        self._end_handoff(now, job)

    def open_ids(self, now: float, request_id: int, ids: list[int]) -> None:
        """The collector's answer: is the request whose KV the decode engine lost still
        open? Then its KV is sent again; else the handoff ends."""
        job = self._handoff.get(request_id)
        if job is None or job.state != "checking":
            return
        if not ids:
            self._end_handoff(now, job)          # it ended meanwhile (e.g. its KV did arrive)
            return
        self.counts["kv_resent_after_restart"] += 1
        self._reserve(now, job)

    def peer_lost(self, now: float, name: str) -> None:
        """Core `name` died: handoffs waiting for its reservation lost it."""
        for job in [j for j in self._handoff.values() if j.target == name and j.state == "reserving"]:
            self._lost(now, job)

    def send_failed(self, now: float, dst: str, method: str, args: tuple) -> None:
        """A message could not be delivered (its destination was down, Ray driver; or
        restarted before taking it, virtual driver)."""
        if method == "reserve_kv":
            job = self._handoff.get(args[0].id)
            if job is not None and job.state == "reserving":
                self._lost(now, job)
        elif method == "abort_kv":
            # the receiver restarted meanwhile: end the request here
            self.send(self.collector, "finish", args[0].id, "failed", args[1], None, now)

    def holding(self, now: float, ids, drop_reserved: bool, reply_to: str, tag: Any) -> None:
        """Reply `reply_to.held(tag, name, ids)`: which of `ids` are here (queued,
        prefilling, or holding their KV until it is handed off); `drop_reserved` is for
        decode engines. For the router's recovery after a peer restarted."""
        want = set(int(i) for i in ids)
        held = [j.req.id for j in (*self._queue, *self._running) if j.req.id in want]
        held += [i for i in self._handoff if i in want]
        self.send(reply_to, "held", tag, self.name, held)

    def held_requests(self) -> list[int]:
        """Ids of the requests this instance holds work for: queued, prefilling, or
        holding their KV until it is handed off (driver read)."""
        return sorted({j.req.id for j in (*self._queue, *self._running)} | set(self._handoff))

    def release(self, now: float, ids) -> None:
        """Drop the work of requests `ids`, which have ended (the driver's quiescence
        check, `rack.runtime.quiescence`): their handed-off KV is freed, queued prompts
        leave the queue. A prompt being prefilled finishes its iteration; its handoff
        then finds the request ended (`open_among`)."""
        want = set(int(i) for i in ids)
        for job in [j for j in self._handoff.values() if j.req.id in want]:
            self._end_handoff(now, job)
        kept = [j for j in self._queue if j.req.id not in want]
        if len(kept) != len(self._queue):
            self._queue.clear()
            self._queue.extend(kept)
            self._outstanding = self._count_outstanding()
            self._report_load()

    def on_wake(self, now: float) -> None:
        if self._iter is not None and now >= self._iter[1]:
            self._end_iteration(now)
        if self._iter is None and now >= self._plan_at:
            self._plan_at = math.inf
            self._start_iteration(now)
        while self._retries and self._retries[0][0] <= now:
            _, _, rid = heapq.heappop(self._retries)
            job = self._handoff.get(rid)
            if job is not None and job.state == "backoff":
                self._check_open(job)
        self._set_wake()
        self._report_load()

    # ------------------------------------------------------------------ driver reads
    def is_idle(self) -> bool:
        return not (self._queue or self._running or self._handoff or self._iter is not None)

    def waiting_for(self) -> str:
        if self.is_idle():
            return ""
        parts = [f"handoff of request {j.req.id} waits for "
                 + (f"{j.target} ({j.state})" if j.state in ("reserving", "transferring") else
                    "the collector (is it still open?)" if j.state == "checking" else "a back-off")
                 for j in list(self._handoff.values())[:3]]
        if len(self._handoff) > 3:
            parts.append(f"{len(self._handoff) - 3} more handoff(s)")
        if self._queue or self._running:
            parts.append(f"{len(self._queue)} queued, {len(self._running)} prefilling")
        return ", ".join(parts)

    def stats(self, now: float) -> dict:
        """Counters and gauges at emulated time `now` (plain values and numpy arrays;
        picklable)."""
        t, used = self.memory.as_arrays()
        out = {
            "name": self.name,
            "role": "prefill",
            "memory": self.ledger.snapshot(),
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "kv_block_bytes": self.pool.block_bytes,
            "memory_t_s": t,
            "memory_used_bytes": used,
            "queue_len": len(self._queue),
            "queue_peak": self.queue_peak,
            "running": len(self._running),
            "handoffs_in_flight": len(self._handoff),
            "tokens_computed": self.tokens_computed,
            "tokens_cached": self.tokens_cached,
            "prefix_cache": self.prefix.stats.as_dict() if self.prefix else None,
            "host_kv": self.prefix.host.as_dict() if self.prefix is not None and self.prefix.host is not None else None,
            "prefix_cache_entries": len(self.prefix) if self.prefix else 0,
            "timeseries": self.series.as_dict(),
            # bytes a cached token holds (all its copies): the cache's size in tokens is
            # at most kv_capacity_bytes / this
            "prefix_cache_bytes_per_token": self.prefix.kv_bytes_per_token if self.prefix else None,
            **self.counts,
        }
        out.update(self.util.as_dict(self.cost.peak_flops, self.cost.memory_bandwidth, now))
        out.update(self.lateness.as_dict())
        return out

    # ------------------------------------------------------------------ iterations
    def _poke(self, now: float) -> None:
        """New work or freed memory: form the next iteration at `now` (after this
        instant's messages; weights first if still loading) unless one is running or
        nothing waits for one (freed memory with an empty queue: planning would find
        nothing, and the engine is idle already, `_t_free` None, since the last
        iteration's end planned nothing)."""
        if self._iter is None and (self._queue or self._running):
            t = now if self.loading_until_s is None else max(now, self.loading_until_s)
            self._plan_at = min(self._plan_at, t)
            self._set_wake()

    def _set_wake(self) -> None:
        t = self._iter[1] if self._iter is not None else self._plan_at
        if self._retries:
            t = min(t, self._retries[0][0])
        self.wake_at = t

    def _report_load(self) -> None:
        if self.router is None:
            return
        load = self._outstanding
        if load != self._reported:
            self._reported = load
            self.send(self.router, "load", self.name, load)

    def _sample(self, t: float) -> None:
        """A row of the gauges over time (`series`), when they are recorded."""
        if self.series.enabled:
            record_series(self, t, len(self._queue), len(self._running))

    def _publish_kv_events(self) -> None:
        """Send the router the prefix cache's changes since the last call (if any)."""
        journal = self.prefix.journal if self.prefix is not None else None
        if journal:
            self.prefix.journal = []
            self.send(self.router, "kv_events", self.name, journal)

    def _try_admit(self, job: _Job) -> bool:
        """Allocate the KV of `job`'s uncached prompt (after a prefix-cache lookup),
        evicting LRU prefix entries if needed. False (nothing held) if it cannot fit."""
        req = job.req
        prefix = self.prefix
        hashes, hit, cached = prefix_lookup(prefix, req)
        pool = self.pool
        need_blocks = pool.blocks_for(req.prompt_tokens - cached)
        need_bytes = need_blocks * pool.block_bytes
        if prefix is not None and self.ledger.free_bytes < need_bytes:
            prefix.make_room(need_bytes)
        if not pool.try_allocate(req.id, need_blocks):
            if prefix is not None:
                prefix.release(req.id)
            return False
        if prefix is not None and prefix.host is not None:
            cached += host_prefix(self, job, hashes, hit, cached)
        admit_with_prefix(self, job, hashes, hit, cached)
        job.state = "running"
        # it moves from the queue to the running set (`plan_chunk`): its running term
        # (remaining, net of the cache's hit) replaces its queued one
        self._outstanding += job.expect - job.cached - job.computed
        return True

    def _start_iteration(self, now: float, events: list | None = None) -> None:
        """Plan and start one chunked-prefill iteration: continuing requests first, then
        FCFS admissions while budget and memory last. Back-to-back iterations start
        when the previous one ended. `events`: lifecycle events of this instant for the
        collector (the previous iteration's ends), sent in one message with this
        iteration's prefill_start events after them (the collector records a message's
        events in order, `Collector.events`: the same records as two messages)."""
        if events is None:
            events = []
        plan = plan_chunk(self._running, self._queue, self.chunk_tokens, self._try_admit)
        self._publish_kv_events()          # admissions may have evicted blocks
        if not plan:
            self._t_free = None
            self._sample(now)
            if events:
                self.send(self.collector, "events", events)
            return
        t0 = now if self._t_free is None else self._t_free
        if self.series.enabled:             # (memory held: a gauge too, recorded with them)
            self.memory.add(t0, self.ledger.used)
        self._sample(t0)
        load_s = host_load_s(plan)           # (of the jobs it starts: before they are marked)
        # one pass over the plan: its counts (lists: the cost model's lookup key as they
        # are), its tokens, the jobs it starts (their prefill_start events)
        new, cached = [], []
        tokens = 0
        for j, take in plan:
            new.append(take)
            cached.append(j.cached + j.computed)
            tokens += take
            if not j.started:
                j.started = True
                events.append((j.req.id, "prefill_start", t0))
        c = self.cost.prefill(new, cached)
        t1 = t0 + load_s + c.time_s
        if events:
            self.send(self.collector, "events", events)
        self._iter = (t0, t1, plan, c, tokens)

    def _end_iteration(self, now: float) -> None:
        t0, t1, plan, c, tokens = self._iter
        self._iter = None
        self.lateness.note(t1, now)
        self._t_free = t1
        self.util.add(c.time_s, c.flops, c.bytes, device_busy_s=c.device_busy_s)
        self.tokens_computed += tokens
        self._outstanding -= tokens
        done: list[_Job] = []
        for j, take in plan:
            j.computed += take
            if j.remaining == 0:
                done.append(j)
        events = []
        if done:
            ids = {id(j) for j in done}
            self._running = [j for j in self._running if id(j) not in ids]
            self.counts["prefilled"] += len(done)
            names = ("prefill_end", "first_token") if self.first_token == "prefill" else ("prefill_end",)
            events = [(j.req.id, nm, t1) for j in done for nm in names]
            for j in done:
                j.t_first = t1
                self._handoff[j.req.id] = j      # held from now on (see `holding`)
                if self.stream_to is not None and self.first_token == "prefill":
                    self.send(self.stream_to, "first_token", j.req.id, t1)
        # the next iteration is formed before the handoffs start (back to back); its
        # prefill_start events go to the collector in one message after these ends
        self._start_iteration(t1, events)
        for j in done:
            self._begin_handoff(t1, j)

    # ------------------------------------------------------------------ handoff
    def _begin_handoff(self, now: float, job: _Job) -> None:
        """Pull protocol: decode reserves, the interconnect ships, then the KV is freed.
        Under "prefill" a one-token request is complete at its first token."""
        req = job.req
        if req.output_tokens == 1 and self.first_token == "prefill":
            # Done at its first token: nothing to decode, nothing to ship.
            self.counts["completed_at_first_token"] += 1
            self.send(self.collector, "finish", req.id, "completed", None, np.empty(0), job.t_first)
            self._end_handoff(now, job)
            return
        self._reserve(now, job)

    def _reserve(self, now: float, job: _Job) -> None:
        job.state = "reserving"
        job.attempt = 0
        self.send(job.target, "reserve_kv", job.req, job.req.prompt_tokens, job.t_first, self.name)

    def _send_payload(self, now: float, job: _Job) -> None:
        req = job.req
        job.state = "transferring"
        logical = req.prompt_tokens * self.kv_bytes_per_token
        args = (req.id, req.prompt_tokens, self.kv_bytes_per_token, self.n_layers, self.layer_group,
                self.payload_scale, self.cost.kv_dtype, self.kv_seed + job.attempt)
        every = self.kv_verify_every
        if every is None:
            frames = make_kv_frames(*args)
        else:
            k = self._payloads
            self._payloads += 1
            frames = describe_kv_frames(*args)
            if k % every == 0:          # the sampled share: real frames, checked against it
                real = make_kv_frames(*args)
                check_description(frames, real)
                frames = real
        self.send(self.collector, "event", req.id, "transfer_start", now)
        self.send(self.interconnect, "transfer", req, frames, logical, self.name, job.target,
                  job.t_first, req.id)

    def _lost(self, now: float, job: _Job) -> None:
        """The decode engine lost the request (it died or restarted): the KV is still
        here, so it is sent again after a back-off (a restarting engine may not be up
        yet), unless the request ended meanwhile; after `max_peer_retries` losses the
        request fails with reason "decode_unavailable"."""
        self.counts["peer_lost"] += 1
        k = job.losses
        job.losses += 1
        if k == self.max_peer_retries:
            self.counts["failed"] += 1
            self.send(self.collector, "finish", job.req.id, "failed", "decode_unavailable", None, now)
            self._end_handoff(now, job)
            return
        if k:
            job.state = "backoff"
            heapq.heappush(self._retries, (now + min(0.5, 1e-3 * 2 ** (k - 1)), self._seq, job.req.id))
            self._seq += 1
            self._set_wake()
        else:
            self._check_open(job)

    def _check_open(self, job: _Job) -> None:
        job.state = "checking"
        self.send(self.collector, "open_among", [job.req.id], self.name, job.req.id)

    def _end_handoff(self, now: float, job: _Job) -> None:
        """Free a handed-off request's KV; its full prompt blocks join the prefix cache."""
        req = job.req
        del self._handoff[req.id]
        self.pool.free(req.id)
        if self.prefix is not None:
            self.prefix.release(req.id)
            if req.block_hashes:
                self.prefix.insert(req.block_hashes[: req.prompt_tokens // req.block_size],
                                   req.block_size)
                self._publish_kv_events()
        if self.series.enabled:
            self.memory.add(now, self.ledger.used)
        self._sample(now)
        self._poke(now)


def _transfer_failed(result: Any) -> bool:
    """Whether `Interconnect.transfer`'s result says the KV did not arrive intact: False,
    a positive count of bad frames, or a dict/object with ok=False or bad_frames > 0."""
    if result is None or result is True:
        return False
    if result is False:
        return True
    if isinstance(result, (int, np.integer)):
        return int(result) > 0
    if isinstance(result, Mapping):
        return result.get("ok", True) is False or int(result.get("bad_frames", 0)) > 0
    ok = getattr(result, "ok", True)
    return ok is False or int(getattr(result, "bad_frames", 0) or 0) > 0
