"""Ray runtime: each component is an async Ray actor (uvloop) on a dilated wall clock.

Emulated time t = (wall - epoch) / dilation, with `epoch` a wall-clock instant chosen
by the driver a little in the future and shared by every actor (on several machines
this relies on their clocks being synchronised, e.g. by NTP: an offset between two
hosts shows up directly as lateness). Each actor's clock records how late each of
its timers fires (emulated seconds); the results report it per actor.

Handles between components are `ActorProxy` objects: `await proxy.method(*args)`
becomes one actor call, so component code is the same as on the virtual runtime.
Every wait on Ray has a timeout; an actor whose resources no node offers is refused
before it is created.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Sequence

from rack.topology import ComponentSpec

from .placement import construct


class RayRunError(RuntimeError):
    """The Ray run could not start or did not finish in time."""


def _ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    return ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray at `address`, or start a local one-node Ray when None.

    A local start uses `address="local"` (never a stale cluster file), no dashboard,
    and a short temp dir (socket paths are length-limited).
    """
    ray = _ray()
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        return
    ray.init(address="local", num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", object_store_memory=512 * 1024 * 1024,
             _temp_dir=os.environ.get("RACK_RAY_TMP", "/tmp/rack-ray"))


class ActorProxy:
    """A peer handle for component code: `await proxy.method(*args, **kwargs)` calls
    `method` on the component living in actor `actor` and returns its result."""

    __slots__ = ("_actor", "_name")

    def __init__(self, actor: Any, name: str) -> None:
        self._actor = actor
        self._name = name

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)
        actor = self._actor

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await actor.call.remote(method, args, kwargs)

        return call

    def __reduce__(self):
        return (ActorProxy, (self._actor, self._name))


class ComponentHost:
    """The body of every component actor: builds one component and forwards calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.obj: Any = None
        self.clock: Any = None

    async def warm(self, factory: str) -> None:
        """Import the component's module (slow the first time in a fresh process)."""
        from .placement import load_factory

        load_factory(factory)

    async def build(self, spec: ComponentSpec, peers: dict[str, Any], epoch_wall: float,
                    dilation: float) -> dict:
        from .virtual import LoopClock

        loop = asyncio.get_running_loop()
        self.clock = LoopClock(loop, origin=epoch_wall, dilation=dilation, record_lateness=True,
                               wall_time=time.time)
        self.obj = construct(spec, self.clock, peers.__getitem__)
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "loop_type": type(loop).__module__ + "." + type(loop).__name__, "pid": os.getpid()}

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        result = getattr(self.obj, method)(*args, **kwargs)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        return result

    async def lateness(self) -> list[float]:
        return list(self.clock.lateness) if self.clock is not None else []


def check_resources(specs: Sequence[ComponentSpec]) -> None:
    """Refuse, before creating any actor, a component whose custom resources no node
    of the cluster offers (an actor asking for them would stay pending forever)."""
    ray = _ray()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for spec in specs:
        for res, amount in spec.resources.items():
            if not any(n.get("Resources", {}).get(res, 0) >= amount for n in nodes):
                offered = sorted({k for n in nodes for k in n.get("Resources", {})
                                  if not k.startswith("node:") and k not in ("CPU", "GPU", "memory", "object_store_memory")})
                raise RayRunError(
                    f"component {spec.name!r} (pool {spec.pool!r}) needs Ray resource {res!r} x {amount}, "
                    f"but no node of the cluster offers it (custom resources offered: {offered or 'none'}); "
                    f"start a node with --resources='{{\"{res}\": {int(amount) if amount == int(amount) else amount}}}'")


def run_topology_ray(specs: Sequence[ComponentSpec], requests: Sequence[Any], *, dilation: float,
                     address: str | None = None, progress: bool = False,
                     timeout_s: float | None = None, startup_timeout_s: float = 120.0) -> dict:
    """Place one actor per component, replay `requests`, and gather the records.

    Returns the same dict as `run_topology_virtual` plus "loop_type", "nodes"
    (component -> node id). Raises RayRunError on a missing resource or a timeout.
    Actors are killed at the end; Ray itself keeps running (the caller owns it).
    """
    ray = _ray()
    ensure_ray(address)
    check_resources(specs)
    Host = ray.remote(ComponentHost)
    actors: dict[str, Any] = {}
    try:
        for spec in specs:
            opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000, "name": None}
            if spec.resources:
                opts["resources"] = dict(spec.resources)
            actors[spec.name] = Host.options(**opts).remote(spec.name)
        proxies = {name: ActorProxy(a, name) for name, a in actors.items()}
        span = max((r.arrival_s for r in requests), default=0.0)
        ray.get([actors[s.name].warm.remote(s.factory) for s in specs], timeout=startup_timeout_s)
        # The epoch lies after every actor is built, so time 0 is not already late.
        epoch = time.time() + 1.0 + 0.1 * len(specs)
        infos = ray.get([actors[s.name].build.remote(s, proxies, epoch, dilation) for s in specs],
                        timeout=startup_timeout_s)
        nodes = {s.name: info["node_id"] for s, info in zip(specs, infos)}
        loop_types = {info["loop_type"] for info in infos}
        if time.time() > epoch:
            raise RayRunError("actors took longer to start than the epoch allowed; retry")
        limit = timeout_s if timeout_s is not None else 600.0 + 4.0 * span * dilation
        deadline = time.time() + limit
        router_ref = actors["router"].call.remote("run", (list(requests),), {})
        done_ref = actors["collector"].call.remote("wait_all", (), {})
        _wait_with_progress(ray, actors["collector"], done_ref, len(requests), deadline, progress)
        router_counts = ray.get(router_ref, timeout=max(1.0, deadline - time.time()))
        engine_names = [s.name for s in specs if s.kind in ("prefill", "decode", "both", "interconnect")]
        ray.get([actors[n].call.remote("drain", (), {}) for n in engine_names], timeout=60)
        stats = dict(zip(engine_names, ray.get(
            [actors[n].call.remote("stats", (), {}) for n in engine_names], timeout=60)))
        snapshot = ray.get(actors["collector"].call.remote("snapshot", (), {}), timeout=60)
        lateness = dict(zip([s.name for s in specs],
                            ray.get([actors[s.name].lateness.remote() for s in specs], timeout=60)))
        now = (time.time() - epoch) / dilation
        return {"snapshot": snapshot, "stats": stats, "router": router_counts, "lateness": lateness,
                "now": now, "loop_type": ",".join(sorted(loop_types)), "nodes": nodes}
    except ray.exceptions.GetTimeoutError as exc:
        raise RayRunError(f"Ray run timed out: {exc}") from None
    finally:
        for a in actors.values():
            try:
                ray.kill(a)
            except Exception:
                pass


def _wait_with_progress(ray, collector, done_ref, total: int, deadline: float, progress: bool) -> None:
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), transient=True)
        bar.start()
        task = bar.add_task("requests ended", total=total)
    try:
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                open_ids = ray.get(collector.call.remote("open_requests", (), {}), timeout=30)
                raise RayRunError(f"Ray run did not finish in time: {len(open_ids)} request(s) "
                                  f"still open, e.g. {open_ids[:10]}")
            ready, _ = ray.wait([done_ref], timeout=min(0.5, remaining))
            if bar is not None:
                n_open = len(ray.get(collector.call.remote("open_requests", (), {}), timeout=30))
                bar.update(task, completed=total - n_open)
            if ready:
                ray.get(done_ref, timeout=30)
                return
    finally:
        if bar is not None:
            bar.stop()
