"""Place a topology on the virtual driver and replay requests through it."""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Sequence

import numpy as np

from rack.serving.collector import DEFERRABLE
from rack.wiring.topology import ComponentSpec

from .errors import ComponentError
from .interrupt import RunStopped, StopRequest, deferred, replaying
from .placement import construct
from .quiescence import ended_holds
from .virtual import VirtualDriver, VirtualTimeDeadlock

#: The router's handlers that only book what its next placement reads (an instance's
#: outstanding prompt tokens, its prefix-cache changes), whenever they run: fed by a
#: deferred inbox in open-loop replays (taken before the router's next call).
INBOX_ROUTER = ("load", "kv_events")

#: Components whose stats a run reports.
STATS_KINDS = ("prefill", "decode", "both", "interconnect")

_LAST_COUNTERS: dict = {}


def run_topology_virtual(specs: Sequence[ComponentSpec], requests: Sequence[Any],
                         max_concurrency: int | None = None, think_time_s: float = 0.0,
                         stop: StopRequest | None = None) -> dict:
    """Run every core in this process on virtual time until each request ended and
    every core is idle.

    max_concurrency, think_time_s: closed-loop replay (`rack.serving.router.Router.start`).
    stop: looked at once per emulated instant; once requested, the replay ends there
        and `RunStopped` (rack.runtime.interrupt) is raised with the records so far.
        A stop with an `attach(collector)` method (`rack.experiments.slo_watch.SloWatch`)
        is attached to the collector first, which then tells it of every first token
        and end (the run stops once its SLO verdict is decided).

    Returns {"snapshot": collector records, "stats": {component: stats dict},
    "router": router counts, "lateness": {} (virtual time is never late), "now":
    emulated s at the end, "loop_type": the driver's class (results' provenance)}.
    Raises `ComponentError` (rack.runtime.errors) when a core raises, and
    `VirtualTimeDeadlock` naming the requests still open and what each core waits for
    if the rack stalls; both carry `partial`, the same dict with the records up to that
    moment (as `RunStopped` does).
    """
    by_name = {s.name: s for s in specs}
    driver = VirtualDriver({s.name: construct(s) for s in specs},
                           rebuild=lambda name, until: construct(by_name[name], until),
                           weight_load_s={s.name: s.weight_load_s for s in specs
                                          if s.weight_load_s is not None})
    cores = driver.cores
    if stop is not None and hasattr(stop, "attach"):     # an SLO watch (rack.experiments.slo_watch)
        stop.attach(cores["collector"])
    if max_concurrency is None and not _has_turns(requests) and not any(s.kind == "faults" for s in specs):
        # An open-loop replay without faults: nothing reads the collector's records or the
        # router's instance reports before the queue runs empty (the router places requests
        # at its wake-ups only, and `Router.ended` does nothing without a closed loop or
        # sessions), so they go by inbox: no queue delivery per record or report.
        cores["collector"].notify = ()
        # Both inboxes are deferred (taken in batches, not at every instant): the
        # router's until its next call; the collector's, without an SLO watch (which
        # reads each record as it comes), until the done check could end the run
        # (`Collector.all_ended`) or it is full.
        watched = stop is not None and hasattr(stop, "attach")
        driver.feed_inboxes({"collector": DEFERRABLE, "router": INBOX_ROUTER},
                            deferred=("router",) if watched else ("collector", "router"))
    # a RequestTable (workloads.table) goes as it is: its requests are built as the router reaches them
    driver.post("router", "start", requests if hasattr(requests, "overlay") else list(requests),
                max_concurrency, think_time_s)

    def finished() -> bool:
        return cores["collector"].all_ended() and all(c.is_idle() for c in cores.values())

    # the driver checks at every instant (~6 times per request): one call less without a stop
    done = finished if stop is None else (lambda: stop.requested or finished())

    def records(salvage: bool = False, failed: str | None = None) -> dict:
        try:
            driver.take_inboxes()               # records of the instant the run stopped in
        except ComponentError:
            if not salvage:
                raise
        stats, missing = {}, []
        for spec in specs:
            if spec.kind in STATS_KINDS:
                if spec.name == failed:         # its state is whatever the error left
                    missing.append(spec.name)
                    continue
                try:
                    stats[spec.name] = cores[spec.name].stats(driver.now)
                except Exception:  # noqa: BLE001 - a core left inconsistent by its failure
                    if not salvage:
                        raise
                    missing.append(spec.name)
                    continue
                if spec.weight_load_s is not None:      # a crash target: how often it restarted
                    stats[spec.name]["restarts"] = driver.incarnation[spec.name]
        held = {n: c.held_requests() for n, c in cores.items() if hasattr(c, "held_requests")}
        return {"snapshot": cores["collector"].snapshot(), "stats": stats, "stats_missing": missing,
                "held_after_end": ended_holds(held, cores["collector"].ended_among),
                "router": cores["router"].counts(), "lateness": {}, "now": driver.now,
                "loop_type": f"{type(driver).__module__}.{type(driver).__name__} (no event loop)"}

    try:
        with replaying(stop), _no_hugepage_advice(), _young_gc_only():
            driver.run(done)
    except ComponentError as exc:
        exc.partial = records(salvage=True, failed=exc.component)
        raise
    finally:
        _LAST_COUNTERS.clear()
        _LAST_COUNTERS.update(messages=driver.messages, wakeups=driver.wakeups,
                              callbacks=driver.messages + driver.wakeups, virtual_s=driver.now)
    if stop is not None and stop.requested and not finished():
        raise RunStopped(stop.signal_name, driver.now, records(salvage=True))
    # The replay has ended: a signal now waits for its records (`StopRequest.deferred`)
    # instead of dropping a whole run's work on the floor.
    with deferred(stop):
        driver.take_inboxes()                   # (deferred records) before reading the collector
        if not cores["collector"].all_ended():
            err = VirtualTimeDeadlock(
                "virtual-time deadlock: nothing is left to happen but "
                + "; ".join(filter(None, (_open_requests(cores["collector"]), driver.waiting()))))
            err.partial = records(salvage=True)
            raise err
        with _no_hugepage_advice():
            return records()


#: Allocations (net, of container objects) between two collections of the youngest
#: generation during a replay (Python's default: 700). See `_young_gc_only`.
REPLAY_GC_THRESHOLD = 10_000


@contextlib.contextmanager
def _young_gc_only():
    """Python's cyclic garbage collector tuned for a replay, then restored: what exists
    before it (the trace's requests, the cores) is frozen out of the collections
    (`gc.freeze`: it lives through the replay anyway), and the youngest generation is
    collected every `REPLAY_GC_THRESHOLD` allocations instead of 700. A replay allocates
    a few small objects per event, most of them dead before the next collection, and
    the messages and records waiting in deferred inboxes (`rack.runtime.virtual`) are
    promoted and traversed again by the older generations' collections at the default
    thresholds: 0.17-0.38 s of collector time against 0.09-0.16 s with this (whole
    Mooncake trace, `gpu-only-kimi-k2` and `helios-cs3-kimi-k2`). Garbage is still
    collected; results are the same. A caller that froze objects itself keeps them
    frozen (nothing is frozen or unfrozen here then)."""
    before = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    gc.set_threshold(REPLAY_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if ours:
            gc.unfreeze()


@contextlib.contextmanager
def _no_hugepage_advice():
    """numpy's advice to back large arrays with huge pages (`madvise(MADV_HUGEPAGE)`,
    its default on Linux; the environment variable NUMPY_MADVISE_HUGEPAGE=0 turns it
    off at import) switched off for a replay, then restored. Where the kernel's THP
    defrag setting is "madvise" (e.g. this project's 2-core test machine), an advised
    page fault compacts memory first: 10-20% of a whole-trace replay's CPU time, which
    allocates its arrays afresh (measured with rack bench, docs/bench.md). Results are
    the same either way (an allocation hint). Does nothing if numpy has no switch."""
    switch = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:
        yield
        return
    before = switch(False)
    try:
        yield
    finally:
        switch(before)


def _has_turns(requests: Any) -> bool:
    """Whether any request is a turn of a session (the router then needs every end)."""
    if hasattr(requests, "has_turns"):
        return bool(requests.has_turns)
    return any(getattr(r, "turn", None) is not None for r in requests)


def last_run_counters() -> dict:
    """Work done by the last virtual run of this process: {"messages" (handler calls),
    "wakeups" (on_wake calls), "callbacks" (both), "virtual_s"}; empty before the first
    run. For `rack bench`'s events per request."""
    return dict(_LAST_COUNTERS)


def _open_requests(coll: Any) -> str:
    """"N request(s) never ended, e.g. 3 (after kv_reserved), ..." from the collector."""
    n_open = len(coll.ids) - int(np.count_nonzero(coll.outcome))
    if not n_open:
        return ""
    examples = [f"{rid} ({'after ' + last if last else 'not arrived'})" for rid, last in coll.open_examples(5)]
    return f"{n_open} request(s) never ended, e.g. " + ", ".join(examples)


__all__ = ["STATS_KINDS", "last_run_counters", "run_topology_virtual"]
