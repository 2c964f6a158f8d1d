"""Ray runtime: each component is an async Ray actor (uvloop) on a dilated wall clock.

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

Handles between components are `ActorProxy` objects: `await proxy.method(*args)`
becomes one actor call, so component code is the same as on the virtual runtime.
Each proxy also counts the calls and the payload bytes (numpy arrays, bytes) it sends,
which gives the messages per actor and the KV bytes that crossed nodes. A KV call
(`transfer`, `receive_kv`) with a large payload is sent from a helper thread and
carries the payload by object-store reference: the sender's copy into shared memory
runs beside its event loop, the receiver reads zero-copy views, and the interconnect
forwards the sender's reference without copying the bytes again. The clocks wait the
last millisecond before a deadline by yielding to the loop (`virtual.SPIN_S`), since
uvloop's timers are millisecond-grained.

`map_ray_tasks` runs independent functions (virtual-time runs of a sweep) as Ray
tasks spread over the cluster; `rack.runtime.parallel.map_virtual_runs` is its
public front.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import os
import socket
import time
import uuid
from typing import Any, Callable, Sequence

import numpy as np

from interconnect.component import PeerLost
from rack.topology import ComponentSpec

from .errors import ComponentError, locate, owners
from .parallel import RunFailed
from .placement import construct

# Methods whose array arguments are KV frames (docs/interfaces.md: the prefill engine
# calls `interconnect.transfer(req, frames, ...)`, the interconnect calls
# `decode.receive_kv(req, frames, ...)`).
KV_METHODS = frozenset({"transfer", "receive_kv"})
#: KV calls carrying at least this many payload bytes are sent from a helper thread
#: (`ActorProxy`); Ray inlines arguments under 100 KiB into the call itself.
OFFLOAD_BYTES = 96 << 10
# Ray's predefined resources: not the custom ones a scenario pins components with.
_PREDEFINED = ("CPU", "GPU", "memory", "object_store_memory")
# Round trips used to measure another host's clock offset (the fastest one wins).
_CLOCK_PROBES = 5


class RayRunError(RuntimeError):
    """The Ray run could not start (missing resources, actors not placed in time) or
    did not finish in time."""


def _ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    return ray


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
    ray = _ray()
    if ray.is_initialized():
        if address not in (None, "auto", "local"):
            current = ray.get_runtime_context().gcs_address
            if current != address:
                raise RayRunError(f"this process is already connected to the Ray cluster at {current}, "
                                  f"not {address}: one process has one Ray session (ray.shutdown() first)")
        return False
    if address and address != "local":
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        return True
    ray.init(address="local", num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", object_store_memory=512 * 1024 * 1024,
             _temp_dir=os.environ.get("RACK_RAY_TMP", "/tmp/rack-ray"))
    return True


def live_nodes() -> list[dict]:
    """The connected cluster's live nodes, as `ray.nodes()` dicts ("NodeID",
    "NodeManagerAddress", "Resources", ...)."""
    return [n for n in _ray().nodes() if n.get("Alive")]


def _payload_bytes(values: Sequence[Any]) -> int:
    """Bytes of the numpy arrays / bytes among `values` (and one list level down: a
    list of KV frames)."""
    n = 0
    for v in values:
        if isinstance(v, np.ndarray):
            n += v.nbytes
        elif isinstance(v, (bytes, bytearray)):
            n += len(v)
        elif isinstance(v, memoryview):
            n += v.nbytes
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], (np.ndarray, bytes, bytearray)):
            n += _payload_bytes(v)
    return n


class ActorProxy:
    """A peer handle for component code: `await proxy.method(*args, **kwargs)` calls
    `method` on the component living in actor `actor` and returns its result.

    Inside a component actor the host attaches a counter dict (`_sent`): every call
    adds to `_sent[peer] = [calls, payload bytes, KV bytes]`."""

    __slots__ = ("_actor", "_name", "_sent")

    def __init__(self, actor: Any, name: str) -> None:
        self._actor = actor
        self._name = name
        self._sent: dict[str, list[int]] | None = None

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)
        actor, peer = self._actor, self._name

        def call(*args: Any, **kwargs: Any) -> Any:
            # The call is sent now and the returned coroutine awaits its reply, so calls
            # made together and then awaited in turn travel concurrently (rack.router._all).
            sent = self._sent
            kv = method in KV_METHODS
            nbytes = 0
            if sent is not None or kv:
                nbytes = _payload_bytes(args) + (_payload_bytes(list(kwargs.values())) if kwargs else 0)
            _count_sent(sent, peer, method, nbytes)
            if kv and nbytes >= OFFLOAD_BYTES:
                # Sending a large payload copies it into the object store on the calling
                # thread: milliseconds during which this actor's due timers wait (measured
                # as the interconnect's lateness tail). Submitted from a helper thread, by
                # reference (`_StoredPayload`), the copy runs beside the event loop and
                # a forwarded payload is not copied again. KV calls are awaited at once
                # by their callers, so sending a little later reorders nothing.
                return _reply_offloaded(actor, method, args, kwargs, peer)
            return _reply(_send(actor, method, args, kwargs), peer, method)

        return call

    def __reduce__(self):
        return (ActorProxy, (self._actor, self._name))


def _count_sent(sent: dict | None, peer: str, method: str, nbytes: int) -> None:
    """Count one call to `peer` carrying `nbytes` of payload in `sent` (if counting)."""
    if sent is None:
        return
    c = sent.get(peer)
    if c is None:
        c = sent[peer] = [0, 0, 0]
    c[0] += 1
    c[1] += nbytes
    if method in KV_METHODS:
        c[2] += nbytes


_SUBMITTER: Any = None


def _submitter() -> Any:
    """One thread per process that submits large actor calls (one thread: they leave
    in the order they were made)."""
    global _SUBMITTER
    if _SUBMITTER is None:
        from concurrent.futures import ThreadPoolExecutor

        _SUBMITTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rack-kv-submit")
    return _SUBMITTER


class _StoredPayload:
    """A KV payload passed by reference: the call carries the ObjectRef, the bytes stay
    in the node's shared-memory object store, and the receiving host reads them back as
    zero-copy numpy views (`_resolve_payloads`). A payload forwarded unchanged (the
    interconnect handing the sender's frames to the decode engine) reuses the same
    reference, so its bytes are copied once per transfer, by the sender."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any) -> None:
        self.ref = ref


def _store_payloads(args: tuple) -> tuple:
    """`args` with each `KVFrames` replaced by a `_StoredPayload` (put now, or the
    reference it was read from if the frames are unchanged). Runs on the submitter thread."""
    from interconnect.codec import KVFrames

    if not any(isinstance(a, KVFrames) for a in args):
        return args
    out = []
    for a in args:
        if isinstance(a, KVFrames):
            ref = a.store_ref if a.store_ref is not None and a.intact() else None
            a = _StoredPayload(ref if ref is not None else _ray().put(a))
        out.append(a)
    return tuple(out)


async def _resolve_payloads(args: tuple) -> tuple:
    """`args` with each `_StoredPayload` read back from the object store (zero-copy)."""
    if not any(isinstance(a, _StoredPayload) for a in args):
        return args
    out = []
    for a in args:
        if isinstance(a, _StoredPayload):
            ref, a = a.ref, await a.ref
            if hasattr(a, "store_ref"):
                a.store_ref = ref
        out.append(a)
    return tuple(out)


async def _reply_offloaded(actor: Any, method: str, args: tuple, kwargs: dict, peer: str) -> Any:
    """`_reply` of a call sent from the submitter thread, its KV payloads by reference."""
    ref = await asyncio.get_running_loop().run_in_executor(
        _submitter(), lambda: _send(actor, method, _store_payloads(args), kwargs))
    return await _reply(ref, peer, method)


def _send(actor: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """Send one call to the component in `actor`: its ObjectRef, or the RayActorError
    sending raised (a dead peer; `_reply` turns it into PeerLost)."""
    try:
        return actor.call.remote(method, args, kwargs)
    except _ray().exceptions.RayActorError as exc:
        return exc


async def _reply(ref: Any, peer: str, method: str) -> Any:
    """The result of an actor call already sent (`ref`, or the error sending it raised)."""
    try:
        if isinstance(ref, BaseException):
            raise ref
        return await ref
    except _ray().exceptions.RayActorError as exc:
        # the peer's actor died or is being restarted: a component-level error
        # the components recover from (rack.faults, docs/robustness.md)
        raise PeerLost(f"{peer}.{method}: {type(exc).__name__}") from None


def _warm_payload() -> tuple:
    """One of each kind of object components send each other: a Request, a numpy array,
    a list of uint8 frames (docs/interfaces.md)."""
    from interconnect.codec import make_kv_frames
    from workloads.request import Request

    # The KV payload is over Ray's 100 KiB inline limit, so the first trip through the
    # shared-memory object store (~5 ms of wall time the first time a process uses it,
    # measured as one late timer of the interconnect at dilation 10) happens here too.
    return (Request(id=0, arrival_s=0.0, prompt_tokens=1, output_tokens=1),
            np.zeros(4, np.float64), make_kv_frames(0, 8, 35_136, 1, 1, 1.0))


class ComponentHost:
    """The body of every component actor: builds one component, forwards calls to it,
    and reports where it runs, its timer lateness and its message counts."""

    def __init__(self, name: str, registry: str | None = None) -> None:
        self.name = name
        self.obj: Any = None
        self.clock: Any = None
        self.failure: ComponentError | None = None   # the first error of this component
        self.calls_in = 0
        self.sent: dict[str, list[int]] = {}
        # Restart support (rack.faults): an engine's host keeps its build arguments in the
        # `registry` actor (named); when Ray restarts this actor (it re-runs __init__ with
        # the same arguments) the first call rebuilds the component from them.
        self._registry = registry
        self._kept: dict[str, tuple] = {}
        self._crashes: dict[str, float] = {}
        self._rebuilding: asyncio.Future | None = None
        self._restarted = False
        if registry is not None:
            import ray

            self._restarted = ray.get_runtime_context().was_current_actor_reconstructed

    async def warm(self, factory: str) -> dict:
        """Import the component's module (slow the first time in a fresh process) and
        say where this actor runs: {"node_id", "node_ip", "hostname", "pid"}."""
        from .placement import load_factory

        warm_up = getattr(load_factory(factory), "warm_up", None)
        if warm_up is not None:
            warm_up()
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    async def connect(self, peers: Sequence[Any]) -> None:
        """Call every peer actor in `peers` once, with a sample of what components send.

        The first call from one actor to another sets up the connection, and the first
        Request or array it carries makes the receiver import its module (~60-100 ms of
        wall time, measured): both happen here, before time 0, not in the replay."""
        sample = _warm_payload()
        await asyncio.gather(*(a.ping.remote(*sample) for a in peers))
        # Once more as KV payloads travel (`ActorProxy`): from the submitter thread, by
        # reference, read back at the peer: the thread's start and the first put and
        # fetch of the object store are paid here too.
        stored = await asyncio.get_running_loop().run_in_executor(_submitter(), _store_payloads, sample)
        await asyncio.gather(*(a.ping.remote(*stored) for a in peers))

    async def wall_time(self) -> float:
        """This host's wall clock (s since the Unix epoch), for clock-offset probes."""
        return time.time()

    async def build(self, spec: ComponentSpec, peers: dict[str, Any], epoch_wall: float,
                    dilation: float) -> dict:
        """Construct the component on a wall clock whose time 0 is `epoch_wall` (this
        host's clock). Returns {"node_id", "loop_type", "pid"} read inside the actor."""
        from .virtual import LoopClock

        for proxy in peers.values():
            if isinstance(proxy, ActorProxy):
                proxy._sent = self.sent
        loop = asyncio.get_running_loop()
        self.clock = LoopClock(loop, origin=epoch_wall, dilation=dilation, record_lateness=True,
                               wall_time=time.time)
        self.obj = construct(spec, self.clock, peers.__getitem__)
        self._watch_tasks(loop)
        import ray

        if self._registry is not None:      # for a rebuild after Ray restarts this actor
            await ray.get_actor(self._registry).keep.remote(self.name, (spec, peers, epoch_wall, dilation))
        # Everything built so far (Ray, numpy, the component) lives for the whole run:
        # moved out of the collector's generations, a full collection during the replay
        # no longer walks it (one took milliseconds, i.e. late timers).
        gc.collect()
        gc.freeze()

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "loop_type": type(loop).__module__ + "." + type(loop).__name__, "pid": os.getpid()}

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        self.calls_in += 1
        if self._restarted and self.obj is None:
            if self._rebuilding is None:
                self._rebuilding = asyncio.ensure_future(self._rebuild())
            await asyncio.shield(self._rebuilding)
        if method == "crash" and self._registry is not None:
            # fault injection: die for real; Ray restarts the actor (max_restarts). The
            # crash time is kept, so the rebuilt component reloads its weights from then
            # (not from whenever Ray has the new process up).
            import ray

            at = kwargs.get("at_s")
            await ray.get_actor(self._registry).keep_crash.remote(
                self.name, self.clock.now() if at is None else float(at))
            ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
            await asyncio.sleep(3600)
        if method in KV_METHODS:
            args = await _resolve_payloads(args)
        try:
            result = getattr(self.obj, method)(*args, **kwargs)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
        except PeerLost:
            raise                 # the protocol's own error: the caller handles it
        except Exception as exc:  # noqa: BLE001 - named here, once, for every caller
            raise self._note_failure(exc) from None
        return result

    def _note_failure(self, exc: BaseException) -> ComponentError:
        """`exc` as a ComponentError naming this component (unless it already names
        the one it came from, through a call to a peer), kept as this host's failure."""
        err = _component_error(exc)
        if err is None:
            _, request_id = locate(exc, {self.name: self.obj})
            err = ComponentError(self.name, self.clock.now() if self.clock else None, request_id, exc)
            err.remote_traceback = err.traceback_text()     # the traceback does not pickle
        if self.failure is None:
            self.failure = err
        return err

    def _watch_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep the first exception that ends one of the component's own background
        tasks (a coroutine of the component, or of the object a Restartable holds):
        nobody awaits those, and their requests would otherwise wait until the run
        times out. Ray's own tasks on this loop are left alone."""
        def factory(loop, coro, **kwargs):
            task = asyncio.Task(coro, loop=loop, **kwargs)
            frame = getattr(coro, "cr_frame", None)
            if frame is not None and id(frame.f_locals.get("self")) in owners({self.name: self.obj}):
                task.add_done_callback(self._task_ended)
            return task

        loop.set_task_factory(factory)

    def _task_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(), PeerLost):
            self._note_failure(task.exception())

    async def failed(self) -> ComponentError | None:
        """The first error of this component (or of a peer it called), or None."""
        return self.failure

    async def ping(self, *sample: Any) -> None:
        """A no-op call, to open the connection from a peer (and unpickle a sample of
        what peers send: a Request, KV frames, also by reference) before the replay starts."""
        await _resolve_payloads(sample)

    async def keep(self, name: str, build_args: tuple) -> None:
        """Registry role: keep `name`'s build arguments (spec, peers, epoch, dilation)."""
        self._kept[name] = build_args

    async def recall(self, name: str) -> tuple | None:
        """Registry role: the build arguments kept for `name` (None if none), with
        `loading_until_s` = its last crash time + `weight_load_s` when it crashed."""
        args = self._kept.get(name)
        crash = self._crashes.get(name)
        if args is None or crash is None or "weight_load_s" not in args[0].kwargs:
            return args
        spec = args[0]
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs,
                                                 "loading_until_s": crash + spec.kwargs["weight_load_s"]})
        return (spec, *args[1:])

    async def keep_crash(self, name: str, at_s: float) -> None:
        """Registry role: `name` crashed at emulated time `at_s`."""
        self._crashes[name] = at_s

    async def _rebuild(self) -> None:
        import ray

        args = await ray.get_actor(self._registry).recall.remote(self.name)
        if args is None:
            raise RayRunError(f"component {self.name!r} restarted but its build arguments were not kept")
        await self.build(*args)

    async def lateness(self) -> list[float]:
        return list(self.clock.lateness) if self.clock is not None else []

    async def report(self) -> dict:
        """{"lateness": [emulated s], "calls_in": n, "sent": {peer: {"calls", "bytes", "kv_bytes"}}}."""
        return {"lateness": await self.lateness(), "calls_in": self.calls_in,
                "sent": {p: {"calls": c[0], "bytes": c[1], "kv_bytes": c[2]} for p, c in self.sent.items()}}


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
        nodes = _ray().nodes()
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
                     think_time_s: float = 0.0) -> dict:
    """Place one actor per component, replay `requests`, and gather the records.

    max_concurrency, think_time_s: closed-loop replay (`rack.router.Router.run`).

    Returns the same dict as `run_topology_virtual` plus "loop_type", "nodes"
    (component -> Ray node id, read inside each actor) and "ray": {"actors": {name:
    {"node_id", "node_ip", "pid", "calls_in", "calls_in_per_s", "calls_out",
    "calls_out_per_s", "sent": {peer: {"calls", "bytes", "kv_bytes"}}}}, "cross_node":
    {"kv_bytes", "kv_bytes_all_hops", "payload_bytes", "calls", "calls_all"},
    "replay_wall_s", "clock": {"epoch_wall", "hosts": {ip: {"offset_s", "rtt_s",
    "corrected"}}}, "pools": {pool: placement}}. Bytes are the bytes handed to Ray (KV
    frames at `payload_scale`), summed over the hops prefill -> interconnect -> decode.
    Raises RayRunError on a missing resource or a timeout (startup_timeout_s: actors
    started; placement_timeout_s: placement groups; timeout_s: the replay, default
    600 s + 4 x the arrival span x dilation). Actors and placement groups are removed
    at the end; Ray itself keeps running (the caller owns it).
    """
    ray = _ray()
    ensure_ray(address)
    check_resources(specs)
    Host = ray.remote(ComponentHost)
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
            elif spec.kind in ("prefill", "decode", "both"):
                opts["max_restarts"] = 4        # an engine that dies is restarted (rack.faults)
                registry = registry_name
            actors[spec.name] = Host.options(**opts).remote(spec.name, registry)
        proxies = {name: ActorProxy(a, name) for name, a in actors.items()}
        span = max((r.arrival_s for r in requests), default=0.0)
        infos = _wait_started(ray, actors, specs, startup_timeout_s)
        ray.get([actors[s.name].connect.remote([actors[n] for n in sorted(s.refs())]) for s in specs],
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

        built = ray.get([actors[s.name].build.remote(s, proxies, local_epoch(s.name), dilation) for s in specs],
                        timeout=startup_timeout_s)
        nodes = {s.name: b["node_id"] for s, b in zip(specs, built)}
        loop_types = {b["loop_type"] for b in built}
        if time.time() > epoch:
            raise RayRunError(f"building the {len(specs)} components took {time.time() - epoch + slack:.1f} s, "
                              f"past time 0 set {slack:.1f} s ahead (an overloaded host?); retry")
        limit = timeout_s if timeout_s is not None else 600.0 + 4.0 * span * dilation
        deadline = time.time() + limit
        router_ref = actors["router"].call.remote("run", (list(requests),), {
            "max_concurrency": max_concurrency, "think_time_s": think_time_s})
        done_ref = actors["collector"].call.remote("wait_all", (), {})
        engine_names = [s.name for s in specs if s.kind in ("prefill", "decode", "both", "interconnect")]
        try:
            _wait_with_progress(ray, actors, done_ref, router_ref, len(requests), deadline, progress)
            replay_wall = time.time() - epoch
            router_counts = ray.get(router_ref, timeout=max(1.0, deadline - time.time()))
            ray.get([actors[n].call.remote("drain", (), {}) for n in engine_names], timeout=60)
            stats = dict(zip(engine_names, ray.get(
                [actors[n].call.remote("stats", (), {}) for n in engine_names], timeout=60)))
        except ray.exceptions.RayTaskError as exc:
            err = _component_error(exc)
            if err is None:
                raise
            err.partial = _partial(ray, actors, engine_names, epoch, dilation)
            raise err from None
        except ComponentError as err:
            err.partial = _partial(ray, actors, engine_names, epoch, dilation)
            raise
        snapshot = ray.get(actors["collector"].call.remote("snapshot", (), {}), timeout=60)
        reports = dict(zip([s.name for s in specs],
                           ray.get([actors[s.name].report.remote() for s in specs], timeout=60)))
        now = (time.time() - epoch) / dilation
        return {"snapshot": snapshot, "stats": stats, "router": router_counts,
                "lateness": {n: r["lateness"] for n, r in reports.items()},
                "now": now, "loop_type": ",".join(sorted(loop_types)), "nodes": nodes,
                "ray": _ray_section(specs, infos, nodes, reports, replay_wall, epoch, hosts, pools)}
    except ray.exceptions.GetTimeoutError as exc:
        raise RayRunError(f"Ray run timed out: {exc}") from None
    finally:
        for a in actors.values():
            try:
                ray.kill(a)
            except Exception:
                pass
        for pg in groups:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:
                pass


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
                          "calls_out_per_s": per_s(calls_out), "sent": r["sent"]}
        for peer, v in r["sent"].items():
            cross["kv_bytes_all_hops"] += v["kv_bytes"]
            cross["calls_all"] += v["calls"]
            if nodes.get(peer) != nodes[s.name]:
                cross["kv_bytes"] += v["kv_bytes"]
                cross["payload_bytes"] += v["bytes"]
                cross["calls"] += v["calls"]
    return {"actors": actors, "cross_node": cross, "replay_wall_s": replay_wall,
            "clock": {"epoch_wall": epoch, "hosts": hosts}, "pools": pools}


def _component_error(exc: BaseException) -> ComponentError | None:
    """The ComponentError `exc` is or wraps (a RayTaskError of a call to a host that
    named its component), with the remote traceback kept for the error log; else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ComponentError):
            err = ComponentError(exc.component, exc.t_s, exc.request_id, exc.cause)
            err.remote_traceback = getattr(exc, "remote_traceback", None)
            return err
        exc = getattr(exc, "cause", None) or exc.__cause__
        seen += 1
    return None


def _first_failure(ray, actors: dict[str, Any]) -> ComponentError | None:
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


def _partial(ray, actors: dict[str, Any], engine_names: Sequence[str], epoch: float, dilation: float) -> dict | None:
    """What the components measured until a failure (best effort, short timeouts): the
    collector's records and every engine's stats that can still be read."""
    try:
        snapshot = ray.get(actors["collector"].call.remote("snapshot", (), {}), timeout=30)
    except Exception:  # noqa: BLE001 - nothing to salvage
        return None
    stats, missing = {}, []
    for n in engine_names:
        try:
            stats[n] = ray.get(actors[n].call.remote("stats", (), {}), timeout=30)
        except Exception:  # noqa: BLE001 - e.g. the engine that failed
            missing.append(n)
    return {"snapshot": snapshot, "stats": stats, "stats_missing": missing, "router": {}, "lateness": {},
            "now": (time.time() - epoch) / dilation, "loop_type": "ray"}


def _wait_with_progress(ray, actors: dict[str, Any], done_ref, router_ref, total: int, deadline: float,
                        progress: bool) -> None:
    """Wait until every request ended (`done_ref`); raise the first component failure
    as soon as a host reports one (polled every `_FAILURE_POLL_S`), and RayRunError
    naming the open requests at `deadline`."""
    collector = actors["collector"]
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), transient=True)
        bar.start()
        task = bar.add_task("requests ended", total=total)
    next_poll = time.time() + _FAILURE_POLL_S
    waits = [done_ref, router_ref]
    try:
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                failure = _first_failure(ray, actors)
                if failure is not None:
                    raise failure
                open_ids = ray.get(collector.call.remote("open_requests", (), {}), timeout=30)
                raise RayRunError(f"Ray run did not finish in time: {len(open_ids)} request(s) "
                                  f"still open, e.g. {open_ids[:10]}")
            ready, _ = ray.wait(waits, num_returns=1, timeout=min(0.5, remaining))
            if router_ref in ready:
                ray.get(router_ref, timeout=30)       # raises if the router failed
                waits = [done_ref]
            if bar is not None:
                n_open = len(ray.get(collector.call.remote("open_requests", (), {}), timeout=30))
                bar.update(task, completed=total - n_open)
            if done_ref in ready:
                ray.get(done_ref, timeout=30)
                return
            if time.time() >= next_poll:
                failure = _first_failure(ray, actors)
                if failure is not None:
                    raise failure
                next_poll = time.time() + _FAILURE_POLL_S
    finally:
        if bar is not None:
            bar.stop()


_FAILURE_POLL_S = 1.0
"""Wall seconds between two checks for a component failure while a Ray run waits."""


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
    ray = _ray()
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
