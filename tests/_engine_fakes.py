"""Test doubles for the engine tests, as cores (`workloads.core`): a recording
collector, a direct interconnect, a scripted client, a small analytic cost model, and
helpers to run cores on the virtual driver (`rack.runtime.virtual.VirtualDriver`)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Mapping

import numpy as np

from devices.costmodel import StepCosts
from devices.engines.common import ITLRef, model_layers
from devices.engines.decode import DecodeEngine
from interconnect.codec import corrupt_frame, make_kv_frames, verify_kv_frames
from rack.runtime.virtual import VirtualDriver
from workloads.core import Core
from workloads.request import Request

GB = 10**9


class FakeCollector(Core):
    """Records events and outcomes; fails loudly if a request ends twice or ends
    without a time. Answers `open_among` (replies `open_ids(tag, ids)`) from its
    outcomes."""

    def __init__(self, name: str = "collector") -> None:
        super().__init__(name)
        self.events_log: list[tuple[int, str, float]] = []
        self.outcomes: dict[int, dict] = {}
        self.recomputed: dict[int, int] = {}      # tokens recomputed after preemptions
        self.step_gaps: dict[str, dict[int, float]] = {}   # decode engines' step logs (`itl_steps`)

    def event(self, now, request_id, name, t):
        self.events_log.append((request_id, name, t))

    def events(self, now, items):
        for rid, name, t in items:
            self.events_log.append((rid, name, t))

    def itl_steps(self, now, log, first, gaps):
        self.step_gaps.setdefault(log, {}).update(zip(range(first, first + len(gaps)), gaps.tolist()))

    def finish(self, now, request_id, outcome, reason=None, itl_s=None, t=None):
        assert request_id not in self.outcomes, f"request {request_id} ended twice"
        assert t is not None
        if type(itl_s) is ITLRef:                 # the samples as one array, as the collector's records give
            gaps = self.step_gaps.get(itl_s.log, {})
            itl_s = np.concatenate((itl_s.head, [gaps[j] for j in range(itl_s.start, itl_s.stop)]))
        self.outcomes[request_id] = {"outcome": outcome, "reason": reason, "itl_s": itl_s, "t": t}

    def open_among(self, now, ids, reply_to, tag):
        self.send(reply_to, "open_ids", tag, [i for i in ids if i not in self.outcomes])

    def note_recomputed(self, now, items):
        for rid, n in items:
            self.recomputed[rid] = self.recomputed.get(rid, 0) + n

    def times(self, name: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for rid, n, t in self.events_log:
            if n == name:
                out.setdefault(rid, t)
        return out

    def count(self, name: str) -> int:
        return sum(1 for _, n, _ in self.events_log if n == name)


class DirectInterconnect(Core):
    """Ships frames after logical_bytes / bandwidth + latency, then sends `receive_kv`
    to the receiver; on its `kv_received(tid, bad)` replies `transfer_done(tag,
    result)` to the sender (result: bad_frames and end_s; None when the receiver held
    no reservation, bad = -1).

    `corrupt_first` corrupts the first attempt of those request ids (fault injection),
    `corrupt_always` every attempt. `transfers`: (request id, start, delivery) of every
    delivered transfer; `attempts`: payloads per request id.
    """

    def __init__(self, name: str = "interconnect", bandwidth_Bps: float = 100e9,
                 latency_s: float = 5e-6, corrupt_first: set | None = None,
                 corrupt_always: set | None = None) -> None:
        super().__init__(name)
        self.bw = bandwidth_Bps
        self.lat = latency_s
        self.corrupt_first = set(corrupt_first or ())
        self.corrupt_always = set(corrupt_always or ())
        self.transfers: list[tuple[int, float, float]] = []
        self.attempts: dict[int, int] = {}
        self._due: list[tuple[float, int]] = []          # (delivery time, transfer id)
        self._flying: dict[int, tuple] = {}
        self._tid = 0

    def transfer(self, now, req, frames, logical_bytes, src, dst, first_token_s=None, tag=None):
        good, bad, logical, _ = verify_kv_frames(frames)
        assert bad == 0 and logical == logical_bytes
        n = self.attempts.get(req.id, 0)
        self.attempts[req.id] = n + 1
        if req.id in self.corrupt_always or (req.id in self.corrupt_first and n == 0):
            frames = [corrupt_frame(frames[0])] + list(frames[1:])
        tid = self._tid
        self._tid += 1
        t_end = now + logical_bytes / self.bw + self.lat
        self._flying[tid] = (req, frames, src, dst, first_token_s, tag, now, t_end)
        heapq.heappush(self._due, (t_end, tid))
        self.wake_at = self._due[0][0]

    def on_wake(self, now):
        while self._due and self._due[0][0] <= now:
            _, tid = heapq.heappop(self._due)
            req, frames, _, dst, first_token_s, _, _, _ = self._flying[tid]
            self.send(dst, "receive_kv", req, frames, first_token_s, self.name, tid)
        self.wake_at = self._due[0][0] if self._due else math.inf

    def kv_received(self, now, tid, bad):
        req, _, src, _, _, tag, t0, t_end = self._flying.pop(tid)
        self.transfers.append((req.id, t0, now))
        result = None if bad < 0 else SimpleNamespace(bad_frames=bad, end_s=t_end)
        self.send(src, "transfer_done", tag, result)

    def is_idle(self):
        return not self._flying

    def waiting_for(self):
        return f"{len(self._flying)} transfer(s) in flight" if self._flying else ""


class Client(Core):
    """Sends scripted messages at given emulated times and records every reply.

    script: entries `(t, dst, method, *args)` (the message is sent at emulated t) or
        `(t, fn)` (`fn(now)` is called at t: a probe of core state mid-run); entries
        due at the same time go out in script order.
    deliver: `{request id: (decode name, cost model)}`: when `kv_reserved(rid,
        "granted")` comes back, `receive_kv` of that request's KV (`frames_for`) is
        sent to the decode engine at once (what a prefill engine's handoff does).
    on_reply: `fn(client, now, method, args)` called after each reply is recorded (a
        reactive script: send the next message when an answer comes).
    `replies`: (now, method, args) of every message received, in order.
    """

    def __init__(self, script=(), *, name: str = "client", deliver: Mapping | None = None,
                 on_reply: Callable | None = None) -> None:
        super().__init__(name)
        self._script = sorted(script, key=lambda e: e[0])       # stable: ties keep script order
        self._next = 0
        self.deliver = dict(deliver or {})
        self.on_reply = on_reply
        self.replies: list[tuple[float, str, tuple]] = []
        self._requests: dict[int, Request] = {}
        self._arm()

    def _arm(self):
        self.wake_at = self._script[self._next][0] if self._next < len(self._script) else math.inf

    def on_wake(self, now):
        while self._next < len(self._script) and self._script[self._next][0] <= now:
            entry = self._script[self._next]
            self._next += 1
            if callable(entry[1]):
                entry[1](now)
                continue
            _, dst, method, *args = entry
            if method == "reserve_kv":
                self._requests[args[0].id] = args[0]
            self.send(dst, method, *args)
        self._arm()

    def _got(self, now, method, args):
        self.replies.append((now, method, args))
        if self.on_reply is not None:
            self.on_reply(self, now, method, args)

    def of(self, method: str) -> list[tuple]:
        """Args of every reply `method` received, in order."""
        return [a for _, m, a in self.replies if m == method]

    # replies of the engines, the interconnect and the collector
    def kv_reserved(self, now, rid, status):
        self._got(now, "kv_reserved", (rid, status))
        if status == "granted" and rid in self.deliver:
            dst, cost = self.deliver[rid]
            req = self._requests[rid]
            self.send(dst, "receive_kv", req, frames_for(cost, req), None, self.name, rid)

    def kv_received(self, now, tag, bad):
        self._got(now, "kv_received", (tag, bad))

    def held(self, now, tag, name, ids):
        self._got(now, "held", (tag, name, ids))

    def transfer_done(self, now, tag, result):
        self._got(now, "transfer_done", (tag, result))

    def open_ids(self, now, tag, ids):
        self._got(now, "open_ids", (tag, ids))

    def is_idle(self):
        return self._next >= len(self._script)

    def waiting_for(self):
        return "" if self.is_idle() else f"{len(self._script) - self._next} scripted message(s)"


def run_cores(cores, *, idle: bool = True, rebuild=None) -> VirtualDriver:
    """Run `cores` (a list, or name -> Core in topology order) on the virtual driver
    until every core is idle (the old engines' `drain`), or until nothing is left to
    happen. With `idle` (default) a run that stops with a busy core raises
    AssertionError naming what each waits for. `rebuild(name, loading_until_s)`: a
    fresh core for a `crash` message. Returns the driver (`now`, `messages`,
    `wakeups`, `cores`)."""
    if not isinstance(cores, Mapping):
        cores = {c.name: c for c in cores}
    drv = VirtualDriver(cores, rebuild=rebuild)
    live = drv.cores
    drv.run(lambda: all(c.is_idle() for c in live.values()))
    if idle:
        assert all(c.is_idle() for c in live.values()), f"run stalled: {drv.waiting()}"
    return drv


@dataclass
class _IterCost:
    time_s: float
    flops: float
    bytes: float
    comm_s: float = 0.0
    bound: str = "compute"

    @property
    def device_busy_s(self) -> float:
        return self.time_s


class FakeCost:
    """A small roofline cost model with the CostModel attributes the engines read.

    prefill: FLOPs = 2 * params * new + 4 * layers * hidden * new * (cached + new/2);
    time = overhead + FLOPs / peak. decode step: bytes = weights + KV of the batch;
    time = overhead + bytes / bandwidth (memory bound, as decode is).
    """

    def __init__(self, *, params=8e9, layers=32, hidden=4096, kv_bytes_per_token=131_072,
                 weight_bytes=16_000_000_000, peak_flops=1e15, memory_bandwidth=3e12,
                 overhead_s=1e-4, tokens_per_step=1.0, kv_dtype="bf16") -> None:
        self.model = SimpleNamespace(name="fake-8b", layers=layers)
        self.params = params
        self.hidden = hidden
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_held_bytes_per_token = kv_bytes_per_token    # one copy (no TP replication)
        self.weight_bytes = weight_bytes
        self.peak_flops = peak_flops
        self.memory_bandwidth = memory_bandwidth
        self.overhead_s = overhead_s
        self.tokens_per_step = tokens_per_step
        self.kv_dtype = kv_dtype
        self.prefill_calls: list[tuple[np.ndarray, np.ndarray]] = []
        self.decode_calls = 0

    def prefill(self, new_tokens, cached_tokens):
        new = np.asarray(new_tokens, dtype=np.float64)
        cached = np.asarray(cached_tokens, dtype=np.float64)
        self.prefill_calls.append((np.asarray(new_tokens).copy(), np.asarray(cached_tokens).copy()))
        flops = float(np.sum(2 * self.params * new
                             + 4 * self.model.layers * self.hidden * new * (cached + new / 2)))
        nbytes = float(self.weight_bytes + np.sum((new + cached) * self.kv_bytes_per_token))
        return _IterCost(self.overhead_s + flops / self.peak_flops, flops, nbytes)

    def decode_steps(self, context_lens, n_steps):
        self.decode_calls += 1
        ctx = np.asarray(context_lens, dtype=np.float64)
        j = np.arange(n_steps, dtype=np.float64)
        kv_tokens = ctx.sum() + j * len(ctx) * self.tokens_per_step
        nbytes = self.weight_bytes + kv_tokens * self.kv_bytes_per_token
        flops = np.full(n_steps, 2 * self.params * len(ctx) * self.tokens_per_step)
        return StepCosts(self.overhead_s + nbytes / self.memory_bandwidth, flops, nbytes,
                         np.zeros(n_steps), "memory", self.tokens_per_step)


def plan(capacity_bytes: int, weight_bytes: int, reserve_bytes: int = 0):
    """A memory plan object as the engines accept in `memory_plan`."""
    return SimpleNamespace(capacity_bytes=capacity_bytes, weight_bytes=weight_bytes,
                           reserve_bytes=reserve_bytes)


def frames_for(cost, req, scale=1e-5):
    """The KV frames of `req`'s prompt for a cost model (8 layers per frame)."""
    return make_kv_frames(req.id, req.prompt_tokens, cost.kv_bytes_per_token,
                          model_layers(cost), 8, scale, kv_dtype=cost.kv_dtype)


def deliveries(engine: str, cost, requests, times=None, *, src: str = "client") -> tuple[list, dict]:
    """Client script and `deliver` map that reserve and hand over each request's KV to
    decode engine `engine` at its time (default 0; first token at that time): what the
    old `deliver` helper did. Use as `Client(script, deliver=d)`."""
    times = [0.0] * len(requests) if times is None else list(times)
    script = [(t, engine, "reserve_kv", r, r.prompt_tokens, t, src) for r, t in zip(requests, times)]
    return script, {r.id: (engine, cost) for r in requests}


def submissions(requests, engine: str, target: str, collector: str | None = None) -> list:
    """Client script: each request's `arrival` event (to `collector`, if given) and its
    `submit_many([(request, target)])` to `engine`, at its arrival time."""
    script = []
    for r in requests:
        if collector is not None:
            script.append((r.arrival_s, collector, "event", r.id, "arrival", r.arrival_s))
        script.append((r.arrival_s, engine, "submit_many", [(r, target)]))
    return script


def run_decode(requests, *, cost=None, capacity=40 * GB, policy="reserve", max_batch=256,
               arrivals=None, **kw):
    """Deliver `requests` (at t=0 or at `arrivals`), run until idle, return (engine,
    collector, stats). Every reservation must be granted."""
    cost = cost or FakeCost()
    mem = None if capacity is None else plan(capacity, cost.weight_bytes)  # None: the planner
    col = FakeCollector()
    eng = DecodeEngine(name="wafer0", cost=cost, collector=col.name, max_batch=max_batch,
                       kv_block_tokens=16, admission_policy=policy, memory_plan=mem, **kw)
    script, deliver = deliveries(eng.name, cost, requests, arrivals)
    client = Client(script, deliver=deliver)
    drv = run_cores([col, eng, client])
    assert sorted(client.of("kv_reserved")) == sorted((r.id, "granted") for r in requests)
    assert all(bad == 0 for _, bad in client.of("kv_received"))
    return eng, col, eng.stats(drv.now)


def make_requests(outputs, prompt=1000):
    """Requests with the given output lengths and slightly different prompts."""
    return [Request(id=i, arrival_s=0.0, prompt_tokens=prompt + 37 * i, output_tokens=n)
            for i, n in enumerate(outputs)]
