"""The core protocol: every component of the emulated rack is a *core*, a synchronous
state machine that never does I/O ("sans-I/O", as the h11 and h2 protocol libraries
are built, and as the Dynamo mocker's engine core is driven by either clock).

A core is handed an event with the current emulated time and changes its state:

- a **message** from a peer: the driver calls the core's handler of that name,
  `core.<method>(now, *args)`; handlers are the core's public methods whose first
  argument is `now` (emulated seconds);
- a **wake-up** it asked for: the driver calls `core.on_wake(now)` once emulated time
  reaches `core.wake_at`.

What the core wants done it leaves in two places, read by the driver after every call:

- `core.outbox`: messages to peers, `(destination name, method, args)`, in the order
  they were sent (`Core.send`). A destination is a core's name; `BROADCAST` sends to
  every other core. Args must be picklable (the Ray driver ships them between
  processes): requests, numbers, numpy arrays, lists, dicts, tuples. A driver may
  make its own message queue every core's outbox (the virtual driver does), so a core
  only appends to it (`send`), or takes back the message it has just sent (`pop()`);
- `core.wake_at`: the earliest emulated time at which it needs `on_wake` (inf: none).
  A core sets it to the minimum over everything it waits for; a driver may wake it
  late (the Ray driver on a loaded host) or early never.

Inboxes (a driver's choice, never a core's): the virtual driver may let every core
hand its messages for some peer straight to that peer's `inbox` (`Core.feed_inbox`)
instead of its outbox, when the peer's handlers for them only book state it reads at
its next call (a collector's records, a router's load reports). The peer takes its
inbox, in the order the messages were sent, before any later call into it
(`take_inbox`), so it sees the same messages in the same order as through the queue;
the driver saves a delivery per message and the peer works through them in a batch.

A core never reads a clock, sleeps, imports asyncio or Ray, or calls a peer. A
request/response exchange is two messages (the request names who to reply to). So the
same cores run on the virtual driver (one process, a heap of wake times, a message
queue; deterministic) and on the Ray driver (one actor per core on a dilated wall
clock); see `rack.runtime`.
"""

from __future__ import annotations

import math
from typing import Any

#: Destination of a message for every core but the sender (e.g. "peer_lost").
BROADCAST = "*"

INF = math.inf


class Core:
    """Base class of every core: a name, an outbox and a wake time (module docstring).

    Subclasses add handlers `def method(self, now, *args)`, override `on_wake`, and
    report `is_idle()` (nothing in progress, nothing queued: the run may end) and
    `waiting_for()` (what it waits on, for a deadlock message).
    """

    #: peers whose messages go straight to their inbox: name -> (that inbox, the methods
    #: that go there or None for all) (module docstring; set per instance by
    #: `feed_inbox`; empty: everything via the outbox)
    _sinks: dict[str, tuple[list, frozenset | None]] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.outbox: list[tuple[str, str, tuple]] = []
        self.wake_at: float = INF
        self.inbox: list[tuple[str, tuple]] = []     # (method, args) sent straight here

    def send(self, dst: str, method: str, *args: Any) -> None:
        """Queue `method(*args)` for core `dst` (after this call returns); `BROADCAST`:
        for every other core (the destination then carries the sender's name, so that a
        driver can leave the sender out). A peer fed by inbox (`feed_inbox`) gets it in
        its inbox at once."""
        sink = self._sinks.get(dst)
        if sink is not None and (sink[1] is None or method in sink[1]):
            sink[0].append((method, args))
            return
        self.outbox.append((BROADCAST + self.name if dst == BROADCAST else dst, method, args))

    def feed_inbox(self, peers: dict[str, tuple[list, frozenset | None]]) -> None:
        """Send messages for the peers named in `peers` (name -> (that peer's `inbox`,
        the methods to send there, None: all)) straight to those inboxes (a driver's
        call: module docstring)."""
        self._sinks = {n: sink for n, sink in peers.items() if n != self.name}

    def take_inbox(self, now: float | None) -> None:
        """Handle the messages in `inbox`, in the order they were sent, at emulated time
        `now` (the instant they were sent in: a driver takes a core's inbox before any
        later call into it and before time moves on), or None when the driver deferred
        them to a later instant (only for handlers that do not read the time)."""
        box = self.inbox
        while box:
            items = box[:]
            box.clear()
            for method, args in items:
                getattr(self, method)(now, *args)

    def on_wake(self, now: float) -> None:
        """Emulated time reached `wake_at` (or later): do what is due."""

    def is_idle(self) -> bool:
        """True when the core holds no work in progress (default: always)."""
        return True

    def waiting_for(self) -> str:
        """What the core waits on, in a few words ("" when idle): deadlock messages."""
        return ""


__all__ = ["BROADCAST", "Core", "INF"]
