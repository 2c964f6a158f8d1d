"""The virtual driver: every core in this process, on emulated time that jumps from
event to event. No asyncio, no threads: one message queue and one heap of wake times.

Order (deterministic, documented so runs repeat bit for bit):

1. every message queued at the current time is delivered, first in, first out; a
   core's messages enter the queue in the order it sent them (the queue is every
   core's `outbox`: a message joins it as it is sent, with no copy after each call;
   only the core called runs until it returns, so its messages come after everything
   queued before the call and before anything queued after it, as if taken from its
   own outbox once the call returned); a message to `workloads.core.BROADCAST` goes
   to every other core that handles it, in topology order;
2. when the queue is empty, the earliest wake-up is taken from the heap (ties: the
   one requested first; a core that changes its wake time asks anew and loses its
   place) and time jumps to it; the core's `on_wake(now)` runs, and its
   messages are delivered (step 1) before the next wake-up.

Inboxes (`feed_inboxes`, `workloads.core`): messages for a core fed by inbox skip the
queue; the core takes its inbox before any call into it, and whenever the queue runs
empty (before the done check and before time moves on), so it handles them in the
order they were sent and at the instant they were sent in. A core whose inbox is
*deferred* (records whose handling does not depend on when it happens, e.g. a
collector's lifecycle events with their own times) takes it only before a call into
it, when `take_inboxes` is called, or once it holds `DEFER_ITEMS` messages: still in
the order sent, in batches instead of once per instant, and with `now` None (its
handlers must not read the time: `Core.take_inbox`).

A core asks for a wake-up by setting `wake_at`; the driver reads it after every call
into the core (a later value replaces the earlier request). A handler that must see
every message of the current instant before acting (an engine forming its next batch)
sets `wake_at = now`: messages come before wake-ups.

Two messages are the driver's own, about the process rather than a core's state:
`crash(at_s)` replaces the core with a fresh one built from its component spec (a
restart: empty, reloading its weights until at_s + weight_load_s); `ping(reply_to,
tag)` replies `pong(tag, {"incarnation": n, "work": its work counters})`.

A core that raises ends the run with `ComponentError` (component, emulated time,
request, cause) carrying the records gathered so far. If the queue and the heap are
empty while requests are still open, the run raises `VirtualTimeDeadlock` naming the
open requests and what each core waits for.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Callable, Mapping, Sequence

from workloads.core import BROADCAST, Core

from .errors import ComponentError, locate

#: Messages the driver handles itself (not a core's handlers).
DRIVER_METHODS = ("crash", "ping")

#: A deferred inbox (module docstring) is taken once it holds this many messages, so
#: that it stays small; large enough that its fixed cost per take is spread thin.
DEFER_ITEMS = 4096


class VirtualTimeDeadlock(RuntimeError):
    """The queue and the heap are empty but requests are still open: nothing can ever
    happen again (e.g. a request waits for memory that nothing will free).
    `partial`: the records gathered when it stopped, or None."""

    partial: dict | None = None


class VirtualDriver:
    """Runs `cores` (name -> Core, in topology order) on virtual time.

    rebuild(name, loading_until_s) -> Core: a fresh core for a crashed one (None: no
    crash can be handled). `done()` -> bool: the run may stop (e.g. every request
    ended); checked once the work of the current instant is done.

    Counters for `rack bench`: `messages` (handler calls), `wakeups` (on_wake calls).
    """

    def __init__(self, cores: Mapping[str, Core],
                 rebuild: Callable[[str, float | None], Core] | None = None,
                 weight_load_s: Mapping[str, float] | None = None) -> None:
        self.cores: dict[str, Core] = dict(cores)
        self.order = {n: i for i, n in enumerate(self.cores)}
        self.now = 0.0
        self._queue: deque = deque()          # (dst, method, args)
        self._heap: list = []                 # (t, seq, name)
        # the wake time each core asked for and the order of that request: a heap entry
        # counts only if it is that very request (a core that asks again loses its place)
        self._asked: dict[str, tuple[float, int]] = {n: (math.inf, -1) for n in self.cores}
        self._seq = 0
        self._rebuild = rebuild
        self._load_s = dict(weight_load_s or {})
        self.incarnation = {n: 0 for n in self.cores}
        self._handlers: dict[tuple[str, str], Callable] = {}   # bound handlers by (core, method)
        self._feeds: dict[str, Sequence[str] | None] = {}   # `feed_inboxes`' argument
        self._fed: list[str] = []             # cores fed by inbox
        self._deferred: tuple[str, ...] = ()  # those whose inbox is deferred (`feed_inboxes`)
        self._boxes: list[list] = []          # the inboxes of the others
        self._late: list[list] = []           # the deferred inboxes
        self.messages = 0
        self.wakeups = 0
        for name, core in self.cores.items():
            self._adopt(core)
            self._after(name, core)

    # ------------------------------------------------------------------ loop
    def feed_inboxes(self, feeds: Mapping[str, Sequence[str] | None], deferred: Sequence[str] = ()) -> None:
        """Every core sends its messages for the cores named in `feeds` (name -> the
        methods that go by inbox, None: all) straight to their inboxes
        (`workloads.core.Core.feed_inbox`; module docstring). The caller vouches that
        those handlers only book state the core reads at its next call (e.g. a
        collector's records in an open-loop replay: nothing reads them before the run
        ends or the done check).

        deferred: those of `feeds` whose inbox waits until something reads the core
        (module docstring); the caller vouches too that their inbox's handlers give the
        same state whenever they run (e.g. every record carries its own time) and that
        the done check takes the inbox when it could change the answer
        (`rack.serving.collector.Collector.all_ended`)."""
        self._feeds = {n: m for n, m in feeds.items() if n in self.cores}
        self._fed = list(self._feeds)
        self._deferred = tuple(n for n in deferred if n in self._feeds)
        sinks = {n: (self.cores[n].inbox, None if m is None else frozenset(m)) for n, m in self._feeds.items()}
        # the loop's lists of them (kept in place: `run` holds them)
        self._boxes[:] = [box for n, (box, _) in sinks.items() if n not in self._deferred]
        self._late[:] = [sinks[n][0] for n in self._deferred]
        for core in self.cores.values():
            core.feed_inbox(sinks)

    def take_inboxes(self, deferred: bool = True) -> None:
        """Let the cores fed by inbox handle what is in it (at the current time);
        deferred=False: leave the deferred inboxes (module docstring) waiting."""
        for name in self._fed:
            late = name in self._deferred
            if late and not deferred:
                continue
            core = self.cores[name]
            if core.inbox:
                try:
                    core.take_inbox(None if late else self.now)
                except Exception as exc:
                    raise self._error(name, exc) from exc
                self._after(name, core)

    def post(self, dst: str, method: str, *args: Any) -> None:
        """Queue a message from outside (the runner starts the router this way)."""
        self._queue.append((dst, method, args))

    def run(self, done: Callable[[], bool]) -> float:
        """Deliver messages and wake-ups until `done()` holds once nothing more is due at
        the current instant, or nothing is left; returns the emulated time reached.
        Raises ComponentError when a core raises."""
        # The loop runs once per message and per wake-up (~13 per request): what
        # `_after` does is inlined, handlers are looked up once per (core, method), and
        # the time is a local (`self.now` follows it: read by `take_inboxes` and errors).
        queue, heap, cores, asked = self._queue, self._heap, self.cores, self._asked
        popleft, push, pop = queue.popleft, heapq.heappush, heapq.heappop
        handlers = self._handlers
        inf = math.inf
        boxes, late = self._boxes, self._late
        deferred = self._deferred
        now = self.now
        messages = wakeups = 0
        try:
            while True:
                while queue:
                    dst, method, args = popleft()
                    fn = handlers.get((dst, method))
                    if fn is None:
                        if dst[0] == BROADCAST:         # to every core but the sender
                            for name in cores:
                                if name != dst[1:] and hasattr(cores[name], method):
                                    queue.append((name, method, args))
                            continue
                        if method in DRIVER_METHODS:
                            self._driver_message(dst, method, args)
                            continue
                        fn = handlers[(dst, method)] = getattr(cores[dst], method)
                    messages += 1
                    core = cores[dst]
                    try:
                        if core.inbox:          # what was sent to it before this message
                            core.take_inbox(None if dst in deferred else now)
                        fn(now, *args)
                    except Exception as exc:
                        raise self._error(dst, exc) from exc
                    t = core.wake_at
                    if t != asked[dst][0]:
                        asked[dst] = (t, self._seq)
                        if t < inf:
                            push(heap, (t, self._seq, dst))
                        self._seq += 1
                if boxes and any(boxes):        # (a list of lists: no generator per instant; an
                                                # open-loop replay defers every inbox: none here)
                    self.take_inboxes(deferred=False)
                    continue                    # what they sent is due now
                if late and max(map(len, late)) >= DEFER_ITEMS:
                    self.take_inboxes()
                    continue
                if done():
                    return self.now
                while heap:
                    t, seq, name = pop(heap)
                    if asked[name][1] == seq:
                        break                   # (else superseded by a later request of the core)
                else:
                    return self.now
                if t > now:
                    self.now = now = t
                core = cores[name]
                wakeups += 1
                try:
                    if core.inbox:              # a deferred inbox (module docstring)
                        core.take_inbox(None)
                    core.on_wake(now)
                except Exception as exc:
                    raise self._error(name, exc) from exc
                t = core.wake_at
                if t < inf:                     # (its request was taken: any value is new)
                    asked[name] = (t, self._seq)
                    push(heap, (t, self._seq, name))
                    self._seq += 1
                else:
                    asked[name] = (inf, -1)
        finally:
            self.messages += messages
            self.wakeups += wakeups

    def _adopt(self, core: Core) -> None:
        """Make the queue `core`'s outbox (module docstring), after what it holds."""
        if core.outbox is not self._queue:
            self._queue.extend(core.outbox)
            core.outbox = self._queue

    def _after(self, name: str, core: Core) -> None:
        """Take `core`'s wake request after a call into it."""
        t = core.wake_at
        if t != self._asked[name][0]:
            self._asked[name] = (t, self._seq)
            if t < math.inf:
                heapq.heappush(self._heap, (t, self._seq, name))
            self._seq += 1

    def _error(self, name: str, exc: Exception) -> ComponentError:
        _, rid = locate(exc, {name: self.cores[name]})
        return ComponentError(name, self.now, rid, exc)

    # ------------------------------------------------------------------ process-level messages
    def _driver_message(self, dst: str, method: str, args: tuple) -> None:
        if method == "ping":
            reply_to, tag = args
            self._queue.append((reply_to, "pong", (tag, {"incarnation": self.incarnation[dst],
                                                         "work": work_of(self.cores[dst], self.now)})))
            return
        (at_s,) = args
        if self._rebuild is None:
            raise ComponentError(dst, self.now, None, RuntimeError("crash: this run cannot restart components"))
        at = self.now if at_s is None else float(at_s)
        new = self._rebuild(dst, at + self._load_s.get(dst, 0.0))
        self._adopt(new)
        self.cores[dst] = new
        for key in [k for k in self._handlers if k[0] == dst]:
            del self._handlers[key]             # bound to the dead core (the loop holds this dict)
        self.incarnation[dst] += 1
        self._asked[dst] = (math.inf, -1)     # the old core's wake-up is void
        if self._fed:                         # the new core sends (and, if fed, receives) by inbox too
            self.feed_inboxes(self._feeds, self._deferred)
        self._after(dst, new)

    # ------------------------------------------------------------------ reading
    def waiting(self) -> str:
        """What each busy core waits for (deadlock messages)."""
        parts = [f"{n}: {c.waiting_for()}" for n, c in self.cores.items() if c.waiting_for()]
        return "; ".join(parts)


def work_of(core: Core, now: float) -> dict | None:
    """The work counters of `core` at `now` (its `stats(now)` subset), or None."""
    stats = getattr(core, "stats", None)
    if stats is None:
        return None
    from rack.measure.faults import WORK_KEYS

    st = stats(now)
    return {k: float(st.get(k, 0.0)) for k in WORK_KEYS}


__all__ = ["DEFER_ITEMS", "DRIVER_METHODS", "VirtualDriver", "VirtualTimeDeadlock", "work_of"]
