"""A pool of independent virtual runs that stays open across many maps, and hands
results back as each run finishes.

`rack.runtime.parallel.map_virtual_runs` runs one list of runs and closes its workers;
a capacity search (`rack.experiments.capacity`) decides its next run from the last one's
verdict, and a study makes hundreds of such decisions: starting two spawned processes
(or a Ray session) for every round would cost more than many of the runs. A `RunPool`
keeps its workers for as long as it is open:

    with RunPool(workers=2) as pool:           # or RunPool(address="auto"): Ray tasks
        t = pool.submit(run_task, task)
        ticket, result = pool.next_done()

`shared(...)` makes a pool the one every sweep of this process uses while it is open
(`current()`), so `rack study` opens one pool (local or on a Ray cluster) for all its
experiments. Results are the same wherever a run executes: each is a deterministic
function of its item.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Optional, Sequence
from .interrupt import current_stop, ignore_sigint, stop_requested
from .parallel import RunsStopped

#: Longest a single wait for a finished run may block before it is retried (s); a Ray
#: wait is bounded by it, so a stalled cluster never hangs the caller silently.
WAIT_SLICE_S = 0.5
#: Longest one Ray result may take to be fetched once the task has finished (s).
RAY_GET_TIMEOUT_S = 60.0


class RunPool:
    """Independent calls `fn(item)` run in parallel, results collected as they finish.

    workers: local processes (spawned on the first submit; 1: each call runs in this
        process when its result is asked for). address: a Ray cluster ("auto",
        "HOST:PORT" or "local"): each call is a Ray task of one CPU, spread over the
        nodes (the project installed on each); a session this pool opens is closed
        with it.
    `submit` returns a ticket (int); `next_done(timeout_s)` blocks until a submitted
    call finishes and returns (ticket, result), where a call that raised gives its
    exception as the result; `map` runs a list and returns the results in order.
    Raises TimeoutError from `next_done` on its timeout, LookupError when nothing is
    pending.
    """

    def __init__(self, workers: int = 2, address: Optional[str] = None) -> None:
        self.workers = max(1, int(workers))
        self.address = address
        self._next = 0
        self._serial: deque = deque()
        self._futures: dict[Future, int] = {}
        self._refs: dict[Any, int] = {}
        self._executor: Optional[ProcessPoolExecutor] = None
        self._ray = None
        self._remote = None
        self._opened_ray = False
        if address is not None:
            from .ray_runtime import _apply, ray_api, ensure_ray

            self._ray = ray_api()
            self._opened_ray = ensure_ray(None if address == "local" else address)
            self._remote = self._ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_apply)

    # ------------------------------------------------------------------ use
    def submit(self, fn: Callable[[Any], Any], item: Any) -> int:
        """Start `fn(item)` (fn: a module-level function, pickled by reference)."""
        ticket = self._next
        self._next += 1
        if self._remote is not None:
            self._refs[self._remote.remote(fn, item)] = ticket
        elif self.workers == 1:
            self._serial.append((ticket, fn, item))
        else:
            if self._executor is None:
                # spawn: a forked child would inherit this process's threads (Ray's, rich's)
                self._executor = ProcessPoolExecutor(max_workers=self.workers,
                                                     mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=ignore_sigint)
            self._futures[self._executor.submit(fn, item)] = ticket
        return ticket

    @property
    def pending(self) -> int:
        """Calls submitted whose result has not been handed back yet."""
        return len(self._serial) + len(self._futures) + len(self._refs)

    def next_done(self, timeout_s: Optional[float] = None) -> tuple[int, Any]:
        """(ticket, result or exception) of the next call to finish."""
        if not self.pending:
            raise LookupError("RunPool.next_done: nothing is pending")
        if self._serial:
            ticket, fn, item = self._serial.popleft()
            try:
                return ticket, fn(item)
            except Exception as exc:  # noqa: BLE001 - handed back as the call's result
                return ticket, exc
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if stop_requested():
                raise RunsStopped([], [])       # the caller knows what it had (`map`)
            left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"RunPool: no run finished within {timeout_s:g} s ({self.pending} pending)")
            if self._futures:
                done, _ = wait(list(self._futures), timeout=left, return_when=FIRST_COMPLETED)
                if done:
                    fut = next(iter(done))
                    ticket = self._futures.pop(fut)
                    exc = fut.exception()
                    return ticket, exc if exc is not None else fut.result()
            else:
                ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=left)
                if ready:
                    ref = ready[0]
                    ticket = self._refs.pop(ref)
                    try:
                        return ticket, self._ray.get(ref, timeout=RAY_GET_TIMEOUT_S)
                    except self._ray.exceptions.RayTaskError as exc:
                        return ticket, exc.as_instanceof_cause()

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any],
            on_done: Optional[Callable[[int, int], None]] = None) -> list:
        """[fn(item) for item in items] in parallel, in order (a call that raised gives
        its exception in its place)."""
        tickets = {self.submit(fn, item): i for i, item in enumerate(items)}
        out: list = [None] * len(tickets)
        got = [False] * len(tickets)
        for done in range(1, len(tickets) + 1):
            try:
                ticket, res = self.next_done()
            except (RunsStopped, KeyboardInterrupt) as exc:
                self.cancel()
                if isinstance(exc, KeyboardInterrupt) and current_stop() is None:
                    raise                   # no command's handlers: Python's own Ctrl-C
                raise RunsStopped(out, got) from None
            out[tickets[ticket]] = res
            got[tickets[ticket]] = True
            if on_done is not None:
                on_done(done, len(tickets))
        return out

    def cancel(self) -> None:
        """Stop the calls in flight (a signal: `rack.runtime.interrupt`): local workers
        are terminated (the pool starts new ones on the next submit), Ray tasks
        cancelled; calls not started are dropped."""
        self._serial.clear()
        if self._executor is not None and self._futures:
            for proc in list((self._executor._processes or {}).values()):
                proc.terminate()
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._futures.clear()
        if self._ray is not None:
            for ref in self._refs:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
            self._refs.clear()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop the workers (runs still going are cancelled) and a Ray session this pool opened."""
        self.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self._ray is not None:
            if self._opened_ray:
                self._ray.shutdown()
                self._opened_ray = False

    def __enter__(self) -> "RunPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_SHARED: list[RunPool] = []


@contextlib.contextmanager
def shared(workers: int = 2, address: Optional[str] = None) -> Iterator[RunPool]:
    """A `RunPool` every sweep of this process uses while the block is open (`current`)."""
    pool = RunPool(workers, address)
    _SHARED.append(pool)
    try:
        yield pool
    finally:
        _SHARED.remove(pool)
        pool.close()


def current() -> Optional[RunPool]:
    """The innermost `shared` pool open, or None."""
    return _SHARED[-1] if _SHARED else None


__all__ = ["RunPool", "current", "shared"]
