"""Virtual-time runtime: every component in one process, on one asyncio loop whose
clock jumps to the next timer instead of waiting for it.

Why our own loop rather than a library such as `looptime`: the emulator needs exact
float deadlines (a timer set for t fires with `loop.time() == t`, bit for bit), a clear
error instead of a silent hang when every component waits on something that can never
happen, and the smallest per-event overhead, since a replay of a one-hour trace runs
~10^5-10^6 events through this loop. The loop is a stock `SelectorEventLoop` whose
`time()` is a counter and whose selector advances that counter to the earliest timer
instead of blocking; everything else (tasks, futures, events) is standard asyncio, so
components run unchanged on the Ray runtime's uvloop.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import selectors
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Every task waits on an event and no timer is pending: the emulation cannot
    progress (for example a request waits for memory that nothing will free)."""


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that never blocks: a wait of `timeout` seconds advances virtual time."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None):  # noqa: D401 - selectors API
        loop = self.loop
        if timeout is None:
            # Nothing ready and no timer: real I/O is never used in a virtual run, so
            # nothing can ever wake the loop again.
            raise VirtualTimeDeadlock(
                "virtual-time deadlock: every task is waiting and no timer is pending"
                + (f" ({loop.deadlock_hint()})" if loop is not None and loop.deadlock_hint else "")
            )
        if timeout > 0 and loop is not None:
            scheduled = loop._scheduled  # the heap of TimerHandles kept by BaseEventLoop
            target = scheduled[0].when() if scheduled else loop._vt + timeout
            if target > loop._vt:
                loop._vt = target
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio event loop with virtual time, starting at 0.0 s.

    `time()` returns virtual seconds; when no callback is ready the loop jumps to the
    earliest timer. Deterministic: the same program gives the same timings bit for bit.
    `deadlock_hint` may be set to a callable returning a description of what is still
    pending, used in the `VirtualTimeDeadlock` message.
    """

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._vt = 0.0
        self.deadlock_hint: Callable[[], str] | None = None

    def time(self) -> float:  # noqa: D401 - asyncio API
        return self._vt

    # BaseEventLoop fires timers with `when < time() + _clock_resolution`; one ulp of
    # the current time makes a timer fire exactly at its time, never earlier.
    @property
    def _clock_resolution(self) -> float:
        return math.ulp(self._vt)

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:
        pass

    def _run_once(self) -> None:
        """One loop iteration, as `BaseEventLoop._run_once` without the I/O poll.

        Same order as the stock loop (drop cancelled timers at the heap's head, jump
        the clock to the earliest timer when nothing is ready, move every timer due at
        `time()` to the ready queue, run the callbacks that were ready at the start),
        minus the selector call and timeout arithmetic: a replay runs this ~10^6 times
        and the stock version spent about half of its time there. `when <= _vt` is the
        stock `when < time() + ulp(time())`.
        """
        if self._debug:  # pragma: no cover - debug mode keeps the stock checks
            return super()._run_once()
        scheduled = self._scheduled
        n = len(scheduled)
        if n > 100 and self._timer_cancelled_count / n > 0.5:
            # many cancelled timers (wait_until deadlines beaten by their event): rebuild
            live = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    live.append(handle)
            heapq.heapify(live)
            self._scheduled = scheduled = live
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        ready = self._ready
        if not ready and not self._stopping:
            if not scheduled:
                self._selector.select(None)   # raises VirtualTimeDeadlock
            when = scheduled[0]._when
            if when > self._vt:
                self._vt = when
        now = self._vt
        while scheduled and scheduled[0]._when <= now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


class LoopClock:
    """A `workloads.clock.Clock` on an asyncio loop.

    Virtual mode (`wall_time=None`): emulated t = loop.time() - origin, timers set
    with `loop.call_at` at exact times (the `VirtualTimeLoop`).
    Wall mode (`wall_time=time.time`, used by the Ray runtime): emulated
    t = (wall_time() - origin) / dilation, read fresh at every call, because uvloop's
    `loop.time()` is cached at the start of each loop iteration and a long iteration
    would make every timer set from it late. A timer that fires early (the loop's
    cached clock lags) is re-armed until the deadline has passed.
    Wake-ups record their lateness (emulated seconds past the deadline) in `lateness`
    when `record_lateness` is set.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: float = 0.0,
                 dilation: float = 1.0, record_lateness: bool = False,
                 wall_time: Callable[[], float] | None = None) -> None:
        if dilation <= 0:
            raise ValueError(f"dilation must be > 0, got {dilation}")
        self._loop = loop
        self._origin = origin
        self._dilation = dilation
        self._wall = wall_time
        self.record_lateness = record_lateness
        self.lateness: list[float] = []

    def now(self) -> float:
        if self._wall is None:
            return (self._loop.time() - self._origin) / self._dilation
        return (self._wall() - self._origin) / self._dilation

    def _arm(self, t: float, fut: asyncio.Future, value: Any) -> asyncio.TimerHandle:
        if self._wall is None:
            return self._loop.call_at(self._origin + t * self._dilation, _resolve, fut, value)
        delay = self._origin + t * self._dilation - self._wall()
        # Long event-loop timers were seen firing ~0.5% of their length late under Ray
        # (97 ms late on a 20 s sleep); arming for 90% and re-arming the rest keeps
        # the final approach short, so the lateness stays at the loop's granularity.
        if delay > 0.005:
            delay *= 0.9
        return self._loop.call_later(max(0.0, delay), _resolve, fut, value)

    def _note(self, t: float) -> None:
        if self.record_lateness:
            self.lateness.append(max(0.0, self.now() - t))

    async def sleep_until(self, t: float) -> None:
        loop = self._loop
        while True:
            fut = loop.create_future()
            handle = self._arm(t, fut, None)
            try:
                await fut
            finally:
                handle.cancel()
            if self._wall is None or self.now() >= t:
                break
        self._note(t)

    async def wait_until(self, event: asyncio.Event, t: float | None) -> bool:
        if event.is_set():
            return True
        if t is None:
            await event.wait()
            return True
        loop = self._loop
        # Event.set() resolves every future in Event._waiters with True; joining that
        # list avoids a Task per wait (the hot path of every engine loop).
        waiters = event._waiters  # type: ignore[attr-defined]
        while True:
            fut = loop.create_future()
            waiters.append(fut)
            handle = self._arm(t, fut, False)
            try:
                fired = await fut
            finally:
                handle.cancel()
                try:
                    waiters.remove(fut)
                except ValueError:
                    pass
            if fired or self._wall is None or self.now() >= t:
                break
        if not fired:
            self._note(t)
        return bool(fired)


def run_virtual(main: Callable[[LoopClock], Awaitable[T]],
                deadlock_hint: Callable[[], str] | None = None) -> T:
    """Run `main(clock)` to completion on a fresh `VirtualTimeLoop` and return its result.

    Tasks still pending when `main` returns (engine loops waiting for work) are
    cancelled. Raises `VirtualTimeDeadlock` if the emulation can no longer progress.
    """
    loop = VirtualTimeLoop()
    loop.deadlock_hint = deadlock_hint
    clock = LoopClock(loop)
    try:
        return loop.run_until_complete(main(clock))
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
