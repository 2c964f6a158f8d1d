"""The metrics collector component: one timeline per request, one outcome per request.

A core (`workloads.core`). Engines and the router report lifecycle events (`event`,
`events`) and each request's end (`finish`). The collector keeps them in flat numpy arrays (one row per request,
one column per event) plus the requests' inter-token latencies, and checks the
request-conservation rule: every submitted request ends exactly once, as completed,
rejected (with a reason) or failed (with a reason). A second end is recorded as a
violation, never silently merged.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from workloads.core import Core

EVENTS = ("arrival", "prefill_queued", "prefill_start", "prefill_end", "kv_reserved",
          "transfer_start", "transfer_end", "decode_admit", "first_token", "completion")
OUTCOMES = ("completed", "rejected", "failed")
_COL = {name: i for i, name in enumerate(EVENTS)}


class Collector(Core):
    """Collects per-request timelines (a core: `workloads.core`).

    Keyword args:
        request_ids: ids of every request the run will submit (shape (n,)).
        notify: cores told of every request's end (`ended(now, request_id, t_end)`),
            e.g. the router (closed-loop replay, fault recovery).
        live_front: a live front's name (`rack.serve`): requests are not known in
            advance (a request's first event or end opens its row), and the front is
            told every request's end with its record (`request_ended(request id,
            outcome, reason, t_end, times (one per EVENTS), itl_s)`). None: replays.
        name: the core's name ("collector").
    Handlers (messages): `event`, `events`, `finish`, `note_fault`, `note_recovery`,
    `note_truncated`, `open_among` (replies `open_ids`), `end_open`. The driver reads
    `snapshot()`, `all_ended()` and `open_requests()` directly.
    """

    def __init__(self, *, request_ids: Sequence[int], notify: Sequence[str] = (),
                 live_front: str | None = None, name: str = "collector") -> None:
        super().__init__(name)
        ids = np.asarray(request_ids, dtype=np.int64)
        self._row = {int(r): i for i, r in enumerate(ids.tolist())}
        n = len(ids)
        self._ids = ids
        self._times = np.full((n, len(EVENTS)), np.nan)
        self._outcome = np.zeros(n, dtype=np.int8)          # 0 open, 1.. index in OUTCOMES + 1
        self._preemptions = np.zeros(n, dtype=np.int32)
        self._end_s = np.full(n, np.nan)                    # when each request ended
        self._n = n
        self._views()
        self.reason: dict[int, str] = {}
        self.itl: dict[int, np.ndarray] = {}
        self.violations: list[str] = []
        self.unknown_events = Counter()
        self._open = n
        self.notify = tuple(notify)
        self.live_front = live_front
        self._closed: set[int] = set()             # ended by `end_open`
        self.after_close = 0                       # ends of those reported later (ignored)
        self.faults: dict[int, dict] = {}        # fault injector records, by fault index
        self.recoveries: list[dict] = []         # router: requests re-dispatched per recovery
        self.truncated: dict[int, int] = {}      # router: output tokens served, if truncated

    # ----------------------------------------------------------------- handlers
    def event(self, now: float, request_id: int, name: str, t: float) -> None:
        """Record lifecycle event `name` (one of EVENTS, or "preempted") at emulated t (s)."""
        self._record(request_id, name, t)

    def events(self, now: float, batch: Iterable[tuple[int, str, float]]) -> None:
        """Record many `(request_id, name, t)` events in one message."""
        for request_id, name, t in batch:
            self._record(request_id, name, t)

    def finish(self, now: float, request_id: int, outcome: str, reason: str | None = None,
               itl_s: np.ndarray | None = None, t: float | None = None) -> None:
        """End request `request_id` with `outcome` in OUTCOMES at emulated time `t`
        (default `now`); rejected/failed need a reason (else "unspecified").

        `itl_s`: the request's inter-token gaps (s), shape (output_tokens - 1,).
        """
        row = self._row_of(request_id)
        if row is None:
            self.violations.append(f"finish for unknown request {request_id}")
            return
        if int(request_id) in self._closed:
            self.after_close += 1
            return
        if outcome not in OUTCOMES:
            self.violations.append(f"request {request_id}: unknown outcome {outcome!r}")
            return
        if self.outcome[row]:
            self.violations.append(
                f"request {request_id} ended twice: {OUTCOMES[self.outcome[row] - 1]} then {outcome}")
            return
        if outcome != "completed" and not reason:
            reason = "unspecified"
        self.outcome[row] = OUTCOMES.index(outcome) + 1
        if reason:
            self.reason[int(request_id)] = reason
        when = now if t is None else t
        if outcome == "completed":
            if np.isnan(self.times[row, _COL["completion"]]):
                self.times[row, _COL["completion"]] = when
            if itl_s is not None:
                self.itl[int(request_id)] = np.asarray(itl_s, dtype=np.float64)
        self.end_s[row] = when
        self._open -= 1
        for dst in self.notify:
            self.send(dst, "ended", int(request_id), float(when))
        if self.live_front is not None:
            self.send(self.live_front, "request_ended", int(request_id), outcome, reason, float(when),
                      self.times[row].copy(), self.itl.get(int(request_id)))

    def end_open(self, now: float, reason: str) -> None:
        """End every open request as failed with `reason` (a live front shutting down:
        what was in flight is recorded, never lost); a later end of one of them is
        counted in `after_close`, not as a second end."""
        for rid in self.open_requests():
            self.finish(now, rid, "failed", reason, None, now)
            self._closed.add(rid)

    def open_among(self, now: float, ids: Iterable[int], reply_to: str, tag: Any) -> None:
        """Reply `open_ids(now, tag, [ids])` to `reply_to`: those of `ids` that have not
        ended (unknown ids are left out)."""
        self.send(reply_to, "open_ids", tag, self.still_open(ids))

    def note_fault(self, now: float, index: int, record: dict) -> None:
        """Keep the fault injector's record of fault `index` (replacing an earlier one);
        it is returned under "faults" by `snapshot` (see rack.wiring.faults)."""
        self.faults[int(index)] = dict(record)

    def note_truncated(self, now: float, items: Iterable[tuple[int, int]]) -> None:
        """Record (request id, output tokens served) of requests whose output the router
        truncated to the context limit (`rack.serving.admission`); in the snapshot under
        "output_tokens_served"."""
        for rid, n in items:
            self.truncated[int(rid)] = int(n)

    def note_recovery(self, now: float, record: dict) -> None:
        """Keep the router's record of one recovery ({"instance", "t", "ids"}: requests
        re-dispatched); returned under "recoveries" by `snapshot`."""
        self.recoveries.append(dict(record))

    # ----------------------------------------------------------------- driver reads
    def all_ended(self) -> bool:
        """True once every request has ended."""
        return self._open == 0

    def open_requests(self) -> list[int]:
        """Ids of requests that have not ended yet."""
        return self.ids[self.outcome == 0].tolist()

    def still_open(self, ids: Iterable[int]) -> list[int]:
        """Those of `ids` that have not ended yet (unknown ids are left out)."""
        out = []
        for rid in ids:
            row = self._row.get(int(rid))
            if row is not None and not self.outcome[row]:
                out.append(int(rid))
        return out

    def is_idle(self) -> bool:
        return True

    def waiting_for(self) -> str:
        return f"{self._open} request(s) to end" if self._open else ""

    def snapshot(self) -> dict:
        """All records, as plain arrays and dicts (picklable) for the metrics step."""
        order = sorted(self.itl)
        lengths = np.array([len(self.itl[r]) for r in order], dtype=np.int64)
        flat = np.concatenate([self.itl[r] for r in order]) if order else np.zeros(0)
        return {
            "ids": self.ids, "times": self.times, "events": list(EVENTS),
            "outcome": self.outcome, "outcomes": list(OUTCOMES), "reason": dict(self.reason),
            "preemptions": self.preemptions, "itl_ids": np.array(order, dtype=np.int64),
            "itl_lengths": lengths, "itl_flat": flat, "violations": list(self.violations),
            "unknown_events": dict(self.unknown_events),
            "faults": [self.faults[i] for i in sorted(self.faults)], "end_s": self.end_s,
            "output_tokens_served": dict(self.truncated),
            "recoveries": list(self.recoveries),
        }

    # ----------------------------------------------------------------- internals
    def _views(self) -> None:
        """The per-request columns as views of the first `_n` rows of their buffers."""
        n = self._n
        self.ids, self.times, self.outcome = self._ids[:n], self._times[:n], self._outcome[:n]
        self.preemptions, self.end_s = self._preemptions[:n], self._end_s[:n]

    def _row_of(self, request_id: int) -> int | None:
        """The row of `request_id`; live (`live_front`): a new row for a new id."""
        row = self._row.get(int(request_id))
        if row is not None or self.live_front is None:
            return row
        n = self._n
        if n == self._ids.shape[0]:                 # amortised growth of the buffers
            cap = max(64, 2 * n)
            grow = lambda a, fill: np.concatenate((a, np.full((cap - n, *a.shape[1:]), fill, a.dtype)))
            self._ids, self._times = grow(self._ids, 0), grow(self._times, np.nan)
            self._outcome, self._preemptions = grow(self._outcome, 0), grow(self._preemptions, 0)
            self._end_s = grow(self._end_s, np.nan)
        self._ids[n] = int(request_id)
        self._row[int(request_id)] = n
        self._n = n + 1
        self._open += 1
        self._views()
        return n

    def _record(self, request_id: int, name: str, t: float) -> None:
        row = self._row_of(request_id)
        if row is None:
            self.violations.append(f"event {name!r} for unknown request {request_id}")
            return
        if name == "preempted":
            self.preemptions[row] += 1
            return
        col = _COL.get(name)
        if col is None:
            self.unknown_events[name] += 1
            return
        # Keep the first occurrence: a re-sent transfer or a recomputed request keeps
        # the time its stage first happened, as a client would observe it...
        old = self.times[row, col]
        if old != old:                     # NaN: not recorded yet (no ufunc call per event)
            self.times[row, col] = t
        elif name in ("transfer_end", "decode_admit"):
            # ...except the end of a stage that was redone, whose latest time counts.
            self.times[row, col] = t
