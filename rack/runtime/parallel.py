"""Independent runs in parallel: local processes, or Ray tasks over a cluster.

A sweep or a comparison is many virtual-time runs that share nothing: each is a
deterministic function of its inputs, so where it runs does not change its numbers.
`map_virtual_runs` spreads them over this machine's cores (processes) or, given a Ray
address, over every node of a cluster (Ray tasks), and returns the results in the order
of the inputs. This module does not import Ray; the Ray branch lives in
`rack.runtime.ray_runtime.map_ray_tasks`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Callable, Sequence, TypeVar

from .errors import RunFailed
from .interrupt import current_stop, ignore_sigint, stop_requested

T = TypeVar("T")
R = TypeVar("R")


class MapTimeout(RuntimeError):
    """The runs did not all finish within the map's `timeout_s`."""


class RunsStopped(KeyboardInterrupt):
    """A signal stopped a map of runs (`rack.runtime.interrupt.current_stop`): the runs
    in flight were terminated, none more was started. `results`: the list in input
    order, None where a run did not finish; `done`: which finished. A KeyboardInterrupt,
    so a caller that does not keep partial results stops as on Ctrl-C (and no `except
    Exception` takes it for a failed run)."""

    def __init__(self, results: list, done: list[bool]) -> None:
        super().__init__(f"stopped after {sum(done)} of {len(done)} run(s)")
        self.results, self.done = results, done


#: Seconds between two looks at the stop request while runs are in flight.
STOP_POLL_S = 0.2


def _progress_callback(progress: bool | Callable[[int, int], None], total: int):
    """(on_done, close) for `progress`: a rich bar on stderr when True."""
    if callable(progress):
        return progress, (lambda: None)
    if not progress:
        return None, (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task("runs", total=total)
    return (lambda done, n: bar.update(task, completed=done)), bar.stop


def map_virtual_runs(fn: Callable[[T], R], items: Sequence[T], *, address: str | None = None,
                     max_workers: int | None = None,
                     progress: bool | Callable[[int, int], None] = False,
                     timeout_s: float | None = None, num_cpus: float = 1.0,
                     return_exceptions: bool = False) -> list[R]:
    """`[fn(item) for item in items]`, the calls run in parallel; results in input order.

    fn: a module-level function (it is pickled by reference: the module must be
        importable where it runs) taking one item, typically a (scenario, requests,
        label) tuple, and returning a picklable result (e.g. `RunOutput.results`).
    address: None: local processes (`max_workers` of them, default one per core,
        `spawn` start method; one item or `max_workers=1`: in this process). Given
        ("auto", "HOST:PORT", or "local" for a fresh local Ray): one Ray task per item
        with `num_cpus` CPUs each, spread over the cluster's nodes; every node needs the
        project installed. A Ray session opened here is closed before returning.
    progress: True for a progress bar on stderr, or a callable(done, total).
    timeout_s: wall-clock limit for the whole map (None: none).
    return_exceptions: put a failed run's exception in its place instead of raising.
    Raises RunFailed(index, cause) for the first run that fails (the others are
    cancelled), MapTimeout on the timeout, RayRunError when the cluster cannot run a
    task (no node with `num_cpus` CPUs).
    """
    items = list(items)
    on_done, close = _progress_callback(progress, len(items))
    try:
        if address is not None:
            from .errors import RayRunError
            from .ray_runtime import map_ray_tasks

            try:
                return map_ray_tasks(fn, items, address=address, num_cpus=num_cpus, on_done=on_done,
                                     timeout_s=timeout_s, return_exceptions=return_exceptions)
            except RayRunError as exc:
                if "not finished within" in str(exc):
                    raise MapTimeout(str(exc)) from None
                raise
        workers = max_workers or min(len(items), os.cpu_count() or 1)
        if workers <= 1 or len(items) <= 1:
            return _map_serial(fn, items, on_done, timeout_s, return_exceptions)
        return _map_processes(fn, items, workers, on_done, timeout_s, return_exceptions)
    finally:
        close()


def _map_serial(fn, items, on_done, timeout_s, return_exceptions) -> list:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    out = []
    for i, item in enumerate(items):
        if stop_requested():
            raise RunsStopped(out + [None] * (len(items) - i), [True] * i + [False] * (len(items) - i))
        if deadline is not None and time.monotonic() > deadline:
            raise MapTimeout(f"{len(items) - i} of {len(items)} run(s) not finished within {timeout_s:.0f} s")
        try:
            out.append(fn(item))
        except Exception as exc:
            if not return_exceptions:
                raise RunFailed(i, exc) from exc
            out.append(exc)
        if on_done is not None:
            on_done(i + 1, len(items))
    return out


def _map_processes(fn, items, workers, on_done, timeout_s, return_exceptions) -> list:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    results: list = [None] * len(items)
    # spawn: a forked child would inherit this process's threads (Ray's, rich's) mid-state.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=ignore_sigint)
    finished = False
    got = [False] * len(items)
    try:
        futures: dict[Future, int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        pending = set(futures)
        done_n = 0
        while pending:
            if stop_requested():
                raise RunsStopped(results, got)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise MapTimeout(f"{len(pending)} of {len(items)} run(s) not finished within {timeout_s:.0f} s")
            try:
                done, pending = wait(pending, timeout=STOP_POLL_S if left is None else min(left, STOP_POLL_S),
                                     return_when=FIRST_COMPLETED)
            except KeyboardInterrupt:       # a second signal: stop at once, keep what finished
                if current_stop() is None:  # no command's handlers: Python's own Ctrl-C
                    raise
                raise RunsStopped(results, got) from None
            for fut in done:
                i = futures[fut]
                exc = fut.exception()
                if exc is not None:
                    if not return_exceptions:
                        raise RunFailed(i, exc) from exc
                    results[i] = exc
                else:
                    results[i] = fut.result()
                got[i] = True
                done_n += 1
            if done and on_done is not None:
                on_done(done_n, len(items))
        finished = True
        return results
    finally:
        if not finished:
            # A failure or a timeout: stop the runs still going instead of waiting for them.
            for proc in list((pool._processes or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
