"""Place a topology on the virtual-time runtime and replay requests through it."""

from __future__ import annotations

from typing import Any, Sequence

from rack.topology import ComponentSpec

from .placement import construct
from .virtual import LoopClock, run_virtual


def run_topology_virtual(specs: Sequence[ComponentSpec], requests: Sequence[Any],
                         max_concurrency: int | None = None, think_time_s: float = 0.0) -> dict:
    """Run every component in this process on virtual time until each request ended.

    max_concurrency, think_time_s: closed-loop replay (`rack.router.Router.run`).

    Returns {"snapshot": collector records, "stats": {component: stats dict},
    "router": router counts, "lateness": {}} (virtual time is never late).
    Raises `VirtualTimeDeadlock` naming the requests still open if the rack stalls.
    """
    objs: dict[str, Any] = {}

    def hint() -> str:
        coll = objs.get("collector")
        if coll is None:
            return ""
        open_ids = coll.ids[coll.outcome == 0].tolist()
        return f"{len(open_ids)} request(s) never ended, e.g. ids {open_ids[:10]}"

    async def main(clock: LoopClock) -> dict:
        for spec in specs:
            objs[spec.name] = construct(spec, clock, objs.__getitem__)
        router_counts = await objs["router"].run(list(requests), max_concurrency=max_concurrency,
                                                 think_time_s=think_time_s)
        await objs["collector"].wait_all()
        for spec in specs:
            if spec.kind in ("prefill", "decode", "both", "interconnect"):
                await objs[spec.name].drain()
        stats = {}
        for spec in specs:
            if spec.kind in ("prefill", "decode", "both", "interconnect"):
                stats[spec.name] = await objs[spec.name].stats()
        return {"snapshot": await objs["collector"].snapshot(), "stats": stats,
                "router": router_counts, "lateness": {}, "now": clock.now()}

    return run_virtual(main, deadlock_hint=hint)
