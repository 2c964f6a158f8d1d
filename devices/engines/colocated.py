"""The colocated engine: prefill and decode on one instance (the baselines: GPU only,
wafer only; and the local path of conditional disaggregation).

It is a `DecodeEngine` whose requests come from its own FCFS prefill queue instead of
a KV transfer. The scheduler is vLLM's with chunked prefill: while prompts are being
prefilled, every iteration is one *mixed* iteration, a decode step of the running
batch fused with a prefill chunk, priced by `cost.mixed(new, cached, context_lens)`;
the chunk's token budget is `chunk_tokens` minus the batch's decode tokens (vLLM's
max_num_batched_tokens counts both; on SGLang stacks `chunk_tokens` whole, as SGLang's
chunked_prefill_size budgets the prefill alone: `decode_in_budget`), continuing prompts
first, then FCFS admissions, each prompt taking at most `prompt_chunk_tokens` of it
(vLLM's long_prefill_token_threshold), so the budget spreads over several prompts. On a
wafer the chunks of the several prompts stream through the layer regions at once,
beside the decode micro-batches (`CostModel.mixed`); `devices.chunking` sizes both from
a TPOT target.
When no prompt is in progress (or the batch alone fills the budget) the engine runs
decode-only with event skipping, exactly as `DecodeEngine`, and a new submission cuts
the run at the next step boundary. Mixed iterations skip events the same way: while one
long prompt takes each iteration's whole budget without finishing, its chunks over the
fixed decode batch are priced in one go (`CostModel.mixed_steps`), and an admission
cuts that run at the next iteration boundary. The engine's work therefore grows with
prompts and batch changes, not with output tokens or a long prompt's chunks.

Memory: one ledger. A prompt is admitted when its KV fits ("reserve": the final
footprint prompt + output - 1 tokens; "preempt": the prompt, then block-by-block
growth with recompute preemption, see `devices.engines.decode`); preempted requests
waiting for memory block new admissions (they go first). With the prefix cache, a
prompt's leading full blocks found in the cache are not recomputed and their KV is
shared (the pinned entries hold it; only the rest is allocated); a finished request's
full prompt blocks join the cache, which gives memory back (LRU) whenever KV needs it.
A prompt's first token is produced at the end of its last chunk (`first_token`); it
joins the decode batch at the next iteration (`decode_admit`); a request with one
output token completes at its first token. ITL and timing as in `DecodeEngine`; the
first ITL sample is the gap from the first token to the first decode step.

Receive interval (SGLang's `--scheduler-recv-interval N`,
python/sglang/srt/managers/scheduler_recv_skipper.py): the scheduler takes new requests
in only at its receive points. Its counter adds 1 per decode (or speculative verify)
iteration and 1000 per other iteration (environ.py: SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_*
defaults), and it receives when the counter reaches N, then resets it. So after a
prefill iteration it receives at once, while decoding only every N decode steps, and
when idle at once. A prompt that arrives during a run of decode steps waits in the
engine's inbox until the next receive point (the run is cut there); every prompt that
arrived by then is queued at once and prefilled together. N = 1 (SGLang's default)
receives at every iteration, as before.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from devices.engines.common import (admit_with_prefix, attach_host_tier, ceil_div, enqueue_batch, host_load_s,
                                    host_prefix, plan_chunk, prefix_lookup, record_series)
from devices.engines.decode import AdmissionPolicy, DecodeEngine, _Seq, _step_ends
from devices.memory import PrefixCache


class _Job:
    """A prompt in the prefill part of the colocated engine."""

    __slots__ = ("req", "cached", "computed", "started", "load_s")

    def __init__(self, req) -> None:
        self.req = req
        self.cached = 0
        self.computed = 0
        self.started = False
        self.load_s = 0.0          # its prefix's load from the host tier (s)

    @property
    def remaining(self) -> int:
        return self.req.prompt_tokens - self.cached - self.computed


class ColocatedEngine(DecodeEngine):
    """Prefill + decode on one instance (see the module docstring).

    Keyword args: as `DecodeEngine` (name, cost, collector, max_batch,
    kv_block_tokens, admission_policy, memory_reserve_fraction, memory_plan,
    max_steps_per_wake, max_reserve_queue, first_token (for KV shipped here by a prefill
    pool: conditional disaggregation), loading_until_s, stream_to (also told each prompt's
    first token, `first_token`)), plus
        chunk_tokens: token budget of one iteration (prefill + decode tokens), >= 1.
        max_queue: queued prompts beyond which `submit` rejects ("prefill_queue_full").
        prefix_cache: enable the prefix cache (requests with `block_hashes`).
        recv_interval: decode steps between the scheduler's receives of new requests
            (SGLang --scheduler-recv-interval, >= 1; see the module docstring).
        prompt_chunk_tokens: at most this many tokens of one prompt per iteration
            (vLLM's long_prefill_token_threshold; None: the whole budget), so an
            iteration's budget spreads over several prompts: on a wafer each is a
            stream of its own through the layer regions (`CostModel.mixed`), and the
            longest stream sets the step's time (`devices.chunking` picks it from a
            TPOT target).
        host_kv_bytes: host memory for prefixes the prefix cache evicts (0: none;
            `devices.memory.HostKVTier`); host_kv_Bps: its link (None: the devices'
            `weight_load_Bps`).
        timeseries: see `DecodeEngine`.
        decode_in_budget: whether the running batch's decode tokens count against
            `chunk_tokens` (True: vLLM, whose max_num_batched_tokens counts both). False
            on SGLang stacks: SGLang's chunked_prefill_size budgets the prefill alone
            (`PrefillAdder(..., rem_chunk_tokens=chunked_prefill_size,
            mixed_with_decode_tokens=running_bs if is_mixed_chunk else 0)` in
            python/sglang/srt/managers/scheduler.py, `get_new_batch_prefill`; only the
            non-default --enable-mixed-chunk subtracts the running batch), so a long
            prompt takes no extra chunk pass because decodes are running.
    `max_batch` bounds the requests being prefilled or decoded at once.
    """

    def __init__(self, *, name: str, cost: Any, collector: str,
                 chunk_tokens: int = 8192, max_queue: int = 1024, max_batch: int = 256,
                 kv_block_tokens: int = 16, prefix_cache: bool = True,
                 admission_policy: AdmissionPolicy = "reserve",
                 memory_reserve_fraction: float | None = None, memory_plan: Any = None,
                 max_steps_per_wake: int = 4096, max_reserve_queue: int | None = None,
                 first_token: str = "prefill", loading_until_s: float | None = None,
                 recv_interval: int = 1, stream_to: str | None = None,
                 prompt_chunk_tokens: int | None = None, host_kv_bytes: int = 0,
                 host_kv_Bps: float | None = None, timeseries: bool = True,
                 decode_in_budget: bool = True) -> None:
        if int(chunk_tokens) < 1:
            raise ValueError(f"ColocatedEngine {name!r}: chunk_tokens must be >= 1, got {chunk_tokens}")
        if int(max_queue) < 0:
            raise ValueError(f"ColocatedEngine {name!r}: max_queue must be >= 0, got {max_queue}")
        if prompt_chunk_tokens is not None and int(prompt_chunk_tokens) < 1:
            raise ValueError(f"ColocatedEngine {name!r}: prompt_chunk_tokens must be >= 1 or None, "
                             f"got {prompt_chunk_tokens}")
        if int(recv_interval) < 1:
            raise ValueError(f"ColocatedEngine {name!r}: recv_interval must be >= 1, got {recv_interval}")
        super().__init__(name=name, cost=cost, collector=collector,
                         max_batch=max_batch, kv_block_tokens=kv_block_tokens,
                         admission_policy=admission_policy,
                         memory_reserve_fraction=memory_reserve_fraction,
                         memory_plan=memory_plan, max_steps_per_wake=max_steps_per_wake,
                         max_reserve_queue=max_reserve_queue, first_token=first_token,
                         loading_until_s=loading_until_s, stream_to=stream_to, timeseries=timeseries)
        self.chunk_tokens = int(chunk_tokens)
        self.prompt_chunk_tokens = None if prompt_chunk_tokens is None else int(prompt_chunk_tokens)
        self.decode_in_budget = bool(decode_in_budget)
        self.max_queue = int(max_queue)
        self.prefix = PrefixCache(self.ledger, self.pool.kv_bytes_per_token) if prefix_cache else None
        attach_host_tier(self, host_kv_bytes, host_kv_Bps)
        self._queue: deque[_Job] = deque()
        self._prefilling: list[_Job] = []
        self.recv_interval = int(recv_interval)
        self._inbox: deque[_Job] = deque()     # arrived, not yet received by the scheduler
        self._recv_base = 0                    # global step index where the receive counter was reset
        self.queue_peak = 0
        self.tokens_computed = 0
        self.tokens_cached = 0
        self.counts.update({"submitted": 0, "rejected": 0, "prefilled": 0,
                            "completed_at_first_token": 0, "mixed_iterations": 0})
        self._mixed: tuple | None = None      # the mixed iteration(s) in progress (see `_extra_work`)

    # ------------------------------------------------------------------ handlers
    def submit_many(self, now: float, items) -> None:
        """Queue (request, decode_target) pairs arriving together (prefill then decode
        here; the target is ignored); ends a request itself when rejected or when it can
        never fit. A new prompt cuts a decode-only run at the next step boundary, or with
        a receive interval at the scheduler's next receive point (it waits in the inbox)."""
        n0 = len(self._queue)
        if not enqueue_batch(self, now, items, self._refusal, lambda req, _target: _Job(req),
                             held=len(self._inbox)):
            return
        if self.recv_interval > 1 and self._phase == "run" and self._run is not None:
            new = [self._queue.pop() for _ in range(len(self._queue) - n0)]
            self._inbox.extend(reversed(new))
            self._cut_at_receive(now)
        else:
            self._kick(now)

    # ------------------------------------------------------------------ receive interval
    def _next_receive(self, step: int) -> int:
        """The first receive point at or after global step boundary `step`: the counter
        was reset at `_recv_base` and reaches the interval every `recv_interval` steps."""
        n = self.recv_interval
        return self._recv_base + n * ceil_div(max(0, step - self._recv_base), n)

    def _cut_at_receive(self, now: float) -> None:
        """Prompts wait in the inbox: cut the decode run in progress at the first
        receive point after `now` (the step in progress finishes), if it gets that far."""
        t0, ends, _, _ = self._run
        g0 = self._t_end.stop                       # the run's first step (not yet logged)
        n = int(ends.searchsorted(now, side="right"))
        boundary = g0 + n if (now == t0 or (n > 0 and ends[n - 1] == now)) else g0 + n + 1
        p = self._next_receive(boundary) - g0
        if p < self._run_steps:
            self._run_steps = p
            self._wake_at(float(ends[p - 1]) if p else t0)
            self._stream_cut()

    def _receive(self) -> None:
        """At a batch boundary: take the inbox in if the scheduler receives here (a
        receive point, or nothing to decode: an idle scheduler receives at once)."""
        if not self._inbox:
            return
        now_step = self._t_end.stop
        if self._batch or self._ready:
            if self._next_receive(now_step) != now_step:
                return
        self._queue.extend(self._inbox)
        self._inbox.clear()

    def _run_limit(self) -> int | None:
        if not self._inbox:
            return None
        now_step = self._t_end.stop
        return max(1, self._next_receive(now_step) - now_step)

    def _body(self, t: float) -> None:
        self._receive()
        super()._body(t)

    def _end_stall(self, now: float, t1: float) -> None:
        super()._end_stall(now, t1)
        self._recv_base = self._t_end.stop          # after a prefill pass the scheduler receives

    def _refusal(self, req, target):
        if self.pool.bytes_for(req.prompt_tokens) > self.kv_capacity_bytes:
            return ("failed", "prompt_exceeds_kv_capacity")
        if self.pool.bytes_for(req.prompt_tokens + req.output_tokens - 1) > self.kv_capacity_bytes:
            return ("failed", "exceeds_decode_kv_capacity")
        return None

    def holding(self, now: float, ids, drop_reserved: bool, reply_to: str, tag: Any) -> None:
        """As `DecodeEngine.holding`, plus the prompts queued or being prefilled here."""
        want = set(int(i) for i in ids)
        mine = [j.req.id for j in (*self._inbox, *self._queue, *self._prefilling) if j.req.id in want]
        super().holding(now, ids, drop_reserved, reply_to, tag)
        dst, method, (tag_, name, held) = self.outbox.pop()
        self.send(dst, method, tag_, name, held + mine)

    def held_requests(self) -> list[int]:
        """As `DecodeEngine.held_requests`, plus the prompts queued or being prefilled here."""
        mine = {j.req.id for j in (*self._inbox, *self._queue, *self._prefilling)}
        return sorted(mine.union(super().held_requests()))

    def is_idle(self) -> bool:
        return super().is_idle() and not (self._queue or self._prefilling or self._inbox)

    def stats(self, now: float) -> dict:
        out = super().stats(now)
        out.update({
            "role": "both",
            "queue_len": len(self._queue) + len(self._inbox),
            "queue_peak": self.queue_peak,
            "prefilling": len(self._prefilling),
            "tokens_computed": self.tokens_computed,
            "tokens_cached": self.tokens_cached,
            "prefix_cache": self.prefix.stats.as_dict() if self.prefix else None,
            "host_kv": self.prefix.host.as_dict() if self.prefix is not None and self.prefix.host is not None else None,
            "prefix_cache_entries": len(self.prefix) if self.prefix else 0,
            # bytes a cached token holds (all its copies): the cache's size in tokens is
            # at most kv_capacity_bytes / this
            "prefix_cache_bytes_per_token": self.prefix.kv_bytes_per_token if self.prefix else None,
        })
        return out

    # ------------------------------------------------------------------ memory hooks
    def _available_bytes(self) -> int:
        extra = self.prefix.evictable_bytes() if self.prefix is not None else 0
        return self.ledger.free_bytes + extra

    def _make_room(self, nbytes: int) -> bool:
        if self.prefix is not None:
            return self.prefix.make_room(nbytes)
        return self.ledger.free_bytes >= nbytes

    def _release_kv(self, s: _Seq) -> None:
        req = s.req
        self.pool.free(req.id)
        if self.prefix is not None:
            self.prefix.release(req.id)
            if req.block_hashes:
                self.prefix.insert(req.block_hashes[: req.prompt_tokens // req.block_size],
                                   req.block_size)

    # ------------------------------------------------------------------ prefill part
    def _try_admit(self, job: _Job) -> bool:
        """Book `job`'s KV (after a prefix-cache lookup); False (nothing held) if it
        cannot start now."""
        if self._waiters:                  # preempted requests wait for memory: they go first
            return False
        if len(self._batch) + len(self._ready) + len(self._prefilling) >= self.max_batch:
            return False
        req = job.req
        hashes, hit, cached = prefix_lookup(self.prefix, req)
        final = req.prompt_tokens + req.output_tokens - 1
        tokens = (final if self.policy == "reserve" else req.prompt_tokens) - cached
        blocks = self.pool.blocks_for(tokens)
        need = blocks * self.pool.block_bytes
        if need > self._available_bytes() or not self._make_room(need) \
                or not self.pool.try_allocate(req.id, blocks):
            if self.prefix is not None:
                self.prefix.release(req.id)
            return False
        admit_with_prefix(self, job, hashes, hit, cached + host_prefix(self, job, hashes, hit, cached))
        return True

    def _schedule(self, budget: int) -> list[tuple[_Job, int]]:
        return plan_chunk(self._prefilling, self._queue, budget, self._try_admit, self.prompt_chunk_tokens)

    def _extra_work(self, t: float) -> bool:
        """Mixed iterations (decode step + prefill chunk) if a prompt can progress: one,
        or a fused run of them while one prompt takes the whole budget without finishing
        (see `_fusable`). Started at `t`; True if one was."""
        if not (self._prefilling or self._queue):
            return False
        budget = self.chunk_tokens - (len(self._batch) if self.decode_in_budget else 0)
        if budget <= 0:
            return False
        t0 = t
        take = self._take(budget)
        run = self._fusable(budget)
        k = self._plan(t0, limit=run) if self._batch else 0   # may preempt (policy "preempt")
        plan = self._schedule(budget)
        if not plan:
            return False
        batch = list(self._batch) if k else []
        ctx = self._contexts(batch) if batch else np.zeros(0, np.int64)
        n = (k if batch else run) if run > 1 and len(plan) == 1 and plan[0] == (self._prefilling[0], take) else 1
        if n > 1:
            job = plan[0][0]
            sc = self.cost.mixed_steps(take, job.cached + job.computed, ctx, n)
            ends = _step_ends(t0, sc.time_s)
            c = None
        else:
            # (lists: `mixed` converts a few ints from a list faster than from an array)
            c = self.cost.mixed([take for _, take in plan], [j.cached + j.computed for j, _ in plan], ctx)
            ends = np.array([t0 + host_load_s(plan) + c.time_s])
            sc = None
        for j, _ in plan:
            if not j.started:
                j.started = True
                self._pending_events.append((j.req.id, "prefill_start", t0))
        self._gauges(t0, len(batch))
        self._flush_events()
        self._mixed = (t0, ends, sc, c, batch, plan, n)
        if n > 1:
            self._begin_run(t0, ends, sc, batch, "mixed")     # an admission cuts the run
        else:
            self._run = None
            self._phase = "mixed"
            self._wake_at(float(ends[0]))
            self._stream_run(t0, ends, batch)
        return True

    def _end_mixed(self, now: float) -> float:
        """The mixed iteration(s) ended: book them, complete what finished; returns
        where the next turn starts."""
        t0, ends, sc, c, batch, plan, n = self._mixed
        self._mixed = None
        if n > 1:
            steps = self._run_steps
            self.wakeups += 1
            self.lateness.note(float(ends[steps - 1]) if steps else t0, now)
            self._run = None
        else:
            steps = 1
            self.lateness.note(float(ends[0]), now)
            self.wakeups += 1
        finished = self._commit(batch, t0, ends, steps) if batch else []
        if steps == 0:
            self._finish(finished)
            return t0
        t1 = float(ends[steps - 1])
        self._recv_base = self._t_end.stop          # after a prefill pass the scheduler receives
        self.counts["mixed_iterations"] += steps
        self._t_free = t1           # a decode-only run that follows starts here
        if n > 1:
            flops, nbytes = sc.work(steps)
            busy = sc.busy(steps)
        else:
            flops, nbytes, busy = c.flops, c.bytes, c.device_busy_s
        self.util.add(t1 - t0, flops, nbytes, iterations=steps, device_busy_s=busy)
        done = []
        for j, take in plan:
            j.computed += take * steps
            self.tokens_computed += take * steps
            if j.remaining == 0:
                done.append(j)
        single = []
        if done:
            ids = {id(j) for j in done}
            self._prefilling = [j for j in self._prefilling if id(j) not in ids]
            self.counts["prefilled"] += len(done)
            for j in done:
                self._pending_events.append((j.req.id, "prefill_end", t1))
                self._pending_events.append((j.req.id, "first_token", t1))
                if self.stream_to is not None:
                    self.send(self.stream_to, "first_token", j.req.id, t1)
                s = _Seq(j.req, t1)
                s.shared = j.cached
                if s.n_out == 1:
                    self._release_kv(s)
                    self.counts["completed_at_first_token"] += 1
                    single.append(s)
                else:
                    self._ready.append(s)
        self._finish(finished)
        for s in single:
            self.send(self.collector, "finish", s.req.id, "completed", None, np.empty(0), t1)
        if single:
            self._grant(t1)
        return t1

    def _sample(self, t: float) -> None:
        """As `DecodeEngine._sample`, with the prompts queued here waiting and those
        being prefilled running."""
        record_series(self, t, len(self._queue) + len(self._waiters) + len(self._reservations) + len(self._ready),
                      len(self._batch) + len(self._prefilling))

    def _take(self, budget: int) -> int:
        """Tokens one prompt may take of an iteration's `budget` (`prompt_chunk_tokens`)."""
        return budget if self.prompt_chunk_tokens is None else min(budget, self.prompt_chunk_tokens)

    def _fusable(self, budget: int) -> int:
        """How many coming iterations the first prompt in progress takes the whole
        `budget` (or its per-prompt share, `_take`, when it is the only prompt in
        progress or queued) without finishing (>= 1), else 1.

        Through those, nothing but an admission changes the schedule: prompts in
        progress are served in order and admissions need budget left, so every
        iteration is the same chunk of that prompt over a fixed decode batch (until one
        of its requests finishes, which `_plan`'s limit respects). They are priced in
        one go (`CostModel.mixed_steps`) and an admission cuts the run at the next
        iteration boundary, as in a decode-only run: the engine's work grows with
        batch changes, not with the chunks of a long prompt.
        """
        if not self._prefilling:
            return 1
        take = self._take(budget)
        if take < budget and (len(self._prefilling) > 1 or self._queue):
            return 1                    # the budget left over goes to other prompts
        left = self._prefilling[0].remaining
        return max(1, min((left - 1) // take, self.max_steps_per_wake)) if left > take else 1
