"""Per-sender FIFO between Ray hosts (rack.runtime.ray_order), driven by hand: the calls
arrive in the orders Ray allows (async actors run calls in no guaranteed order)."""

from __future__ import annotations

import asyncio

from rack.runtime.ray_order import InOrder, Outgoing


def _deliver(order: InOrder, ran: list, sender: str, inc: str, seq: int, low: int):
    async def call():
        st = await order.turn(sender, inc, seq, low)
        await asyncio.sleep(0)           # a handler that awaits (a KV payload) keeps its turn
        ran.append((sender, seq))
        order.done(st, seq)
    return asyncio.ensure_future(call())


def _run(arrivals):
    """Deliver (sender, incarnation, seq, low) calls in the given arrival order, one
    loop turn apart; returns the order they were handled in and the InOrder."""
    async def main():
        order, ran, tasks = InOrder(), [], []
        for a in arrivals:
            tasks.append(_deliver(order, ran, *a))
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return ran, order
    return asyncio.run(main())


def test_calls_of_one_sender_run_in_the_order_it_made_them():
    ran, order = _run([("d", "a", 2, 0), ("d", "a", 0, 0), ("d", "a", 3, 0), ("d", "a", 1, 0)])
    assert ran == [("d", 0), ("d", 1), ("d", 2), ("d", 3)]
    assert order.held == 2


def test_senders_do_not_wait_for_each_other():
    async def main():
        order, ran = InOrder(), []
        held = _deliver(order, ran, "d", "a", 1, 0)      # waits for d's call 0
        await asyncio.sleep(0)
        await asyncio.wait_for(_deliver(order, ran, "p", "b", 0, 0), 5)
        assert ran == [("p", 0)] and not held.done()
        await asyncio.wait_for(asyncio.gather(_deliver(order, ran, "d", "a", 0, 0), held), 5)
        return ran
    assert asyncio.run(main()) == [("p", 0), ("d", 0), ("d", 1)]


def test_a_restarted_receiver_starts_at_the_mark_and_an_empty_call_moves_it_past_a_failure():
    # The sender had calls 5, 6, 7 open; 5 reached the receiver's dead incarnation and
    # failed; 6 and 7 reach the new incarnation (their mark says 5 may still come) and
    # wait; the sender's empty follow-up (mark 6) lets them run, in order.
    out = Outgoing()
    for _ in range(5):
        out.done(out.stamp()[0])
    stamps = [out.stamp() for _ in range(3)]
    assert stamps == [(5, 5), (6, 5), (7, 5)]
    assert out.done(5, failed=True)                      # later calls open: follow up
    nudge = out.stamp(empty=True)
    assert nudge == (8, 6)
    ran, _ = _run([("d", "a", 6, 5), ("d", "a", 7, 5), ("d", "a", *nudge)])
    assert ran == [("d", 6), ("d", 7), ("d", 8)]


def test_follow_ups_end_when_the_destination_is_dead_for_good():
    # Every call fails: each failure with a later call carrying messages asks for one
    # empty follow-up; failing follow-ups ask for none, so it ends.
    out = Outgoing()
    for _ in range(3):
        out.stamp()
    sent = 3
    pending = [0, 1, 2]
    while pending:
        seq = pending.pop(0)
        if out.done(seq, failed=True):
            pending.append(out.stamp(empty=True)[0])
            sent += 1
        assert sent < 10
    assert out.open == {} and sent == 5


def test_an_answered_call_asks_for_no_follow_up():
    out = Outgoing()
    a, _ = out.stamp()
    b, low = out.stamp()
    assert low == a
    assert not out.done(a)                               # answered
    assert out.stamp()[1] == b
    assert out.done(b, failed=True)                      # b failed with call 2 still open
    assert not out.done(2)
