"""Router: replay timing, policies, admission bound, conditional disaggregation."""

from __future__ import annotations

import pytest

from rack.serving.collector import Collector
from rack.serving.router import Router
from rack.runtime.virtual import VirtualDriver
from workloads import Request
from workloads.core import Core


class FakeInstance(Core):
    """A prefill-capable instance: records what it is sent and reports its outstanding
    prompt tokens to the router (`load`), at construction and on every submission, as
    the engines do."""

    def __init__(self, name, load=0, router="router"):
        super().__init__(name)
        self.router = router
        self.load = load
        self.got = []
        self.send(router, "load", name, load)

    def submit_many(self, now, items):
        for req, target in items:
            self.got.append((req.id, target, now))
            self.load += req.prompt_tokens
        self.send(self.router, "load", self.name, self.load)


def reqs(n, prompt=100, t=0.0, dt=0.0):
    return [Request(id=i, arrival_s=t + i * dt, prompt_tokens=prompt, output_tokens=5) for i in range(n)]


def run(make_router, requests):
    """Run the router built by `make_router(collector name)` -> (router, instances) with
    a collector until every request was sent; returns (collector, instances)."""
    coll = Collector(request_ids=[r.id for r in requests])
    router, insts = make_router(coll.name)
    drv = VirtualDriver({c.name: c for c in (router, coll, *insts)})
    drv.post("router", "start", list(requests), None, 0.0)
    drv.run(lambda: router.is_idle())
    assert router.is_idle()
    return coll, insts


def test_requests_are_dispatched_at_their_arrival_times():
    rs = reqs(4, dt=0.5)

    def make(coll):
        a = FakeInstance("p0")
        return Router(collector=coll, prefill=["p0"], decode_targets=["d0"]), [a]

    coll, (a,) = run(make, rs)
    assert [t for _, _, t in a.got] == [0.0, 0.5, 1.0, 1.5]
    assert all(target == "d0" for _, target, _ in a.got)
    assert coll.snapshot()["times"][:, 0].tolist() == [0.0, 0.5, 1.0, 1.5]     # arrival events


def test_round_robin_alternates():
    def make(coll):
        a, b = FakeInstance("a"), FakeInstance("b")
        return Router(collector=coll, prefill=["a", "b"], decode_targets=["d"],
                      policy="round_robin"), [a, b]

    _, (a, b) = run(make, reqs(6))
    assert [i for i, *_ in a.got] == [0, 2, 4] and [i for i, *_ in b.got] == [1, 3, 5]


def test_least_outstanding_work_balances_tokens():
    def make(coll):
        a, b = FakeInstance("a", load=1000), FakeInstance("b", load=0)
        return Router(collector=coll, prefill=["a", "b"], decode_targets=["d"]), [a, b]

    _, (a, b) = run(make, reqs(12))
    # b starts 1000 tokens lighter: it takes the first 10 requests of 100 tokens, then they alternate.
    assert len(b.got) == 11 and len(a.got) == 1


def test_rejects_when_every_instance_is_over_the_bound():
    def make(coll):
        a = FakeInstance("a")
        return Router(collector=coll, prefill=["a"], decode_targets=["d"],
                      max_outstanding_tokens=250), [a]

    coll, (a,) = run(make, reqs(5))
    assert len(a.got) == 3             # loads 0, 100, 200 admitted; 300 > 250 rejects the rest
    assert coll.snapshot()["reason"] == {3: "router_queue_full", 4: "router_queue_full"}


def test_short_prompts_go_to_the_colocated_pool():
    rs = [Request(id=i, arrival_s=0.0, prompt_tokens=p, output_tokens=4) for i, p in enumerate([50, 5000, 100, 8000])]

    def make(coll):
        gpu, wafer = FakeInstance("gpu"), FakeInstance("wafer")
        return Router(collector=coll, prefill=["gpu"], decode_targets=["wafer"],
                      local=["wafer"], local_prefill_threshold_tokens=100), [gpu, wafer]

    _, (gpu, wafer) = run(make, rs)
    assert [i for i, *_ in wafer.got] == [0, 2] and [i for i, *_ in gpu.got] == [1, 3]


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match="router policy"):
        Router(collector="collector", prefill=["a"], decode_targets=[], policy="random")
