"""Test doubles for the engine tests: a recording collector, a direct interconnect, a
small analytic cost model, and helpers to run engines on the virtual-time loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from devices.costmodel import StepCosts
from devices.engines.common import model_layers
from devices.engines.decode import DecodeEngine
from interconnect.codec import corrupt_frame, make_kv_frames, verify_kv_frames
from rack.runtime.virtual import run_virtual
from workloads.request import Request

GB = 10**9


class FakeCollector:
    """Records events and outcomes; fails loudly if a request ends twice."""

    def __init__(self, clock=None) -> None:
        self.clock = clock
        self.events_log: list[tuple[int, str, float]] = []
        self.outcomes: dict[int, dict] = {}

    async def event(self, request_id, name, t):
        self.events_log.append((request_id, name, t))

    async def events(self, items):
        for rid, name, t in items:
            self.events_log.append((rid, name, t))

    async def finish(self, request_id, outcome, reason=None, itl_s=None, t=None):
        assert request_id not in self.outcomes, f"request {request_id} ended twice"
        assert t is not None
        self.outcomes[request_id] = {"outcome": outcome, "reason": reason, "itl_s": itl_s, "t": t}

    def times(self, name: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for rid, n, t in self.events_log:
            if n == name:
                out.setdefault(rid, t)
        return out

    def count(self, name: str) -> int:
        return sum(1 for _, n, _ in self.events_log if n == name)


class DirectInterconnect:
    """Ships frames after logical_bytes / bandwidth + latency, then calls receive_kv.

    `corrupt_first` corrupts the first attempt of those request ids (fault injection).
    """

    def __init__(self, clock, receivers: dict, bandwidth_Bps: float = 100e9,
                 latency_s: float = 5e-6, corrupt_first: set | None = None,
                 corrupt_always: set | None = None) -> None:
        self.clock = clock
        self.receivers = receivers
        self.bw = bandwidth_Bps
        self.lat = latency_s
        self.corrupt_first = set(corrupt_first or ())
        self.corrupt_always = set(corrupt_always or ())
        self.transfers: list[tuple[int, float, float]] = []
        self.attempts: dict[int, int] = {}

    async def transfer(self, req, frames, logical_bytes, src, dst, *, first_token_s=None):
        t0 = self.clock.now()
        good, bad, logical, _ = verify_kv_frames(frames)
        assert bad == 0 and logical == logical_bytes
        n = self.attempts.get(req.id, 0)
        self.attempts[req.id] = n + 1
        if req.id in self.corrupt_always or (req.id in self.corrupt_first and n == 0):
            frames = [corrupt_frame(frames[0])] + list(frames[1:])
        await self.clock.sleep_until(t0 + logical_bytes / self.bw + self.lat)
        bad = await self.receivers[dst].receive_kv(req, frames, first_token_s)
        self.transfers.append((req.id, t0, self.clock.now()))
        return SimpleNamespace(bad_frames=bad)


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


async def deliver(engine, cost, req, t_first=None):
    """Reserve and hand over `req`'s KV to a decode engine (first token at t_first)."""
    t_first = engine.clock.now() if t_first is None else t_first
    assert await engine.reserve_kv(req, req.prompt_tokens) is True
    return await engine.receive_kv(req, frames_for(cost, req), t_first)


def run_decode(requests, *, cost=None, capacity=40 * GB, policy="reserve", max_batch=256,
               arrivals=None, **kw):
    """Deliver `requests` (at t=0 or at `arrivals`), drain, return (engine, collector, stats)."""
    cost = cost or FakeCost()
    out = {}
    mem = None if capacity is None else plan(capacity, cost.weight_bytes)  # None: the planner

    async def main(clock):
        col = FakeCollector(clock)
        eng = DecodeEngine(name="wafer0", clock=clock, cost=cost, collector=col,
                           max_batch=max_batch, kv_block_tokens=16, admission_policy=policy,
                           memory_plan=mem, **kw)

        async def one(req, t):
            await clock.sleep_until(t)
            await deliver(eng, cost, req)

        times = arrivals or [0.0] * len(requests)
        await asyncio.gather(*(one(r, t) for r, t in zip(requests, times)))
        await eng.drain()
        out.update(engine=eng, collector=col, stats=await eng.stats())

    run_virtual(main)
    return out["engine"], out["collector"], out["stats"]


def make_requests(outputs, prompt=1000):
    """Requests with the given output lengths and slightly different prompts."""
    return [Request(id=i, arrival_s=0.0, prompt_tokens=prompt + 37 * i, output_tokens=n)
            for i, n in enumerate(outputs)]
