"""The link model: link specs and a max-min fair-share network of flows.

Cost of one transfer of F frames totalling B logical bytes over a path of links
(stated once here, used by `Interconnect`)::

    T = F * per_message_s(path)  +  B / r(t)  +  latency_s(path)
        \\ sender's per-message /    \\ bytes at the   \\ propagation, once
          work, before the bytes      fair-share rate

    per_message_s(path) = max over the path's links (messages pipeline through hops,
                          so the slowest hop's per-message work sets the pace)
    latency_s(path)     = sum over the path's links (each hop adds its propagation)
    r(t)                = the flow's max-min fair rate, recomputed whenever a flow
                          starts or drains or a link's capacity changes

A transfer alone on a path therefore takes F*pm + B/min(bandwidth) + latency. Only the B
bytes occupy link bandwidth: the per-message overhead and the latency delay the
transfer but leave the link free for other flows (the overhead is endpoint work,
the latency is time of flight).

`FairShareNetwork` is pure: no clock, no asyncio. It moves from event to event
(flow start, flow drain, capacity change), so its work grows with events, never with
bytes. Rates are max-min fair by progressive filling: raise every unfrozen flow's
rate equally until a link saturates, freeze the flows crossing it, repeat. No link
ever carries more than its current capacity.

Sources of the defaults (reference/hardware.md, section Interconnect):
- CS-3 external I/O: 12 x 100 GbE = 1.2 Tb/s = 150 GB/s per system [E] - the
  wafer side's ceiling, `CS3_IO_GBPS`.
- GPU-side 800 GbE NIC: 800 Gb/s = 100 GB/s per NIC, `NIC_800GBE_GBPS`.
- Mooncake transfer engine, measured: 87 GB/s over 4 x 200 Gb/s RoCE and 190 GB/s over
  8 x 400 Gb/s RoCE [M], `MOONCAKE_4X200_GBPS`, `MOONCAKE_8X400_GBPS`.
- Other emulators default to 64 GB/s, `EMULATOR_DEFAULT_GBPS`.
- Latency: "a few microseconds per hop" -> `DEFAULT_LATENCY_US` = 5 us.
- Per-message overhead: no published figure for this link; `DEFAULT_PER_MESSAGE_US` =
  2 us is an assumption (order of an RDMA work-request post + completion), to be
  calibrated.
"""

from __future__ import annotations

import heapq
import math
import operator
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from workloads.series import BoundedSeries

__all__ = [
    "CS3_IO_GBPS",
    "DEFAULT_LATENCY_US",
    "DEFAULT_PER_MESSAGE_US",
    "EMULATOR_DEFAULT_GBPS",
    "MOONCAKE_4X200_GBPS",
    "MOONCAKE_8X400_GBPS",
    "NIC_800GBE_GBPS",
    "FairShareNetwork",
    "LinkSpec",
    "LinkUsage",
    "PathCost",
    "path_cost",
    "transfer_time_alone",
]

CS3_IO_GBPS = 150.0
"""GB/s: 12 x 100 GbE = 1.2 Tb/s external I/O per CS-3 system [E], reference/hardware.md."""
NIC_800GBE_GBPS = 100.0
"""GB/s: one 800 GbE NIC (800e9 bit/s / 8), GPU side, reference/hardware.md."""
MOONCAKE_4X200_GBPS = 87.0
"""GB/s: Mooncake transfer engine over 4 x 200 Gb/s RoCE [M], reference/hardware.md."""
MOONCAKE_8X400_GBPS = 190.0
"""GB/s: Mooncake transfer engine over 8 x 400 Gb/s RoCE [M], reference/hardware.md."""
EMULATOR_DEFAULT_GBPS = 64.0
"""GB/s: the default KV link bandwidth of other emulators, reference/hardware.md."""
DEFAULT_LATENCY_US = 5.0
"""us per hop: "a few microseconds of latency per hop", reference/hardware.md."""
DEFAULT_PER_MESSAGE_US = 2.0
"""us per message: assumption (no published figure), order of an RDMA post + completion."""

_REL_EPS = 1e-12  # relative tolerance when comparing link shares in progressive filling
_arrival = operator.attrgetter("seq")   # a flow's arrival order (ties between drains)


class LinkSpec(BaseModel):
    """One link (or bundle of links treated as one pipe).

    name: unique link name. bandwidth_GBps: capacity in GB/s (1 GB = 1e9 bytes), > 0.
    latency_us: propagation latency in microseconds, >= 0. per_message_us: fixed cost
    per message (frame) in microseconds, >= 0. SI views: `bandwidth_Bps`, `latency_s`,
    `per_message_s`. Pydantic raises ValidationError naming the field on bad values.
    """

    # strict: a bandwidth written "400" is an error, not silently a number
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    name: str = Field(min_length=1, description="unique link name")
    bandwidth_GBps: float = Field(gt=0, description="capacity, GB/s (1e9 bytes/s)")
    latency_us: float = Field(default=DEFAULT_LATENCY_US, ge=0, description="propagation latency, us")
    per_message_us: float = Field(default=DEFAULT_PER_MESSAGE_US, ge=0, description="fixed cost per message, us")

    @property
    def bandwidth_Bps(self) -> float:
        """Capacity in bytes/s."""
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        """Propagation latency in seconds."""
        return self.latency_us * 1e-6

    @property
    def per_message_s(self) -> float:
        """Per-message overhead in seconds."""
        return self.per_message_us * 1e-6


@dataclass(frozen=True, slots=True)
class PathCost:
    """Fixed costs of a path: bottleneck bandwidth (bytes/s), per-message overhead
    (s, max over links) and latency (s, sum over links). See the module docstring."""

    bandwidth_Bps: float
    per_message_s: float
    latency_s: float


def path_cost(links: Sequence[LinkSpec]) -> PathCost:
    """The `PathCost` of a non-empty sequence of links. Raises ValueError if empty."""
    if not links:
        raise ValueError("a path needs at least one link")
    return PathCost(
        bandwidth_Bps=min(link.bandwidth_Bps for link in links),
        per_message_s=max(link.per_message_s for link in links),
        latency_s=sum(link.latency_s for link in links),
    )


def transfer_time_alone(links: Sequence[LinkSpec], n_messages: int, logical_bytes: float) -> float:
    """Seconds one transfer takes with the path to itself:
    n_messages * per_message_s + logical_bytes / bottleneck bandwidth + latency_s."""
    c = path_cost(links)
    return n_messages * c.per_message_s + logical_bytes / c.bandwidth_Bps + c.latency_s


@dataclass(slots=True)
class _Flow:
    fid: Hashable
    seq: int  # arrival order: ties are broken by it, so runs are deterministic
    path: tuple[str, ...]
    nbytes: float
    remaining: float
    start: float
    rate: float = 0.0
    finish_at: float = math.inf


@dataclass(slots=True)
class _Interval:
    start: float
    end: float
    factor: float  # capacity multiplier while active (0.0 = link down)


@dataclass(slots=True)
class _Link:
    spec: LinkSpec
    nominal: float  # bytes/s
    capacity: float  # bytes/s now (nominal x active degradations, 0 while flapped)
    flows: dict[Hashable, _Flow] = field(default_factory=dict)
    intervals: list[_Interval] = field(default_factory=list)
    bytes: float = 0.0
    busy_s: float = 0.0
    peak_flows: int = 0
    series: BoundedSeries = field(default_factory=lambda: BoundedSeries(1))


@dataclass(frozen=True, slots=True)
class LinkUsage:
    """What a link did from the network's start `t0` to `t`.

    bytes: bytes carried (floats: flows in progress count their partial progress).
    busy_s: time during which the link carried bytes at a rate > 0.
    utilisation: bytes / (nominal bandwidth x (t - t0)), in [0, 1].
    peak_flows: most flows crossing the link at once.
    series: (time s, aggregate rate / nominal bandwidth) sampled at every event that
        changed rates (flow start, drain, capacity change); a step function, bounded as
        `workloads.series.BoundedSeries` (a long run keeps each window's last sample).
    """

    name: str
    bandwidth_Bps: float
    bytes: float
    busy_s: float
    utilisation: float
    peak_flows: int
    series: tuple[tuple[float, float], ...]


class FairShareNetwork:
    """Flows over shared links with max-min fair rates, advanced event by event.

    links: the links (unique names). t0: start time (s) for utilisation.
    series: record each link's utilisation over time (`LinkUsage.series`); False: the
    series stay empty (every other figure is the same), for runs that read none.
    Flows are identified by any hashable id chosen by the caller. Times are seconds,
    sizes bytes, rates bytes/s. Methods that take a time `t` first advance the model
    to `t`; `t` must not go backwards (ValueError).
    """

    def __init__(self, links: Iterable[LinkSpec], t0: float = 0.0, series: bool = True):
        self._links: dict[str, _Link] = {}
        self._series = bool(series)
        for spec in links:
            if spec.name in self._links:
                raise ValueError(f"duplicate link name {spec.name!r}")
            self._links[spec.name] = _Link(spec=spec, nominal=spec.bandwidth_Bps, capacity=spec.bandwidth_Bps)
        self.t0 = float(t0)
        self.now = float(t0)
        self._flows: dict[Hashable, _Flow] = {}
        self._seq = 0
        self._changes: list[float] = []  # heap of capacity-change times > now
        self._finished: list[tuple[Hashable, float]] = []
        # the earliest (finish_at, seq, flow) at the current rates; drain times change
        # only when rates are recomputed, so it is found there, once per event
        self._next: tuple[float, int, _Flow] | None = None
        self._on_path: dict[tuple[str, ...], list[_Link]] = {}    # the links of each path checked

    # ------------------------------------------------------------------ queries

    @property
    def link_names(self) -> list[str]:
        """Names of the links, in construction order."""
        return list(self._links)

    def spec(self, link: str) -> LinkSpec:
        """The LinkSpec of `link`. Raises KeyError naming the known links."""
        return self._link(link).spec

    @property
    def n_flows(self) -> int:
        """Flows still moving bytes (not yet drained)."""
        return len(self._flows)

    def rate(self, flow_id: Hashable) -> float:
        """Current rate (bytes/s) of a flow. KeyError if it is not active."""
        return self._flows[flow_id].rate

    def remaining(self, flow_id: Hashable) -> float:
        """Bytes the flow still has to move at `now`. KeyError if it is not active."""
        return self._flows[flow_id].remaining

    def capacity(self, link: str) -> float:
        """Current capacity (bytes/s) of `link` (degradations and flaps applied)."""
        return self._link(link).capacity

    def link_rates(self) -> dict[str, float]:
        """Aggregate rate (bytes/s) carried by each link now."""
        return {name: sum(f.rate for f in ln.flows.values()) for name, ln in self._links.items()}

    def flow_ids(self):
        """Ids of the active flows (a live view)."""
        return self._flows.keys()

    def flow_rates(self) -> dict[Hashable, float]:
        """Current rate (bytes/s) of each active flow."""
        return {fid: f.rate for fid, f in self._flows.items()}

    def flow_paths(self) -> dict[Hashable, tuple[str, ...]]:
        """Path of each active flow."""
        return {fid: f.path for fid, f in self._flows.items()}

    def next_completion(self) -> tuple[float, Hashable] | None:
        """(time, flow id) of the earliest drain at the current rates, or None if no flow
        can finish at the current rates. Exact unless a flow arrives or a capacity change
        (see `next_event_time`) comes first."""
        nxt = self._next
        return None if nxt is None else (nxt[0], nxt[2].fid)

    def next_event_time(self) -> float:
        """Time of the next internal event (a drain or a capacity change), math.inf if
        none. Capacity changes count only while flows are active (they are applied
        lazily otherwise)."""
        if not self._flows:
            return math.inf
        t = self._next[0] if self._next is not None else math.inf
        if self._changes:
            t = min(t, self._changes[0])
        return t

    def usage(self, t: float | None = None) -> dict[str, LinkUsage]:
        """Per-link `LinkUsage` from t0 up to `t` (default: now; advances the model)."""
        if t is not None:
            self._advance_to(t)
        elapsed = self.now - self.t0
        out = {}
        for name, ln in self._links.items():
            util = ln.bytes / (ln.nominal * elapsed) if elapsed > 0 else 0.0
            out[name] = LinkUsage(
                name=name,
                bandwidth_Bps=ln.nominal,
                bytes=ln.bytes,
                busy_s=ln.busy_s,
                utilisation=min(1.0, util),
                peak_flows=ln.peak_flows,
                series=tuple(zip(*(c.tolist() for c in ln.series.columns()))),
            )
        return out

    # ------------------------------------------------------------------ mutations

    def add_flow(self, flow_id: Hashable, path: Sequence[str], nbytes: float, t: float) -> None:
        """Start a flow of `nbytes` (>= 0) bytes at time `t` over the links in `path`.

        A flow of 0 bytes drains at `t`. Raises ValueError for a duplicate id, an empty
        path, a link repeated in the path, negative bytes; KeyError for an unknown link.
        """
        if flow_id in self._flows:
            raise ValueError(f"flow {flow_id!r} is already active")
        path = tuple(path)
        links = self._path_links(path, f"flow {flow_id!r}")
        if not (nbytes >= 0) or math.isinf(nbytes):
            raise ValueError(f"flow {flow_id!r}: bytes must be finite and >= 0, got {nbytes!r}")
        self._advance_to(t)
        f = _Flow(fid=flow_id, seq=self._seq, path=path, nbytes=float(nbytes), remaining=float(nbytes), start=self.now)
        self._seq += 1
        self._flows[flow_id] = f
        for ln in links:
            ln.flows[flow_id] = f
            ln.peak_flows = max(ln.peak_flows, len(ln.flows))
        if len(self._flows) == 1:
            self._alone(f)
        else:
            self._recompute()

    def drain_alone(self, path: Sequence[str], nbytes: float, t: float, by: float) -> float | None:
        """Carry a flow of `nbytes` (> 0) bytes over `path` from time `t` in closed form,
        if it is alone from its start to its drain: no flow active, no capacity change
        pending, a rate > 0 on its path, and a drain at or before `by` (the caller vouches
        that no flow starts before `by`). Returns its drain time; the network is then at
        that time with the links' bytes, busy time, peak flows and series as `add_flow`
        at `t` then `advance` to the drain leave them, bit for bit (the same float
        operations in the same order: progressive filling gives a lone flow the smallest
        capacity on its path, and it drains at `t + nbytes / rate`). Otherwise returns
        None, having only moved the model to `t` (as `add_flow` would first).
        Most handoffs cross an idle network this way: one call instead of a flow added,
        its rates filled and its drain found by the event loop. Raises ValueError for
        a path `add_flow` refuses."""
        if self._flows or self._changes or self._finished:
            self._advance_to(t)
            return None
        if t < self.now:
            raise ValueError(f"time went backwards: {t!r} < now {self.now!r}")
        self.now = t            # (what `_advance_to` does with no flow: nothing moves)
        path = path if type(path) is tuple else tuple(path)
        links = self._path_links(path, "drain_alone")
        rate = links[0].capacity
        for ln in links:        # (the smallest: `min` without a generator)
            if ln.capacity < rate:
                rate = ln.capacity
        nbytes = float(nbytes)
        if not rate > 0 or not 0 < nbytes < math.inf:
            return None
        t_end = t + nbytes / rate
        if t_end > by:
            return None
        self._seq += 1          # the flow's arrival number, as `add_flow` takes it
        dt = t_end - t
        for ln in links:
            if ln.peak_flows < 1:
                ln.peak_flows = 1
            if dt > 0:          # (`_progress` moves nothing over an empty interval)
                ln.bytes += nbytes
                ln.busy_s += dt
        if self._series:        # the rates at its start, then none at its drain
            on_path = set(path)
            for name, ln in self._links.items():
                self._note(ln, (rate if name in on_path else 0) / ln.nominal)
            self.now = t_end
            for ln in self._links.values():
                self._note(ln, 0 / ln.nominal)
        self.now = t_end
        return t_end

    def _path_links(self, path: tuple, what: str) -> list:
        """The links of `path`, checked the first time it is seen (then kept). Raises
        ValueError (naming `what`) for an empty path or one crossing a link twice, and
        `_link`'s error for an unknown link."""
        links = self._on_path.get(path)
        if links is None:
            if not path:
                raise ValueError(f"{what}: empty path")
            if len(set(path)) != len(path):
                raise ValueError(f"{what}: path {list(path)} crosses a link twice")
            links = self._on_path[path] = [self._link(name) for name in path]
        return links

    def has_flow(self, flow_id: Hashable) -> bool:
        """True while `flow_id` is active (added, not yet drained or removed)."""
        return flow_id in self._flows

    def remove_flow(self, flow_id: Hashable, t: float) -> float:
        """Cancel an active flow at time `t`; returns the bytes it had not moved.
        Raises KeyError if the flow is not active (never added, drained or removed)."""
        self._advance_to(t)
        f = self._flows.get(flow_id)
        if f is None:
            raise KeyError(f"flow {flow_id!r} is not active")
        self._detach(f)
        self._recompute()
        return f.remaining

    def advance(self, t: float) -> list[tuple[Hashable, float]]:
        """Move the model to time `t`, processing every event up to `t` in order.
        Returns the flows that drained since the last call as (flow id, drain time),
        in drain order (ties by arrival order), including drains caused by earlier
        `add_flow`/`degrade` calls' advances."""
        self._advance_to(t)
        done, self._finished = self._finished, []
        return done

    def degrade(self, link: str, factor: float, start: float, end: float) -> None:
        """Scale `link`'s capacity by `factor` (0 < factor <= 1) during [start, end).

        Overlapping degradations multiply. The part of the interval before `now` is
        ignored (the past is not rewritten). Flows slow down and resume at full speed
        afterwards. Raises ValueError on a bad factor or interval, KeyError on an
        unknown link."""
        if not (0.0 < factor <= 1.0):
            raise ValueError(f"degrade({link!r}): factor must be in (0, 1], got {factor!r} (use flap for a link down)")
        self._add_interval(link, factor, start, end)

    def flap(self, link: str, start: float, end: float) -> None:
        """Take `link` down (capacity 0) during [start, end): flows crossing it stop
        moving bytes and resume at `end`. Same rules as `degrade`."""
        self._add_interval(link, 0.0, start, end)

    # ------------------------------------------------------------------ internals

    def _link(self, name: str) -> _Link:
        try:
            return self._links[name]
        except KeyError:
            raise KeyError(f"unknown link {name!r}; known links: {sorted(self._links)}") from None

    def _add_interval(self, link: str, factor: float, start: float, end: float) -> None:
        ln = self._link(link)
        if not (math.isfinite(start) and end > start) or math.isnan(end):
            raise ValueError(f"link {link!r}: interval [{start!r}, {end!r}) is empty or not finite")
        start = max(start, self.now)
        if end <= start:
            return  # entirely in the past
        ln.intervals.append(_Interval(start, end, factor))
        for te in (start, end):
            if te > self.now and math.isfinite(te):
                heapq.heappush(self._changes, te)
        if start <= self.now:
            self._apply_capacities()
            self._recompute()

    def _apply_capacities(self) -> None:
        t = self.now
        for ln in self._links.values():
            mult = 1.0
            for iv in ln.intervals:
                if iv.start <= t < iv.end:
                    mult *= iv.factor
            ln.intervals = [iv for iv in ln.intervals if iv.end > t]
            ln.capacity = ln.nominal * mult

    def _detach(self, f: _Flow) -> None:
        del self._flows[f.fid]
        for name in f.path:
            del self._links[name].flows[f.fid]

    def _advance_to(self, t: float) -> None:
        if t < self.now:
            raise ValueError(f"time went backwards: {t!r} < now {self.now!r}")
        while True:
            t_drain = self._next[0] if self._next is not None else math.inf
            t_change = self._changes[0] if self._changes else math.inf
            te = min(t_drain, t_change)
            if te > t:
                break
            self._progress(te)
            drained = [f for f in self._flows.values() if f.finish_at <= te]
            if len(drained) > 1:        # (mostly one drains at a time: no sort)
                drained.sort(key=_arrival)
            for f in drained:
                self._detach(f)
                self._finished.append((f.fid, te))
            while self._changes and self._changes[0] <= te:
                heapq.heappop(self._changes)
                self._apply_capacities()
            self._recompute()
        self._progress(t)

    def _progress(self, t: float) -> None:
        """Move bytes at the current rates from `now` to `t` (no rate change inside)."""
        dt = t - self.now
        if dt <= 0:
            return
        on_path = self._on_path
        for f in self._flows.values():
            if f.finish_at <= t:
                moved = f.remaining  # drains exactly at its event: no float residue
            else:
                moved = min(f.remaining, f.rate * dt)
            f.remaining -= moved
            for ln in on_path[f.path]:
                ln.bytes += moved
        for ln in self._links.values():
            for f in ln.flows.values():
                if f.rate > 0:      # (carried bytes during dt)
                    ln.busy_s += dt
                    break
        self.now = t

    def _alone(self, f: _Flow) -> None:
        """Rates when `f` is the only flow: progressive filling gives it the smallest
        capacity on its path (the closed form of `_recompute` for one flow; most
        handoffs start on an idle network)."""
        f.rate = min(self._links[name].capacity for name in f.path)
        self._set_drain_times()
        self._note_utilisation()

    def _recompute(self) -> None:
        """Max-min fair rates by progressive filling, then projected drain times."""
        if len(self._flows) < 2:    # (most drains leave one flow or none)
            if self._flows:
                self._alone(next(iter(self._flows.values())))
            else:
                self._next = None
                self._note_utilisation()
            return
        # (only the links that carry flows: the others' residuals are never read)
        residual, unfrozen_on = {}, {}
        for name, ln in self._links.items():
            if ln.flows:
                residual[name] = ln.capacity
                unfrozen_on[name] = len(ln.flows)
        unfrozen = set(self._flows)
        while unfrozen:
            share = {name: max(0.0, residual[name]) / n for name, n in unfrozen_on.items() if n > 0}
            smallest = min(share.values())
            limit = smallest + smallest * _REL_EPS
            bottlenecks = [name for name, s in share.items() if s <= limit]
            bottlenecks.sort()
            for name in bottlenecks:
                for fid, f in self._links[name].flows.items():
                    if fid not in unfrozen:
                        continue
                    unfrozen.discard(fid)
                    f.rate = smallest
                    for other in f.path:
                        residual[other] -= smallest
                        unfrozen_on[other] -= 1
        self._set_drain_times()
        self._note_utilisation()

    def _set_drain_times(self) -> None:
        """Each flow's projected drain time at its current rate, and the earliest."""
        nxt = None
        for f in self._flows.values():
            if f.remaining <= 0:
                f.finish_at = self.now
            elif f.rate > 0:
                f.finish_at = self.now + f.remaining / f.rate
            else:
                f.finish_at = math.inf
            if f.finish_at < math.inf and (nxt is None or (f.finish_at, f.seq) < nxt[:2]):
                nxt = (f.finish_at, f.seq, f)
        self._next = nxt

    def _note_utilisation(self) -> None:
        """Append each link's utilisation to its series when it changed."""
        if not self._series:
            return
        for ln in self._links.values():
            self._note(ln, sum(f.rate for f in ln.flows.values()) / ln.nominal)

    def _note(self, ln: _Link, util: float) -> None:
        """Append `util` at `now` to `ln`'s series when it changed."""
        last = ln.series.last()
        if last is None or last[0] == self.now or last[1] != util:
            ln.series.add(self.now, util)      # the same instant: its last state
