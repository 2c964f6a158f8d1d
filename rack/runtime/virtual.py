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
import contextvars
import heapq
import math
import selectors
from asyncio import format_helpers
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from .errors import ComponentError, locate

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Every task waits on an event and no timer is pending: the emulation cannot
    progress (for example a request waits for memory that nothing will free).
    `partial`: the records gathered when it stopped (see `run_virtual`), or None."""

    partial: dict | None = None


class _TaskFailed(Exception):
    """Internal: a watched task ended with an exception (its `__cause__`)."""


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
        self.task_error: BaseException | None = None   # first failure of a watched task
        # work done, for `rack bench` (events per request): loop iterations, callbacks
        # run (each a component wake-up: a task step or a timer firing), timers fired
        self.iterations = 0
        self.callbacks = 0
        self.timers = 0

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

    def call_soon(self, callback, *args, context=None):  # noqa: D401 - asyncio API
        """`BaseEventLoop.call_soon` minus the debug-mode checks (every future that
        completes and every task step comes through here)."""
        if self._debug:  # pragma: no cover
            return super().call_soon(callback, *args, context=context)
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_at(self, when, callback, *args, context=None):  # noqa: D401 - asyncio API
        """`BaseEventLoop.call_at` minus the debug-mode checks (every timer)."""
        if self._debug:  # pragma: no cover
            return super().call_at(when, callback, *args, context=context)
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """Loop iterations, each as `BaseEventLoop._run_once` without the I/O poll,
        until the loop is stopping (`run_forever` checks that after each call).

        Same order as the stock loop (drop cancelled timers at the heap's head, jump
        the clock to the earliest timer when nothing is ready, move every timer due at
        `time()` to the ready queue, run the callbacks that were ready at the start of
        the iteration), minus the selector call, the timeout arithmetic and a Python
        frame per callback: a replay runs ~10^6 iterations and the stock version spent
        about half of its time outside the callbacks. `when <= _vt` is the stock
        `when < time() + ulp(time())`.
        """
        if self._debug:  # pragma: no cover - debug mode keeps the stock checks
            return super()._run_once()
        ready = self._ready
        popleft = ready.popleft
        heappop = heapq.heappop
        while True:
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
                    heappop(scheduled)._scheduled = False
            if not ready and not self._stopping:
                if not scheduled:
                    self._selector.select(None)   # raises VirtualTimeDeadlock
                when = scheduled[0]._when
                if when > self._vt:
                    self._vt = when
            now = self._vt
            before = len(ready)
            while scheduled and scheduled[0]._when <= now:
                handle = heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)
            todo = len(ready)
            self.timers += todo - before
            self.callbacks += todo
            self.iterations += 1
            for _ in range(todo):
                handle = popleft()
                if handle._cancelled:
                    continue
                try:   # Handle._run, inlined
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    cb = format_helpers._format_callback_source(handle._callback, handle._args)
                    self.call_exception_handler({"message": f"Exception in callback {cb}",
                                                 "exception": exc, "handle": handle})
            handle = None  # break cycles when an exception occurs, as the stock loop
            if self.task_error is not None:
                exc, self.task_error = self.task_error, None
                raise _TaskFailed() from exc
            if self._stopping:
                return

    def watch_tasks(self) -> None:
        """From now on, a task that ends with an exception (not a cancellation) stops
        the loop: `run_until_complete` raises `_TaskFailed` from it at the end of the
        loop iteration in which the task ended, at that virtual time. Without this, a
        component's background task that fails leaves its requests waiting forever and
        the run ends as a deadlock that hides the cause."""
        def factory(loop, coro, **kwargs):
            task = asyncio.Task(coro, loop=loop, **kwargs)
            task.add_done_callback(loop._task_ended)
            return task
        self.set_task_factory(factory)

    def _task_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and self.task_error is None:
            self.task_error = task.exception()


class _Handle(asyncio.Handle):
    """asyncio.Handle built without the per-handle debug-mode query (the virtual loop
    falls back to the stock classes in debug mode)."""

    __slots__ = ()

    def __init__(self, callback, args, loop, context=None) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _TimerHandle(asyncio.TimerHandle):
    """asyncio.TimerHandle built as `_Handle` is."""

    __slots__ = ()

    def __init__(self, when, callback, args, loop, context=None) -> None:
        _Handle.__init__(self, callback, args, loop, context)
        self._when = when
        self._scheduled = False


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


SPIN_S = 0.001
"""Wall seconds before a wall-mode deadline from which `LoopClock` stops using loop
timers and yields to the loop until the deadline (see `LoopClock._arm`)."""


class LoopClock:
    """A `workloads.clock.Clock` on an asyncio loop.

    Virtual mode (`wall_time=None`): emulated t = loop.time() - origin, timers set
    with `loop.call_at` at exact times (the `VirtualTimeLoop`).
    Wall mode (`wall_time=time.time`, used by the Ray runtime): emulated
    t = (wall_time() - origin) / dilation, read fresh at every call, because uvloop's
    `loop.time()` is cached at the start of each loop iteration and a long iteration
    would make every timer set from it late. A timer that fires early (the loop's
    cached clock lags) is re-armed until the deadline has passed; the last `SPIN_S` of
    wall time before a deadline are waited by yielding to the loop, not with a timer
    (uvloop's timers have millisecond granularity).
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
        if delay <= SPIN_S:
            # The final approach: uvloop keeps time in whole milliseconds, so a timer
            # wakes up to ~1 ms of wall time late (p99 ~0.7 ms measured on an idle
            # project machine); the last SPIN_S are waited by yielding to the loop
            # (other callbacks and I/O still run) and re-checking the clock, which
            # wakes within ~20 us (p99) at the price of that much CPU per timer.
            return self._loop.call_soon(_resolve, fut, value)
        # Long event-loop timers were seen firing ~0.5% of their length late under Ray
        # (97 ms late on a 20 s sleep); arming for 90% and re-arming the rest keeps
        # the final approach short.
        delay -= SPIN_S
        if delay > 0.005:
            delay *= 0.9
        return self._loop.call_later(delay, _resolve, fut, value)

    def _note(self, t: float) -> None:
        if self.record_lateness:
            self.lateness.append(max(0.0, self.now() - t))

    async def sleep_until(self, t: float) -> None:
        loop = self._loop
        if self._wall is None:
            # Virtual time: one exact timer, never early. A handle that fired needs no
            # cancel (this is the hot path of every component), only an abandoned one.
            fut = loop.create_future()
            handle = loop.call_at(self._origin + t * self._dilation, _resolve, fut, None)
            try:
                await fut
            except BaseException:
                handle.cancel()
                raise
            if self.record_lateness:
                self.lateness.append(max(0.0, self.now() - t))
            return
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
                deadlock_hint: Callable[[], str] | None = None, *,
                components: Callable[[], Mapping[str, Any]] | None = None,
                salvage: Callable[[], Awaitable[dict]] | None = None) -> T:
    """Run `main(clock)` to completion on a fresh `VirtualTimeLoop` and return its result.

    Tasks still pending when `main` returns (engine loops waiting for work) are
    cancelled. Raises `VirtualTimeDeadlock` if the emulation can no longer progress.

    components: a callable returning {name: component object} (the run's components,
    built inside `main`). When given, an exception that ends any task started after
    `main`'s, or `main` itself, ends the run at once with `ComponentError` naming the
    component and request it came from (`rack.runtime.errors.locate`), the virtual
    time and the cause. salvage: a coroutine function reading the records gathered
    until then (it must not suspend: it runs outside the loop, with nothing else
    moving); its result becomes the error's `partial` (also a deadlock's), None if it
    fails.
    """
    loop = VirtualTimeLoop()
    loop.deadlock_hint = deadlock_hint
    clock = LoopClock(loop)
    task = loop.create_task(main(clock))
    if components is not None:
        loop.watch_tasks()
    try:
        return loop.run_until_complete(task)
    except VirtualTimeDeadlock as exc:
        exc.partial = _salvage(salvage)
        raise
    except Exception as exc:
        if components is None:
            raise
        cause = exc.__cause__ if isinstance(exc, _TaskFailed) else exc
        name, request_id = locate(cause, components())
        raise ComponentError(name or "runtime", loop.time(), request_id, cause,
                             partial=_salvage(salvage)) from cause
    finally:
        _LAST_COUNTERS.clear()
        _LAST_COUNTERS.update(iterations=loop.iterations, callbacks=loop.callbacks,
                              timers=loop.timers, virtual_s=loop.time())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


def _salvage(salvage: Callable[[], Awaitable[dict]] | None) -> dict | None:
    """Run `salvage()` to its end outside the loop (nothing else runs meanwhile);
    None if there is none, if it fails, or if it would have to wait."""
    if salvage is None:
        return None
    coro = salvage()
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    except Exception:
        return None
    coro.close()          # it suspended: the records cannot be read without running on
    return None


_LAST_COUNTERS: dict = {}


def last_loop_counters() -> dict:
    """Work done by the last `run_virtual` of this process (until its main returned):
    {"iterations", "callbacks" (component wake-ups: task steps and timer firings),
    "timers" (timers that fired), "virtual_s" (the loop's clock at the end)}; empty
    before the first run. For `rack bench`'s events per request."""
    return dict(_LAST_COUNTERS)
