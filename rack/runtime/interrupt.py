"""Stopping a run on SIGINT or SIGTERM and keeping what it measured.

`StopRequest` is what a signal sets and what the drivers poll: the virtual driver
looks at it once per emulated instant (`rack.runtime.virtual_run`), the Ray driver in
its wait loops (`rack.runtime.ray_runtime`). A driver that sees it stops the replay
(the Ray driver halts every actor, the router first, so nothing is admitted any more),
gathers the records of what finished and raises `RunStopped` with them in `partial`;
`rack.run.runner.run_scenario` turns that into results with status "interrupted".

`handle_signals()` installs the handlers for the duration of a command (main thread
only). While a replay is running (`StopRequest.replaying()`), the first signal only
sets the request and the run ends as above; before the replay starts and after it has
ended (starting Ray) there is nothing to keep, and the first signal raises
KeyboardInterrupt at once, as Python's default handler does. While a command writes
its results (`StopRequest.deferred`) a first and a second signal wait for the write to
complete, and the command then ends with the signal's exit code (`replaying(stop)` and
`deferred(stop)` give these contexts for a stop that may be None). Elsewhere a second
signal always raises KeyboardInterrupt at once (the gathering is skipped; the
command's clean-up still shuts Ray down), a third exits the process on the spot
(`exit_now`: the processes it started, e.g. a local Ray's, are killed by PID, then
`os._exit`). Exit codes are 128 + the first signal's number (`exit_code`): 130 for
SIGINT, 143 for SIGTERM.

`ray.init` installs its own SIGTERM handlers in the driver, in Python (`sys.exit`) and
in C (a stack dump, "*** SIGTERM received at time=..."), over whatever was there; the
Ray driver keeps the Python one out while rack's handlers are installed
(`signals_claimed`) and calls `reclaim_signals()` right after it, so rack's handlers
win again (`rack.runtime.ray_runtime.init_ray`).
After a command has finished (`quiet_after_command`, rack's console entry point), a
signal during the interpreter's own clean-up (Ray's atexit shutdown) also exits at once
instead of printing a KeyboardInterrupt traceback from it.

A KeyboardInterrupt raised while Python runs a finaliser (an object's `__del__`, e.g.
a Ray actor handle's) cannot propagate: Python prints it as "Exception ignored" with a
traceback and goes on. While the handlers are installed, such a swallowed interrupt is
caught by `sys.unraisablehook` and raised again in the main thread once the finaliser
has returned (`_thread.interrupt_main`, from a 10 ms timer thread), so a second Ctrl-C
always stops the command.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

#: Exit status of a command stopped by SIGINT (128 + 2, the shell's convention for Ctrl-C).
EXIT_INTERRUPTED = 130
#: Exit status of a command stopped by SIGTERM (128 + 15).
EXIT_TERMINATED = 143


def exit_code(signal_name: str | None) -> int:
    """128 + the number of signal `signal_name` ("SIGINT": 130, "SIGTERM": 143), the
    shell's convention; EXIT_INTERRUPTED for a stop requested in code (None or a name
    that is not a signal's)."""
    try:
        return 128 + int(signal.Signals[signal_name])
    except (KeyError, TypeError):
        return EXIT_INTERRUPTED


def exit_now(code: int) -> None:
    """End this process on the spot with `code`: first SIGKILL, by PID, every process it
    started that is still running (a local Ray's GCS, raylet and workers, which
    `os._exit` alone would leave behind), then `os._exit(code)`. Never returns."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    finally:
        os._exit(code)


#: Handlers installed by the `handle_signals` blocks now open, innermost last.
_ACTIVE: list[dict] = []
#: Their StopRequests, in the same order (`current_stop`).
_STOPS: list["StopRequest"] = []


class StopRequest:
    """Set by a signal (or by code: `request`); drivers poll `requested`.

    `signal_name`: "SIGINT", "SIGTERM" or what `request` was given; `count`: signals
    received so far. Thread-safe to set; reading is a plain attribute read.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.count = 0
        self._replaying = 0
        #: A second signal only counts (no KeyboardInterrupt) while True: for commands
        #: whose first signal already stops at once and only writes what it holds (a
        #: sweep), so the second cannot cut that write short; a third still exits.
        self.absorb_second = False
        self._lock = threading.Lock()
        #: A KeyboardInterrupt of ours was swallowed by a finaliser: raise it again.
        self.redeliver = False

    @property
    def requested(self) -> bool:
        """True once a stop was asked for."""
        return self.signal_name is not None

    def request(self, name: str = "request") -> None:
        """Ask the run to stop (what the first signal does during a replay)."""
        with self._lock:
            self.count += 1
            if self.signal_name is None:
                self.signal_name = name

    @contextlib.contextmanager
    def replaying(self) -> Iterator["StopRequest"]:
        """While inside, a first signal asks for a stop instead of raising."""
        self._replaying += 1
        try:
            yield self
        finally:
            self._replaying -= 1

    @property
    def in_replay(self) -> bool:
        return self._replaying > 0

    @contextlib.contextmanager
    def deferred(self) -> Iterator["StopRequest"]:
        """While inside (a command writing what it measured), a first and a second
        signal only ask for a stop, so the write completes; a third still exits at
        once. The caller checks `requested` afterwards."""
        absorb = self.absorb_second
        self.absorb_second = True
        try:
            with self.replaying():
                yield self
        finally:
            self.absorb_second = absorb


def replaying(stop: StopRequest | None) -> "contextlib.AbstractContextManager":
    """`stop.replaying()` (a first signal asks for a stop instead of raising), or a
    context that does nothing when `stop` is None (a run nobody can stop: no
    `handle_signals` block, e.g. a test or a worker process of a sweep)."""
    return stop.replaying() if stop is not None else contextlib.nullcontext()


def deferred(stop: StopRequest | None) -> "contextlib.AbstractContextManager":
    """`stop.deferred()` (a first and a second signal wait for the write inside), or a
    context that does nothing when `stop` is None (as `replaying`)."""
    return stop.deferred() if stop is not None else contextlib.nullcontext()


class RunStopped(Exception):
    """A replay stopped on request (`StopRequest`).

    `signal_name`: what asked for it; `t_s`: the emulated time the replay reached;
    `partial`: the records gathered then (the dict `run_topology_*` returns), or None
    when nothing could be gathered.
    """

    def __init__(self, signal_name: str | None, t_s: float | None, partial: dict | None = None) -> None:
        super().__init__(f"stopped by {signal_name or 'request'}"
                         + (f" at t={t_s:.6f} s of emulated time" if t_s is not None else ""))
        self.signal_name = signal_name
        self.t_s = t_s
        self.partial = partial

    def details(self) -> dict:
        """results.json's `interrupted` block: {"signal", "t_s"}."""
        return {"signal": self.signal_name, "t_s": self.t_s}


@contextlib.contextmanager
def handle_signals(stop: StopRequest | None = None,
                   signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[StopRequest]:
    """Install SIGINT/SIGTERM handlers (module docstring) for the `with` block and
    restore the previous ones after it. Yields the StopRequest they set. Outside the
    main thread nothing is installed (Python allows handlers only there)."""
    stop = stop or StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):  # noqa: ARG001 - the signal module's signature
        name = signal.Signals(signum).name
        if stop.redeliver:
            stop.redeliver = False
            raise KeyboardInterrupt(stop.signal_name or name)
        stop.request(name)
        if stop.count >= 3:
            # straight to fd 2: the main thread may be inside a write to sys.stderr
            os.write(2, f"interrupted again ({name}): exited at once, no results written\n".encode())
            exit_now(exit_code(stop.signal_name))
        if (stop.count >= 2 and not stop.absorb_second) or not stop.in_replay:
            raise KeyboardInterrupt(name)

    previous_hook = sys.unraisablehook

    def unraisable(info) -> None:
        if info.exc_type is KeyboardInterrupt and stop.requested:
            stop.redeliver = True
            # Later and from another thread: called now, the handler would raise inside
            # this hook (even inside Thread.start's wait); 10 ms lets the finaliser return.
            timer = threading.Timer(0.01, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
            return
        previous_hook(info)

    previous = {s: signal.signal(s, handler) for s in signals}
    sys.unraisablehook = unraisable
    installed = {s: handler for s in signals}
    _ACTIVE.append(installed)
    _STOPS.append(stop)
    try:
        yield stop
    finally:
        _ACTIVE.remove(installed)
        _STOPS.remove(stop)
        sys.unraisablehook = previous_hook
        for s, h in previous.items():
            signal.signal(s, h)


def current_stop() -> StopRequest | None:
    """The StopRequest of the innermost `handle_signals` block open in this process
    (None outside one): what a map of many runs (`rack.runtime.parallel`, `run_pool`)
    polls so that a sweep, a comparison or a study stops on a signal and keeps the runs
    that finished."""
    return _STOPS[-1] if _STOPS else None


def stop_requested() -> bool:
    """True once the `current_stop` was asked for."""
    return bool(_STOPS) and _STOPS[-1].requested


def ignore_sigint() -> None:
    """Initializer of worker processes: a terminal's Ctrl-C reaches the whole process
    group, but a worker's run is the parent's to stop (it terminates the workers and
    keeps what finished), so the worker ignores SIGINT; SIGTERM still ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def signals_claimed() -> bool:
    """True while a `handle_signals` block is open in the main thread (rack's handlers
    are the ones that must run)."""
    return bool(_ACTIVE) and threading.current_thread() is threading.main_thread()


def reclaim_signals() -> None:
    """Install the innermost open `handle_signals` block's handlers again (nothing when
    none is open, or outside the main thread). Called right after `ray.init`, which
    replaces the SIGTERM handler in Python and in C (module docstring):
    `signal.signal` sets the C-level handler again, so rack's is the one that runs."""
    if not signals_claimed():
        return
    for s, h in _ACTIVE[-1].items():
        signal.signal(s, h)


def quiet_after_command(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """From now on, SIGINT or SIGTERM ends the process at once (`exit_now`, code 128 +
    the signal's number) without a traceback: for the end of a command, when only the
    interpreter's clean-up is left (Ray's atexit shutdown sleeps and waits, and a
    KeyboardInterrupt there is printed with its traceback). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in signals:
        signal.signal(s, lambda signum, frame: exit_now(128 + signum))


__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "RunStopped", "StopRequest", "current_stop", "deferred",
           "exit_code", "exit_now", "handle_signals", "ignore_sigint", "quiet_after_command", "reclaim_signals",
           "replaying", "signals_claimed", "stop_requested"]
