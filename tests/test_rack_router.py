"""Router: replay timing, policies, admission bound, conditional disaggregation."""

from __future__ import annotations

import pytest

from rack.serving.collector import Collector
from rack.serving.router import Router
from rack.runtime.virtual import run_virtual
from workloads import Request


class FakeInstance:
    def __init__(self, clock, load=0):
        self.clock = clock
        self.load = load
        self.got = []

    async def submit(self, req, target):
        self.got.append((req.id, target, self.clock.now()))
        self.load += req.prompt_tokens

    async def submit_many(self, items):
        for req, target in items:
            await self.submit(req, target)

    async def outstanding_tokens(self):
        return self.load


def reqs(n, prompt=100, t=0.0, dt=0.0):
    return [Request(id=i, arrival_s=t + i * dt, prompt_tokens=prompt, output_tokens=5) for i in range(n)]


def run(make_router, requests):
    async def main(clock):
        coll = Collector(clock=clock, request_ids=[r.id for r in requests])
        router, insts = make_router(clock, coll)
        await router.run(requests)
        return coll, insts

    return run_virtual(main)


def test_requests_are_dispatched_at_their_arrival_times():
    rs = reqs(4, dt=0.5)

    def make(clock, coll):
        a = FakeInstance(clock)
        return Router(clock=clock, collector=coll, prefill={"p0": a}, decode_targets=["d0"]), [a]

    coll, (a,) = run(make, rs)
    assert [t for _, _, t in a.got] == [0.0, 0.5, 1.0, 1.5]
    assert all(target == "d0" for _, target, _ in a.got)
    assert coll.times[:, 0].tolist() == [0.0, 0.5, 1.0, 1.5]     # arrival events


def test_round_robin_alternates():
    def make(clock, coll):
        a, b = FakeInstance(clock), FakeInstance(clock)
        return Router(clock=clock, collector=coll, prefill={"a": a, "b": b}, decode_targets=["d"],
                      policy="round_robin"), [a, b]

    _, (a, b) = run(make, reqs(6))
    assert [i for i, *_ in a.got] == [0, 2, 4] and [i for i, *_ in b.got] == [1, 3, 5]


def test_least_outstanding_work_balances_tokens():
    def make(clock, coll):
        a, b = FakeInstance(clock, load=1000), FakeInstance(clock, load=0)
        return Router(clock=clock, collector=coll, prefill={"a": a, "b": b}, decode_targets=["d"]), [a, b]

    _, (a, b) = run(make, reqs(12))
    # b starts 1000 tokens lighter: it takes the first 10 requests of 100 tokens, then they alternate.
    assert len(b.got) == 11 and len(a.got) == 1


def test_rejects_when_every_instance_is_over_the_bound():
    def make(clock, coll):
        a = FakeInstance(clock)
        return Router(clock=clock, collector=coll, prefill={"a": a}, decode_targets=["d"],
                      max_outstanding_tokens=250), [a]

    coll, (a,) = run(make, reqs(5))
    assert len(a.got) == 3             # loads 0, 100, 200 admitted; 300 > 250 rejects the rest
    assert coll.reason == {3: "router_queue_full", 4: "router_queue_full"}


def test_short_prompts_go_to_the_colocated_pool():
    rs = [Request(id=i, arrival_s=0.0, prompt_tokens=p, output_tokens=4) for i, p in enumerate([50, 5000, 100, 8000])]

    def make(clock, coll):
        gpu, wafer = FakeInstance(clock), FakeInstance(clock)
        return Router(clock=clock, collector=coll, prefill={"gpu": gpu}, decode_targets=["wafer"],
                      local={"wafer": wafer}, local_prefill_threshold_tokens=100), [gpu, wafer]

    _, (gpu, wafer) = run(make, rs)
    assert [i for i, *_ in wafer.got] == [0, 2] and [i for i, *_ in gpu.got] == [1, 3]


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match="router policy"):
        Router(clock=None, collector=None, prefill={"a": object()}, decode_targets=[], policy="random")
