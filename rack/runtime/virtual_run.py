"""Place a topology on the virtual-time runtime and replay requests through it."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Sequence

import numpy as np

from rack.collector import EVENTS
from rack.topology import ComponentSpec

from .errors import component_of, owners, request_of
from .placement import construct
from .virtual import LoopClock, run_virtual

_STATS_KINDS = ("prefill", "decode", "both", "interconnect")


def run_topology_virtual(specs: Sequence[ComponentSpec], requests: Sequence[Any],
                         max_concurrency: int | None = None, think_time_s: float = 0.0) -> dict:
    """Run every component in this process on virtual time until each request ended.

    max_concurrency, think_time_s: closed-loop replay (`rack.router.Router.run`).

    Returns {"snapshot": collector records, "stats": {component: stats dict},
    "router": router counts, "lateness": {}} (virtual time is never late).
    Raises `ComponentError` (rack.runtime.errors) when a component raises, and
    `VirtualTimeDeadlock` naming the requests still open and what each waiting task
    waits in if the rack stalls; both carry `partial`, the same dict with the records
    up to that moment plus "stats_missing": the components that could not report
    (an engine re-raises its failed background task's exception from `stats`).
    """
    objs: dict[str, Any] = {}
    clocks: list[LoopClock] = []

    def hint() -> str:
        coll = objs.get("collector")
        if coll is None:
            return ""
        return "; ".join(filter(None, (_open_requests(coll), _waiting(objs))))

    async def main(clock: LoopClock) -> dict:
        clocks.append(clock)
        for spec in specs:
            objs[spec.name] = construct(spec, clock, objs.__getitem__)
        router_counts = await objs["router"].run(list(requests), max_concurrency=max_concurrency,
                                                 think_time_s=think_time_s)
        await objs["collector"].wait_all()
        for spec in specs:
            if spec.kind in _STATS_KINDS:
                await objs[spec.name].drain()
        stats = {}
        for spec in specs:
            if spec.kind in _STATS_KINDS:
                stats[spec.name] = await objs[spec.name].stats()
        return {"snapshot": await objs["collector"].snapshot(), "stats": stats,
                "router": router_counts, "lateness": {}, "now": clock.now()}

    async def salvage() -> dict:
        stats, missing = {}, []
        for spec in specs:
            if spec.kind in _STATS_KINDS and spec.name in objs:
                try:
                    stats[spec.name] = await objs[spec.name].stats()
                except Exception:  # noqa: BLE001 - an engine whose background task failed
                    missing.append(spec.name)
        return {"snapshot": await objs["collector"].snapshot(), "stats": stats, "stats_missing": missing,
                "router": {}, "lateness": {}, "now": clocks[0].now()}

    return run_virtual(main, deadlock_hint=hint, components=lambda: objs, salvage=salvage)


def _open_requests(coll: Any) -> str:
    """"N request(s) never ended, e.g. 3 (after kv_reserved), ..." from the collector."""
    open_rows = np.flatnonzero(coll.outcome == 0)
    if not open_rows.size:
        return ""
    examples = []
    for row in open_rows[:5].tolist():
        done = np.flatnonzero(~np.isnan(coll.times[row]))
        stage = f"after {EVENTS[done.max()]}" if done.size else "not arrived"
        examples.append(f"{int(coll.ids[row])} ({stage})")
    return f"{open_rows.size} request(s) never ended, e.g. " + ", ".join(examples)


def _waiting(objs: dict) -> str:
    """What each pending task waits on: "prefill-0 PrefillEngine._handoff (request 5)
    waits in decode-0 DecodeEngine.reserve_kv, ..." (the task's component and
    coroutine, the request it handles, and the innermost component method it waits
    in; "runtime" for the driver's own task)."""
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop
        return ""
    seen: Counter = Counter()
    owned = owners(objs)
    for task in tasks:
        frames = []                       # outermost first
        coro = task.get_coro()
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            frames.append(coro.cr_frame)
            coro = coro.cr_await
        if not frames:
            continue
        where = next((f for f in reversed(frames) if id(f.f_locals.get("self")) in owned), frames[-1])
        text = f"{component_of(frames[:1], owned) or 'runtime'} {_name(frames[0])}"
        if where is frames[0]:            # e.g. an engine loop waiting for work
            seen[text + " waits for its own wake-up"] += 1
            continue
        rid = request_of(reversed(frames))
        seen[text + (f" (request {rid})" if rid is not None else "")
             + f" waits in {component_of([where], owned) or 'runtime'} {_name(where)}"] += 1
    if not seen:
        return ""
    return "waiting: " + ", ".join(k + (f" (x{n})" if n > 1 else "") for k, n in sorted(seen.items()))


def _name(frame: Any) -> str:
    code = frame.f_code
    return getattr(code, "co_qualname", code.co_name)
