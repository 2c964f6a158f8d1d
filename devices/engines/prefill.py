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

Outcomes decided here: "rejected"/"prefill_queue_full" when the queue is at
`max_queue`; "failed"/"prompt_exceeds_kv_capacity" when the prompt's KV alone exceeds
the instance's whole KV capacity (it could never be admitted).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Mapping

import numpy as np

from devices.engines.common import (
    admit_with_prefix,
    prefix_lookup,
    plan_chunk,
    enqueue_batch,
    Lateness,
    TimeSeries,
    Utilisation,
    instance_ledger,
    memory_label,
    model_layers,
    spawn,
)
from devices.memory import KVBlockPool, PrefixCache
from interconnect.codec import make_kv_frames
from interconnect.component import PeerLost


class _Job:
    """A request inside the prefill engine."""

    __slots__ = ("req", "target", "cached", "computed", "started")

    def __init__(self, req, target: str) -> None:
        self.req = req
        self.target = target
        self.cached = 0        # prompt tokens served by the prefix cache
        self.computed = 0      # prompt tokens computed so far
        self.started = False   # prefill_start sent

    @property
    def remaining(self) -> int:
        return self.req.prompt_tokens - self.cached - self.computed


class PrefillEngine:
    """A prefill instance (see the module docstring for the behaviour).

    Keyword args:
        name: instance name (used as `src` of transfers and in ledger messages).
        clock: a `workloads.clock.Clock`.
        cost: the instance's `devices.costmodel.CostModel`.
        collector: handle with async `event`, `events`, `finish` (docs/interfaces.md).
        interconnect: handle with async `transfer(req, frames, logical_bytes, src, dst)`.
        decode: decode engine handles by name (targets of `submit`).
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
            the request (PeerLost: it died or restarted) before the request fails with
            reason "decode_unavailable", >= 0.
        first_token: "decode" or "prefill": who sends the client its first token (module
            docstring); must match the decode engines' setting.
        loading_until_s: no iteration starts before this emulated time (a restarted
            instance reloading its weights, `rack.faults`); None: ready at once.
    Raises ValueError on out-of-range arguments; `planner.ModelDoesNotFit` if the
    weights do not fit the instance.
    """

    def __init__(self, *, name: str, clock: Any, cost: Any, collector: Any, interconnect: Any,
                 decode: Mapping[str, Any], chunk_tokens: int = 8192, max_queue: int = 1024,
                 kv_block_tokens: int = 16, prefix_cache: bool = True,
                 payload_scale: float = 1e-3, layer_group: int = 8,
                 memory_reserve_fraction: float | None = None, memory_plan: Any = None,
                 max_resends: int = 1, kv_seed: int = 0, max_peer_retries: int = 8,
                 first_token: str = "prefill", loading_until_s: float | None = None) -> None:
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
        self.name = name
        self.clock = clock
        self.cost = cost
        self.collector = collector
        self.interconnect = interconnect
        self.decode = dict(decode)
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

        self._queue: deque[_Job] = deque()
        self._running: list[_Job] = []
        self._handoffs = 0                 # requests between first token and KV freed
        self._wake = asyncio.Event()       # new work or freed memory
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Future | None = None
        self._errors: list[BaseException] = []
        self._tasks: set[asyncio.Future] = set()
        self._in_handoff: set[int] = set()     # ids whose KV is held here until handed off
        self.max_peer_retries = max(0, int(max_peer_retries))

        self.util = Utilisation()
        self.lateness = Lateness()
        self.memory = TimeSeries()
        self.counts = {"submitted": 0, "rejected": 0, "failed": 0, "prefilled": 0,
                       "completed_at_first_token": 0, "handoffs_done": 0,
                       "handoffs_refused": 0, "transfer_failed": 0, "resends": 0,
                       "peer_lost": 0, "kv_resent_after_restart": 0}
        self.tokens_computed = 0
        self.tokens_cached = 0
        self.queue_peak = 0

    # ------------------------------------------------------------------ peer API
    @staticmethod
    def warm_up() -> None:
        """Build the codec's cached payload block now (tens of ms the first time), so
        that the first transfer of a wall-clock run does not stall the engine's loop."""
        make_kv_frames(0, 1, 64, 1, 1, 1.0)

    async def submit(self, req, decode_target: str) -> None:
        """Queue `req` for prefill; its KV will go to decode engine `decode_target`.

        Returns at once. Ends the request itself when it is rejected (queue full) or
        can never fit (prompt KV above the instance's KV capacity). Raises KeyError for
        an unknown `decode_target` when the request needs decode.
        """
        await self.submit_many([(req, decode_target)])

    async def submit_many(self, items) -> None:
        """`submit` for a list of (request, decode_target) pairs arriving together."""
        for req, target in items:
            if req.output_tokens > 1 and target not in self.decode:
                raise KeyError(f"PrefillEngine {self.name!r}: unknown decode target {target!r}; "
                               f"known: {sorted(self.decode)}")
        await enqueue_batch(self, items, self._refusal, _Job, self._wake)

    def _refusal(self, req, target):
        if self.pool.bytes_for(req.prompt_tokens) > self.kv_capacity_bytes:
            return ("failed", "prompt_exceeds_kv_capacity")
        return None

    async def outstanding_tokens(self) -> int:
        """Prompt tokens still to compute (queued + running; queued ones counted whole,
        before any prefix-cache hit). For the router's least-loaded policy."""
        return sum(j.remaining for j in self._running) + sum(j.req.prompt_tokens for j in self._queue)

    async def holding(self, ids, drop_reserved: bool = False) -> list[int]:
        """Which of request `ids` are here: queued, being prefilled, or holding their KV
        until it is handed off (`drop_reserved` is for decode engines: ignored). For the
        router's recovery after a peer restarted."""
        want = set(int(i) for i in ids)
        held = [j.req.id for j in (*self._queue, *self._running) if j.req.id in want]
        return held + [i for i in self._in_handoff if i in want]

    def halt(self) -> None:
        """Stop as if the process died (virtual-time fault injection; a Ray actor is
        killed instead): the loop and every handoff stop where they are (a handoff
        waiting on a peer is cancelled there). The object must not be used afterwards."""
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                task.cancel()

    async def drain(self) -> None:
        """Return when nothing is queued, running or being handed off; re-raise a
        background task's exception."""
        self._raise_errors()
        while not self._is_idle():
            self._idle.clear()
            await self.clock.wait_until(self._idle, None)
            self._raise_errors()

    async def stats(self) -> dict:
        """Counters and gauges (plain values and numpy arrays; picklable)."""
        self._raise_errors()
        now = self.clock.now()
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
            "handoffs_in_flight": self._handoffs,
            "tokens_computed": self.tokens_computed,
            "tokens_cached": self.tokens_cached,
            "prefix_cache": self.prefix.stats.as_dict() if self.prefix else None,
            "prefix_cache_entries": len(self.prefix) if self.prefix else 0,
            **self.counts,
        }
        out.update(self.util.as_dict(self.cost.peak_flops, self.cost.memory_bandwidth, now))
        out.update(self.lateness.as_dict())
        return out

    # ------------------------------------------------------------------ internals
    def _start(self) -> None:
        if self._loop_task is None:
            self._loop_task = spawn(self._loop(), self._errors)
            self._loop_task.add_done_callback(lambda _f: self._idle.set())

    def _raise_errors(self) -> None:
        if self._errors:
            raise RuntimeError(f"PrefillEngine {self.name!r}: a background task failed") from self._errors[0]

    def _is_idle(self) -> bool:
        return bool(self._errors) or not (self._queue or self._running or self._handoffs)

    def _note_idle(self) -> None:
        if self._is_idle():
            self._idle.set()

    def _try_admit(self, job: _Job) -> bool:
        """Allocate the KV of `job`'s uncached prompt (after a prefix-cache lookup),
        evicting LRU prefix entries if needed. False (nothing held) if it cannot fit."""
        req = job.req
        hashes, hit, cached = prefix_lookup(self.prefix, req)
        need_blocks = self.pool.blocks_for(req.prompt_tokens - cached)
        need_bytes = need_blocks * self.pool.block_bytes
        if self.ledger.free_bytes < need_bytes and self.prefix is not None:
            self.prefix.make_room(need_bytes)
        if not self.pool.try_allocate(req.id, need_blocks):
            if self.prefix is not None:
                self.prefix.release(req.id)
            return False
        admit_with_prefix(self, job, hashes, hit, cached)
        return True

    def _schedule(self) -> list[tuple[_Job, int]]:
        """The next iteration's (job, new tokens) list: continuing requests first, then
        FCFS admissions while budget and memory last."""
        return plan_chunk(self._running, self._queue, self.chunk_tokens, self._try_admit)

    async def _loop(self) -> None:
        clock = self.clock
        if self.loading_until_s is not None and clock.now() < self.loading_until_s:
            await clock.sleep_until(self.loading_until_s)     # weights still loading
        t_free = None       # end of the previous iteration when running back to back
        while True:
            self._wake.clear()
            plan = self._schedule()
            if not plan:
                self._note_idle()
                await clock.wait_until(self._wake, None)
                t_free = None
                continue
            # Back-to-back iterations start when the previous one ended, not after the
            # collector round trips in between (which take wall time on the Ray runtime).
            t0 = clock.now() if t_free is None else t_free
            new = np.fromiter((take for _, take in plan), dtype=np.int64, count=len(plan))
            cached = np.fromiter((j.cached + j.computed for j, _ in plan), dtype=np.int64,
                                 count=len(plan))
            c = self.cost.prefill(new, cached)
            t1 = t0 + c.time_s
            starts = [(j.req.id, "prefill_start", t0) for j, _ in plan if not j.started]
            for j, _ in plan:
                j.started = True
            self.memory.add(t0, self.ledger.used)
            if starts:
                await self.collector.events(starts)
            await clock.sleep_until(t1)
            self.lateness.note(t1, clock.now())
            t_free = t1
            self.util.add(c.time_s, c.flops, c.bytes, device_busy_s=c.device_busy_s)
            self.tokens_computed += int(new.sum())
            done: list[_Job] = []
            for j, take in plan:
                j.computed += take
                if j.remaining == 0:
                    done.append(j)
            if done:
                ids = {id(j) for j in done}
                self._running = [j for j in self._running if id(j) not in ids]
                self.counts["prefilled"] += len(done)
                self._handoffs += len(done)
                names = ("prefill_end", "first_token") if self.first_token == "prefill" else ("prefill_end",)
                await self.collector.events([(j.req.id, nm, t1) for j in done for nm in names])
                for j in done:
                    self._in_handoff.add(j.req.id)      # held from now on (see `holding`)
                    task = spawn(self._handoff(j, t1), self._errors)
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _handoff(self, job: _Job, t_first: float) -> None:
        """Pull protocol: decode reserves, the interconnect ships, then free the KV.

        If the decode engine dies or restarts meanwhile (PeerLost), the KV is still
        here: it is sent again (after a back-off, as a restarting engine may not be up
        yet) up to `max_peer_retries` times, unless the request has ended meanwhile;
        then the request fails with reason "decode_unavailable"."""
        req = job.req
        try:
            if req.output_tokens == 1 and self.first_token == "prefill":
                # Done at its first token: nothing to decode, nothing to ship.
                self.counts["completed_at_first_token"] += 1
                await self.collector.finish(req.id, "completed", itl_s=np.empty(0), t=t_first)
                return
            for lost in range(self.max_peer_retries + 1):
                try:
                    await self._ship(job, t_first)
                    return
                except PeerLost:
                    self.counts["peer_lost"] += 1
                    if lost == self.max_peer_retries:
                        break
                    if lost:
                        await self.clock.sleep_until(self.clock.now() + min(0.5, 1e-3 * 2 ** (lost - 1)))
                    if not await self.collector.open_among([req.id]):
                        return          # it ended meanwhile (e.g. its KV did arrive before the loss)
                    self.counts["kv_resent_after_restart"] += 1
            self.counts["failed"] += 1
            await self.collector.finish(req.id, "failed", reason="decode_unavailable", t=self.clock.now())
        finally:
            self._in_handoff.discard(req.id)
            self._release(job)

    async def _ship(self, job: _Job, t_first: float) -> None:
        """One handoff attempt: reserve, transfer (re-sending bad payloads), or abort.
        Raises PeerLost if the decode engine lost the request's reservation."""
        req = job.req
        target = self.decode[job.target]
        ok = await target.reserve_kv(req, req.prompt_tokens, first_token_s=t_first)
        if ok is False:
            # The decode engine ended the request (it can never fit there, or its
            # reservation queue is full) or already holds its KV.
            self.counts["handoffs_refused"] += 1
            return
        logical = req.prompt_tokens * self.kv_bytes_per_token
        for attempt in range(self.max_resends + 1):
            frames = make_kv_frames(req.id, req.prompt_tokens, self.kv_bytes_per_token,
                                    self.n_layers, self.layer_group, self.payload_scale,
                                    kv_dtype=self.cost.kv_dtype, seed=self.kv_seed + attempt)
            await self.collector.event(req.id, "transfer_start", self.clock.now())
            result = await self.interconnect.transfer(req, frames, logical, src=self.name,
                                                      dst=job.target, first_token_s=t_first)
            t_end = getattr(result, "end_s", None)
            await self.collector.event(req.id, "transfer_end",
                                       self.clock.now() if t_end is None else float(t_end))
            if not _transfer_failed(result):
                self.counts["handoffs_done"] += 1
                break
            if attempt < self.max_resends:
                self.counts["resends"] += 1
        else:
            # Still bad after the re-sends: the receiver drops its reservation and
            # ends the request (a bad frame is never used).
            self.counts["transfer_failed"] += 1
            try:
                await target.abort_kv(req, "kv_checksum")
            except PeerLost:        # the receiver restarted meanwhile: end it here
                await self.collector.finish(req.id, "failed", reason="kv_checksum", t=self.clock.now())

    def _release(self, job: _Job) -> None:
        """Free a handed-off request's KV; its full prompt blocks join the prefix cache."""
        req = job.req
        self.pool.free(req.id)
        if self.prefix is not None:
            self.prefix.release(req.id)
            if req.block_hashes:
                self.prefix.insert(req.block_hashes[: req.prompt_tokens // req.block_size],
                                   req.block_size)
        self._handoffs -= 1
        self.memory.add(self.clock.now(), self.ledger.used)
        self._wake.set()
        self._note_idle()


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
