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


def _router_with_two_requests(prefill=("prefill-0",)):
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=100, output_tokens=5) for i in range(2)]
    router = Router(collector="collector", prefill=list(prefill), decode_targets=["decode-0"],
                    decoders=["decode-0"])
    for name in prefill:
        router.load(0.0, name, 0)
    router.start(0.0, reqs, None, 0.0)
    router.on_wake(0.0)
    take(router)
    return router


def test_an_undelivered_recovery_question_counts_its_routed_requests_as_held():
    # The restarted decode engine dies again before it answers `holding`. The recovery
    # goes on instead of waiting for ever, but must not re-dispatch the requests routed
    # to it: Ray reports the failure up to seconds late, and the engine's next
    # incarnation may have received one of them meanwhile (a KV its prefill instance
    # still held and re-sent): re-dispatched, it was decoded twice (Ray fault storm,
    # "request 0 ended twice"). Its own recovery, once it is back, asks about them.
    router = _router_with_two_requests()
    router.recover(1.0, "decode-0", "faults", 0)
    (_, m, (ids, _, tag)), = take(router)
    assert m == "open_among" and sorted(ids) == [0, 1]
    router.open_ids(1.0, tag, [0, 1])
    (dst, m, args), = take(router)
    assert (dst, m) == ("decode-0", "holding")
    router.send_failed(1.1, dst, m, args)
    # both are routed to decode-0, which counts as holding them: nothing left to ask
    (dst, m, (ids, _, tag)), = take(router)
    assert (dst, m, ids) == ("collector", "open_among", [])
    router.open_ids(1.2, tag, [])
    sent = take(router)
    assert [m for _, m, _ in sent] == ["recovered"] and sent[0][2][1]["redispatched"] == []
    assert router.waiting_for() == ""
    # the next recovery of decode-0 (it died again, so one follows) asks its new incarnation
    router.recover(2.0, "decode-0", "faults", 1)
    (_, m, (ids, _, _)), = take(router)
    assert m == "open_among" and sorted(ids) == [0, 1]


def test_an_undelivered_question_to_another_instance_leaves_it_only_its_own_requests():
    # A prefill instance that never received a request cannot hold it: when the question
    # to it fails, the requests lost with the decode engine are still re-dispatched.
    router = _router_with_two_requests(prefill=("prefill-0", "prefill-1"))
    on = {rid: name for name in ("prefill-0", "prefill-1") for rid in router.routed_to(name)}
    assert sorted(on) == [0, 1] and set(on.values()) == {"prefill-0", "prefill-1"}
    router.recover(1.0, "decode-0", "faults", 0)
    (_, _, (_, _, tag)), = take(router)
    router.open_ids(1.0, tag, [0, 1])
    (dst, m, args), = take(router)
    router.held(1.0, args[-1], "decode-0", [])                   # restarted empty
    asked = take(router)
    assert sorted(d for d, m, _ in asked) == ["prefill-0", "prefill-1"]
    (_, _, args), = [a for a in asked if a[0] == "prefill-1"]
    router.held(1.1, args[-1], "prefill-0", [])
    router.send_failed(1.2, "prefill-1", "holding", args)          # prefill-1 died meanwhile
    (dst, m, (ids, _, tag)), = take(router)
    assert (dst, m) == ("collector", "open_among")
    (lost,) = [i for i in (0, 1) if on[i] == "prefill-0"]
    assert ids == [lost]                                          # prefill-1's one counts as held
    router.open_ids(1.3, tag, ids)
    sent = take(router)
    (resent,) = [args for d, m, args in sent if m == "submit_many"]
    assert [d for d, m, _ in sent if m == "submit_many"] == ["prefill-0"]
    assert [(r.id, target) for r, target in resent[0]] == [(lost, "decode-0")]


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
