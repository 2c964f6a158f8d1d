"""The engines' side of fault recovery, one engine at a time: a lost decode peer's
re-sends and their limit, reservations dropped for a lost sender, a crashed engine
forgetting what it held, the decode reservation-queue bound, and the results' failure
accounting."""

from __future__ import annotations

import numpy as np
import pytest

from _engine_fakes import Client, FakeCollector, FakeCost, GB, frames_for, plan, run_cores
from devices.engines.decode import DecodeEngine
from devices.engines.prefill import PrefillEngine
from rack.measure.faults import faults_section
from workloads.core import BROADCAST, Core
from workloads.request import Request


class DeadDecode(Core):
    """A decode peer that is never there: every `reserve_kv` is lost, as the prefill
    engine learns it in one of three ways (`mode`): "lost", the engine answers
    `kv_reserved(rid, "lost")` (it restarted and dropped the reservation); "send_failed",
    the driver could not deliver the message (Ray: the actor is down); "peer_lost", the
    fault injector's broadcast that the engine died while the reservation waited."""

    def __init__(self, mode, name="d0"):
        super().__init__(name)
        self.mode = mode
        self.calls = 0

    def reserve_kv(self, now, req, kv_tokens, first_token_s, src):
        self.calls += 1
        if self.mode == "lost":
            self.send(src, "kv_reserved", req.id, "lost")
        elif self.mode == "send_failed":
            self.send(src, "send_failed", self.name, "reserve_kv", (req, kv_tokens, first_token_s, src))
        else:
            self.send(BROADCAST, "peer_lost", self.name)


class NoLink(Core):
    def __init__(self):
        super().__init__("interconnect")

    def transfer(self, now, *a):  # pragma: no cover - never reached
        raise AssertionError("nothing to ship")


@pytest.mark.parametrize("mode", ["lost", "send_failed", "peer_lost"])
def test_prefill_gives_up_after_max_peer_retries_and_frees_the_kv(mode):
    cost = FakeCost()
    req = Request(id=3, arrival_s=0.0, prompt_tokens=2000, output_tokens=10)
    col, dead = FakeCollector(), DeadDecode(mode)
    eng = PrefillEngine(name="p0", cost=cost, collector=col.name, interconnect="interconnect",
                        decode=["d0"], memory_plan=plan(80 * GB, cost.weight_bytes),
                        max_peer_retries=3, payload_scale=1e-5)
    drv = run_cores([col, Client([(0.0, "p0", "submit_many", [(req, "d0")])]), eng, NoLink(), dead])
    o = col.outcomes[3]
    assert o["outcome"] == "failed" and o["reason"] == "decode_unavailable"
    assert dead.calls == 4                               # the first try + 3 re-sends
    st = eng.stats(drv.now)
    assert st["peer_lost"] == 4 and st["kv_resent_after_restart"] == 3
    assert st["memory"]["held_bytes"].get("kv", 0) == 0   # the KV was freed
    assert drv.now >= 1e-3 + 2e-3                         # it backed off between tries


def test_dropped_reservations_are_lost_to_their_senders_and_a_crash_forgets_them():
    cost = FakeCost()
    big = [Request(id=i, arrival_s=0.0, prompt_tokens=100_000, output_tokens=2) for i in range(3)]
    col = FakeCollector()

    def engine(loading_until_s=None):
        # room for one request's KV: the second and third wait
        return DecodeEngine(name="d0", cost=cost, collector=col.name, max_batch=4,
                            memory_plan=plan(cost.weight_bytes + 14 * GB, cost.weight_bytes),
                            loading_until_s=loading_until_s)

    eng = engine()
    seen = {}
    client = Client([
        *[(0.0, "d0", "reserve_kv", r, r.prompt_tokens, 0.0, "client") for r in big],
        (0.001, lambda now: seen.update(at_1ms=list(client.of("kv_reserved")), peak=eng.waiting_peak)),
        (0.001, "d0", "holding", [0, 1, 2], False, "client", "all"),
        (0.001, "d0", "holding", [1], True, "client", "drop"),          # request 1's sender died
        (0.002, lambda now: seen.update(at_2ms=list(client.of("kv_reserved")))),
        (0.002, "d0", "crash", None),                                    # the engine itself dies
        (0.003, "d0", "receive_kv", big[0], frames_for(cost, big[0]), 0.0, "client", "after"),
        (0.003, "d0", "abort_kv", big[0], "kv_checksum"),
        (0.003, "d0", "holding", [0, 1, 2], False, "client", "fresh"),
    ])
    drv = run_cores([col, eng, client], rebuild=lambda name, until: engine(until))
    assert seen["at_1ms"] == [(0, "granted")] and seen["peak"] == 2
    held = {tag: ids for tag, _, ids in client.of("held")}
    assert held["all"] == [0, 1, 2]                                      # reservations count as held
    assert held["drop"] == []
    assert seen["at_2ms"] == [(0, "granted"), (1, "lost")]               # its waiting sender is told
    assert eng.stats(drv.now)["reservations_dropped"] == 1
    # restarted (the driver's crash: a fresh core that knows nothing)
    fresh = drv.cores["d0"]
    assert fresh is not eng and drv.incarnation["d0"] == 1
    assert held["fresh"] == []                                           # request 2's wait is gone too
    assert client.of("kv_received") == [("after", -1)]                   # no reservation: the sender lost it
    assert col.outcomes[0] == {"outcome": "failed", "reason": "kv_checksum", "itl_s": None, "t": 0.003}
    assert fresh.stats(drv.now)["memory"]["held_bytes"].get("reserved", 0) == 0


def test_decode_reservation_queue_is_bounded():
    cost = FakeCost()
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=100_000, output_tokens=2) for i in range(6)]
    col = FakeCollector()
    eng = DecodeEngine(name="d0", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(cost.weight_bytes + 14 * GB, cost.weight_bytes),
                       max_reserve_queue=2)
    client = Client([(0.0 if r.id < 3 else 0.001, "d0", "reserve_kv", r, r.prompt_tokens, 0.0, "client")
                     for r in reqs])
    drv = run_cores([col, eng, client], idle=False)      # 1 and 2 wait for memory for ever
    got = client.of("kv_reserved")
    assert got[0] == (0, "granted") and got[1:] == [(3, "refused"), (4, "refused"), (5, "refused")]
    assert eng.waiting_peak == 2 and eng.stats(drv.now)["waiting_reservations"] == 2
    for i in (3, 4, 5):
        o = col.outcomes[i]
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
