"""The engines' side of fault recovery, one engine at a time: PeerLost re-sends and their
limit, reservations dropped for a lost sender, a halted engine failing its waiting
callers, the decode reservation-queue bound, and the results' failure accounting."""

from __future__ import annotations

import numpy as np
import pytest

from _engine_fakes import FakeCollector, FakeCost, GB, frames_for, plan
from devices.engines.decode import DecodeEngine
from devices.engines.prefill import PrefillEngine
from interconnect.component import PeerLost
from rack.analysis.faults import faults_section
from rack.runtime.virtual import run_virtual
from workloads.request import Request


class Collector(FakeCollector):
    async def open_among(self, ids):
        return [i for i in ids if i not in self.outcomes]


class DeadDecode:
    """A decode peer that is never there (every call: PeerLost)."""

    def __init__(self):
        self.calls = 0

    async def reserve_kv(self, req, kv_tokens, first_token_s=None):
        self.calls += 1
        raise PeerLost("decode-0 is down")


class NoLink:
    async def transfer(self, *a, **k):  # pragma: no cover - never reached
        raise AssertionError("nothing to ship")


def test_prefill_gives_up_after_max_peer_retries_and_frees_the_kv():
    cost = FakeCost()
    req = Request(id=3, arrival_s=0.0, prompt_tokens=2000, output_tokens=10)
    out = {}

    async def main(clock):
        col = Collector(clock)
        dead = DeadDecode()
        eng = PrefillEngine(name="p0", clock=clock, cost=cost, collector=col, interconnect=NoLink(),
                            decode={"d0": dead}, memory_plan=plan(80 * GB, cost.weight_bytes),
                            max_peer_retries=3, payload_scale=1e-5)
        await eng.submit(req, "d0")
        await eng.drain()
        out.update(col=col, dead=dead, stats=await eng.stats(), t=clock.now())

    run_virtual(main)
    o = out["col"].outcomes[3]
    assert o["outcome"] == "failed" and o["reason"] == "decode_unavailable"
    assert out["dead"].calls == 4                        # the first try + 3 re-sends
    st = out["stats"]
    assert st["peer_lost"] == 4 and st["kv_resent_after_restart"] == 3
    assert st["memory"]["held_bytes"].get("kv", 0) == 0   # the KV was freed
    assert out["t"] >= 1e-3 + 2e-3                        # it backed off between tries


def test_dropped_and_halted_reservations_raise_peer_lost_in_their_callers():
    import asyncio

    cost = FakeCost()
    big = [Request(id=i, arrival_s=0.0, prompt_tokens=100_000, output_tokens=2) for i in range(3)]
    out = {}

    def engine(clock, col):
        # room for one request's KV: the second and third wait
        return DecodeEngine(name="d0", clock=clock, cost=cost, collector=col, max_batch=4,
                            memory_plan=plan(cost.weight_bytes + 14 * GB, cost.weight_bytes))

    async def main(clock):
        col = Collector(clock)
        eng = engine(clock, col)
        results = {}

        async def reserve(r):
            try:
                results[r.id] = await eng.reserve_kv(r, r.prompt_tokens, first_token_s=0.0)
            except PeerLost as exc:
                results[r.id] = exc

        tasks = [asyncio.ensure_future(reserve(r)) for r in big]
        await clock.sleep_until(0.001)
        assert results == {0: True} and eng.waiting_peak == 2
        assert await eng.holding([0, 1, 2]) == [0, 1, 2]         # reservations count as held
        assert await eng.holding([1], drop_reserved=True) == []   # request 1's sender died
        await clock.sleep_until(0.002)
        assert isinstance(results[1], PeerLost) and 2 not in results
        eng.halt()                                                 # the engine itself dies
        await asyncio.gather(*tasks)
        assert isinstance(results[2], PeerLost)
        fresh = engine(clock, col)                                 # as restarted: knows nothing
        with pytest.raises(PeerLost, match="without a reservation"):
            await fresh.receive_kv(big[0], frames_for(cost, big[0]), 0.0)
        with pytest.raises(PeerLost):
            await fresh.abort_kv(big[0])
        out["stats"] = await eng.stats()

    run_virtual(main)
    assert out["stats"]["reservations_dropped"] == 1


def test_decode_reservation_queue_is_bounded():
    cost = FakeCost()
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=100_000, output_tokens=2) for i in range(6)]
    out = {}

    async def main(clock):
        import asyncio

        col = Collector(clock)
        eng = DecodeEngine(name="d0", clock=clock, cost=cost, collector=col, max_batch=4,
                           memory_plan=plan(cost.weight_bytes + 14 * GB, cost.weight_bytes),
                           max_reserve_queue=2)
        got = await asyncio.gather(*(asyncio.wait_for(eng.reserve_kv(r, r.prompt_tokens, 0.0), 10)
                                     for r in reqs[:1]))
        waiting = [asyncio.ensure_future(eng.reserve_kv(r, r.prompt_tokens, 0.0)) for r in reqs[1:3]]
        await clock.sleep_until(0.001)
        refused = [await eng.reserve_kv(r, r.prompt_tokens, 0.0) for r in reqs[3:]]
        out.update(got=got, refused=refused, col=col, peak=eng.waiting_peak)
        for t in waiting:
            t.cancel()

    run_virtual(main)
    assert out["got"] == [True] and out["refused"] == [False, False, False]
    assert out["peak"] == 2
    for i in (3, 4, 5):
        o = out["col"].outcomes[i]
        assert (o["outcome"], o["reason"]) == ("rejected", "decode_queue_full")


def test_faults_section_counts_fault_failures():
    ids = np.arange(6)
    cols = {"id": ids, "outcome": np.array(["completed", "failed", "failed", "completed", "rejected", "failed"],
                                           dtype=object),
            "reason": np.array(["", "kv_checksum", "exceeds_decode_kv_capacity", "", "prefill_queue_full",
                                "decode_unavailable"], dtype=object)}
    snap = {"faults": [{"index": 0, "kind": "decode_crash", "instance": "decode-0", "applied": True,
                        "applied_at_s": 1.0, "recovered": True}],
            "recoveries": [{"instance": "decode-0", "t": 1.0, "ids": [3, 4]}]}
    f = faults_section(snap, {}, cols)
    # 4 was re-dispatched and then rejected; 1 and 5 failed for fault-only reasons; 2 is
    # an ordinary failure
    assert f["requests_failed"] == 3
    assert f["requests_redispatched"] == 2 and f["requests_recovered"] == 1
    assert f["injected"] == f["recovered"] == 1 and f["errors"] == []
    assert f["list"][0]["requests_failed"] == 1 and f["list"][0]["requests_redispatched"] == 2


def test_faults_count_each_request_once_per_fault_that_hit_it():
    """A request re-dispatched twice for one crash (a later recovery of the same
    instance, e.g. after a submission found it down) counts once for that crash; one
    hit by two crashes counts once in each; the totals count distinct requests. A
    frame_corrupt that found nothing says so and is neither recovered nor failed."""
    ids = np.arange(8)
    cols = {"id": ids, "outcome": np.array(["completed"] * 8, dtype=object), "reason": np.array([""] * 8, dtype=object)}
    crash = {"kind": "decode_crash", "instance": "decode-0", "applied": True, "recovered": True}
    snap = {"faults": [{**crash, "index": 0, "applied_at_s": 1.0}, {**crash, "index": 1, "applied_at_s": 3.0},
                       {"index": 2, "kind": "prefill_crash", "instance": "prefill-1", "applied": True,
                        "applied_at_s": 2.0, "recovered": True},
                       {"index": 3, "kind": "frame_corrupt", "instance": "*", "applied": True, "recovered": False}],
            "recoveries": [{"instance": "decode-0", "t": 1.0, "ids": [3, 4]},
                           {"instance": "decode-0", "t": 1.2, "ids": [4]},        # the same crash again
                           {"instance": "prefill-1", "t": 2.0, "ids": [6]},
                           {"instance": "decode-0", "t": 3.0, "ids": [4, 5]}]}    # a second crash
    f = faults_section(snap, {"interconnect": {"corruption": []}}, cols)
    assert [r.get("requests_redispatched") for r in f["list"]] == [2, 2, 1, None]
    assert f["requests_redispatched"] == 4 and f["requests_recovered"] == 4       # 3, 4, 5, 6
    assert f["list"][3]["outcome"] == "no target at that time" and f["list"][3]["recovered"] is None
    assert f["injected"] == 4 and f["recovered"] == 3 and f["no_target"] == 1
    assert "outcome" not in f["list"][0]
