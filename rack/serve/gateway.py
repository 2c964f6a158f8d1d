"""The gateway core: a live front's side of the rack, as a core (`workloads.core`).

The HTTP front (`rack.serve.ray_front.FrontHost`) is one more driver of the router's
input (DESIGN.md): for every accepted HTTP request it calls `open(now, req)`, which
sends `submit_live` to the router. What comes back is enough to stream the request's
tokens at their emulated times without a message per token:

- `admitted(request id, reason, output_tokens)` from the router: dispatched (with the
  tokens it will get) or rejected (the reason, e.g. "router_queue_full");
- `first_token(request id, t)` from a prefill or colocated engine when the client's
  first token comes from the end of the prompt (first_token = "prefill", colocated);
- `tokens_planned(engine, t0, ends, tps, ids, index0, done, rem)` from a decode
  engine when a run of steps starts: the steps' end times and, per request of the
  batch, the index of its first token in the run and its stint's progress
  (`devices.engines.common.step_token_times` turns them into token times);
- `run_cut(engine, steps)` when an admission cuts that run after `steps` steps: the
  planned tokens after the cut are unknown again (the next run plans them);
- `prompt_cached(request id, tokens)` from a prefill or colocated engine when it admits
  a prompt: the prompt tokens its prefix cache served (`usage.prompt_tokens_details`);
- `request_ended(request id, outcome, reason, t_end, times, itl)` from the collector:
  the request's record. A completed request's token times are then replaced by the
  record's (first token + cumulative ITL), which is the truth the pacing was aiming at;
- `peer_lost(name)` (a crash): an engine's run in progress stops where it is.

Per request the core keeps `times` (emulated s of each output token, NaN while
unknown). The host reads it (`live(request id)`) and is told which requests changed
(`changed`, drained by the host after every call). Nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.engines.common import step_token_times
from rack.serving.collector import EVENTS
from workloads.core import Core

_FIRST = EVENTS.index("first_token")


@dataclass
class LiveRequest:
    """What the gateway knows of one live request.

    status: the router's verdict: "pending" (sent to the router), "admitted" or
    "rejected" (`reason`). Ended once the collector's record is in (`outcome`,
    `reason`, `t_end`, `record_times` (one per `rack.serving.collector.EVENTS`),
    `itl_s`); the record may come before the verdict (two senders).
    times: emulated time of each output token (shape (output_tokens,), NaN unknown).
    """

    req: Any
    times: np.ndarray
    status: str = "pending"
    n_out: int = 0
    reason: str | None = None
    outcome: str | None = None
    t_end: float = math.nan
    record_times: np.ndarray | None = None
    itl_s: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        """The collector's record is in."""
        return self.outcome is not None


class Gateway(Core):
    """The live front's core (module docstring).

    Keyword args:
        router: the router's name.
        name: the core's name ("front").
    """

    def __init__(self, *, router: str, name: str = "front") -> None:
        super().__init__(name)
        self.router = router
        self.requests: dict[int, LiveRequest] = {}
        self.changed: set[int] = set()
        # per engine: its run in progress (starts, ends, tps, ids, index0, done, rem)
        self._runs: dict[str, tuple] = {}
        self.counts = {"opened": 0, "admitted": 0, "rejected": 0, "ended": 0, "cuts": 0, "runs": 0}

    # ------------------------------------------------------------------ the host's calls
    def open(self, now: float, req: Any) -> None:
        """A new live request (its id unique in the run): sent to the router."""
        self.requests[req.id] = LiveRequest(req, np.full(int(req.output_tokens), np.nan))
        self.counts["opened"] += 1
        self.send(self.router, "submit_live", req, self.name)

    def forget(self, now: float, request_id: int) -> None:
        """Drop an ended request's state (the host has kept what it needs)."""
        self.requests.pop(int(request_id), None)

    # ------------------------------------------------------------------ messages
    def admitted(self, now: float, request_id: int, reason: str | None, output_tokens: int) -> None:
        """The router's verdict on a live request (module docstring)."""
        lr = self.requests.get(int(request_id))
        if lr is None:
            return
        if reason is not None:
            lr.status = "rejected"
            lr.reason = lr.reason or reason
            self.counts["rejected"] += 1
        else:
            if lr.status == "pending":
                lr.status = "admitted"
            lr.n_out = int(output_tokens)
            lr.times = lr.times[: lr.n_out]
            self.counts["admitted"] += 1
        self.changed.add(lr.req.id)

    def first_token(self, now: float, request_id: int, t: float) -> None:
        """The client's first token, made at the end of the prompt, at emulated `t`."""
        lr = self.requests.get(int(request_id))
        if lr is not None and lr.times.shape[0] and lr.record_times is None:
            lr.times[0] = t
            self.changed.add(lr.req.id)

    def tokens_planned(self, now: float, engine: str, t0: float, ends: np.ndarray, tps: float,
                       ids: np.ndarray, index0: np.ndarray, done: np.ndarray, rem: np.ndarray) -> None:
        """A decode run of `engine` started at `t0`; step j ends at ends[j] (module docstring)."""
        starts = np.concatenate(([t0], ends[:-1]))
        self._runs[engine] = (starts, ends, tps, ids, index0, done, rem)
        self.counts["runs"] += 1
        for i, rid in enumerate(ids.tolist()):
            lr = self.requests.get(rid)
            if lr is None or lr.record_times is not None:
                continue
            a = int(index0[i])
            # a = 0: the run starts with the client's first token (`step_token_times`)
            t = step_token_times(starts, ends, int(done[i]), int(rem[i]), tps, first_whole=a == 0)
            b = min(a + t.shape[0], lr.times.shape[0])
            if b > a:
                lr.times[a:b] = t[: b - a]
                self.changed.add(rid)

    def run_cut(self, now: float, engine: str, steps: int) -> None:
        """`engine`'s run in progress stops after `steps` steps: later planned tokens
        are unknown again."""
        run = self._runs.get(engine)
        if run is None:
            return
        starts, ends, tps, ids, index0, done, rem = run
        steps = max(0, min(int(steps), ends.shape[0]))
        self.counts["cuts"] += 1
        for i, rid in enumerate(ids.tolist()):
            lr = self.requests.get(rid)
            if lr is None or lr.record_times is not None:
                continue
            full = step_token_times(starts, ends, int(done[i]), int(rem[i]), tps).shape[0]
            kept = step_token_times(starts[:steps], ends[:steps], int(done[i]), int(rem[i]), tps).shape[0]
            a = int(index0[i])
            if full > kept:
                lr.times[a + kept: a + full] = np.nan
                self.changed.add(rid)
        self._runs[engine] = (starts[:steps], ends[:steps], tps, ids, index0, done, rem)

    def prompt_cached(self, now: float, request_id: int, tokens: int) -> None:
        """The prompt tokens the prefix cache served at the request's (last) admission."""
        lr = self.requests.get(int(request_id))
        if lr is not None:
            lr.extra["cached_tokens"] = int(tokens)

    def request_ended(self, now: float, request_id: int, outcome: str, reason: str | None,
                      t_end: float, times: np.ndarray, itl_s: np.ndarray | None) -> None:
        """The collector's record of a request's end (module docstring)."""
        lr = self.requests.get(int(request_id))
        if lr is None:
            return
        lr.outcome, lr.reason, lr.t_end = outcome, reason, float(t_end)
        lr.record_times, lr.itl_s = np.asarray(times, dtype=np.float64), itl_s
        if outcome == "completed" and lr.times.shape[0]:
            gaps = np.zeros(0) if itl_s is None else np.asarray(itl_s, dtype=np.float64)
            if math.isnan(lr.record_times[_FIRST]):
                # On Ray an engine's `events` may reach the collector after its `finish`
                # (an async actor does not keep the order of calls): the first token is
                # then the completion less the gaps, from the same record.
                lr.record_times[_FIRST] = float(t_end) - float(gaps.sum())
            if gaps.shape[0] == lr.times.shape[0] - 1:
                lr.times = lr.record_times[_FIRST] + np.concatenate(([0.0], np.cumsum(gaps)))
        self.counts["ended"] += 1
        self.changed.add(lr.req.id)

    def peer_lost(self, now: float, name: str) -> None:
        """A core died (an injected crash): its run stops at `now`."""
        run = self._runs.get(name)
        if run is not None:
            self.run_cut(now, name, int(np.searchsorted(run[1], now, side="right")))

    # ------------------------------------------------------------------ reads
    def live(self, request_id: int) -> LiveRequest | None:
        """The state of a live request (None once forgotten or never opened)."""
        return self.requests.get(int(request_id))

    def open_count(self) -> int:
        """Live requests whose end the collector has not reported yet."""
        return sum(1 for lr in self.requests.values() if not lr.ended)

    def waiting_for(self) -> str:
        n = self.open_count()
        return f"{n} live request(s) to end" if n else ""


__all__ = ["Gateway", "LiveRequest"]
