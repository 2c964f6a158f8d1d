"""`Interconnect`: the throttled KV link between prefill and decode, as an async component.

A transfer of F frames carrying B logical bytes from `src` to `dst`:

1. waits F x per_message_s of the route (sender's per-message work; link stays free);
2. enters the shared `FairShareNetwork` as a flow of B bytes and waits (on an
   asyncio.Event, through the clock) until its last byte has crossed the route's links
   at its max-min fair rate, which changes whenever other flows start or drain or a
   link is degraded or flapped;
3. waits the route's propagation latency;
4. hands the frames to the receiver, `await receivers[dst].receive_kv(req, frames,
   first_token_s)`, which verifies every frame and returns the number of bad ones.

The formula and the sources of link figures are in `interconnect.link`. One driver
coroutine advances the network from event to event (a flow start or drain, a capacity
change) and wakes the transfers whose bytes have drained: the work is O(events), never
O(bytes). The network model runs on model time (the exact event times), so host
lateness on the wall-clock runtime delays wake-ups but does not change the modelled
transfer times; on a virtual-time loop the run is deterministic.

The component reads time only through its `clock` and never imports Ray.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Sequence

import numpy as np

from interconnect.codec import FrameError, corrupt_frame, payload_size, scan_kv_frames
from interconnect.link import FairShareNetwork, LinkSpec, PathCost, path_cost

if TYPE_CHECKING:
    from workloads.clock import Clock
    from workloads.request import Request

__all__ = ["Interconnect", "InterconnectConfigError", "PeerLost", "TransferError", "TransferResult"]


class InterconnectConfigError(ValueError):
    """The links, routes or receivers given to `Interconnect` do not fit together."""


class TransferError(ValueError):
    """A transfer request is inconsistent (unknown route, frames that disagree with the
    stated logical size, the request or the payload scale)."""


class PeerLost(RuntimeError):
    """A peer component lost the state a call relied on: it died (on Ray: its actor was
    killed or is restarting) or restarted since (a fresh instance without the request's
    reservation). The caller may recover (re-send, re-prefill) or end the request; see
    docs/robustness.md. The runtimes raise it for a call to a dead peer."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """Outcome of one `Interconnect.transfer`. Times are emulated seconds.

    start_s: transfer() was called; wire_start_s: bytes began to cross (after the
    per-message overhead); wire_end_s: last byte left the route's links; end_s: last
    byte arrived (wire_end_s + latency), when the receiver was called.
    logical_bytes: bytes charged to the links; payload_bytes: bytes actually shipped
    (sum of frame sizes, headers included); bad_frames: frames the receiver rejected.
    """

    request_id: int
    src: str
    dst: str
    path: tuple[str, ...]
    start_s: float
    wire_start_s: float
    wire_end_s: float
    end_s: float
    n_frames: int
    logical_bytes: int
    payload_bytes: int
    bad_frames: int

    @property
    def duration_s(self) -> float:
        """end_s - start_s."""
        return self.end_s - self.start_s


class Interconnect:
    """The throttled KV interconnect component.

    clock: a `workloads.clock.Clock`.
    links: the links (unique names; `LinkSpec`).
    routes: (src endpoint, dst endpoint) -> path, a non-empty list of link names,
        each link at most once.
    receivers: dst endpoint -> handle with `async receive_kv(req, frames,
        first_token_s) -> int` (number of bad frames); every route's dst must be here.
    payload_scale: fraction of logical KV bytes the senders ship, in (0, 1]; frames
        whose body size disagrees with it are rejected (TransferError).
    Raises InterconnectConfigError naming the bad route, link or endpoint.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        links: Sequence[LinkSpec],
        routes: Mapping[tuple[str, str], Sequence[str]],
        receivers: Mapping[str, Any],
        payload_scale: float,
    ) -> None:
        specs = list(links)
        if not specs:
            raise InterconnectConfigError("Interconnect needs at least one link")
        by_name: dict[str, LinkSpec] = {}
        for spec in specs:
            if not isinstance(spec, LinkSpec):
                raise InterconnectConfigError(f"links: expected LinkSpec objects, got {type(spec).__name__}")
            if spec.name in by_name:
                raise InterconnectConfigError(f"links: duplicate link name {spec.name!r}")
            by_name[spec.name] = spec
        if not isinstance(payload_scale, (int, float)) or not (0.0 < payload_scale <= 1.0):
            raise InterconnectConfigError(f"payload_scale must be in (0, 1], got {payload_scale!r}")
        self._routes: dict[tuple[str, str], tuple[str, ...]] = {}
        self._costs: dict[tuple[str, str], PathCost] = {}
        for key, path in routes.items():
            if not (isinstance(key, (tuple, list)) and len(key) == 2 and all(isinstance(k, str) for k in key)):
                raise InterconnectConfigError(f"routes: key {key!r} must be a (src, dst) pair of endpoint names")
            src, dst = key
            path = tuple(path)
            where = f"route {src!r} -> {dst!r}"
            if not path:
                raise InterconnectConfigError(f"{where}: empty path")
            unknown = [name for name in path if name not in by_name]
            if unknown:
                raise InterconnectConfigError(f"{where}: unknown link(s) {unknown}; known links: {sorted(by_name)}")
            if len(set(path)) != len(path):
                raise InterconnectConfigError(f"{where}: path {list(path)} uses a link twice")
            if dst not in receivers:
                raise InterconnectConfigError(
                    f"{where}: no receiver for endpoint {dst!r}; receivers: {sorted(receivers)}"
                )
            self._routes[(src, dst)] = path
            self._costs[(src, dst)] = path_cost([by_name[name] for name in path])
        self._clock = clock
        self._specs = by_name
        self._receivers = dict(receivers)
        self.payload_scale = float(payload_scale)
        self._t0 = clock.now()
        self._net = FairShareNetwork(specs, t0=self._t0)
        self._waiters: dict[int, asyncio.Event] = {}
        self._drained: dict[int, float] = {}
        self._next_fid = 0
        self._wake = asyncio.Event()
        self._driver: asyncio.Future | None = None
        self._driver_error: BaseException | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # accounting
        self._link_transfers = {name: 0 for name in by_name}
        self._link_logical = {name: 0 for name in by_name}
        self._link_shipped = {name: 0 for name in by_name}
        self._link_lost = {name: 0 for name in by_name}     # delivered to a restarted receiver
        self._durations: list[float] = []
        self._n_transfers = 0
        self._total_logical = 0
        self._total_shipped = 0
        self._checksum_failures = 0
        self._failed_transfers = 0
        # fault injection (corrupt): armed rules, requests awaiting an intact re-send
        self._corruption: list[dict] = []
        self._corrupted_rids: dict[int, dict] = {}
        self._frames_corrupted = 0
        self._lost_transfers = 0

    # ------------------------------------------------------------------ public API

    @property
    def routes(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(src, dst) -> path of link names."""
        return dict(self._routes)

    async def transfer(
        self,
        req: Request,
        frames: list[np.ndarray],
        logical_bytes: int,
        src: str,
        dst: str,
        *,
        first_token_s: float | None = None,
    ) -> TransferResult:
        """Ship `frames` (a request's KV, `logical_bytes` bytes of it) from `src` to `dst`.

        Returns when the receiver has taken the frames, with the `TransferResult`.
        first_token_s: passed through to `receive_kv` (when the sender produced the first
        token); defaults to the transfer's start time.
        Raises TransferError for an unknown route, a negative size, or frames whose
        headers name another request, sum to another logical size or carry a body that
        does not match `payload_scale` (frames with unreadable headers are left for the
        receiver to reject).
        """
        key = (src, dst)
        path = self._routes.get(key)
        if path is None:
            raise TransferError(
                f"request {req.id}: no route from {src!r} to {dst!r}; routes: "
                f"{sorted(f'{a}->{b}' for a, b in self._routes)}"
            )
        if isinstance(logical_bytes, bool) or not isinstance(logical_bytes, (int, np.integer)) or logical_bytes < 0:
            raise TransferError(f"request {req.id}: logical_bytes must be an integer >= 0, got {logical_bytes!r}")
        logical_bytes = int(logical_bytes)
        shipped = self._check_frames(req, frames, logical_bytes)
        cost = self._costs[key]
        clock = self._clock
        t0 = clock.now()
        self._in_flight += 1
        self._idle.clear()
        try:
            t_wire = t0 + len(frames) * cost.per_message_s
            if t_wire > t0:
                await clock.sleep_until(t_wire)
            if logical_bytes > 0:
                # model time, not the clock: host lateness must not stretch the transfer
                wire_start = max(t_wire, self._net.now)
                wire_end = await self._cross(path, logical_bytes, wire_start)
            else:
                wire_start = wire_end = t_wire
            t_end = wire_end + cost.latency_s
            await clock.sleep_until(t_end)
            receiver = self._receivers[dst]
            if self._corruption:
                frames = self._inject_corruption(req.id, frames, path, t_end)
            try:
                bad = await receiver.receive_kv(req, frames, t0 if first_token_s is None else first_token_s)
            except PeerLost:
                # the receiver restarted: the bytes crossed for nothing; the sender re-sends
                self._lost_transfers += 1
                for name in path:
                    self._link_lost[name] += logical_bytes
                raise
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        bad = int(bad)
        if bad == 0 and self._corrupted_rids:
            rule = self._corrupted_rids.pop(req.id, None)
            if rule is not None:
                rule["recovered"] += 1      # the re-sent payload arrived intact
        self._n_transfers += 1
        self._total_logical += logical_bytes
        self._total_shipped += shipped
        self._durations.append(t_end - t0)
        self._checksum_failures += bad
        self._failed_transfers += bad > 0
        for name in path:
            self._link_transfers[name] += 1
            self._link_logical[name] += logical_bytes
            self._link_shipped[name] += shipped
        return TransferResult(
            request_id=req.id, src=src, dst=dst, path=path, start_s=t0, wire_start_s=wire_start,
            wire_end_s=wire_end, end_s=t_end, n_frames=len(frames), logical_bytes=logical_bytes,
            payload_bytes=shipped, bad_frames=bad,
        )

    async def degrade(self, link: str, factor: float, start: float, end: float) -> None:
        """Scale `link`'s bandwidth by `factor` in (0, 1] during [start, end) (emulated
        seconds; the part before now is ignored). Flows crossing it slow down, then
        resume. Raises ValueError / KeyError (unknown link) from the network model."""
        self._sync()
        self._net.degrade(link, factor, start, end)
        self._poke()

    async def flap(self, link: str, start: float, end: float) -> None:
        """Take `link` down during [start, end): flows crossing it stop and resume at
        `end` (flows still in their per-message or latency phase are not affected)."""
        self._sync()
        self._net.flap(link, start, end)
        self._poke()

    async def corrupt(self, count: int, seed: int = 0, start: float = 0.0, end: float = math.inf,
                      link: str | None = None, tag: int = 0) -> None:
        """Fault injection: flip one byte of one frame (`codec.corrupt_frame`) in each of
        the next `count` (>= 1) payloads delivered during [start, end) (emulated s) over
        `link` (None: any link), at most once per request, so its re-send arrives intact.
        Frame and byte are drawn from `seed`. The receiver's checksum must catch every
        one; `stats()["corruption"]` counts them per `tag` with their intact re-sends.
        Raises ValueError for count < 1 or an unknown link."""
        if int(count) < 1:
            raise ValueError(f"corrupt: count must be >= 1, got {count!r}")
        if link is not None and link not in self._specs:
            raise ValueError(f"corrupt: unknown link {link!r}; known links: {sorted(self._specs)}")
        self._corruption.append({"tag": tag, "left": int(count), "seed": int(seed), "start": float(start),
                                 "end": float(end), "link": link, "corrupted": 0, "recovered": 0,
                                 "hit": set()})

    def _inject_corruption(self, request_id: int, frames: list, path: tuple[str, ...], t: float) -> list:
        """`frames`, with one frame replaced by a corrupted copy if an armed rule applies."""
        if request_id in self._corrupted_rids or not frames:
            return frames
        for rule in self._corruption:
            if rule["left"] <= 0 or not (rule["start"] <= t < rule["end"]) or request_id in rule["hit"] \
                    or (rule["link"] is not None and rule["link"] not in path):
                continue
            rng = np.random.default_rng([rule["seed"], rule["corrupted"]])
            i = int(rng.integers(len(frames)))
            try:
                bad = corrupt_frame(frames[i], seed=int(rng.integers(1 << 31)))
            except FrameError:      # empty or unreadable body: nothing to flip in this one
                continue
            frames = list(frames)
            frames[i] = bad
            rule["left"] -= 1
            rule["corrupted"] += 1
            rule["hit"].add(request_id)
            self._corrupted_rids[request_id] = rule
            self._frames_corrupted += 1
            break
        return frames

    async def drain(self) -> None:
        """Return when no transfer is in flight."""
        await self._clock.wait_until(self._idle, None)

    async def stats(self) -> dict:
        """Counters since construction, as plain (picklable) values.

        Returns {"elapsed_s", "payload_scale", "transfers", "in_flight",
        "bytes_logical", "bytes_shipped", "checksum_failures" (bad frames reported by
        receivers), "failed_transfers" (transfers with >= 1 bad frame),
        "lost_transfers" (the receiver had restarted: PeerLost), "frames_corrupted" and
        "corruption" (list of {"tag", "corrupted", "recovered", "left"}, see `corrupt`),
        "transfer_time_s" (list of per-transfer durations, s), "links": {name: {
        "bandwidth_Bps", "latency_s", "per_message_s", "transfers", "bytes_logical"
        (completed transfers), "bytes_shipped", "bytes_lost" (transfers whose receiver
        had restarted), "bytes_carried" (incl. partial progress), "busy_s", "utilisation" (bytes_carried / (bandwidth x elapsed)),
        "peak_flows", "series" (list of [t, utilisation] at flow events)}}}.
        """
        self._sync()
        usage = self._net.usage()
        links = {}
        for name, u in usage.items():
            spec = self._specs[name]
            links[name] = {
                "bandwidth_Bps": spec.bandwidth_Bps,
                "latency_s": spec.latency_s,
                "per_message_s": spec.per_message_s,
                "transfers": self._link_transfers[name],
                "bytes_logical": self._link_logical[name],
                "bytes_shipped": self._link_shipped[name],
                "bytes_lost": self._link_lost[name],
                "bytes_carried": u.bytes,
                "busy_s": u.busy_s,
                "utilisation": u.utilisation,
                "peak_flows": u.peak_flows,
                "series": [[t, x] for t, x in u.series],
            }
        return {
            "elapsed_s": self._net.now - self._t0,
            "payload_scale": self.payload_scale,
            "transfers": self._n_transfers,
            "in_flight": self._in_flight,
            "bytes_logical": self._total_logical,
            "bytes_shipped": self._total_shipped,
            "checksum_failures": self._checksum_failures,
            "failed_transfers": self._failed_transfers,
            "lost_transfers": self._lost_transfers,
            "frames_corrupted": self._frames_corrupted,
            "corruption": [{k: r[k] for k in ("tag", "corrupted", "recovered", "left")}
                           for r in self._corruption],
            "transfer_time_s": list(self._durations),
            "links": links,
        }

    # ------------------------------------------------------------------ internals

    def _check_frames(self, req: Request, frames: list[np.ndarray], logical_bytes: int) -> int:
        """Cheap header checks (no hashing); returns the bytes shipped."""
        if not isinstance(frames, (list, tuple)):
            raise TransferError(f"request {req.id}: frames must be a list of uint8 arrays, got {type(frames).__name__}")
        shipped = 0
        for i, f in enumerate(frames):
            if isinstance(f, np.ndarray):
                shipped += f.nbytes
            elif isinstance(f, (bytes, bytearray, memoryview)):
                shipped += memoryview(f).nbytes
            else:
                raise TransferError(f"request {req.id}: frame {i} is a {type(f).__name__}, expected a uint8 array")
        # Header tuples (from the header cache make_kv_frames filled, no FrameHeader per
        # frame); a payload with an unreadable frame is left for the receiver to count bad.
        entries = scan_kv_frames(frames, False)
        headers = entries if len(entries) == len(frames) and None not in entries else None
        if headers is not None:
            rid = req.id
            scale = self.payload_scale
            total = 0
            for h_rid, layer_start, layer_end, _, _, _, _, logical, payload in headers:
                if h_rid != rid:
                    raise TransferError(f"request {rid}: a frame header names request {h_rid}")
                expected = payload_size(logical, scale)
                if payload != expected:
                    raise TransferError(
                        f"request {rid}, layers [{layer_start}, {layer_end}): body of "
                        f"{payload} bytes for {logical} logical bytes; the interconnect's "
                        f"payload_scale {scale} expects {expected} (sender and interconnect "
                        "disagree on payload_scale)"
                    )
                total += logical
            if total != logical_bytes:
                raise TransferError(
                    f"request {rid}: frames carry {total} logical bytes but the transfer "
                    f"says {logical_bytes}"
                )
        return shipped

    async def _cross(self, path: tuple[str, ...], nbytes: int, t: float) -> float:
        """Move `nbytes` over `path` starting at model time `t`; returns the drain time."""
        fid = self._next_fid
        self._next_fid += 1
        event = asyncio.Event()
        self._waiters[fid] = event
        self._net.add_flow(fid, path, nbytes, t)
        self._dispatch(self._net.advance(self._net.now))
        self._poke()
        try:
            await self._clock.wait_until(event, None)
        except BaseException:
            # cancelled: take the flow off the links so it stops holding bandwidth
            self._waiters.pop(fid, None)
            if fid not in self._drained:
                try:
                    self._net.remove_flow(fid, self._model_now())
                except KeyError:
                    pass
                self._dispatch(self._net.advance(self._net.now))
                self._poke()
            self._drained.pop(fid, None)
            raise
        if fid not in self._drained:
            raise RuntimeError("interconnect driver failed") from self._driver_error
        return self._drained.pop(fid)

    def _model_now(self) -> float:
        # never behind the network (it may sit at an event time the clock has just
        # passed or, on a wall clock that fires timers a hair early, not quite reached)
        return max(self._clock.now(), self._net.now)

    def _sync(self) -> None:
        self._dispatch(self._net.advance(self._model_now()))

    def _dispatch(self, drained: list[tuple[Hashable, float]]) -> None:
        for fid, t in drained:
            self._drained[fid] = t
            event = self._waiters.pop(fid, None)
            if event is not None:
                event.set()

    def _poke(self) -> None:
        """Wake the driver (the next event time changed) or start it."""
        if not self._net.n_flows:
            return
        self._wake.set()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())

    async def _drive(self) -> None:
        # The driver lives as long as the component: with no flow it waits for the next
        # `_poke` (starting a task per transfer cost more than the transfer's bookkeeping).
        net = self._net
        try:
            while True:
                t_next = net.next_event_time() if net.n_flows else math.inf
                self._wake.clear()
                fired = await self._clock.wait_until(self._wake, None if math.isinf(t_next) else t_next)
                t = self._model_now()
                if not fired:
                    t = max(t, t_next)  # the deadline passed: process it at its exact time
                self._dispatch(net.advance(t))
        except BaseException as e:
            self._driver_error = e
            for event in self._waiters.values():
                event.set()
            raise
