"""Per-sender FIFO between Ray hosts: the messages one core sends another are handled
in the order it sent them, as over a wire.

Why: the cores' protocols assume it (a decode engine's ITL step log arrives in step
order before the finishes that refer to it; a reservation before its payload), and Ray
does not give it. An async actor runs its calls in no guaranteed order, even those of
one caller (docs.ray.io, "Actor Task Execution Order": asynchronous or threaded
actors; a call whose arguments went through the object store waits for them while a
later one runs), and a host awaiting a KV payload lets the peer's next call run. Seen
in a Ray fault storm: the collector got a decode engine's steps 910.. after its steps
up to 1,105 and the run aborted.

How: every call from a host to a peer carries the sender's name, an id of its
incarnation (a restarted actor is a new sender), a sequence number counted per
destination, and a low-water mark: the lowest number among the sender's calls to that
destination not yet answered or failed (`Outgoing`). The receiver (`InOrder`) runs a
sender's calls one at a time in number order, holding a call that arrives early until
its predecessors have run. A predecessor below the low-water mark will never come
(it failed: the receiver had died, and this is its next incarnation), so the receiver
starts, or jumps, there. A failed call with later calls still open is followed by an
empty one (`Outgoing.done` says when), whose mark lets a receiver holding those later
calls go on. A call of a sender that died, held for a predecessor that died with it,
is never handled: a crashed process's last messages are lost, never handled out of
order (its recovery does not depend on them).
"""

from __future__ import annotations

import asyncio


class Outgoing:
    """One sender's numbering of its calls to one destination."""

    __slots__ = ("next", "open")

    def __init__(self) -> None:
        self.next = 0
        # numbers sent and not yet answered or failed -> whether the call carries messages
        self.open: dict[int, bool] = {}

    def stamp(self, empty: bool = False) -> tuple[int, int]:
        """(sequence number, low-water mark) for the next call (now open); `empty`: a
        call without messages (`done`'s follow-up)."""
        seq = self.next
        self.next += 1
        self.open[seq] = not empty
        return seq, min(self.open)

    def done(self, seq: int, failed: bool = False) -> bool:
        """Call `seq` was answered (or `failed`). True when it failed and a later call
        with messages is still open: the receiver may be holding it for this one, so
        the sender should send an empty call, whose low-water mark is past `seq`. (Not
        for later empty calls: with a destination dead for good, each failing follow-up
        would ask for another.)"""
        self.open.pop(seq, None)
        return failed and any(full for s, full in self.open.items() if s > seq)


class _Stream:
    """The calls of one sender incarnation as one receiver sees them."""

    __slots__ = ("next", "held")

    def __init__(self, low: int) -> None:
        self.next = low                  # the number of the call to run next
        self.held: dict[int, asyncio.Future] = {}


class InOrder:
    """The receiver's side: `await turn(...)` before handling a call, `done(...)` after.

    Calls of different senders do not wait for each other. `held` counts the calls that
    arrived early and waited."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str], _Stream] = {}
        self.held = 0

    async def turn(self, sender: str, incarnation: str, seq: int, low: int) -> _Stream:
        """Wait until call `seq` of `sender` (incarnation `incarnation`) may run; returns
        the stream to pass to `done` once the call has been handled."""
        st = self._streams.get((sender, incarnation))
        if st is None:
            st = self._streams[(sender, incarnation)] = _Stream(low)
        if low > st.next:                # its predecessors below `low` failed: none will come
            st.next = low
            self._wake(st)
        if seq > st.next:                # early: held until its predecessors have run
            fut = asyncio.get_running_loop().create_future()
            st.held[seq] = fut
            self.held += 1
            await fut
        return st

    def done(self, st: _Stream, seq: int) -> None:
        """Call `seq` has been handled: the sender's next call may run. (While call k
        runs, `st.next` is k: a jump of the mark cannot pass it, since the sender has
        no answer for it yet, so no other call of the stream runs meanwhile.)"""
        if seq >= st.next:
            st.next = seq + 1
        self._wake(st)

    def _wake(self, st: _Stream) -> None:
        fut = st.held.pop(st.next, None)
        if fut is not None:
            fut.set_result(None)


__all__ = ["InOrder", "Outgoing"]
