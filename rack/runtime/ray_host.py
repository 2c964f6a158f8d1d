"""The Ray driver's actor: one async Ray actor per core, on a dilated wall clock.

`CoreHost` builds its core (`workloads.core`) from a `ComponentSpec` and drives it:

- **messages**: `deliver_many([(method, args), ...])` (from a peer) or `deliver(method,
  args)` (from the driver) calls the core's handlers with the emulated time now; what
  the core then leaves in its outbox is sent on, fire and forget, the messages to one
  destination in one `deliver_many` call (a `BROADCAST` goes to every other host). A
  message that cannot be delivered (the destination's actor died or is restarting)
  comes back to the core as `send_failed(dst, method, args)` if it has that handler;
- **timers**: the core's `wake_at` is armed on the event loop; when it fires,
  `on_wake(now)` runs and the lateness (now - wake_at, emulated seconds) is recorded.
  Emulated t = (wall - epoch) / dilation, read fresh at every use (uvloop caches its
  clock per loop iteration). Timers are armed for 90% of a long wait and re-armed for
  the rest, and the last `SPIN_S` of wall time before a deadline are waited by yielding
  to the loop: uvloop's timers have millisecond granularity;
- **driver reads** (`query`): the driver calls a core's read methods (`stats(now)`,
  `snapshot()`, `all_ended()`, `is_idle()`, ...) directly, never during a handler;
- **halt** (`halt()`, an interrupted run): the core gets no message or timer any more
  and its emulated clock stops, so the driver reads a consistent state;
- **process-level messages**: `crash(at_s)` kills the actor for real (Ray restarts it;
  the restarted host rebuilds its core from the build arguments kept in the registry
  actor, reloading its weights from at_s + `ComponentSpec.weight_load_s`: the restart's
  own wall time is not counted), and `ping(reply_to, tag)` replies `pong(tag,
  {"incarnation": pid, "work": work counters})`;
- **health** (`health()`, the driver's liveness probe, `rack.runtime.ray_runtime`): the
  process id, the core's failure if any and the emulated time. A restarted host first
  tells the registry (`note_restart`), which tells an injected crash (recorded by
  `keep_crash` before the kill) from a real death: the registry keeps the real ones
  (`deaths`, in its own `health()` answer) with the emulated time of the restart, from
  which the restarted core reloads its weights, as after an injected crash.

Large KV payloads (`transfer`, `receive_kv`) are sent from a helper thread by
object-store reference: the sender's copy into shared memory runs beside its event
loop, the receiver reads zero-copy views, and the interconnect forwards the sender's
reference without copying the bytes again.

A handler that raises is kept as this host's `ComponentError` (the driver polls
`failed()` and stops the run) and the core is not called again.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import socket
import time
import uuid
from typing import Any, Sequence

import numpy as np

from rack.wiring.topology import ComponentSpec
from workloads.core import BROADCAST

from .errors import ComponentError, RayRunError, locate
from .placement import construct, load_factory
from .ray_order import InOrder, Outgoing
from .virtual import work_of

#: Messages whose array arguments are KV frames (the prefill engine sends
#: `transfer(req, frames, ...)` to the interconnect, which sends `receive_kv(req,
#: frames, ...)` to the decode engine).
KV_METHODS = frozenset({"transfer", "receive_kv"})
#: KV messages carrying at least this many payload bytes are sent from a helper thread
#: by object-store reference; Ray inlines arguments under 100 KiB into the call itself.
OFFLOAD_BYTES = 96 << 10
SPIN_S = 0.001
"""Wall seconds before a deadline from which a host stops using loop timers and
yields to the loop until the deadline (module docstring)."""


def ray_api():
    """The `ray` module, imported on first use (so that importing rack.runtime never
    starts or needs Ray), with usage stats and token auth off unless the user set them."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    return ray


def payload_bytes(values: Sequence[Any]) -> int:
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
            n += payload_bytes(v)
    return n


_SUBMITTER: Any = None


def _submitter() -> Any:
    """One thread per process that submits large KV messages (one thread: they leave
    in the order they were made)."""
    global _SUBMITTER
    if _SUBMITTER is None:
        from concurrent.futures import ThreadPoolExecutor

        _SUBMITTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rack-kv-submit")
    return _SUBMITTER


class _StoredPayload:
    """A KV payload passed by reference: the message carries the ObjectRef, the bytes
    stay in the node's shared-memory object store, and the receiving host reads them
    back as zero-copy numpy views (`_resolve_payloads`). A payload forwarded unchanged
    (the interconnect handing the sender's frames to the decode engine) reuses the same
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
            a = _StoredPayload(ref if ref is not None else ray_api().put(a))
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


def warm_payload() -> tuple:
    """One of each kind of object cores send each other: a Request, a numpy array, a
    list of uint8 frames (their first trips through pickling and the object store are
    paid before time 0)."""
    from interconnect.codec import make_kv_frames
    from workloads.request import Request

    return (Request(id=0, arrival_s=0.0, prompt_tokens=1, output_tokens=1),
            np.zeros(4, np.float64), make_kv_frames(0, 8, 35_136, 1, 1, 1.0))


class CoreHost:
    """The body of every actor: builds one core, delivers its messages and wake-ups,
    and reports where it runs, its lateness and its message counts (module docstring).

    name: the core's name; registry: the name of the actor that keeps build arguments
    and crash times for restarts (None: not restartable)."""

    def __init__(self, name: str, registry: str | None = None) -> None:
        self.name = name
        self.core: Any = None
        self.peers: dict[str, Any] = {}
        self.failure: ComponentError | None = None   # the first error of this core
        self.calls_in = 0
        self.sent: dict[str, list[int]] = {}
        # per-peer FIFO (rack.runtime.ray_order): this process's calls are numbered per
        # destination under an id of this incarnation (a restarted actor is a new sender)
        self._incarnation = uuid.uuid4().hex
        self._out: dict[str, Outgoing] = {}
        self._in = InOrder()
        self.lateness: list[float] = []
        self._epoch = 0.0
        self._dilation = 1.0
        self._timer: asyncio.Handle | None = None
        self._armed = math.inf
        self._registry = registry
        self._kept: dict[str, tuple] = {}
        self._crashes: dict[str, float] = {}
        self._crash_counts: dict[str, int] = {}
        self._rebuilding: asyncio.Future | None = None
        self._announcing: asyncio.Future | None = None
        self._halted_at: float | None = None   # emulated s when the driver stopped the run
        self._restarted = False
        self._dying = False
        # registry role: injected crashes not yet matched by a restart, each host's last
        # process id, and the real deaths seen (restarts no injected crash explains)
        self._injected_pending: dict[str, int] = {}
        self._pids: dict[str, int] = {}
        self._deaths: list[dict] = []
        if registry is not None:
            self._restarted = ray_api().get_runtime_context().was_current_actor_reconstructed

    # ------------------------------------------------------------------ setup
    async def warm(self, factory: str) -> dict:
        """Import the core's module (slow the first time in a fresh process) and say
        where this actor runs: {"node_id", "node_ip", "hostname", "pid"}."""
        warm_up = getattr(load_factory(factory), "warm_up", None)
        if warm_up is not None:
            warm_up()
        ray = ray_api()
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    async def connect(self, peers: Sequence[Any]) -> None:
        """Message every peer actor in `peers` once with a sample of what cores send,
        directly and by object-store reference: the connections, the receivers'
        imports and the object store's first use happen here, before time 0."""
        sample = warm_payload()
        await asyncio.gather(*(a.ping_host.remote(*sample) for a in peers))
        stored = await asyncio.get_running_loop().run_in_executor(_submitter(), _store_payloads, sample)
        await asyncio.gather(*(a.ping_host.remote(*stored) for a in peers))
        # the first call of an actor method through a handle costs milliseconds (measured:
        # 3-4.5 ms, the lateness of a prefill engine's first iteration); peers' messages
        # all travel as `deliver_many`, first used here
        await asyncio.gather(*(a.deliver_many.remote([]) for a in peers))

    async def ping_host(self, *sample: Any) -> None:
        """A no-op call (see `connect`)."""
        await _resolve_payloads(sample)

    async def wall_time(self) -> float:
        """This host's wall clock (s since the Unix epoch), for clock-offset probes."""
        return time.time()

    async def build(self, spec: ComponentSpec, peers: dict[str, Any], epoch_wall: float,
                    dilation: float, loading_until_s: float | None = None) -> dict:
        """Build the core on a wall clock whose time 0 is `epoch_wall` (this host's
        clock); `peers`: every actor by core name. Returns {"node_id", "loop_type",
        "pid"} read inside the actor."""
        self.peers = dict(peers)
        self._epoch, self._dilation = epoch_wall, dilation
        self.core = construct(spec, loading_until_s)
        ray = ray_api()
        if self._registry is not None:      # for a rebuild after Ray restarts this actor
            await ray.get_actor(self._registry).keep.remote(self.name, (spec, peers, epoch_wall, dilation),
                                                            os.getpid())
        self._after()
        # Everything built so far (Ray, numpy, the core) lives for the whole run: moved
        # out of the collector's generations, a full collection during the replay no
        # longer walks it (one took milliseconds, i.e. late timers).
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "loop_type": type(loop).__module__ + "." + type(loop).__name__, "pid": os.getpid()}

    def now(self) -> float:
        """Emulated seconds now (frozen at the halt once `halt` was called)."""
        if self._halted_at is not None:
            return self._halted_at
        return (time.time() - self._epoch) / self._dilation

    async def health(self) -> dict:
        """The driver's liveness probe: {"pid", "failure" (this core's ComponentError or
        None), "t_s" (emulated s now), "deaths" (registry role: the real deaths seen,
        `note_restart`)}. A restarted host first reports its restart to the registry."""
        if self._restarted:
            await self._announce()
        return {"pid": os.getpid(), "failure": self.failure, "t_s": self.now(), "deaths": list(self._deaths)}

    async def _announce(self) -> None:
        """Once per restarted process: tell the registry (`note_restart`)."""
        if self._announcing is None:
            self._announcing = asyncio.ensure_future(
                ray_api().get_actor(self._registry).note_restart.remote(self.name, os.getpid()))
        await asyncio.shield(self._announcing)

    async def halt(self) -> float:
        """Stop the core where it is (an interrupted run, `rack.runtime.interrupt`): no
        message or timer reaches it any more and its reads answer as of this moment.
        Returns that emulated time."""
        if self._halted_at is None:
            self._halted_at = self.now()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return self._halted_at

    # ------------------------------------------------------------------ messages
    async def deliver(self, method: str, args: tuple) -> None:
        """One message for this host's core (the driver's; peers use `deliver_many`)."""
        await self.deliver_many([(method, args)])

    async def deliver_many(self, messages: list, sender: str | None = None, incarnation: str = "",
                           seq: int = 0, low: int = 0) -> None:
        """Messages [(method, args), ...] a peer sent this core in one turn (one Ray call
        per destination and turn, `_after`): handled in order, as `deliver` would, and
        what the core sends meanwhile leaves after the last of them. A peer's calls
        (`sender` given: its incarnation, the call's number and the low-water mark,
        `rack.runtime.ray_order`) are handled in the order it made them."""
        stream = None if sender is None else await self._in.turn(sender, incarnation, seq, low)
        try:
            ran = False
            for method, args in messages:
                ran = await self._take(method, args) or ran
            if ran and self.failure is None:
                self._after()
        finally:
            if stream is not None:
                self._in.done(stream, seq)

    async def _take(self, method: str, args: tuple) -> bool:
        """Hand one message to the core; True when a handler ran (its sends are due)."""
        self.calls_in += 1
        if self._halted_at is not None:
            return False
        if self._restarted and self.core is None:
            if self._rebuilding is None:
                self._rebuilding = asyncio.ensure_future(self._rebuild())
            await asyncio.shield(self._rebuilding)
        if self._dying:
            # killed already: a message that reaches this process now (e.g. the injector's
            # ping right behind the crash) must fail with it, not be answered by the old
            # incarnation while the crash is being recorded
            await asyncio.sleep(3600)
        if method == "crash" and self._registry is not None:
            self._dying = True
            at = args[0] if args else None
            await ray_api().get_actor(self._registry).keep_crash.remote(self.name, self.now() if at is None else float(at))
            ray_api().kill(ray_api().get_runtime_context().current_actor, no_restart=False)
            await asyncio.sleep(3600)
        if method == "ping":
            reply_to, tag = args
            self._send(reply_to, "pong", (tag, {"incarnation": os.getpid(),
                                                "work": work_of(self.core, self.now())}))
            return False
        if method in KV_METHODS:
            args = await _resolve_payloads(args)
        if self.failure is not None:
            return False
        handler = getattr(self.core, method, None)
        if handler is None:
            return False      # e.g. a broadcast this core does not handle
        try:
            handler(self.now(), *args)
        except Exception as exc:  # noqa: BLE001 - named here, once, for the driver
            self._fail(exc)
            return False
        return True

    def _after(self) -> None:
        """Send what the core left in its outbox and arm its wake-up. The messages to one
        destination go in one Ray call (`deliver_many`), in the order they were sent:
        submitting an actor call costs ~0.3-2 ms of this process's event loop on a
        shared 2-core host (measured per call), during which its timers wait."""
        core = self.core
        if core.outbox:
            out = list(core.outbox)
            core.outbox.clear()
            by_dst: dict[str, list] = {}
            for dst, method, args in out:
                if dst[0] == BROADCAST:         # to every other core
                    for name in self.peers:
                        if name != self.name:
                            by_dst.setdefault(name, []).append((method, args))
                else:
                    by_dst.setdefault(dst, []).append((method, args))
            for dst, messages in by_dst.items():
                self._send_many(dst, messages)
        self._arm(core.wake_at)

    def _send(self, dst: str, method: str, args: tuple) -> None:
        """Send one message to core `dst` (see `_send_many`)."""
        self._send_many(dst, [(method, args)])

    def _send_many(self, dst: str, messages: list) -> None:
        """Send `messages` [(method, args)] to core `dst`, counted one by one, in order:
        KV payloads of OFFLOAD_BYTES or more each in a call of its own from the
        submitter thread by object-store reference, the runs of other messages between
        them each in one `deliver_many` call. Every call is numbered for the receiver's
        FIFO (`rack.runtime.ray_order`)."""
        c = self.sent.get(dst)
        if c is None:
            c = self.sent[dst] = [0, 0, 0]
        inline: list = []
        for method, args in messages:
            nbytes = payload_bytes(args)
            c[0] += 1
            c[1] += nbytes
            if method in KV_METHODS:
                c[2] += nbytes
                if nbytes >= OFFLOAD_BYTES:
                    if inline:
                        self._call(dst, inline)
                        inline = []
                    self._call(dst, [(method, args)], offload=True)
                    continue
            inline.append((method, args))
        if inline:
            self._call(dst, inline)

    def _call(self, dst: str, messages: list, offload: bool = False) -> None:
        """One numbered `deliver_many` call to `dst` (from the submitter thread, its KV
        payloads put in the object store there, when `offload`)."""
        actor = self.peers[dst]
        out = self._out.get(dst)
        if out is None:
            out = self._out[dst] = Outgoing()
        seq, low = out.stamp(empty=not messages)
        stamp = (self.name, self._incarnation, seq, low)
        if offload:
            (method, args), = messages
            fut = asyncio.get_running_loop().run_in_executor(
                _submitter(), lambda: actor.deliver_many.remote([(method, _store_payloads(args))], *stamp))
            asyncio.ensure_future(self._watch_offloaded(fut, dst, messages, seq))
            return
        try:
            ref = actor.deliver_many.remote(messages, *stamp)
        except ray_api().exceptions.RayActorError:
            self._settle(dst, seq, messages, failed=True)
            return
        asyncio.ensure_future(self._watch(ref, dst, messages, seq))

    async def _watch_offloaded(self, fut, dst: str, messages: list, seq: int) -> None:
        try:
            ref = await fut
        except ray_api().exceptions.RayActorError:
            self._settle(dst, seq, messages, failed=True)
            return
        await self._watch(ref, dst, messages, seq)

    async def _watch(self, ref, dst: str, messages: list, seq: int) -> None:
        """The delivery of one call; a dead destination makes its messages `send_failed`."""
        ray = ray_api()
        try:
            await ref
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            self._settle(dst, seq, messages, failed=True)
            return
        except Exception:  # noqa: BLE001 - the destination's own failure: its host reports it
            pass
        self._settle(dst, seq, messages, failed=False)

    def _settle(self, dst: str, seq: int, messages: list, failed: bool) -> None:
        """Call `seq` to `dst` answered or failed. A failed one's messages come back to
        the core (`send_failed`); if later calls are still open, an empty call follows,
        whose low-water mark lets the receiver's next incarnation go on past it."""
        if self._out[dst].done(seq, failed):
            self._call(dst, [])
        if failed:
            self._failed_sends(dst, messages)

    def _failed_sends(self, dst: str, messages: list) -> None:
        for method, args in messages:
            self._failed_send(dst, method, args)

    def _failed_send(self, dst: str, method: str, args: tuple) -> None:
        handler = getattr(self.core, "send_failed", None)
        if handler is None or self.failure is not None or self._halted_at is not None:
            return
        try:
            handler(self.now(), dst, method, args)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return
        self._after()

    # ------------------------------------------------------------------ timers
    def _arm(self, t: float) -> None:
        if t == self._armed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed = t
        if t < math.inf:
            self._schedule(t)

    def _schedule(self, t: float) -> None:
        loop = asyncio.get_running_loop()
        delay = self._epoch + t * self._dilation - time.time()
        if delay <= SPIN_S:
            # the final approach: yield to the loop and look at the clock again
            self._timer = loop.call_soon(self._fire, t)
            return
        delay -= SPIN_S
        if delay > 0.005:
            delay *= 0.9          # long timers were seen firing late: re-arm for the rest
        self._timer = loop.call_later(delay, self._fire, t)

    def _fire(self, t: float) -> None:
        self._timer = None
        if t != self._armed or self._halted_at is not None:
            return
        now = self.now()
        if now < t:
            self._schedule(t)
            return
        self._armed = math.inf
        self.lateness.append(now - t)
        if self.failure is not None:
            return
        try:
            self.core.on_wake(now)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return
        self._after()

    # ------------------------------------------------------------------ failures, reads
    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            _, request_id = locate(exc, {self.name: self.core})
            err = ComponentError(self.name, self.now(), request_id, exc)
            err.remote_traceback = err.traceback_text()     # the traceback does not pickle
            self.failure = err

    async def failed(self) -> ComponentError | None:
        """The first error of this core, or None."""
        return self.failure

    async def query(self, method: str, *args: Any) -> Any:
        """A driver read of the core (`stats` gets the emulated time now first)."""
        if self._restarted and self.core is None:
            if self._rebuilding is None:
                self._rebuilding = asyncio.ensure_future(self._rebuild())
            await asyncio.shield(self._rebuilding)
        if method == "stats":
            return self.core.stats(self.now())
        return getattr(self.core, method)(*args)

    async def report(self) -> dict:
        """{"lateness": [emulated s], "calls_in": n, "calls_held": calls from peers that
        arrived before an earlier one and waited for it (`rack.runtime.ray_order`),
        "sent": {peer: {"calls", "bytes", "kv_bytes"}}}."""
        return {"lateness": list(self.lateness), "calls_in": self.calls_in, "calls_held": self._in.held,
                "sent": {p: {"calls": c[0], "bytes": c[1], "kv_bytes": c[2]} for p, c in self.sent.items()}}

    # ------------------------------------------------------------------ registry role
    async def keep(self, name: str, build_args: tuple, pid: int | None = None) -> None:
        """Registry role: keep `name`'s build arguments (spec, peers, epoch, dilation) and
        the process id of the host that built it."""
        self._kept[name] = build_args
        if pid is not None:
            self._pids[name] = pid

    async def keep_crash(self, name: str, at_s: float) -> None:
        """Registry role: `name` crashed at emulated time `at_s` (an injected crash, told
        before the kill: the restart that follows is its)."""
        self._crashes[name] = at_s
        self._crash_counts[name] = self._crash_counts.get(name, 0) + 1
        self._injected_pending[name] = self._injected_pending.get(name, 0) + 1

    async def note_restart(self, name: str, pid: int) -> bool:
        """Registry role: `name`'s actor was restarted, now as process `pid`. True when an
        injected crash explains it; otherwise it died for real: the death is kept
        (`deaths`: {"instance", "t_s", "pid_before", "pid"}, t_s the emulated time now),
        counted among its restarts, and its restarted core reloads its weights from now
        (`recall`), as after an injected crash."""
        before = self._pids.get(name)
        self._pids[name] = pid
        if self._injected_pending.get(name, 0) > 0:
            self._injected_pending[name] -= 1
            return True
        now = self.now()
        self._deaths.append({"instance": name, "t_s": now, "pid_before": before, "pid": pid})
        self._crashes[name] = now
        self._crash_counts[name] = self._crash_counts.get(name, 0) + 1
        return False

    async def crash_counts(self) -> dict[str, int]:
        """Registry role: crashes per component (its restarts)."""
        return dict(self._crash_counts)

    async def recall(self, name: str) -> tuple | None:
        """Registry role: `name`'s build arguments (None if none), with the time its
        restarted core serves from (its last crash + `weight_load_s`)."""
        args = self._kept.get(name)
        if args is None:
            return None
        spec = args[0]
        crash = self._crashes.get(name)
        until = crash + spec.weight_load_s if crash is not None and spec.weight_load_s is not None else None
        return (*args, until)

    async def _rebuild(self) -> None:
        await self._announce()          # first: a real death sets the time it reloads from
        args = await ray_api().get_actor(self._registry).recall.remote(self.name)
        if args is None:
            raise RayRunError(f"component {self.name!r} restarted but its build arguments were not kept")
        await self.build(*args)


__all__ = ["CoreHost", "KV_METHODS", "OFFLOAD_BYTES", "SPIN_S", "payload_bytes", "warm_payload"]
