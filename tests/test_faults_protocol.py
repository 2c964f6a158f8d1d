"""The crash-recovery protocol under the orderings the Ray driver allows: the cores are
driven by hand, message by message, so an interleaving a loaded machine produces only
now and then is produced every time here."""

from __future__ import annotations

from rack.serving.fault_injector import PING_BACKOFF_S, FaultInjector
from rack.serving.router import Router
from workloads import Request
from workloads.core import BROADCAST


def take(core):
    out = list(core.outbox)
    core.outbox.clear()
    return out


def decode_crash_at_1s():
    """A FaultInjector with one decode crash at t = 1 s, its set-up messages taken."""
    f = {"kind": "decode_crash", "target": "decode-0", "at_s": 1.0, "duration_s": None, "factor": None,
         "count": 1, "seed": 0, "weight_load_s": 0.5, "index": 0, "instance": "decode-0"}
    inj = FaultInjector(faults=[f], collector="collector", router="router")
    take(inj)
    return inj


def crash_injector():
    inj = decode_crash_at_1s()
    inj.on_wake(1.0)
    assert take(inj) == [("decode-0", "ping", ("faults", (0, "before")))]
    inj.pong(1.0, (0, "before"), {"incarnation": 111, "work": {}})
    sent = take(inj)
    assert [(d, m) for d, m, _ in sent] == [("decode-0", "crash"), (BROADCAST + "faults", "peer_lost"),
                                            ("collector", "note_fault"), ("decode-0", "ping")]
    return inj


def test_an_answer_from_the_dying_incarnation_is_not_taken_for_the_restart():
    # On Ray the ping sent right behind `crash` can reach the old process before it is
    # killed; its pong carries the old incarnation and must not start the recovery.
    inj = crash_injector()
    inj.pong(1.001, (0, "after"), {"incarnation": 111, "work": {}})
    assert take(inj) == []
    assert inj.wake_at == 1.001 + PING_BACKOFF_S[0]
    inj.on_wake(inj.wake_at)
    assert take(inj) == [("decode-0", "ping", ("faults", (0, "after")))]
    inj.pong(1.01, (0, "after"), {"incarnation": 222, "work": {}})
    assert take(inj) == [("router", "recover", ("decode-0", "faults", 0))]
    assert inj.records[0]["restarted"] and inj.records[0]["incarnations"] == [111, 222]


def test_a_recovery_question_that_cannot_be_delivered_counts_as_holding_nothing():
    # The restarted decode engine dies again before it answers `holding`: the recovery
    # goes on (a down instance holds nothing) instead of waiting for ever.
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=100, output_tokens=5) for i in range(2)]
    router = Router(collector="collector", prefill=["prefill-0"], decode_targets=["decode-0"],
                    decoders=["decode-0"])
    router.load(0.0, "prefill-0", 0)
    router.start(0.0, reqs, None, 0.0)
    router.on_wake(0.0)
    take(router)
    router.recover(1.0, "decode-0", "faults", 0)
    (_, m, (ids, _, tag)), = take(router)
    assert m == "open_among" and sorted(ids) == [0, 1]
    router.open_ids(1.0, tag, [0, 1])
    (dst, m, args), = take(router)
    assert (dst, m) == ("decode-0", "holding")
    router.send_failed(1.1, dst, m, args)
    (dst, m, _), = take(router)
    assert (dst, m) == ("prefill-0", "holding")          # the other holders are asked next
    assert router.waiting_for() == "1 recovery(ies) waiting for replies"


def test_a_crash_aimed_at_an_instance_still_down_applies_once_it_is_back():
    # Ray fault storm (issue 37): the "before" ping of a second crash failed while the
    # instance restarted from the first, and its retry went out as an "after" ping, whose
    # answer found no record of the crash (KeyError 'incarnations', the run aborted).
    inj = decode_crash_at_1s()
    inj.on_wake(1.0)
    (ping,) = take(inj)
    inj.send_failed(1.0, "decode-0", "ping", ping[2])        # the actor is down
    inj.on_wake(inj.wake_at)
    assert take(inj) == [("decode-0", "ping", ("faults", (0, "before")))]
    inj.pong(1.2, (0, "before"), {"incarnation": 222, "work": {}})
    assert inj.records[0]["incarnations"] == [222] and inj.records[0]["applied"]
