"""Ray driver: each core (`workloads.core`) in an async Ray actor (uvloop) on a dilated
wall clock.

Emulated time t = (wall - epoch) / dilation. The driver picks `epoch`, a wall-clock
instant a little after every actor is built, and sends it to every actor. Actors on
the driver's own host use it as is (one clock). For an actor on another host the
driver first measures that host's clock offset (best of a few `time.time()` round
trips to one actor there, NTP-style: offset = remote - midpoint, error <= RTT/2) and,
when the offset is larger than that error bound, hands it `epoch + offset`, so every
actor starts emulated time 0 at the same instant of the driver's clock; what remains
is the smaller of the hosts' NTP error and RTT/2, plus the clocks' drift during the
run (docs/multinode.md gives the figures). Each actor records how late each of its
timers fires (emulated seconds); the results report it per actor.

Placement: a component's actor asks for its `ComponentSpec.resources` (pool
`resources`, scenario `[placement]`). A pool of several instances gets a placement
group (one bundle per instance, strategy SPREAD: over as many nodes as offer the
resources, packed when they are fewer) when it asks for custom resources, and Ray's
SPREAD scheduling otherwise. A resource that no node offers (or too little of it in
the whole cluster) is refused by `check_resources` before any actor exists; every
later wait (placement groups, actor start, the replay, the final gathering) has a
timeout and its error names what is missing.

Each core lives in a `rack.runtime.ray_host.CoreHost` actor, which delivers its
messages and arms its wake-ups on the wall clock and records its lateness, message
counts and the KV bytes it sends (hence the bytes that crossed nodes).

`map_ray_tasks` runs independent functions (virtual-time runs of a sweep) as Ray
tasks spread over the cluster; `rack.runtime.parallel.map_virtual_runs` is its
public front.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rack.wiring.topology import ComponentSpec

from .errors import ActorLost, ComponentError, RayDaemonLost, RayRunError, RunFailed
from .interrupt import RunStopped, StopRequest, reclaim_signals, replaying, signals_claimed
from rack.wiring.pace import LIVENESS_FLOOR_S, dilation_error, replay_error, replay_timeout_s
from .placement import load_factory
from .quiescence import ended_holds
from .ray_host import CoreHost, ray_api
from .ray_watch import ActorWatch

# Ray's predefined resources: not the custom ones a scenario pins components with.
_PREDEFINED = ("CPU", "GPU", "memory", "object_store_memory")
# Round trips used to measure another host's clock offset (the fastest one wins).
_CLOCK_PROBES = 5


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to Ray at `address`, or start a local one-node Ray when None or "local".

    A local start uses `address="local"` (never a stale cluster file), no dashboard,
    a 512 MiB object store and a short temp dir ($RACK_RAY_TMP or /tmp/rack-ray; socket
    paths are length-limited). `address` may be "auto" (the cluster `ray start` made
    on this machine) or "HOST:PORT" of a head node. Returns True when this call
    initialised Ray (so the caller owns the session and shuts it down), False when Ray
    was already initialised in this process. Raises RayRunError when this process is
    already connected to another cluster than an explicit "HOST:PORT" `address`.
    """
    ray = ray_api()
    if ray.is_initialized():
        if address not in (None, "auto", "local"):
            current = ray.get_runtime_context().gcs_address
            if current != address:
                raise RayRunError(f"this process is already connected to the Ray cluster at {current}, "
                                  f"not {address}: one process has one Ray session (ray.shutdown() first)")
        return False
    if address and address != "local":
        init_ray(address=address, log_to_driver=False, logging_level="ERROR")
    else:
        init_ray(address="local", num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR", object_store_memory=512 * 1024 * 1024,
                 _temp_dir=os.environ.get("RACK_RAY_TMP", "/tmp/rack-ray"))
    _messages_to_file(ray)
    return True


#: Where the Ray driver's messages go (in the session's log folder), not the terminal.
DRIVER_MESSAGES = "driver_messages.log"


def _messages_to_file(ray) -> None:
    """Send the messages Ray's driver prints from its daemons (e.g. "Raylet is
    terminated" with the last 20 lines of the raylet's log, on stdout) to
    `DRIVER_MESSAGES` in the session's log folder instead: a user's terminal gets
    rack's one-line cause, which names that folder (`RayDaemonLost`). Ray prints them
    through `ray._private.worker.print_to_stdstream` from its error-listener thread."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(worker, "_global_node", None)
    if worker is None or node is None or not callable(getattr(worker, "print_to_stdstream", None)):
        return
    try:
        path = os.path.join(node.get_logs_dir_path(), DRIVER_MESSAGES)
    except Exception:  # noqa: BLE001 - Ray's private API: keep Ray's own printing
        return

    def to_file(data, ignore_prefix: bool = False) -> None:  # noqa: ARG001 - Ray's signature
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
            f.write(f"[{data.get('pid', '')}] " + "\n".join(str(x) for x in data.get("lines", ())) + "\n")

    worker.print_to_stdstream = to_file


def end_local_ray() -> bool:
    """Shut down the Ray this process started (`ensure_ray`). When one of its daemons
    died (`rack.runtime.ray_watch.lost_daemon`), Ray's own shutdown would wait on it, so
    every process of its session is killed by PID instead: this process's children and
    every process whose command line names the session's folder (the agents a killed
    raylet leaves behind, orphaned). Returns True when it had to kill them (the caller
    then ends the process with `os._exit`: Ray's atexit clean-up would hang too)."""
    ray = ray_api()
    from .ray_watch import lost_daemon

    if lost_daemon() is None:
        ray.shutdown()
        return False
    import psutil

    node = ray._private.worker._global_node
    session = node.get_session_dir_path()
    me = os.getpid()
    victims = {c.pid: c for c in psutil.Process(me).children(recursive=True)}
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid != me and any(session in arg for arg in (p.info["cmdline"] or ())):
            victims.setdefault(p.pid, p)
    for p in victims.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(list(victims.values()), timeout=5)
    return True


def init_ray(**kwargs: Any) -> None:
    """`ray.init(**kwargs)`, leaving rack's SIGINT/SIGTERM handlers in charge when a
    `rack.runtime.interrupt.handle_signals` block is open (a command's run).

    ray.init installs SIGTERM handlers of its own in the driver: in Python, through
    `ray._private.utils.set_sigterm_handler` (`sys.exit(15)` when it starts, a node's
    clean-up and `sys.exit(1)` for a local head), and in C (absl's failure handler:
    "*** SIGTERM received at time=..." and a stack dump). During the call the Python
    one is kept out (that function is replaced by a no-op, the only way to stop it
    short of not calling ray.init: a SIGTERM while Ray starts is then rack's, the run
    stops at once with exit code 143), and afterwards rack's handlers are installed
    again over the C one (`reclaim_signals`). Outside such a block Ray's own handlers
    stay, as a library user expects."""
    ray = ray_api()
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "set_sigterm_handler", None)
    keep_out = original is not None and signals_claimed()
    if keep_out:
        utils.set_sigterm_handler = lambda handler: None
    try:
        ray.init(**kwargs)
    finally:
        if keep_out:
            utils.set_sigterm_handler = original
        reclaim_signals()


def live_nodes() -> list[dict]:
    """The connected cluster's live nodes, as `ray.nodes()` dicts ("NodeID",
    "NodeManagerAddress", "Resources", ...)."""
    return [n for n in ray_api().nodes() if n.get("Alive")]


def _custom(resources: dict) -> dict:
    return {k: v for k, v in resources.items() if k not in _PREDEFINED and not k.startswith("node:")}


def _fmt_amount(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check_resources(specs: Sequence[ComponentSpec], nodes: Sequence[dict] | None = None) -> None:
    """Refuse, before creating any actor, components whose Ray resources the cluster
    cannot give (an actor asking for them would stay pending forever).

    nodes: `ray.nodes()`-style dicts ("Alive", "Resources", "NodeID"); default: the
    live nodes of the connected cluster. Checks, in order: every amount is positive and
    finite; some node offers every resource of each component at once; the cluster's
    total of each resource covers the sum asked for by all components (pools of several
    instances). Raises RayRunError naming the component, its pool, the resource and
    what the nodes offer.
    """
    if nodes is None:
        nodes = ray_api().nodes()
    live = [n for n in nodes if n.get("Alive", True)]
    offered = [n.get("Resources", {}) for n in live]
    custom_offered = sorted({k for r in offered for k in _custom(r)})

    def where() -> str:
        return f"custom resources offered by the {len(live)} live node(s): {custom_offered or 'none'}"

    need: dict[str, float] = {}
    users: dict[str, list[str]] = {}
    for spec in specs:
        for res, amount in spec.resources.items():
            if not isinstance(amount, (int, float)) or not amount > 0 or math.isinf(amount):
                raise RayRunError(f"component {spec.name!r} (pool {spec.pool!r}): Ray resource {res!r} "
                                  f"must be a positive finite amount, got {amount!r}")
            need[res] = need.get(res, 0.0) + float(amount)
            users.setdefault(res, []).append(spec.name)
        if not spec.resources:
            continue
        if any(all(o.get(r, 0) >= a for r, a in spec.resources.items()) for o in offered):
            continue
        missing = [r for r, a in spec.resources.items() if not any(o.get(r, 0) >= a for o in offered)]
        if missing:
            res = missing[0]
            amount = spec.resources[res]
            raise RayRunError(
                f"component {spec.name!r} (pool {spec.pool!r}) needs Ray resource {res!r} x "
                f"{_fmt_amount(amount)}, but no node of the cluster offers it ({where()}); start a node with "
                f"--resources='{{\"{res}\": {_fmt_amount(amount)}}}'")
        raise RayRunError(
            f"component {spec.name!r} (pool {spec.pool!r}) needs Ray resources {dict(spec.resources)} on one "
            f"node, but no single node offers all of them together ({where()})")
    for res, total in need.items():
        have = sum(o.get(res, 0) for o in offered)
        if total > have + 1e-9:
            names = users[res]
            raise RayRunError(
                f"the components need Ray resource {res!r} x {_fmt_amount(total)} in total "
                f"({len(names)} actor(s): {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}), but the "
                f"cluster offers only {_fmt_amount(have)}; add nodes or raise the node's --resources")


def _place_pools(ray, specs: Sequence[ComponentSpec], timeout_s: float) -> tuple[dict[str, dict], list, dict]:
    """Scheduling options per component for pools of several instances, the placement
    groups created (the caller removes them) and a description {pool: strategy}."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    by_pool: dict[str, list[ComponentSpec]] = {}
    for s in specs:
        if s.pool is not None:
            by_pool.setdefault(s.pool, []).append(s)
    options: dict[str, dict] = {}
    groups: list = []
    described: dict[str, str] = {}
    pending: dict[str, Any] = {}
    for pool, members in by_pool.items():
        if len(members) < 2:
            continue
        if members[0].resources:
            pg = placement_group([dict(m.resources) for m in members], strategy="SPREAD",
                                 name=f"rack-{pool}-{uuid.uuid4().hex[:8]}")
            groups.append(pg)
            pending[pool] = pg
            for i, m in enumerate(members):
                options[m.name] = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i)}
            described[pool] = f"placement group SPREAD x {len(members)}"
        else:
            for m in members:
                options[m.name] = {"scheduling_strategy": "SPREAD"}
            described[pool] = f"SPREAD x {len(members)}"
    if pending:
        refs = {pool: pg.ready() for pool, pg in pending.items()}
        _, not_ready = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        if not_ready:
            late = [p for p, r in refs.items() if r in not_ready]
            raise RayRunError(
                f"placement group(s) of pool(s) {late} not placed within {timeout_s:.0f} s: the cluster has "
                f"the resources in total but not free now (available: {_custom(ray.available_resources())}); "
                "another job may hold them")
    return options, groups, described


def _wait_started(ray, actors: dict[str, Any], specs: Sequence[ComponentSpec], timeout_s: float) -> dict[str, dict]:
    refs = {s.name: actors[s.name].warm.remote(s.factory) for s in specs}
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [(s.name, dict(s.resources)) for s in specs if refs[s.name] in pending]
        raise RayRunError(
            f"{len(late)} actor(s) did not start within {timeout_s:.0f} s: {late[:6]}; resources "
            f"available now: {_custom(ray.available_resources())} (are they held by another job?)")
    return dict(zip(refs, ray.get(list(refs.values()), timeout=30)))


def _clock_offsets(ray, actors: dict[str, Any], infos: dict[str, dict]) -> dict[str, dict]:
    """{host ip: {"offset_s", "rtt_s", "corrected"}}: each host's clock minus the
    driver's, from the fastest of `_CLOCK_PROBES` round trips to one actor there.
    Only hosts other than the driver's are corrected (one host has one clock), and
    only when the offset exceeds the probe's error bound RTT/2."""
    driver_ip = ray.util.get_node_ip_address()
    out: dict[str, dict] = {}
    for name, info in infos.items():
        ip = info["node_ip"]
        if ip in out:
            continue
        best = None
        for _ in range(_CLOCK_PROBES):
            t0 = time.time()
            remote = ray.get(actors[name].wall_time.remote(), timeout=30)
            t1 = time.time()
            if best is None or t1 - t0 < best[1]:
                best = (remote - 0.5 * (t0 + t1), t1 - t0)
        # Corrected only when the probe proves the clocks differ (|offset| > RTT/2, its
        # error bound): NTP on a LAN keeps hosts within tens of microseconds (chrony's
        # documentation), better than a ~1 ms Ray round trip can measure.
        out[ip] = {"offset_s": best[0], "rtt_s": best[1],
                   "corrected": ip != driver_ip and abs(best[0]) > 0.5 * best[1]}
    return out


def run_topology_ray(specs: Sequence[ComponentSpec], requests: Sequence[Any], *, dilation: float,
                     address: str | None = None, progress: bool = False,
                     timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                     placement_timeout_s: float = 60.0, max_concurrency: int | None = None,
                     think_time_s: float = 0.0, stop: StopRequest | None = None,
                     liveness_timeout_s: float = LIVENESS_FLOOR_S) -> dict:
    """Place one actor per core, replay `requests`, and gather the records.

    max_concurrency, think_time_s: closed-loop replay (`rack.serving.router.Router.start`).
    stop: polled while the replay runs (every 0.2 s); once requested, every actor is
        halted (the router first: nothing more is admitted), what finished is gathered
        and `RunStopped` (rack.runtime.interrupt) is raised with it.
    liveness_timeout_s: wall seconds an actor may leave the driver's probe unanswered
        before it counts as hung (`rack.wiring.pace.liveness_timeout_s` derives it from
        the run's pace; `rack.runtime.ray_watch`).

    Returns the same dict as `run_topology_virtual` plus "loop_type", "nodes"
    (component -> Ray node id, read inside each actor) and "ray": {"actors": {name:
    {"node_id", "node_ip", "pid", "calls_in", "calls_in_per_s", "calls_out",
    "calls_out_per_s", "calls_held_for_order" (peers' calls Ray started before an
    earlier one of the same peer, held until it ran: `rack.runtime.ray_order`), "sent":
    {peer: {"calls", "bytes", "kv_bytes"}}}}, "cross_node":
    {"kv_bytes", "kv_bytes_all_hops", "payload_bytes", "calls", "calls_all"},
    "replay_wall_s", "clock": {"epoch_wall", "hosts": {ip: {"offset_s", "rtt_s",
    "corrected"}}}, "pools": {pool: placement}}. Bytes are the bytes handed to Ray (KV
    frames at `payload_scale`), summed over the hops prefill -> interconnect -> decode.
    Raises RayRunError on a missing resource or a timeout (startup_timeout_s: actors
    started; placement_timeout_s: placement groups; timeout_s: the replay, default
    `rack.wiring.pace.replay_timeout_s`; a dilation outside `rack.wiring.pace`'s
    limits, or arrivals that would take more than a week without `timeout_s`, are
    refused before any actor exists), ComponentError when a core raises (with
    `partial` records), `rack.runtime.errors.ActorLost` (a ComponentError, with the
    `partial` records of the others) when an actor dies or hangs beyond what its
    restarts cover (`rack.runtime.ray_watch`), RunStopped on `stop`. Actors and
    placement groups are removed at the end; Ray itself keeps running (the caller owns it).
    """
    ray = ray_api()
    span = max((r.arrival_s for r in requests), default=0.0)
    why = replay_error(span, dilation, timeout_s)
    if why is not None:
        raise RayRunError(why)
    topo = launch_topology(specs, dilation=dilation, address=address, startup_timeout_s=startup_timeout_s,
                           placement_timeout_s=placement_timeout_s)
    actors = topo.actors
    daemon_lost = False
    try:
        limit = timeout_s if timeout_s is not None else replay_timeout_s(span, dilation)
        deadline = time.time() + limit
        ray.get(actors["router"].deliver.remote("start", (list(requests), max_concurrency, think_time_s)),
                timeout=60)
        # from here a first signal stops the replay and keeps what finished
        watch = ActorWatch(ray, topo, liveness_timeout_s)
        with replaying(stop):
            try:
                _wait_with_progress(ray, watch, len(requests), deadline, progress, stop)
                replay_wall = time.time() - topo.epoch
                released = _wait_idle(ray, watch, specs, deadline, stop)
                return {**collect_records(topo, replay_wall), "held_after_end": released}
            except RayDaemonLost as err:
                # Ray is going down: what the actors still say within seconds, else the
                # collector's last checkpoint; nothing is removed (no daemon to ask)
                daemon_lost = True
                err.partial = _partial(ray, actors, topo.engine_names, topo.epoch, dilation, timeout_s=3.0) \
                    or watch.checkpoint
                raise
            except ActorLost as err:
                # the others stop where they are (one instant's records); the lost one is not asked
                _halt(ray, {n: a for n, a in actors.items() if n != err.component})
                # the collector's death takes its records with it: its last checkpoint then
                err.partial = _partial(ray, actors, topo.engine_names, topo.epoch, dilation,
                                       lost=err.component) or watch.checkpoint
                raise
            except ComponentError as err:
                err.partial = _partial(ray, actors, topo.engine_names, topo.epoch, dilation)
                raise
            except RayRunError as err:
                # the deadline passed: what finished is kept as for any aborted run
                t_halt = _halt(ray, actors)
                err.partial = _partial(ray, actors, topo.engine_names, topo.epoch, dilation) or watch.checkpoint
                if err.partial is not None and t_halt is not None:
                    err.partial["now"] = t_halt
                raise
            except _Stopped:
                t_halt = None
                try:
                    t_halt = _halt(ray, actors)
                    partial = _partial(ray, actors, topo.engine_names, topo.epoch, dilation)
                except KeyboardInterrupt:
                    # a second signal: stop gathering at once, but write what is held
                    # (the collector's last checkpoint) rather than nothing
                    partial = watch.checkpoint
                if partial is not None and t_halt is not None:
                    partial["now"] = t_halt
                raise RunStopped(stop.signal_name, t_halt if t_halt is not None else
                                 (partial or {}).get("now"), partial) from None
    except ray.exceptions.GetTimeoutError as exc:
        raise RayRunError(f"Ray run timed out: {exc}") from None
    finally:
        if not daemon_lost:
            remove_topology(topo)


@dataclass
class RayTopology:
    """Actors placed and built by `launch_topology`, ready for time 0 at `epoch` (wall
    clock of the driver's host); `collect_records` reads them, `remove_topology` ends them."""

    specs: Sequence[ComponentSpec]
    dilation: float
    actors: dict[str, Any]
    groups: list
    infos: dict[str, dict]
    hosts: dict[str, dict]
    nodes: dict[str, str]
    pools: dict[str, str]
    loop_types: set
    epoch: float

    @property
    def engine_names(self) -> list[str]:
        return [s.name for s in self.specs if s.kind in ("prefill", "decode", "both", "interconnect")]


def launch_topology(specs: Sequence[ComponentSpec], *, dilation: float, address: str | None = None,
                    startup_timeout_s: float = 120.0, placement_timeout_s: float = 60.0) -> RayTopology:
    """Place one actor per core (its `ComponentSpec.host` class, `CoreHost` by
    default), connect them, measure clock offsets and build every core for a time 0 a
    little ahead (`RayTopology.epoch`). Raises RayRunError as `run_topology_ray`; the
    actors made so far are removed when it raises."""
    why = dilation_error(dilation)
    if why is not None:
        raise RayRunError(f"dilation {dilation!r}: {why}")
    ray = ray_api()
    ensure_ray(address)
    check_resources(specs)
    hosts_cls: dict[str, Any] = {}
    registry_name = f"rack-registry-{uuid.uuid4().hex[:12]}"
    actors: dict[str, Any] = {}
    groups: list = []
    try:
        sched, groups, pools = _place_pools(ray, specs, placement_timeout_s)
        for spec in specs:
            opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000, "name": None}
            if spec.resources:
                opts["resources"] = dict(spec.resources)
            opts.update(sched.get(spec.name, {}))
            registry = None
            if spec.kind == "collector":
                opts["name"] = registry_name    # keeps the engines' build arguments
            elif spec.weight_load_s is not None:
                # restarted by Ray after each injected crash and each real death it may
                # survive (rack.wiring.faults, Scenario.max_restarts; ray_watch tells them apart)
                opts["max_restarts"] = max(1, spec.crashes + spec.restarts)
                registry = registry_name
            key = spec.host or "rack.runtime.ray_host:CoreHost"
            if key not in hosts_cls:
                hosts_cls[key] = ray.remote(CoreHost if spec.host is None else load_factory(spec.host))
            actors[spec.name] = hosts_cls[key].options(**opts).remote(spec.name, registry)
        infos = _wait_started(ray, actors, specs, startup_timeout_s)
        ray.get([actors[s.name].connect.remote([actors[n] for n in _talks_to(s, specs)]) for s in specs],
                timeout=startup_timeout_s)
        hosts = _clock_offsets(ray, actors, infos)
        # The epoch lies after every actor is built, so time 0 is not already late: a
        # build is a constructor call (ms), but a loaded 2-core host was seen to take
        # over 1.6 s for six of them; 2 s + 0.2 s per actor leaves room.
        slack = 2.0 + 0.2 * len(specs)
        epoch = time.time() + slack

        def local_epoch(name: str) -> float:
            h = hosts[infos[name]["node_ip"]]
            return epoch + (h["offset_s"] if h["corrected"] else 0.0)

        built = ray.get([actors[s.name].build.remote(s, actors, local_epoch(s.name), dilation) for s in specs],
                        timeout=startup_timeout_s)
        if time.time() > epoch:
            raise RayRunError(f"building the {len(specs)} components took {time.time() - epoch + slack:.1f} s, "
                              f"past time 0 set {slack:.1f} s ahead (an overloaded host?); retry")
        return RayTopology(specs=specs, dilation=dilation, actors=actors, groups=groups, infos=infos,
                           hosts=hosts, nodes={s.name: b["node_id"] for s, b in zip(specs, built)},
                           pools=pools, loop_types={b["loop_type"] for b in built}, epoch=epoch)
    except BaseException as exc:
        remove_topology(RayTopology(specs, dilation, actors, groups, {}, {}, {}, {}, set(), 0.0))
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            raise RayRunError(f"Ray run timed out: {exc}") from None
        raise


def collect_records(topo: RayTopology, replay_wall: float) -> dict:
    """The run's records (`run_topology_ray`'s dict) read from the actors of `topo`:
    router counts, engine stats, restarts, the collector's snapshot, each host's report."""
    ray, actors, specs = ray_api(), topo.actors, topo.specs
    engine_names = topo.engine_names
    router_counts = ray.get(actors["router"].query.remote("counts"), timeout=60)
    stats = dict(zip(engine_names, ray.get(
        [actors[n].query.remote("stats") for n in engine_names], timeout=60)))
    crashes = ray.get(actors["collector"].crash_counts.remote(), timeout=60)
    for s in specs:
        if s.weight_load_s is not None and s.name in stats:   # a crash target
            stats[s.name]["restarts"] = crashes.get(s.name, 0)
    snapshot = ray.get(actors["collector"].query.remote("snapshot"), timeout=60)
    reports = dict(zip([s.name for s in specs],
                       ray.get([actors[s.name].report.remote() for s in specs], timeout=60)))
    now = (time.time() - topo.epoch) / topo.dilation
    return {"snapshot": snapshot, "stats": stats, "router": router_counts,
            "lateness": {n: r["lateness"] for n, r in reports.items()},
            "now": now, "loop_type": ",".join(sorted(topo.loop_types)), "nodes": topo.nodes,
            "ray": _ray_section(specs, topo.infos, topo.nodes, reports, replay_wall, topo.epoch,
                                topo.hosts, topo.pools)}


def remove_topology(topo: RayTopology) -> None:
    """Kill the actors and remove the placement groups of `topo` (best effort)."""
    ray = ray_api()
    for a in topo.actors.values():
        try:
            ray.kill(a)
        except Exception:
            pass
    for pg in topo.groups:
        try:
            ray.util.remove_placement_group(pg)
        except Exception:
            pass


def _talks_to(spec: ComponentSpec, specs: Sequence[ComponentSpec]) -> list[str]:
    """The cores `spec`'s core sends messages to: its peers, and every core that names
    it as a peer (replies go back to the sender)."""
    out = set(spec.refs())
    out.update(s.name for s in specs if spec.name in s.refs())
    out.discard(spec.name)
    return sorted(out)


class _Stopped(Exception):
    """A wait loop saw the run's StopRequest."""


def _check_stop(stop: StopRequest | None) -> None:
    if stop is not None and stop.requested:
        raise _Stopped()


def _halt(ray, actors: dict[str, Any]) -> float | None:
    """Halt every actor's core (`CoreHost.halt`), the router first so that nothing more
    is admitted; returns the router's emulated time then (None if it did not answer or
    is not among `actors`)."""
    try:
        t = ray.get(actors["router"].halt.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - best effort: the records are read anyway
        t = None
    refs = [a.halt.remote() for n, a in actors.items() if n != "router"]
    try:
        ray.get(refs, timeout=10)
    except Exception:  # noqa: BLE001
        pass
    return t


def _wait_idle(ray, watch: ActorWatch, specs: Sequence[ComponentSpec], deadline: float,
               stop: StopRequest | None = None) -> dict[str, list[int]]:
    """Wait until every core says it is idle (every request has ended: the engines
    finish their bookkeeping, e.g. a last prefix-cache insert). Work a busy core holds
    for a request that has ended is a phantom (`rack.runtime.quiescence`): it is
    released at once instead of being waited for. Returns {core: request ids released}."""
    actors = watch.actors
    released: dict[str, list[int]] = {}
    while True:
        _check_stop(stop)
        refs = [actors[s.name].query.remote("is_idle") for s in specs]
        try:
            idle = ray.get(refs, timeout=min(60.0, watch.liveness_s))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            watch.poll()            # names the actor that died or hangs (ActorLost)
            continue
        if all(idle):
            return released
        busy = [s.name for s, i in zip(specs, idle) if not i]
        found = _ended_holds(ray, watch, busy)
        for name, ids in found.items():
            watch.call(name, actors[name].deliver.remote("release", (ids,)), 30)
            released.setdefault(name, []).extend(i for i in ids if i not in released[name])
        watch.poll()
        if time.time() > deadline:
            busy = [s.name for s, i in zip(specs, idle) if not i]
            raise RayRunError(f"Ray run: every request ended, but {busy} did not become idle in time")
        time.sleep(0.05)


def _ended_holds(ray, watch: ActorWatch, names: Sequence[str]) -> dict[str, list[int]]:
    """`rack.runtime.quiescence.ended_holds` over the actors `names` (those without
    per-request work, e.g. the router, are asked nothing)."""
    actors = watch.actors
    held = {}
    for name in names:
        try:
            held[name] = ray.get(actors[name].query.remote("held_requests"), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
        except Exception:  # noqa: BLE001 - a core without the read (router, collector)
            continue
    collector = actors["collector"]
    return ended_holds(held, lambda ids: watch.call("collector", collector.query.remote("ended_among", ids), 30))


def _ray_section(specs, infos, nodes, reports, replay_wall, epoch, hosts, pools) -> dict:
    actors: dict[str, dict] = {}
    cross = {"kv_bytes": 0, "kv_bytes_all_hops": 0, "payload_bytes": 0, "calls": 0, "calls_all": 0}
    per_s = (lambda n: n / replay_wall if replay_wall > 0 else 0.0)
    for s in specs:
        r = reports[s.name]
        calls_out = sum(v["calls"] for v in r["sent"].values())
        actors[s.name] = {"node_id": nodes[s.name], "node_ip": infos[s.name]["node_ip"],
                          "pid": infos[s.name]["pid"], "calls_in": r["calls_in"],
                          "calls_in_per_s": per_s(r["calls_in"]), "calls_out": calls_out,
                          "calls_out_per_s": per_s(calls_out), "calls_held_for_order": r["calls_held"],
                          "sent": r["sent"]}
        for peer, v in r["sent"].items():
            cross["kv_bytes_all_hops"] += v["kv_bytes"]
            cross["calls_all"] += v["calls"]
            if nodes.get(peer) != nodes[s.name]:
                cross["kv_bytes"] += v["kv_bytes"]
                cross["payload_bytes"] += v["bytes"]
                cross["calls"] += v["calls"]
    return {"actors": actors, "cross_node": cross, "replay_wall_s": replay_wall,
            "clock": {"epoch_wall": epoch, "hosts": hosts}, "pools": pools}


def first_failure(ray, actors: dict[str, Any]) -> ComponentError | None:
    """The earliest failure (by emulated time) any host kept, or None. An actor that
    is down (killed by an injected crash, restarting) has nothing to say."""
    found = []
    for ref in [a.failed.remote() for a in actors.values()]:
        try:
            failure = ray.get(ref, timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            continue
        if failure is not None:
            found.append(failure)
    return min(found, key=lambda f: f.t_s if f.t_s is not None else math.inf) if found else None


def _partial(ray, actors: dict[str, Any], engine_names: Sequence[str], epoch: float, dilation: float,
             lost: str | None = None, timeout_s: float = 30.0) -> dict | None:
    """What the components measured until a failure (best effort, `timeout_s` per
    call): the collector's records and every engine's stats that can still be read;
    `lost`: an actor that is gone (not asked: a restarted one would answer as a fresh
    core)."""
    if lost == "collector":
        return None
    try:
        snapshot = ray.get(actors["collector"].query.remote("snapshot"), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - nothing to salvage
        return None
    stats, missing = {}, []
    for n in engine_names:
        if n == lost:
            missing.append(n)
            continue
        try:
            stats[n] = ray.get(actors[n].query.remote("stats"), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - e.g. the engine that failed
            missing.append(n)
    return {"snapshot": snapshot, "stats": stats, "stats_missing": missing, "router": {}, "lateness": {},
            "now": (time.time() - epoch) / dilation, "loop_type": "ray"}


#: Wall seconds between two checkpoints of the collector's records while a Ray run
#: waits (`_wait_with_progress`): what is written if Ray itself goes down (a lost GCS
#: or raylet takes the actors with it), so at most this much of the run is lost.
CHECKPOINT_S = 2.0


def _wait_with_progress(ray, watch: ActorWatch, total: int, deadline: float, progress: bool,
                        stop: StopRequest | None = None) -> None:
    """Wait until every request ended (the collector's `all_ended`, polled); raise what
    the watch finds (`ActorWatch.poll`, every `rack.runtime.ray_watch.POLL_S`: a lost
    actor, the first core failure), RayRunError naming the open requests at `deadline`,
    and `_Stopped` once `stop` is requested."""
    collector = watch.actors["collector"]
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), transient=True)
        bar.start()
        task = bar.add_task("requests ended", total=total)
    next_checkpoint = time.time() + CHECKPOINT_S
    try:
        while True:
            _check_stop(stop)
            if watch.call("collector", collector.query.remote("all_ended"), 60):
                return
            if time.time() >= next_checkpoint:
                t0 = time.time()
                watch.checkpoint = {"snapshot": watch.call("collector", collector.query.remote("snapshot"), 60),
                                    "stats": {}, "stats_missing": list(watch.topo.engine_names), "router": {},
                                    "lateness": {}, "loop_type": "ray",
                                    "now": (t0 - watch.topo.epoch) / watch.topo.dilation}
                # at most ~5% of the driver's time, however many rows the snapshot holds
                next_checkpoint = time.time() + max(CHECKPOINT_S, 20 * (time.time() - t0))
            if time.time() > deadline:
                watch.poll()
                open_ids = watch.call("collector", collector.query.remote("open_requests"), 30)
                raise RayRunError(f"Ray run did not finish in time: {len(open_ids)} request(s) "
                                  f"still open, e.g. {open_ids[:10]}")
            if bar is not None:
                n_open = len(watch.call("collector", collector.query.remote("open_requests"), 30))
                bar.update(task, completed=total - n_open)
            if watch.due():
                watch.poll()
            time.sleep(0.2)
    finally:
        if bar is not None:
            bar.stop()


# ---------------------------------------------------------------------------------------
# Independent runs as Ray tasks (sweeps, comparisons)


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def map_ray_tasks(fn: Callable[[Any], Any], items: Sequence[Any], *, address: str | None = None,
                  num_cpus: float = 1.0, on_done: Callable[[int, int], None] | None = None,
                  timeout_s: float | None = None, return_exceptions: bool = False) -> list:
    """`[fn(item) for item in items]`, each call a Ray task (`num_cpus` CPUs, no retry,
    SPREAD over the cluster's nodes), results in the order of `items`.

    address: as in `ensure_ray` (None or "local": a local Ray started for this call).
    A session this call opens is closed at the end; one already open is reused.
    on_done(done, total) is called as tasks finish. timeout_s: wall-clock limit for
    the whole map (None: none; every single wait is still bounded). `fn` and the items
    must be picklable, and `fn`'s module importable on every node (the same package
    installed there).
    Raises RayRunError when no node has `num_cpus` CPUs (a task would never start) or
    on the timeout; a failing call raises `RunFailed(index, cause)` (the remaining tasks
    are cancelled) unless `return_exceptions`, in which case its exception is returned
    in its place.
    """
    ray = ray_api()
    opened = ensure_ray(None if address in (None, "local") else address)
    pending: list = []
    try:
        cpus = [n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
        if not any(c >= num_cpus for c in cpus):
            raise RayRunError(f"no node of the cluster has {num_cpus:g} CPU(s) for a task "
                              f"(CPUs per live node: {cpus})")
        remote = ray.remote(num_cpus=num_cpus, max_retries=0, scheduling_strategy="SPREAD")(_apply)
        refs = [remote.remote(fn, item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        deadline = None if timeout_s is None else time.time() + timeout_s
        done = 0
        while pending:
            if deadline is not None and time.time() > deadline:
                raise RayRunError(f"{len(pending)} of {len(refs)} task(s) not finished within {timeout_s:.0f} s")
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref, timeout=60)
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.as_instanceof_cause()
                    if not return_exceptions:
                        raise RunFailed(i, cause) from None
                    results[i] = cause
                done += 1
            if ready and on_done is not None:
                on_done(done, len(refs))
        return results
    finally:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        if opened:
            ray.shutdown()
