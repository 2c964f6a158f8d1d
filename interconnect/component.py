"""`Interconnect`: the throttled KV link between prefill and decode, as a core
(`workloads.core`: a synchronous state machine; it never reads a clock).

A transfer of F frames carrying B logical bytes from `src` to `dst`:

1. waits F x per_message_s of the route (sender's per-message work; link stays free);
2. enters the shared `FairShareNetwork` as a flow of B bytes until its last byte has
   crossed the route's links at its max-min fair rate, which changes whenever other
   flows start or drain or a link is degraded or flapped;
3. waits the route's propagation latency;
4. hands the frames to the receiver (`receive_kv`), which verifies every frame and
   replies the number of bad ones; the sender then gets `transfer_done`.

The formula and the sources of link figures are in `interconnect.link`. The work is
O(events), never O(bytes); an uncontended transfer is one flow whose drain time the
network computes in closed form. Only step 4 sends a message, so the core wakes only
when a delivery may be due: at the earliest lower bound of its transfers' deliveries
(a pending delivery's time; a flow's by the next network event plus the smallest
latency of the flows on the wire, as no flow drains before that event; a transfer
still in its per-message phase's by that phase's end plus its bytes at the path's
nominal bottleneck rate plus its latency, as sharing and degradation only slow a flow
down). That bound is the exact delivery time of a transfer alone on its path, so an
uncontended transfer costs one wake-up. Whatever is due in between (phase ends, flow
starts and drains) is done, in time order, at that wake-up or when the next message
arrives, exactly as if the core had woken for each. Once a link has been degraded or
flapped the core wakes at every phase end and network event instead. The network model runs on model time (the exact event times), so host lateness
on the wall-clock driver delays wake-ups but does not change the modelled transfer
times; on the virtual driver the run is deterministic.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from interconnect.codec import FrameError, KVDescription, corrupt_frame, payload_size, scan_kv_frames
from interconnect.link import FairShareNetwork, LinkSpec, PathCost, path_cost
from workloads.core import Core

if TYPE_CHECKING:
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


class _Transfer:
    """One transfer in flight (see `Interconnect.transfer`)."""

    __slots__ = ("req", "frames", "n_frames", "logical", "shipped", "src", "dst", "path", "cost", "t0",
                 "wire_start", "wire_end", "t_end", "first_token_s", "tag", "delivered")

    def __init__(self, req, frames, n_frames, logical, shipped, src, dst, path, cost, t0, first_token_s,
                 tag) -> None:
        # n_frames: len(frames), taken once (a described payload's len is a Python call)
        self.req, self.frames, self.n_frames = req, frames, n_frames
        self.logical, self.shipped = logical, shipped
        self.src, self.dst, self.path, self.cost = src, dst, path, cost
        self.t0, self.first_token_s, self.tag = t0, first_token_s, tag
        self.wire_start = self.wire_end = self.t_end = t0
        self.delivered = False      # receive_kv sent; the receiver's reply is awaited


class Interconnect(Core):
    """The throttled KV interconnect (a core: `workloads.core`).

    links: the links (unique names; `LinkSpec`).
    routes: (src endpoint, dst endpoint) -> path, a non-empty list of link names,
        each link at most once.
    receivers: names of the dst endpoints (cores with a `receive_kv` handler that
        replies `kv_received(now, tag, bad_frames)`, -1 when it holds no reservation);
        every route's dst must be one.
    payload_scale: fraction of logical KV bytes the senders ship, in (0, 1]; frames
        whose body size disagrees with it are rejected (TransferError).
    name: the core's name ("interconnect").
    timeseries: record each link's utilisation over time (stats' links' "series"); False:
        not recorded (`run_scenario(timeseries=False)`); every other figure is the same.
    Raises InterconnectConfigError naming the bad route, link or endpoint.
    """

    def __init__(
        self,
        *,
        links: Sequence[LinkSpec],
        routes: Mapping[tuple[str, str], Sequence[str]],
        receivers: Sequence[str],
        payload_scale: float,
        name: str = "interconnect",
        timeseries: bool = True,
    ) -> None:
        super().__init__(name)
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
        receivers = set(receivers)
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
        self._specs = by_name
        self.payload_scale = float(payload_scale)
        self._t0 = 0.0
        self._net = FairShareNetwork(specs, t0=self._t0, series=timeseries)
        self._transfers: dict[int, _Transfer] = {}     # in flight, by transfer id (= flow id)
        self._timers: list[tuple[float, int, int, str]] = []   # (t, seq, transfer id, phase)
        self._seq = 0
        self._next_tid = 0
        # accounting: completed transfers, logical and shipped bytes per path (summed per
        # link by `stats`: one update per transfer instead of three per link)
        self._path_done: dict[tuple[str, ...], list[int]] = {}
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
        self._described = 0         # transfers whose payload was described, not built
        self._lost_transfers = 0
        self._late_replies = 0      # receivers' replies to transfers already counted lost
        self._released = 0          # transfers dropped because their request had ended
        # wake only when a delivery may be due (module docstring) until a link is degraded
        self._lazy = True

    # ------------------------------------------------------------------ handlers

    @property
    def routes(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(src, dst) -> path of link names."""
        return dict(self._routes)

    def transfer(self, now: float, req: Request, frames: list[np.ndarray], logical_bytes: int,
                 src: str, dst: str, first_token_s: float | None = None, tag: Any = None) -> None:
        """Ship `frames` (a request's KV, `logical_bytes` bytes of it) from `src` to `dst`.

        F frames carrying B logical bytes: (1) F x per_message_s of the route (the
        sender's per-message work; the link stays free); (2) a flow of B bytes in the
        shared `FairShareNetwork` until its last byte has crossed the route's links at
        its max-min fair rate (which changes whenever other flows start or drain or a
        link is degraded or flapped); (3) the route's propagation latency; (4) the
        frames go to the receiver, `dst.receive_kv(now, req, frames, first_token_s,
        self.name, tid)`, which verifies every frame and replies the number of bad ones.
        Then `src.transfer_done(now, tag, TransferResult)` (None when the receiver held
        no reservation: it restarted, the bytes crossed for nothing).
        first_token_s: passed through to `receive_kv`; defaults to the transfer's start.
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
        # (a Python int, what the senders give, passes the first test alone)
        if not (type(logical_bytes) is int or (isinstance(logical_bytes, (int, np.integer))
                                               and not isinstance(logical_bytes, bool))) or logical_bytes < 0:
            raise TransferError(f"request {req.id}: logical_bytes must be an integer >= 0, got {logical_bytes!r}")
        logical_bytes = int(logical_bytes)
        shipped = self._check_frames(req, frames, logical_bytes)
        # nothing in progress (no timer, no flow): nothing is due before or at `now` but
        # what this transfer starts (no catching up)
        idle = not (self._timers or self._net.n_flows)
        if not idle:
            self._catch_up(now, before=True)
        cost = self._costs[key]
        tid = self._next_tid
        self._next_tid = tid + 1
        n_frames = len(frames)
        tr = _Transfer(req, frames, n_frames, logical_bytes, shipped, src, dst, path, cost, now,
                       now if first_token_s is None else first_token_s, tag)
        self._transfers[tid] = tr
        t_wire = now + n_frames * cost.per_message_s
        if t_wire > now:
            self._at(t_wire, tid, "wire")
            if idle:                # its wire timer is the only thing in progress, not due yet
                self._set_wake()
                return
        else:
            self._enter_wire(tid, t_wire, -math.inf)
        self._settle(now)

    def kv_received(self, now: float, tid: int, bad: int) -> None:
        """The receiver's reply to `receive_kv`: bad frames, or -1 when it held no
        reservation for the request (it restarted). A reply to a transfer already
        counted lost (its receiver died before answering: `peer_lost`, `send_failed`)
        or released (`release`) is ignored: the sender has been told once."""
        tr = self._transfers.pop(tid, None)
        if tr is None:
            self._late_replies += 1
            return
        if bad < 0:
            self._lose(tr)
            return
        bad = int(bad)
        if bad == 0 and self._corrupted_rids:
            rule = self._corrupted_rids.pop(tr.req.id, None)
            if rule is not None:
                rule["recovered"] += 1      # the re-sent payload arrived intact
        self._n_transfers += 1
        self._total_logical += tr.logical
        self._total_shipped += tr.shipped
        self._durations.append(tr.t_end - tr.t0)
        self._checksum_failures += bad
        self._failed_transfers += bad > 0
        done = self._path_done.get(tr.path)
        if done is None:
            done = self._path_done[tr.path] = [0, 0, 0]
        done[0] += 1
        done[1] += tr.logical
        done[2] += tr.shipped
        self.send(tr.src, "transfer_done", tr.tag, TransferResult(
            request_id=tr.req.id, src=tr.src, dst=tr.dst, path=tr.path, start_s=tr.t0,
            wire_start_s=tr.wire_start, wire_end_s=tr.wire_end, end_s=tr.t_end,
            n_frames=tr.n_frames, logical_bytes=tr.logical, payload_bytes=tr.shipped, bad_frames=bad))

    def _lose(self, tr: _Transfer) -> None:
        """The receiver lost the transfer (it restarted, or died before answering): the
        bytes crossed for nothing; the sender is told (`transfer_done` with None) and
        re-sends if its request is still open."""
        self._lost_transfers += 1
        for name in tr.path:
            self._link_lost[name] += tr.logical
        self.send(tr.src, "transfer_done", tr.tag, None)

    def peer_lost(self, now: float, name: str) -> None:
        """Core `name` died (an injected crash or a real death). Transfers it had been
        handed (`receive_kv` sent, no reply yet) are lost: the dead process may never
        answer (on Ray its reply can die with it), and a transfer nobody answers would
        keep the interconnect busy after its request ended. A reply its new incarnation
        gives later is ignored (`kv_received`)."""
        for tid in [t for t, tr in self._transfers.items() if tr.dst == name and tr.delivered]:
            self._lose(self._transfers.pop(tid))

    def send_failed(self, now: float, dst: str, method: str, args: tuple) -> None:
        """A message could not be delivered (its destination was down: Ray driver). A
        `receive_kv` that did not arrive is a lost transfer."""
        if method == "receive_kv":
            tr = self._transfers.pop(args[-1], None)
            if tr is not None:
                self._lose(tr)

    def release(self, now: float, ids) -> None:
        """Drop the transfers of requests `ids`, which have ended (the driver's
        quiescence check, `rack.runtime.quiescence`): their bytes leave the links and
        nobody is told (the request has its outcome)."""
        want = set(int(i) for i in ids)
        self._advance(max(now, self._net.now))
        for tid in [t for t, tr in self._transfers.items() if tr.req.id in want]:
            del self._transfers[tid]
            self._released += 1
            if self._net.has_flow(tid):
                self._net.remove_flow(tid, self._net.now)
        self._settle(now)

    def held_requests(self) -> list[int]:
        """Ids of the requests whose transfers are in flight (driver read)."""
        return sorted({tr.req.id for tr in self._transfers.values()})

    def degrade(self, now: float, link: str, factor: float, start: float, end: float) -> None:
        """Scale `link`'s bandwidth by `factor` in (0, 1] during [start, end) (emulated
        seconds; the part before now is ignored). Flows crossing it slow down, then
        resume. Raises ValueError / KeyError (unknown link) from the network model."""
        self._catch_up(now, before=True)
        self._lazy = False
        self._advance(max(now, self._net.now))
        self._net.degrade(link, factor, start, end)
        self._settle(now)

    def flap(self, now: float, link: str, start: float, end: float) -> None:
        """Take `link` down during [start, end): flows crossing it stop and resume at
        `end` (flows still in their per-message or latency phase are not affected)."""
        self._catch_up(now, before=True)
        self._lazy = False
        self._advance(max(now, self._net.now))
        self._net.flap(link, start, end)
        self._settle(now)

    def corrupt(self, now: float, count: int, seed: int = 0, start: float = 0.0, end: float = math.inf,
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

    def on_wake(self, now: float) -> None:
        self._settle(now)

    def is_idle(self) -> bool:
        return not self._transfers

    def waiting_for(self) -> str:
        if not self._transfers:
            return ""
        return f"{len(self._transfers)} transfer(s) in flight (e.g. request {next(iter(self._transfers.values())).req.id})"

    # ------------------------------------------------------------------ progress
    def _at(self, t: float, tid: int, phase: str) -> None:
        heapq.heappush(self._timers, (t, self._seq, tid, phase))
        self._seq += 1

    def _enter_wire(self, tid: int, t_wire: float, last: float) -> None:
        """The per-message phase ended at `t_wire`: the bytes start to cross. `_catch_up`
        is doing what is due by `last` (-inf: called from elsewhere). A flow that drains
        on an idle network before the next timer and by `last` is alone throughout (no
        other flow can start before it drains; a tie goes to the drain, as in
        `_catch_up`), so it is carried in closed form (`FairShareNetwork.drain_alone`);
        its delivery, when it is due by `last` before any other timer, is done at once
        (the next thing `_catch_up` would do). Otherwise the flow joins the network."""
        tr = self._transfers[tid]
        if tr.logical > 0:
            net, timers = self._net, self._timers
            # model time, not the clock: host lateness must not stretch the transfer
            tr.wire_start = max(t_wire, net.now)
            t_next = timers[0][0] if timers else math.inf
            t_drain = net.drain_alone(tr.path, tr.logical, tr.wire_start, min(last, t_next))
            if t_drain is None:
                net.add_flow(tid, tr.path, tr.logical, tr.wire_start)
                self._drained(net.advance(net.now))
                return
            tr.wire_end = t_drain
            tr.t_end = t_end = t_drain + tr.cost.latency_s
            if t_end <= last and t_end < t_next:
                self._deliver(tid, t_end)
            else:
                self._at(t_end, tid, "deliver")
        else:
            tr.wire_start = tr.wire_end = t_wire
            tr.t_end = t_wire + tr.cost.latency_s
            self._at(tr.t_end, tid, "deliver")

    def _drained(self, drained) -> None:
        """Flows that drained, as (transfer id, time): their latency phase starts."""
        for tid, t in drained:
            tr = self._transfers.get(tid)
            if tr is None:
                continue            # lost while its bytes crossed

            tr.wire_end = t
            tr.t_end = t + tr.cost.latency_s
            self._at(tr.t_end, tid, "deliver")

    def _advance(self, t: float) -> None:
        self._drained(self._net.advance(t))

    def _settle(self, now: float) -> None:
        """Do everything due by `now` (`_catch_up`), then set `wake_at` (module
        docstring)."""
        self._catch_up(now)
        self._set_wake()

    def _set_wake(self) -> None:
        """`wake_at` from what is in progress (module docstring), all of it due later."""
        net, timers = self._net, self._timers
        if not self._lazy:
            self.wake_at = min(net.next_event_time(), timers[0][0] if timers else math.inf)
            return
        wake = math.inf
        for t, _, tid, phase in timers:
            if phase == "deliver":
                if t < wake:
                    wake = t
            else:   # still in its per-message phase: alone at the nominal bottleneck, at best
                tr = self._transfers[tid]
                wake = min(wake, t + tr.logical / tr.cost.bandwidth_Bps + tr.cost.latency_s)
        t_net = net.next_event_time()       # (inf without flows)
        if t_net < wake:
            lat = min(self._transfers[fid].cost.latency_s for fid in net.flow_ids())
            wake = min(wake, t_net + lat)
        self.wake_at = wake

    def _catch_up(self, now: float, before: bool = False) -> None:
        """Do everything due by `now`: timers and network events, in time order (a
        network event first at a tie); with `before`, only what is due strictly before
        `now` (a handler catching up before it acts)."""
        net, timers, transfers = self._net, self._timers, self._transfers
        next_event, inf = net.next_event_time, math.inf
        # nothing can start a flow before this (other than what is done here, in order)
        last = math.nextafter(now, -inf) if before else now
        while True:
            t_net = next_event()            # (inf without flows)
            t_timer = timers[0][0] if timers else inf
            if t_net <= last and t_net <= t_timer:
                self._advance(max(t_net, net.now))
                continue
            if t_timer > last:
                break
            t, _, tid, phase = heapq.heappop(timers)
            if tid not in transfers:
                continue            # lost or released meanwhile
            if phase == "wire":
                self._enter_wire(tid, t, last)
            else:
                self._deliver(tid, t)

    def _deliver(self, tid: int, t: float) -> None:
        tr = self._transfers[tid]
        tr.delivered = True
        frames = tr.frames
        if self._corruption:
            frames = self._inject_corruption(tr.req.id, frames, tr.path, t)
        self.send(tr.dst, "receive_kv", tr.req, frames, tr.first_token_s, self.name, tid)

    def _inject_corruption(self, request_id: int, frames: list, path: tuple[str, ...], t: float) -> list:
        """`frames`, with one frame replaced by a corrupted copy if an armed rule applies."""
        if request_id in self._corrupted_rids or not frames:
            return frames
        for rule in self._corruption:
            if rule["left"] <= 0 or not (rule["start"] <= t < rule["end"]) or request_id in rule["hit"] \
                    or (rule["link"] is not None and rule["link"] not in path):
                continue
            if type(frames) is KVDescription:   # a described payload: its real bytes to corrupt
                frames = frames.build()
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

    def stats(self, now: float | None = None) -> dict:
        """Counters since construction, as plain (picklable) values (read by the driver;
        `now` is not needed: the counters run on model time).

        Returns {"elapsed_s", "payload_scale", "transfers", "in_flight",
        "bytes_logical", "bytes_shipped", "checksum_failures" (bad frames reported by
        receivers), "failed_transfers" (transfers with >= 1 bad frame),
        "lost_transfers" (the receiver had restarted), "frames_corrupted" and
        "corruption" (list of {"tag", "corrupted", "recovered", "left"}, see `corrupt`),
        "transfer_time_s" (list of per-transfer durations, s), "links": {name: {
        "bandwidth_Bps", "latency_s", "per_message_s", "transfers", "bytes_logical"
        (completed transfers), "bytes_shipped", "bytes_lost" (transfers whose receiver
        had restarted), "bytes_carried" (incl. partial progress), "busy_s", "utilisation"
        (bytes_carried / (bandwidth x elapsed)), "peak_flows", "series" (list of [t,
        utilisation] at flow events)}}}.
        """
        usage = self._net.usage()
        done = {name: [0, 0, 0] for name in usage}
        for path, counts in self._path_done.items():
            for name in path:
                done[name] = [a + b for a, b in zip(done[name], counts)]
        links = {}
        for name, u in usage.items():
            spec = self._specs[name]
            links[name] = {
                "bandwidth_Bps": spec.bandwidth_Bps,
                "latency_s": spec.latency_s,
                "per_message_s": spec.per_message_s,
                "transfers": done[name][0],
                "bytes_logical": done[name][1],
                "bytes_shipped": done[name][2],
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
            "described_transfers": self._described,
            "transfers": self._n_transfers,
            "in_flight": len(self._transfers),
            "bytes_logical": self._total_logical,
            "bytes_shipped": self._total_shipped,
            "checksum_failures": self._checksum_failures,
            "failed_transfers": self._failed_transfers,
            "lost_transfers": self._lost_transfers,
            "late_replies": self._late_replies,
            "released_after_end": self._released,
            "frames_corrupted": self._frames_corrupted,
            "corruption": [{k: r[k] for k in ("tag", "corrupted", "recovered", "left")}
                           for r in self._corruption],
            "transfer_time_s": list(self._durations),
            "links": links,
        }

    # ------------------------------------------------------------------ internals

    def _check_frames(self, req: Request, frames: list[np.ndarray], logical_bytes: int) -> int:
        """Cheap header checks (no hashing); returns the bytes shipped."""
        described = type(frames) is KVDescription
        if not (described or isinstance(frames, (list, tuple))):
            raise TransferError(f"request {req.id}: frames must be a list of uint8 arrays, got {type(frames).__name__}")
        if described:
            self._described += 1
            if frames.passes_transfer_checks(req.id, self.payload_scale, logical_bytes):
                return frames.nbytes        # (what the headers below would show)
        shipped = frames.nbytes if described else 0
        for i, f in enumerate(() if described else frames):
            if isinstance(f, np.ndarray):
                shipped += f.nbytes
            elif isinstance(f, (bytes, bytearray, memoryview)):
                shipped += memoryview(f).nbytes
            else:
                raise TransferError(f"request {req.id}: frame {i} is a {type(f).__name__}, expected a uint8 array")
        # Header tuples (from the header records make_kv_frames attaches, no FrameHeader per
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
