"""The live front's protocol on the virtual driver: requests opened through the
gateway core get the same per-request metrics as the same requests replayed, and the
token times the engines planned (tokens_planned, run_cut, first_token) are exactly the
times the collector records, for split (first token from decode or from prefill),
colocated and speculative-decoding scenarios."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rack.runtime.placement import construct
from rack.runtime.virtual import VirtualDriver
from rack.serve.gateway import Gateway
from rack.serve.topology import live_topology
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import load_requests
from workloads.core import Core


class _Clients(Core):
    """Opens each request at its arrival time through the front (an HTTP client's part)."""

    def __init__(self, requests) -> None:
        super().__init__("clients")
        self.reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        self.i = 0
        self.wake_at = self.reqs[0].arrival_s if self.reqs else np.inf

    def on_wake(self, now: float) -> None:
        while self.i < len(self.reqs) and self.reqs[self.i].arrival_s <= now:
            self.send("front", "open", self.reqs[self.i])
            self.i += 1
        self.wake_at = self.reqs[self.i].arrival_s if self.i < len(self.reqs) else np.inf


class _PlanKeeper(Gateway):
    """Keeps each request's planned token times as they were just before its record came."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.planned: dict[int, np.ndarray] = {}

    def request_ended(self, now, request_id, outcome, reason, t_end, times, itl_s):
        lr = self.requests.get(int(request_id))
        if lr is not None:
            self.planned[int(request_id)] = lr.times.copy()
        super().request_ended(now, request_id, outcome, reason, t_end, times, itl_s)


def _live_run(scenario, requests):
    specs = live_topology(scenario)
    cores = {}
    for s in specs:
        cores[s.name] = _PlanKeeper(router="router") if s.kind == "front" else construct(s)
    cores["clients"] = _Clients(requests)
    driver = VirtualDriver(cores)
    driver.post("router", "start", [], None, 0.0)
    n = len(requests)
    col = cores["collector"]
    driver.run(lambda: col.ids.shape[0] == n and col.all_ended() and all(c.is_idle() for c in cores.values()))
    return cores


def _scenario(name, **changes):
    sc = load_scenario(name)
    if changes:
        data = sc.model_dump()
        for path, value in changes.items():
            d = data
            keys = path.split(".")
            for k in keys[:-1]:
                d = d[int(k)] if k.isdigit() else d[k]
            d[keys[-1]] = value
        sc = type(sc).model_validate(data)
    return sc


CASES = {
    "split-decode-first": ("helios-cs3-kimi-k2", {}),
    "split-prefill-first": ("helios-cs3-kimi-k2", {"first_token": "prefill"}),
    "colocated": ("gpu-only-kimi-k2", {}),
    "colocated-recv-interval": ("gpu-only-kimi-k2", {"pools.0.scheduler_recv_interval": 8}),
    "speculative": ("helios-cs3-kimi-k2", {"pools.1.speculative": {"draft_tokens": 3, "acceptance_rate": 0.7}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_live_requests_match_replay_and_planned_times_match_the_record(case):
    name, changes = CASES[case]
    sc = _scenario(name, **changes)
    reqs = [r for r in load_requests("mooncake-excerpt") if r.arrival_s < 15.0]
    # distinct arrival times (a replay tick of several requests is one submission, a
    # live request always its own): ties 1 ms apart
    uniq, last = [], -1.0
    for r in reqs:
        t = max(r.arrival_s, last + 1e-3)
        uniq.append(dataclasses.replace(r, arrival_s=t))
        last = t
    cores = _live_run(sc, uniq)
    replay = run_scenario(sc, uniq, runtime="virtual")
    snap = cores["collector"].snapshot()
    order = np.argsort(snap["ids"])
    want = replay.snapshot
    worder = np.argsort(want["ids"])
    assert snap["ids"][order].tolist() == want["ids"][worder].tolist()
    assert snap["outcome"][order].tolist() == want["outcome"][worder].tolist()
    np.testing.assert_allclose(snap["times"][order], want["times"][worder], rtol=0, atol=1e-12)
    front = cores["front"]
    completed = [int(i) for i, o in zip(snap["ids"], snap["outcome"]) if o == 1]
    assert len(completed) >= len(uniq) - 2
    first = list(snap["events"]).index("first_token")
    row = {int(r): i for i, r in enumerate(snap["ids"].tolist())}
    per = snap["itl"].per_request()
    ends = np.cumsum(per["itl_lengths"])
    itls = {int(r): per["itl_flat"][e - n:e] for r, n, e in zip(per["itl_ids"], per["itl_lengths"], ends)}
    for rid in completed:
        itl = itls.get(rid, np.zeros(0))         # one output token: no gap
        truth = snap["times"][row[rid], first] + np.concatenate(([0.0], np.cumsum(itl)))
        planned = front.planned[rid]
        assert planned.shape == truth.shape
        np.testing.assert_allclose(planned, truth, rtol=0, atol=1e-9, err_msg=f"request {rid}")
    if case == "split-decode-first":     # admissions cut runs in progress
        assert front.counts["cuts"] > 0
    assert not snap["violations"]


def test_router_rejection_is_replied_to_the_front():
    sc = _scenario("helios-cs3-kimi-k2", **{"router.max_outstanding_tokens": 1})
    reqs = [r for r in load_requests("mooncake-excerpt")][:3]
    same = [type(r)(id=r.id, arrival_s=0.001 * k, prompt_tokens=r.prompt_tokens, output_tokens=5)
            for k, r in enumerate(reqs)]
    cores = _live_run(sc, same)
    front = cores["front"]
    statuses = [front.requests[r.id].status for r in same]
    outcomes = [front.requests[r.id].outcome for r in same]
    # the first two fill both prefill instances (above 1 token of outstanding work each)
    assert statuses == ["admitted", "admitted", "rejected"]
    assert outcomes == ["completed", "completed", "rejected"]
    assert front.requests[same[2].id].reason == "router_queue_full"
    assert front.counts["rejected"] == 1
