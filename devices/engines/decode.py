"""The decode engine (wafer-scale SRAM or GPU HBM): continuous batching with event skipping.

Memory. The instance's ledger (capacity, weights and workspace from
`planner.plan_memory`) holds the KV of the running batch in paged blocks of
`kv_block_tokens`. A request enters through the pull protocol: `reserve_kv` books the
memory for its incoming KV (waiting FIFO until it fits; the sender keeps the KV until
then), the interconnect ships the frames, `receive_kv` verifies every frame and hands
the request to the batch at the next step boundary. Two admission policies:

- "reserve" (default, safe): `reserve_kv` books the request's *final* footprint,
  prompt + output_tokens - 1 tokens (the KV after its last decode step). This is a
  max_tokens-style reservation, as when a server reserves for the request's full
  `max_tokens`: decode can never run out of memory and never preempts, at the price of
  memory held early.
- "preempt": `reserve_kv` books only the prompt's blocks; each request's KV grows block
  by block as it decodes. Before each run of steps the engine computes at which step
  the batch's growth would overflow the ledger and stops there; at that boundary it
  preempts the most recently admitted request (vLLM's recompute preemption): its blocks
  are freed, it records a `preempted` event and goes to the front of the reservation
  queue (behind earlier preempted requests, before any new reservation) for prompt +
  tokens-generated-so-far tokens. When that is granted it re-enters
  the batch after a recompute prefill of those tokens on this device
  (`cost.prefill([prompt + generated], [0])`), during which the whole batch stalls (one
  iteration, as an unchunked prefill in the same scheduler would); it then generates
  its remaining tokens normally; it sends `decode_readmit` (its first `decode_admit`
  stays the first admission) and tells the collector the tokens it recomputed
  (`note_recomputed`). Its ITL samples include the gap around the
  preemption. Memory for a run of k steps is booked when the run starts (the growth up
  to its last step), so a reservation made mid-run cannot take it; blocks not yet used
  are returned if the run is cut short.

Time: events, not tokens. Between batch-changing events (admission, completion,
preemption) the batch is fixed, so the engine asks `cost.decode_steps(context_lens, k)`
for the next k step times at once, k = steps until the earliest completion (at most
`max_steps_per_wake`, then it continues), and asks to be woken at the last of them.
An admission during the run cuts it: the engine counts the steps finished by then with
`np.searchsorted`, lets the step in progress finish and rebuilds the batch there.
`wakeups` counts the runs it ended: it grows with batch changes, not with output tokens.

A core (`workloads.core`): handlers `reserve_kv` (replies `kv_reserved(request id,
"granted" | "refused" | "lost")` to the sender), `receive_kv` (replies
`kv_received(tag, bad frames)`, -1 without a reservation), `abort_kv`, `holding`
(replies `held`); it sends lifecycle events and outcomes to the collector. A handler
that lets a request into the batch does not act at once: it asks for a wake-up at the
current time, so every message of that instant is in before the next batch forms (the
virtual driver delivers messages before wake-ups).

Speculative decoding: the cost model's `tokens_per_step` (expected tokens per
verification step, >= 1) is used as a deterministic expectation. Step j of a stint
emits floor(j * tps) - floor((j - 1) * tps) tokens, so n remaining tokens need
ceil(n / tps) steps (the last step emits the rest).

Token timing. The engine keeps one growing log of step start/end times; a request
keeps the index range of the steps it took part in. At completion its token times are
rebuilt: one token per step at the step's end, or with speculative decoding the q
tokens of a step spread evenly over it (start + i/q * duration, i = 1..q, the last at
the step's end), except the tokens of the step that makes the client's first token
(first_token = "decode"): they all come at its end, since no token of a verification
step exists before the step has ended (so speculative decoding never lowers TTFT). ITL samples are the gaps between consecutive output tokens, starting
with the gap from the first token (made by prefill, `first_token_s`) to the first
decode token, which therefore includes the KV transfer and admission wait. So a
request with n output tokens has n - 1 samples and their mean is exactly
TPOT = (E2E - TTFT) / (n - 1) (DESIGN.md metric definitions).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Any, Literal

import numpy as np

from devices.engines.common import (
    EventSeries,
    GrowingArray,
    ITLRef,
    Lateness,
    TimeSeries,
    Utilisation,
    emitted_after,
    instance_ledger,
    memory_label,
    model_layers,
    step_token_times,
    record_series,
    step_log_key,
    steps_for,
)
from devices.memory import KVBlockPool
from interconnect.codec import KVDescription, scan_kv_frames
from workloads.core import Core

AdmissionPolicy = Literal["reserve", "preempt"]
#: Who sends the client a split request's first output token (DecodeEngine docstring).
FirstToken = Literal["decode", "prefill"]
#: `_first_end` of an empty batch: a step index no run reaches.
_NEVER = 1 << 62
_NO_GAPS = np.zeros(0)


class _Waiter:
    """A memory reservation waiting in FIFO order (external request or preempted seq)."""

    __slots__ = ("req", "kv_tokens", "blocks", "first_token_s", "src", "granted", "seq")

    def __init__(self, req, kv_tokens: int, blocks: int, first_token_s, seq=None, src: str | None = None) -> None:
        self.req = req
        self.kv_tokens = kv_tokens
        self.blocks = blocks
        self.first_token_s = first_token_s
        self.src = src          # the sender to reply to (external reservations)
        self.granted = False
        self.seq = seq


class _Seq:
    """A request in the decode engine (ready or running).

    `first_token_s`: when the client received the first output token from the prefill
    side (first_token = "prefill"): this engine then generates the other n_out - 1
    tokens, the first step's input being that token (context prompt + 1). None: the
    client's first token is this engine's (first_token = "decode", as vLLM's and
    Dynamo's disaggregated serving): it generates all n_out tokens, the first step
    recomputing the last prompt position (context prompt), so its KV after j >= 1
    steps holds prompt - 1 + j tokens (the prompt's KV, shipped, at j = 0).
    """

    __slots__ = ("req", "first_token_s", "prompt", "n_out", "total", "ctx0", "kv0", "emitted",
                 "rem", "steps", "start", "end", "order", "times", "recompute", "shared", "base_less_start")

    def __init__(self, req, first_token_s: float | None) -> None:
        self.req = req
        self.first_token_s = None if first_token_s is None else float(first_token_s)
        self.prompt = int(req.prompt_tokens)
        self.n_out = int(req.output_tokens)
        here = first_token_s is None          # the client's first token comes from here
        self.total = self.n_out if here else self.n_out - 1   # tokens this engine generates
        self.ctx0 = self.prompt if here else self.prompt + 1  # context of the first step
        self.kv0 = self.prompt - 1 if here else self.prompt   # KV tokens = kv0 + generated (>= prompt)
        self.emitted = 0          # decode tokens emitted before the current stint
        self.rem = 0              # tokens to emit in the current stint
        self.steps = 0            # steps the current stint needs
        self.start = 0            # global index of the stint's first step (steps done in the
                                  # stint: the engine's step count minus this, `_done`)
        self.end = 0              # global step at which the stint ends (start + steps)
        self.order = 0            # admission order (preemption picks the largest)
        self.times: list[np.ndarray] = []   # token times of ended stints
        self.recompute = False
        self.shared = 0           # prompt tokens whose KV lives in (pinned) prefix-cache entries
        self.base_less_start = 0  # in the batch: context at the stint's start - start (`_admit_ready`)


class DecodeEngine(Core):
    """A decode instance (see the module docstring for the behaviour).

    Keyword args:
        name: instance name (the core's name; ledger messages, stats).
        cost: the instance's `devices.costmodel.CostModel` (its `tokens_per_step`
            carries speculative decoding).
        collector: the collector's name.
        max_batch: most requests in the running batch, >= 1.
        kv_block_tokens: tokens per paged KV block, >= 1.
        admission_policy: "reserve" or "preempt" (module docstring).
        memory_reserve_fraction: `planner.plan_memory`'s reserve_fraction; None: default.
        memory_plan: overrides the planner: an object with `capacity_bytes`,
            `weight_bytes`, `reserve_bytes` (ints).
        max_steps_per_wake: longest run of steps computed at once (bounds the arrays;
            the run continues after it), >= 1.
        max_reserve_queue: KV reservations that may wait for memory at once; one more
            is refused ("rejected"/"decode_queue_full"); None: unbounded.
        first_token: who sends the client its first output token for requests whose KV
            arrives here: "decode" (this engine's first step after admission, as vLLM's
            and Dynamo's disaggregated serving do; it generates every output token) or
            "prefill" (the prefill instance streams it at the end of the prompt; this
            engine generates the rest). See `_Seq`.
        loading_until_s: the engine runs no step before this emulated time (a restarted
            instance reloading its weights, `rack.wiring.faults`); None: ready at once.
        stream_to: a live front's name (`rack.serve`), told the planned token times of
            every run of steps (`tokens_planned`) and where a run was cut
            (`run_cut`), so that it streams tokens at their emulated times without a
            message per token; None (replays): nothing is sent.
        timeseries: record the gauges over time (memory, batch size, `series`) at every
            batch boundary; False: none (a run nothing reads them from, e.g. a sweep's:
            `run_scenario(timeseries=False)`); every other figure is the same.
    Raises ValueError on out-of-range arguments; `planner.ModelDoesNotFit` if the
    weights do not fit.
    """

    def __init__(self, *, name: str, cost: Any, collector: str, max_batch: int = 256,
                 kv_block_tokens: int = 16, admission_policy: AdmissionPolicy = "reserve",
                 memory_reserve_fraction: float | None = None, memory_plan: Any = None,
                 max_steps_per_wake: int = 4096, max_reserve_queue: int | None = None,
                 first_token: FirstToken = "prefill", loading_until_s: float | None = None,
                 stream_to: str | None = None, timeseries: bool = True) -> None:
        super().__init__(name)
        self.stream_to = stream_to
        if first_token not in ("decode", "prefill"):
            raise ValueError(f"DecodeEngine {name!r}: first_token must be 'decode' or 'prefill', "
                             f"got {first_token!r}")
        self.first_token = first_token
        self.loading_until_s = loading_until_s
        if max_reserve_queue is not None and int(max_reserve_queue) < 1:
            raise ValueError(f"DecodeEngine {name!r}: max_reserve_queue must be >= 1 or None, "
                             f"got {max_reserve_queue}")
        self.max_reserve_queue = None if max_reserve_queue is None else int(max_reserve_queue)
        self.waiting_peak = 0                  # most external reservations waiting at once
        if int(max_batch) < 1:
            raise ValueError(f"DecodeEngine {name!r}: max_batch must be >= 1, got {max_batch}")
        if admission_policy not in ("reserve", "preempt"):
            raise ValueError(f"DecodeEngine {name!r}: admission_policy must be 'reserve' or "
                             f"'preempt', got {admission_policy!r}")
        if int(max_steps_per_wake) < 1:
            raise ValueError(f"DecodeEngine {name!r}: max_steps_per_wake must be >= 1")
        tps = float(cost.tokens_per_step)
        if not tps >= 1.0:
            raise ValueError(f"DecodeEngine {name!r}: cost.tokens_per_step must be >= 1, got {tps}")
        self.cost = cost
        # the cost model's pricing of a run from its context sum (`_start_run`), if it has one
        self._steps_of_sum = getattr(cost, "decode_steps_of_sum", None)
        self.collector = collector
        self.max_batch = int(max_batch)
        self.policy: AdmissionPolicy = admission_policy
        self.max_steps_per_wake = int(max_steps_per_wake)
        self.tps = tps
        self.n_layers = model_layers(cost)

        self.ledger, self.plan = instance_ledger(cost, f"{name}/{memory_label(cost)}",
                                                 memory_reserve_fraction, memory_plan)
        self.kv_capacity_bytes = self.ledger.free_bytes
        # a token's KV in memory: all its copies (MLA's latent on every TP device)
        self.pool = KVBlockPool(self.ledger, kv_block_tokens, int(cost.kv_held_bytes_per_token))
        self.block_tokens = self.pool.block_tokens

        self._waiters: deque[_Waiter] = deque()
        self._n_internal = 0                   # preempted waiters at the deque's front
        self._reservations: dict[int, _Waiter] = {}
        self._ready: deque[_Seq] = deque()
        self._batch: list[_Seq] = []
        # Each request of the batch keeps its stint on its `_Seq` (start, rem, end,
        # base_less_start: advanced per event, not per step); the engine keeps two
        # aggregates as requests join and leave, in Python ints: `_first_end`, the
        # earliest stint end (no request can finish before it, so a run that stops
        # short needs no check), and `_base_less_start`, the sum of base_less_start
        # (what a run is priced from, `_start_run`). Batches are small (a wafer's ~2
        # requests, a GPU instance's ~10 on the whole public traces), where numpy's
        # per-call overhead costs more than a pass over the batch in Python; arrays
        # are built only where a vector computation needs them (`_contexts`,
        # `_overflow_step`, `_stream_run`).
        self._base_less_start = 0
        self._first_end = _NEVER
        self._waiting_ids: set[int] = set()
        self._order = 0
        self._pending_events: list[tuple] = []
        self._t_free: float | None = None     # end of the last step while busy
        # what the engine is doing: "idle" (nothing to run), "loading" (weights),
        # "run" (a run of decode steps), "stall" (a recompute prefill), "mixed" (the
        # colocated engine's prefill chunks); `_due` is when it ends
        self._phase = "idle"
        self._due = math.inf
        self._kicked = False                  # something may enter the batch: form it anew
        self._run: tuple | None = None        # (t0, ends, StepCosts, batch) of the run in progress
        self._run_steps = 0                   # steps of `_run` that will have run when it ends
        self._stall: tuple | None = None      # (IterationCost, [seqs]) of a recompute prefill

        # global step log (emulated s): step ends, and step starts only with speculative
        # decoding (a step's tokens spread over it, `_stint_times`; else nothing reads them)
        self._t_end = GrowingArray(4096)
        self._t_start = GrowingArray(4096) if tps != 1.0 else None
        # the step log's gaps as the collector has them (`ITLRef`): sent up to this step
        self._itl_log = step_log_key(name)
        self._gaps_sent = 0
        self.util = Utilisation()
        self.lateness = Lateness()
        self.memory = TimeSeries(timeseries)
        self.batch_series = TimeSeries(timeseries)
        self.series = EventSeries(timeseries)  # gauges at batch boundaries (rack.measure.timeseries)
        self.wakeups = 0
        self.batch_peak = 0
        self._batch_seconds = 0.0              # integral of batch size over step time
        self._step_seconds = 0.0               # time spent in decode steps
        self.counts = {"reserved": 0, "admitted": 0, "completed": 0, "failed": 0,
                       "preemptions": 0, "recompute_tokens": 0, "bad_frames": 0,
                       "tokens_generated": 0}
        if loading_until_s is not None:
            self._phase, self._due = "loading", float(loading_until_s)
            self.wake_at = self._due

    # ------------------------------------------------------------------ handlers
    def reserve_kv(self, now: float, req, kv_tokens: int, first_token_s: float | None, src: str) -> None:
        """Reserve memory for `req`'s incoming KV of `kv_tokens` tokens; replies
        `src.kv_reserved(request id, status)` when reserved ("granted"), waiting FIFO
        behind earlier reservations.

        Under "reserve" the final footprint (kv_tokens + output_tokens - 1 tokens) is
        booked, under "preempt" the kv_tokens only. If the final footprint exceeds the
        whole KV capacity the request can never run here: it is ended as failed
        ("exceeds_decode_kv_capacity") and "refused" is replied (the sender just frees
        its copy); so is a request refused because the reservation queue is full
        ("rejected"/"decode_queue_full") or whose KV is here already.
        `first_token_s` (optional) is kept for `receive_kv`. The same sender asking again
        for a reservation held or waiting here gets the one there is ("granted" again,
        or the grant when it comes): after a restart it cannot tell whether its first
        ask reached this engine (on Ray, calls queued while an actor restarts reach the
        new process, and the death's `peer_lost` then voids the exchange at the sender).
        Raises RuntimeError for a request reserved by two senders.
        """
        rid = req.id
        final = int(kv_tokens) + req.output_tokens - 1
        blocks = self.pool.blocks_for(final)           # (`pool.bytes_for`'s blocks, counted once)
        if blocks * self.pool.block_bytes > self.kv_capacity_bytes:
            self.counts["failed"] += 1
            self.send(self.collector, "finish", rid, "failed", "exceeds_decode_kv_capacity", None, now)
            self.send(src, "kv_reserved", rid, "refused")
            return
        if rid in self._reservations or rid in self._waiting_ids:
            held = self._reservations.get(rid)
            first = held if held is not None else next(w for w in self._waiters if w.req.id == rid and w.seq is None)
            if first.src != src:
                raise RuntimeError(f"DecodeEngine {self.name!r}: request {rid} reserved twice "
                                   f"(by {first.src!r} and {src!r})")
            self.counts["reserve_repeated"] = self.counts.get("reserve_repeated", 0) + 1
            if held is not None:
                self.send(src, "kv_reserved", rid, "granted")
            return
        if self._kv_here(rid):
            # A second copy of a request whose KV is here already: a stale payload
            # admitted after a recovery dropped its reservation, a copy re-sent across a
            # restart, or a re-dispatched copy of a request that moved from its prefill
            # instance to this engine between a recovery's two questions (this engine,
            # then the others). There is nothing to reserve: the copy is refused and the
            # request ends once.
            self.counts["reserve_duplicate_refused"] = self.counts.get("reserve_duplicate_refused", 0) + 1
            self.send(src, "kv_reserved", rid, "refused")
            return
        if self.max_reserve_queue is not None and \
                len(self._waiters) - self._n_internal >= self.max_reserve_queue:
            self.counts["reserve_rejected"] = self.counts.get("reserve_rejected", 0) + 1
            self.send(self.collector, "finish", rid, "rejected", "decode_queue_full", None, now)
            self.send(src, "kv_reserved", rid, "refused")
            return
        if self.policy != "reserve":                   # (else: the final footprint's blocks)
            blocks = self.pool.blocks_for(int(kv_tokens))
        w = _Waiter(req, int(kv_tokens), blocks, first_token_s, src=src)
        self._waiting_ids.add(rid)
        self._waiters.append(w)
        self._grant(now)
        if not w.granted:
            self.waiting_peak = max(self.waiting_peak, len(self._waiters) - self._n_internal)

    def receive_kv(self, now: float, req, frames: list, first_token_s: float | None,
                   reply_to: str, tag: Any) -> None:
        """Verify every frame of `req`'s KV; reply `reply_to.kv_received(tag, bad)`.

        A frame is bad if it fails its checksum or structure check, names another
        request, or covers another token range; missing layers count as bad too. Bad
        frames are never used: the reservation stays, so the sender may re-send (or
        `abort_kv`). With 0 bad frames the request joins the batch at the next step
        boundary. Without a reservation here (this engine restarted since) the reply is
        -1: the sender lost the exchange.
        """
        w = self._reservations.get(req.id)
        if w is None:
            self.send(reply_to, "kv_received", tag, -1)
            return
        bad = _count_bad_frames(req.id, w.kv_tokens, self.n_layers, frames)
        if bad:
            self.counts["bad_frames"] += bad
            self.send(reply_to, "kv_received", tag, bad)
            return
        del self._reservations[req.id]
        if self._kv_here(req.id):
            # A second copy of a request already decoding here (`reserve_kv`'s case, its
            # reservation granted before the first copy's KV arrived): the request
            # decodes and ends once; the copy's reservation is freed and its sender told
            # it arrived, so it lets its copy go.
            self.ledger.free("reserved", w.blocks * self.pool.block_bytes)
            self.counts["kv_duplicate_dropped"] = self.counts.get("kv_duplicate_dropped", 0) + 1
            self.send(reply_to, "kv_received", tag, 0)
            self._grant(now)
            return
        t_first = None
        if self.first_token == "prefill":
            t_first = first_token_s if first_token_s is not None else w.first_token_s
            if t_first is None:
                raise ValueError(f"DecodeEngine {self.name!r}: request {req.id}: first_token_s was "
                                 "given neither to reserve_kv nor to receive_kv")
        self.pool.adopt(req.id, w.blocks, "reserved")
        seq = _Seq(req, t_first)
        if seq.total == 0:
            # Nothing to decode (a router normally never sends these here).
            self.pool.free(req.id)
            self.counts["completed"] += 1
            self.send(self.collector, "finish", req.id, "completed", None, np.empty(0), seq.first_token_s)
            self.send(reply_to, "kv_received", tag, 0)
            self._grant(now)
            return
        self._ready.append(seq)
        self.send(reply_to, "kv_received", tag, 0)
        if len(self._batch) < self.max_batch:
            self._kick(now)

    def abort_kv(self, now: float, req, reason: str = "kv_checksum") -> None:
        """Drop `req`'s reservation (its KV never arrived intact) and end it as failed
        (also when this engine restarted since and holds none)."""
        w = self._reservations.pop(req.id, None)
        if w is not None:
            self.ledger.free("reserved", w.blocks * self.pool.block_bytes)
        self.counts["failed"] += 1
        self.send(self.collector, "finish", req.id, "failed", reason, None, now)
        self._grant(now)

    def holding(self, now: float, ids, drop_reserved: bool, reply_to: str, tag: Any) -> None:
        """Reply `reply_to.held(tag, name, ids)`: which of request `ids` this engine
        holds: KV received (ready, running, preempted) or, unless `drop_reserved`, a
        reservation. With `drop_reserved` the reservations of `ids` (waiting or granted)
        are dropped instead (their sender lost its state and the router re-dispatches
        them): memory freed, a waiting reservation's sender told "lost". For the
        router's recovery."""
        want = set(int(i) for i in ids)
        held = [i for i in self._decoding_ids() if i in want]
        if drop_reserved:
            dropped = 0
            for rid in [r for r in self._reservations if r in want]:
                w = self._reservations.pop(rid)
                self.ledger.free("reserved", w.blocks * self.pool.block_bytes)
                dropped += 1
            for w in [w for w in self._waiters if w.seq is None and w.req.id in want]:
                self._waiters.remove(w)
                self._waiting_ids.discard(w.req.id)
                self.send(w.src, "kv_reserved", w.req.id, "lost")
                dropped += 1
            if dropped:
                self.counts["reservations_dropped"] = self.counts.get("reservations_dropped", 0) + dropped
                self._grant(now)
        else:
            held += [r for r in self._reservations if r in want]
            held += [w.req.id for w in self._waiters if w.seq is None and w.req.id in want]
        self.send(reply_to, "held", tag, self.name, held)

    def held_requests(self) -> list[int]:
        """Ids of the requests this engine holds work for: reservations (waiting or
        granted), KV received and not yet ended (driver read)."""
        held = set(self._decoding_ids()) | set(self._reservations)
        held.update(w.req.id for w in self._waiters if w.seq is None)
        return sorted(held)

    def release(self, now: float, ids) -> None:
        """Drop the reservations of requests `ids`, which have ended (the driver's
        quiescence check, `rack.runtime.quiescence`): memory freed, nobody told (the
        request has its outcome). Requests decoding here run to their end."""
        want = set(int(i) for i in ids)
        for rid in [r for r in self._reservations if r in want]:
            w = self._reservations.pop(rid)
            self.ledger.free("reserved", w.blocks * self.pool.block_bytes)
        for w in [w for w in self._waiters if w.seq is None and w.req.id in want]:
            self._waiters.remove(w)
            self._waiting_ids.discard(w.req.id)
        self._grant(now)

    # ------------------------------------------------------------------ driver reads
    def is_idle(self) -> bool:
        return not (self._waiters or self._reservations or self._ready or self._batch
                    or self._phase in ("run", "stall", "mixed"))

    def waiting_for(self) -> str:
        if self.is_idle():
            return ""
        return (f"{self._phase}: {len(self._batch)} running, {len(self._ready)} ready, "
                f"{len(self._waiters)} reservation(s) waiting for memory, "
                f"{len(self._reservations)} reserved awaiting KV")

    def stats(self, now: float) -> dict:
        """Counters and gauges at emulated time `now` (plain values and numpy arrays;
        picklable)."""
        mt, mv = self.memory.as_arrays()
        bt, bv = self.batch_series.as_arrays()
        out = {
            "name": self.name,
            "role": "decode",
            "admission_policy": self.policy,
            "tokens_per_step": self.tps,
            "memory": self.ledger.snapshot(),
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "kv_block_bytes": self.pool.block_bytes,
            "memory_t_s": mt,
            "memory_used_bytes": mv,
            "batch_t_s": bt,
            "batch_size": bv,
            "batch_peak": self.batch_peak,
            "timeseries": self.series.as_dict(),
            # time-averaged batch size over decode steps, and over the whole run
            "batch_mean_busy": self._batch_seconds / self._step_seconds if self._step_seconds else 0.0,
            "batch_mean": self._batch_seconds / now if now > 0 else 0.0,
            "running": len(self._batch),
            "ready": len(self._ready),
            "waiting_reservations": len(self._waiters),
            "waiting_peak": self.waiting_peak,
            "wakeups": self.wakeups,
            "steps": self._t_end.stop,
            **self.counts,
        }
        out.update(self._util_now(now).as_dict(self.cost.peak_flops, self.cost.memory_bandwidth, now))
        out.update(self.lateness.as_dict())
        return out

    def _util_now(self, now: float) -> Utilisation:
        """`util` plus the steps of the run in progress that have ended by `now` (they
        are booked when the run ends; a crash or a stats call can come first)."""
        if self._run is None:
            return self.util
        t0, ends, sc, _ = self._run
        n = int(ends.searchsorted(now, side="right"))
        if n == 0:
            return self.util
        u = Utilisation()
        u.add(self.util.busy_s, self.util.flops, self.util.bytes, self.util.iterations, self.util.device_busy_s)
        u.add(float(ends[n - 1]) - t0, *sc.work(n), iterations=n, device_busy_s=sc.busy(n))
        return u

    def _kv_here(self, rid: int) -> bool:
        """Whether request `rid`'s KV is here (`_decoding_ids` without building the set:
        ready and batched requests own pool blocks, preempted ones wait at the front of
        the waiters), for the reservation path, which runs for every request."""
        return self.pool.held_blocks(rid) > 0 or (self._n_internal > 0 and any(
            w.req.id == rid for w in itertools.islice(self._waiters, self._n_internal)))

    def _decoding_ids(self) -> set[int]:
        """Ids whose KV is here: ready, in the batch, preempted (waiting)."""
        out = {s.req.id for s in self._ready}
        out.update(s.req.id for s in self._batch)
        out.update(w.req.id for w in self._waiters if w.seq is not None)
        return out

    # ------------------------------------------------------------------ memory
    def _grant(self, now: float) -> None:
        """Grant waiting reservations in FIFO order while they fit."""
        while self._waiters:
            w = self._waiters[0]
            nbytes = w.blocks * self.pool.block_bytes
            if nbytes > self._available_bytes() or not self._make_room(nbytes):
                break
            self._waiters.popleft()
            w.granted = True
            if w.seq is None:
                self.ledger.alloc("reserved", nbytes)
                self._reservations[w.req.id] = w
                self._waiting_ids.discard(w.req.id)
                self.counts["reserved"] += 1
                self.send(self.collector, "event", w.req.id, "kv_reserved", now)
                self.send(w.src, "kv_reserved", w.req.id, "granted")
            else:
                self._n_internal -= 1
                self.pool.allocate(w.req.id, w.blocks)
                self._ready.appendleft(w.seq)
                if len(self._batch) < self.max_batch:
                    self._kick(now)

    def _available_bytes(self) -> int:
        """Bytes KV could get now (free, plus what a cache could give up)."""
        return self.ledger.free_bytes

    def _make_room(self, nbytes: int) -> bool:
        """Make `nbytes` free in the ledger if possible (a cache may evict)."""
        return self.ledger.free_bytes >= nbytes

    def _release_kv(self, s: _Seq) -> None:
        """Free a finished request's KV."""
        self.pool.free(s.req.id)

    def _done(self, s: _Seq) -> int:
        """Steps `s` has taken part in since its stint started (the batch moves together,
        so it is the engine's step count since then)."""
        return self._t_end.stop - s.start

    def _kv_now(self, s: _Seq, extra_steps: int = 0) -> int:
        """KV tokens of `s` held here (not in shared prefix-cache entries) after
        `extra_steps` more steps of its current stint (none when it is not in one)."""
        made = s.emitted + (int(emitted_after(self._done(s) + extra_steps, s.rem, self.tps)) if s.rem else 0)
        return max(s.prompt, s.kv0 + made) - s.shared

    def _overflow_step(self, horizon: int) -> int | None:
        """First step (1-based, <= horizon) whose KV growth does not fit, or None."""
        batch = self._batch
        B = self.block_tokens
        kv0 = np.fromiter((s.kv0 - s.shared + s.emitted for s in batch), np.int64, len(batch))
        low = np.fromiter((s.prompt - s.shared for s in batch), np.int64, len(batch))
        done, rem = self._stints(batch)
        held = np.fromiter((self.pool.held_blocks(s.req.id) for s in batch), np.int64, len(batch))
        need_h = -(-np.maximum(low, kv0 + emitted_after(done + horizon, rem, self.tps)) // B)
        cnt = np.maximum(0, need_h - held)
        total = int(cnt.sum())
        free_blocks = self._available_bytes() // self.pool.block_bytes
        if total <= free_blocks:
            return None
        idx = np.repeat(np.arange(len(batch)), cnt)
        local = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        m = held[idx] + 1 + local                       # the block number being added
        tokens_needed = (m - 1) * B - kv0[idx] + 1      # stint tokens that fill block m-1
        step = np.maximum(1, steps_for(tokens_needed, self.tps) - done[idx])
        step.sort()
        return int(step[free_blocks])

    def _grow(self, k: int) -> None:
        """Book the blocks the batch needs through step k of the coming run."""
        need = sum(max(0, self.pool.blocks_for(self._kv_now(s, k)) - self.pool.held_blocks(s.req.id))
                   for s in self._batch)
        self._make_room(need * self.pool.block_bytes)
        for s in self._batch:
            if not self.pool.try_ensure_tokens(s.req.id, self._kv_now(s, k)):
                raise AssertionError(f"{self.name}: planned KV growth does not fit")  # pragma: no cover

    def _preempt_newest(self, t: float) -> None:
        # the newest is the last: the batch keeps admission order
        victim = self._batch[-1]
        self._end_stint(victim)
        self._batch_left(self._batch[:-1], (victim,))
        self._release_kv(victim)
        victim.recompute = True
        victim.shared = 0
        kv = self._kv_now(victim)
        w = _Waiter(victim.req, kv, self.pool.blocks_for(kv), None, seq=victim)
        self._waiters.insert(self._n_internal, w)   # behind earlier preempted, before new
        self._n_internal += 1
        self.counts["preemptions"] += 1
        self._pending_events.append((victim.req.id, "preempted", t))

    def _plan(self, t: float, limit: int | None = None) -> int:
        """Steps to run before the next batch change (0 if the batch is empty), at most
        `limit`; under "preempt" books their KV growth, preempting if even one step
        does not fit."""
        while self._batch:
            horizon = min(self._first_end - self._t_end.stop, self.max_steps_per_wake)
            if limit is not None:
                horizon = min(horizon, limit)
            if self.policy == "reserve":
                return horizon
            over = self._overflow_step(horizon)
            if over is None:
                k = horizon
            elif over > 1:
                k = over - 1
            else:
                self._preempt_newest(t)
                continue
            self._grow(k)
            return k
        return 0

    # ------------------------------------------------------------------ token timing
    def _stint_times(self, s: _Seq) -> np.ndarray:
        """Token times of `s`'s current stint so far (spec tokens spread over a step)."""
        d = self._done(s)
        if d == 0:
            return np.empty(0)
        ends = self._t_end.slice(s.start, s.start + d)
        if self.tps == 1.0:
            return ends
        # the first stint of a request whose client's first token is this engine's: its
        # first step's tokens come at the step's end (`step_token_times`, issue 37)
        return step_token_times(self._t_start.slice(s.start, s.start + d), ends, 0, s.rem, self.tps,
                                first_whole=s.first_token_s is None and s.emitted == 0)

    def _end_stint(self, s: _Seq) -> None:
        s.times.append(self._stint_times(s))
        s.emitted += int(emitted_after(self._done(s), s.rem, self.tps))
        s.rem = s.steps = 0

    # ------------------------------------------------------------------ the engine's turns
    def _kick(self, now: float) -> None:
        """Something may join the batch (admission): form the batch anew at the next step
        boundary. Idle: at once (after this instant's messages). Running: the run is cut
        at the step boundary at or after `now` (the step in progress finishes)."""
        self._kicked = True
        if self._phase == "idle":
            self._wake_at(now)
        elif self._phase in ("run", "mixed") and self._run is not None:
            t0, ends, _, _ = self._run
            # (not cut yet: the wake-up is at its last step's end, `_due`, a Python float)
            if self._run_steps == ends.shape[0] and now < self._due:
                n = int(ends.searchsorted(now, side="right"))   # (the method: no dispatch)
                if now == t0 or (n > 0 and ends[n - 1] == now):
                    self._run_steps = n                       # at a step boundary
                    self._wake_at(now)
                else:
                    self._run_steps = n + 1                   # the step in progress finishes
                    self._wake_at(float(ends[n]))
                self._stream_cut()

    def _wake_at(self, t: float) -> None:
        self._due = t
        self.wake_at = t

    def on_wake(self, now: float) -> None:
        if now < self._due:
            return
        phase, t = self._phase, self._due
        self._due = self.wake_at = math.inf
        if phase == "run":
            self._end_run(now)      # (`t`: the last step's end, or the run's start if cut before it)
        elif phase == "stall":
            self._end_stall(now, t)
            if self._after_admit(t):
                return
            t = None
        elif phase == "mixed":
            t = self._end_mixed(now)
            if t is None:
                return
        elif phase == "loading":
            pass                                    # weights loaded: serve from `t`
        else:  # idle, kicked
            self.wakeups += 1
            t = now
        if t is not None:
            self._body(t)

    def _body(self, t: float) -> None:
        """One turn of the scheduler at emulated time `t` (a step boundary): admit ready
        requests, then run mixed iterations (colocated), a run of decode steps, or idle."""
        self._kicked = False
        self._phase = "busy"
        if self._admit_ready(t):
            return                                  # a recompute prefill stalls the batch
        self._after_admit(t)

    def _after_admit(self, t: float) -> bool:
        """`_body` after the admissions: mixed iterations, decode steps or idle; True when
        something was started."""
        if self._extra_work(t):
            return True
        k = self._plan(t, self._run_limit())
        if self._waiters:
            self._grant(t)
        self._flush_events()
        self._gauges(t, len(self._batch))
        if k == 0:
            self._t_free = None
            self._phase = "idle"
            if self._kicked:                        # something arrived meanwhile
                self._wake_at(t)
            return False
        self._start_run(t, k)
        return True

    def _gauges(self, t: float, batch_size: int) -> None:
        """The gauges over time at a batch boundary: memory held, the batch's size and
        a row of `series` (`_sample`); nothing without them (`timeseries=False`, one
        check instead of three calls per batch change)."""
        if self.series.enabled:
            self.memory.add(t, self.ledger.used)
            self.batch_series.add(t, batch_size)
            self._sample(t)

    def _sample(self, t: float) -> None:
        """A row of the time series: waiting = reservations waiting for memory or for
        their KV, and requests ready for the batch; running = the decode batch."""
        record_series(self, t, len(self._waiters) + len(self._reservations) + len(self._ready),
                      len(self._batch))

    def _admit_ready(self, t: float) -> bool:
        """Move ready requests into the batch (step boundary); recompute preempted ones
        (the batch stalls for one prefill iteration: True, with a wake-up at its end)."""
        batch, ready = self._batch, self._ready
        if not ready:               # (most turns: a run's end or a mixed iteration's)
            return False
        recompute: list[_Seq] = []
        start = self._t_end.stop
        while ready and len(batch) < self.max_batch:
            s = ready.popleft()
            s.rem = rem = s.total - s.emitted
            s.steps = steps = steps_for(rem, self.tps)
            s.start = start
            s.end = end = start + steps
            if end < self._first_end:
                self._first_end = end
            s.base_less_start = s.ctx0 + s.emitted - start   # its context at `start` - start
            self._base_less_start += s.base_less_start
            self._order += 1
            s.order = self._order
            batch.append(s)
            if s.recompute:
                recompute.append(s)
                # a re-admission after preemption is its own event: `decode_admit`
                # keeps the first admission (issue 37)
                self._pending_events.append((s.req.id, "decode_readmit", t))
            else:
                self.counts["admitted"] += 1
                self._pending_events.append((s.req.id, "decode_admit", t))
        if len(batch) > self.batch_peak:
            self.batch_peak = len(batch)
        if not recompute:
            return False
        new = np.array([self._kv_now(s) for s in recompute], dtype=np.int64)
        c = self.cost.prefill(new, np.zeros_like(new))
        self._stall = (c, recompute)
        self._phase = "stall"
        self._wake_at(t + c.time_s)
        return True

    def _end_stall(self, now: float, t1: float) -> None:
        c, recompute = self._stall
        self._stall = None
        self.lateness.note(t1, now)
        self._t_free = t1
        self.util.add(c.time_s, c.flops, c.bytes, device_busy_s=c.device_busy_s)
        per = [(s.req.id, int(self._kv_now(s))) for s in recompute]
        self.counts["recompute_tokens"] += sum(n for _, n in per)
        # per request too: results.json and requests.csv carry each one's recomputed tokens
        self.send(self.collector, "note_recomputed", per)
        for s in recompute:
            s.recompute = False

    def _extra_work(self, t: float) -> bool:
        """Hook at each batch boundary before decode-only steps; True if it started an
        iteration (the colocated engine runs mixed prefill+decode iterations here)."""
        return False

    def _run_limit(self) -> int | None:
        """Hook: most decode steps the next run may take before the batch must be formed
        anew (None: no bound; the colocated engine stops at its scheduler's next
        receive of new requests)."""
        return None

    def _flush_events(self) -> None:
        if self._pending_events:
            ev, self._pending_events = self._pending_events, []
            self.send(self.collector, "events", ev)

    def _start_run(self, t: float, k: int) -> None:
        """Start a run of up to k decode steps of the current batch (cut short at the
        step boundary after an admission, `_kick`)."""
        batch = list(self._batch)
        sc = None
        if self._steps_of_sum is not None and self.tps == 1.0:
            # one token per step: every request of the batch has taken done = steps - start
            # steps of its stint (< its tokens left, or it would have completed), so the
            # contexts sum to sum(base_less_start) + B * steps (`__init__`)
            sc = self._steps_of_sum(len(batch), self._base_less_start + len(batch) * self._t_end.stop, k)
        if sc is None:
            sc = self.cost.decode_steps(self._contexts(batch), k)
        # While busy, the next step starts where the last one ended.
        t0 = t if self._t_free is None else self._t_free
        self._begin_run(t0, _step_ends(t0, sc.time_s), sc, batch, "run")

    def _begin_run(self, t0: float, ends: np.ndarray, sc: Any, batch: list, phase: str) -> None:
        """Wait for a run of steps (step i ends at ends[i]); an admission already pending
        cuts it before its first step (the batch is formed anew at t0)."""
        self._run = (t0, ends, sc, batch)
        self._phase = phase
        if self._kicked:
            self._run_steps = 0
            self._wake_at(t0)
        else:
            self._run_steps = ends.shape[0]
            self._wake_at(float(ends[-1]))
            self._stream_run(t0, ends, batch)

    def _stream_cut(self) -> None:
        """Tell the live front (`stream_to`) that the run in progress now stops after
        `_run_steps` steps."""
        if self.stream_to is not None:
            self.send(self.stream_to, "run_cut", self.name, self._run_steps)

    def _stream_run(self, t0: float, ends: np.ndarray, batch: list) -> None:
        """Tell the live front (`stream_to`) the planned token times of a run of steps
        of `batch` (`_batch`, aligned with the batch arrays): the steps' ends and, per
        request, the client-side index of its first token in the run and what
        `step_token_times` needs. A later `run_cut` says how many steps ran."""
        if self.stream_to is None or not batch:
            return
        done, rem = self._stints(batch)
        index0 = emitted_after(done, rem, self.tps) + np.fromiter(
            (s.emitted + (s.first_token_s is not None) for s in batch), np.int64, len(batch))
        self.send(self.stream_to, "tokens_planned", self.name, float(t0), ends, self.tps,
                  np.fromiter((s.req.id for s in batch), np.int64, len(batch)), index0, done, rem)

    def _end_run(self, now: float) -> None:
        """The run ended (or was cut): book its steps, complete finished requests."""
        t0, ends, sc, batch = self._run
        steps = self._run_steps
        self.wakeups += 1
        self._run = None
        if steps:
            self._t_free = t1 = float(ends[steps - 1])
            self.lateness.note(t1, now)
            flops, nbytes = sc.work(steps)
            self.util.add(t1 - t0, flops, nbytes, iterations=steps, device_busy_s=sc.busy(steps))
        else:
            self.lateness.note(t0, now)
        self._finish(self._commit(batch, t0, ends, steps))

    def _contexts(self, batch: list[_Seq]) -> np.ndarray:
        """Context of each request of the batch (`batch` is `_batch`) at its next step:
        prompt + tokens so far (the last one is the step's input; `_Seq.ctx0`)."""
        stop, tps = self._t_end.stop, self.tps
        if tps == 1.0:
            # one token per step: each has taken stop - start steps of its stint, fewer
            # than its tokens left (or it would have completed), so its context is
            # base_less_start + stop (`_start_run` prices from their sum)
            return np.fromiter((s.base_less_start + stop for s in batch), np.int64, len(batch))
        # (its context at the stint's start is base_less_start + start)
        done, rem = self._stints(batch)
        return np.fromiter((s.base_less_start + s.start for s in batch), np.int64, len(batch)) + \
            emitted_after(done, rem, tps)

    def _stints(self, batch: list[_Seq]) -> tuple[np.ndarray, np.ndarray]:
        """(steps each request of `batch` has taken of its current stint, the tokens its
        stint had left when it began): int64 arrays of shape (len(batch),), for the
        vector computations over the batch (`emitted_after`)."""
        done = self._t_end.stop - np.fromiter((s.start for s in batch), np.int64, len(batch))
        return done, np.fromiter((s.rem for s in batch), np.int64, len(batch))

    def _batch_left(self, batch: list[_Seq], leaving) -> None:
        """The batch is now `batch` (the requests that stay, in order): `leaving` left."""
        self._batch = batch
        for s in leaving:           # (a loop: one or two leave at a time, fewer than a sum() costs)
            self._base_less_start -= s.base_less_start
        self._first_end = min([s.end for s in batch]) if batch else _NEVER

    def _finish(self, finished: list) -> None:
        self._flush_events()
        if not finished:
            return
        for s, t, itl in finished:
            self.send(self.collector, "finish", s.req.id, "completed", None, itl, t)
        if self._waiters:
            self._grant(self._t_free if self._t_free is not None else finished[-1][1])

    def _commit(self, batch: list[_Seq], t0: float, ends: np.ndarray, steps: int) -> list:
        """Record `steps` finished steps of `batch` (step i ends at ends[i], the first
        starts at t0); complete and release finished requests. Returns [(seq,
        completion time, itl samples)]. Utilisation is the caller's to record."""
        if steps == 0:
            self._shrink(batch)
            return []
        t_last = float(ends[steps - 1])
        log = self._t_end
        if steps == 1:               # a mixed iteration or a step finished after an admission
            log.append(t_last)
        else:
            log.extend(ends[:steps])
        if self._t_start is not None:   # step i starts where step i - 1 ended
            self._t_start.append(t0)
            if steps > 1:
                self._t_start.extend(ends[: steps - 1])
        self._batch_seconds += len(batch) * (t_last - t0)
        self._step_seconds += t_last - t0
        finished = []
        stop = log.stop
        if stop >= self._first_end:
            # (`batch` is `_batch`: nothing joins or leaves during a run)
            done = [s for s in batch if s.end <= stop]
            linked = False
            for s in done:
                if self.tps == 1.0 and not s.times:
                    # one stint of one token per step: its gaps are the step log's over its
                    # steps (`ITLRef`), shared with the batch; no array per request
                    itl = self._linked_itl(s)
                    linked = True
                    n = itl.head.shape[0] + itl.stop - itl.start
                else:
                    self._end_stint(s)
                    if s.first_token_s is None:      # the client's first token was this engine's
                        times = np.concatenate(s.times)
                        self._pending_events.append((s.req.id, "first_token", float(times[0])))
                    else:
                        times = np.concatenate([[s.first_token_s], *s.times])
                    itl = times[1:] - times[:-1]     # np.diff's result, without its dispatch
                    n = itl.shape[0]
                if n != s.n_out - 1:  # pragma: no cover - internal invariant
                    raise AssertionError(f"{self.name}: request {s.req.id} has {n} "
                                         f"ITL samples for {s.n_out} tokens")
                self._release_kv(s)
                self.counts["completed"] += 1
                self.counts["tokens_generated"] += s.total
                self._pending_events.append((s.req.id, "completion", t_last))
                finished.append((s, t_last, itl))
            self._batch_left([s for s in batch if s.end > stop], done)
            if linked:
                self._send_gaps()
        self._shrink(self._batch)
        if finished or stop - log.base > (1 << 16):
            self._compact_log()
        return finished

    def _linked_itl(self, s: _Seq) -> ITLRef:
        """End `s`'s only stint (one token per step, at each step's end) and return its
        ITL as a reference to the step log: the gap from the prefill side's first token
        to its first step's end (`first_token` "prefill"), then the gaps of its other
        steps. The same floats `_end_stint`'s token times give."""
        a = s.start
        d = self._t_end.stop - a
        t0 = self._t_end.at(a)
        s.emitted += min(s.rem, d)
        s.rem = s.steps = 0
        if s.first_token_s is None:              # the client's first token was this engine's
            self._pending_events.append((s.req.id, "first_token", t0))
            head = _NO_GAPS
        else:
            head = np.array([t0 - s.first_token_s])
        return ITLRef(head, self._itl_log, a + 1, a + d)

    def _send_gaps(self) -> None:
        """Send the collector the step log's gaps it does not have yet (before the
        finishes that refer to them; steps dropped from the log unsent are referred to
        by no request)."""
        lo = max(self._gaps_sent, self._t_end.base + 1)
        hi = self._t_end.stop
        if hi > lo:
            self.send(self.collector, "itl_steps", self._itl_log, lo, self._t_end.gaps(lo, hi))
        self._gaps_sent = hi

    def _shrink(self, batch: list[_Seq]) -> None:
        """Under "preempt", return blocks booked for steps that did not run."""
        if self.policy == "preempt":
            for s in batch:
                self.pool.shrink_to_tokens(s.req.id, self._kv_now(s))

    def _compact_log(self) -> None:
        """Forget logged steps no running request refers to."""
        if self._t_end.stop - self._t_end.base <= (1 << 14):
            return                  # (every request starts at or before the log's end)
        low = min((s.start for s in self._batch), default=self._t_end.stop)
        if low - self._t_end.base > (1 << 14):
            if self._t_start is not None:
                self._t_start.drop_before(low)
            self._t_end.drop_before(low)


def _step_ends(t0: float, time_s: np.ndarray) -> np.ndarray:
    """End of each step of a run that starts at t0 with step durations `time_s`: t0 +
    their cumulative sum, added in place (one array fewer per run; the same floats,
    IEEE addition commutes); ndarray.cumsum is np.cumsum without its dispatch."""
    ends = time_s.cumsum()
    ends += t0
    return ends


def _count_bad_frames(request_id: int, kv_tokens: int, n_layers: int, frames: list) -> int:
    """Bad frames of a KV payload: failing decode (checksum/structure), naming another
    request or token range; plus 1 if the good frames leave layers uncovered."""
    if type(frames) is KVDescription and frames.verifies_for(request_id, kv_tokens, n_layers):
        return 0                    # (what the headers below would show)
    # One batched decode (header tuples, every body hashed) instead of a FrameHeader
    # per frame: this runs for every transfer.
    bad = 0
    covered: list[tuple[int, int]] = []
    for h in scan_kv_frames(frames, True):
        # h: (request_id, layer_start, layer_end, token_start, token_end, ...) or None
        if h is None or h[0] != request_id or h[3] != 0 or h[4] != kv_tokens:
            bad += 1
            continue
        covered.append((h[1], h[2]))
    if bad == 0:
        covered.sort()
        pos = 0
        for a, b in covered:
            if a > pos:
                break
            pos = max(pos, b)
        if pos < n_layers:
            bad += 1
    return bad
