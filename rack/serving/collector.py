"""The metrics collector component: one timeline per request, one outcome per request.

A core (`workloads.core`). Engines and the router report lifecycle events (`event`,
`events`) and each request's end (`finish`). The collector keeps a row per request in
flat numpy arrays (one column per event) plus the request's inter-token latencies, and
checks the request-conservation rule: every submitted request ends exactly once, as
completed, rejected (with a reason) or failed (with a reason). A second end is recorded
as a violation, never silently merged.

Memory is bounded by the requests in the rack, not by the run's length: a row is held
from the request's first event until it has ended and a chunk of ended rows is full;
then the chunk goes to a sink (`rack.serving.records`: kept in memory, or written to a
folder when `records_dir` is given). An event for a request whose row has already left
(it ended at least a chunk earlier) is not recorded but counted (`late_events` in the
snapshot); events after a request's end are otherwise kept as before. The same chunks
are cut at the same moments whichever the sink, so both give the same records.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from devices.engines.common import ITLRef
from rack.serving import records
from rack.serving.records import DiskRecords, MemoryRecords, assemble
from workloads.core import Core

EVENTS = ("arrival", "prefill_queued", "prefill_start", "prefill_end", "kv_reserved",
          "transfer_start", "transfer_end", "decode_admit", "first_token", "completion")
OUTCOMES = ("completed", "rejected", "failed")
_COL = {name: i for i, name in enumerate(EVENTS)}
_E = len(EVENTS)
_ARRIVAL, _FIRST, _COMPLETION = _COL["arrival"], _COL["first_token"], _COL["completion"]
_OUTCOME_CODE = {name: i + 1 for i, name in enumerate(OUTCOMES)}     # `Collector.outcome`'s codes
_COMPLETED = _OUTCOME_CODE["completed"]
#: Handlers whose records carry their own times (`finish` with its `t`, as every engine
#: and the router send it): handled later, in the same order, they leave the same state,
#: so a virtual driver may defer them (`rack.runtime.virtual`, `all_ended`).
DEFERRABLE = ("event", "events", "finish", "itl_steps", "note_recomputed", "note_truncated")

#: Stages that can be redone (a re-sent transfer, a re-admission): their latest time counts.
_REDONE = ("transfer_end", "decode_admit")


class Collector(Core):
    """Collects per-request timelines (a core: `workloads.core`).

    Keyword args:
        request_ids: ids of every request the run will submit (shape (n,), unique).
        notify: cores told of every request's end (`ended(now, request_id, t_end)`),
            e.g. the router (closed-loop replay, fault recovery).
        live_front: a live front's name (`rack.serve`): requests are not known in
            advance (a request's first event or end opens its row; `request_ids` may
            be empty), and the front is told every request's end with its record
            (`request_ended(request id, outcome, reason, t_end, times (one per EVENTS),
            itl_s)`). None: replays.
        name: the core's name ("collector").
        records_dir: write the rows of ended requests to this folder in chunks
            (`rack.serving.records.DiskRecords`); None: keep them in memory.
        chunk_rows, chunk_samples: a chunk's limits (None: `rack.serving.records`'s
            CHUNK_ROWS and CHUNK_SAMPLES).
    Handlers (messages): `event`, `events`, `finish`, `itl_steps`, `note_fault`, `note_recovery`,
    `note_truncated`, `open_among` (replies `open_ids`), `end_open`. The driver reads `snapshot()`,
    `all_ended()`, `open_requests()` and `open_examples()` directly.
    Raises ValueError for duplicate request ids, or chunk limits below 1.
    """

    def __init__(self, *, request_ids: Sequence[int], notify: Sequence[str] = (),
                 live_front: str | None = None, name: str = "collector", records_dir: str | None = None,
                 chunk_rows: int | None = None, chunk_samples: int | None = None) -> None:
        super().__init__(name)
        ids = np.asarray(request_ids, dtype=np.int64).reshape(-1)
        self.ids = ids
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]
        if ids.size > 1 and np.any(self._sorted[1:] == self._sorted[:-1]):
            dup = self._sorted[1:][self._sorted[1:] == self._sorted[:-1]]
            raise ValueError(f"Collector: duplicate request ids, e.g. {dup[:3].tolist()}")
        chunk_rows = records.CHUNK_ROWS if chunk_rows is None else chunk_rows
        chunk_samples = records.CHUNK_SAMPLES if chunk_samples is None else chunk_samples
        if int(chunk_rows) < 1 or int(chunk_samples) < 1:
            raise ValueError(f"Collector: chunk_rows and chunk_samples must be >= 1, got {chunk_rows}, {chunk_samples}")
        n = len(ids)
        self._cursor = 0                              # `_position`'s first guess
        self.outcome = np.zeros(n, dtype=np.int8)     # by position in ids: 0 open, 1.. OUTCOMES + 1
        self._open = n
        # rows held: request id -> slot of the slot arrays (grown by doubling, reused)
        self._slot: dict[int, int] = {}
        cap = 64
        self._slot_id = np.zeros(cap, np.int64)
        self._times = np.full((cap, _E), np.nan)
        self._pre = np.zeros(cap, np.int32)
        self._end = np.full(cap, np.nan)
        self._free = list(range(cap - 1, -1, -1))
        self._reason: dict[int, str] = {}            # by slot
        self._pos_of_slot: dict[int, int] = {}       # by slot: the request's position in ids
        self._itl: dict[int, np.ndarray | ITLRef] = {}    # by slot
        # decode engines' step logs (`itl_steps`): key -> gaps by global step index
        self._logs: dict[str, _StepLog] = {}
        self._log_index: dict[str, int] = {}       # key -> its index in the chunks' itl_log
        self._ended: list[int] = []                  # slots of ended rows, in order of their ends
        self._ended_samples = 0
        self.chunk_rows, self.chunk_samples = int(chunk_rows), int(chunk_samples)
        self.sink = DiskRecords(records_dir) if records_dir is not None else MemoryRecords()
        self.violations: list[str] = []
        self.unknown_events = Counter()
        self.late_events = Counter()
        self.notify = tuple(notify)
        self.live_front = live_front
        # live: positions of the requests opened as they came (ids not known in advance)
        self._live_pos: dict[int, int] | None = None
        if live_front is not None:
            self._live_pos = {int(r): i for i, r in enumerate(ids.tolist())}
            self._n_live = n
            self._ids_buf, self._outcome_buf = self.ids.copy(), self.outcome.copy()
            self.ids, self.outcome = self._ids_buf[:n], self._outcome_buf[:n]
        self._closed: set[int] = set()             # ended by `end_open`
        self.after_close = 0                       # ends of those reported later (ignored)
        self.faults: dict[int, dict] = {}        # fault injector records, by fault index
        self.recoveries: list[dict] = []         # router: requests re-dispatched per recovery
        self.truncated: dict[int, int] = {}      # router: output tokens served, if truncated
        # decode engines: per preempted request, the KV tokens recomputed at its
        # re-admissions (summed) and the time of its last re-admission
        self.recomputed: dict[int, int] = {}
        self.readmitted: dict[int, float] = {}
        # told of every first token and end (`rack.experiments.slo_watch.SloWatch.attach`):
        # a run whose SLO verdict is decided can stop early
        self.watch: Any = None

    # ----------------------------------------------------------------- handlers
    def event(self, now: float, request_id: int, name: str, t: float) -> None:
        """Record lifecycle event `name` (one of EVENTS, or "preempted") at emulated t (s)."""
        self._record(((request_id, name, t),))

    def events(self, now: float, batch: Iterable[tuple[int, str, float]]) -> None:
        """Record many `(request_id, name, t)` events in one message."""
        self._record(batch)

    def finish(self, now: float, request_id: int, outcome: str, reason: str | None = None,
               itl_s: np.ndarray | None = None, t: float | None = None) -> None:
        """End request `request_id` with `outcome` in OUTCOMES at emulated time `t`
        (default `now`); rejected/failed need a reason (else "unspecified").

        `itl_s`: the request's inter-token gaps (s), shape (output_tokens - 1,), or a
        `devices.engines.common.ITLRef` to a step log sent before (`itl_steps`).
        """
        rid = int(request_id)
        slot = self._slot.get(rid)
        pos = self._position(rid) if slot is None else self._pos_of_slot[slot]
        if pos is None:
            self.violations.append(f"finish for unknown request {request_id}")
            return
        if rid in self._closed:
            self.after_close += 1
            return
        code = _OUTCOME_CODE.get(outcome)
        if code is None:
            self.violations.append(f"request {request_id}: unknown outcome {outcome!r}")
            return
        if self.outcome[pos]:
            self.violations.append(
                f"request {request_id} ended twice: {OUTCOMES[self.outcome[pos] - 1]} then {outcome}")
            return
        if outcome != "completed" and not reason:
            reason = "unspecified"
        if slot is None:
            slot = self._take_slot(rid, pos)
        self.outcome[pos] = code
        if reason:
            self._reason[slot] = reason
        if t is None and now is None:
            raise ValueError(f"finish of request {request_id} from a deferred inbox (no current time) "
                             "needs its time t")
        when = now if t is None else t
        if code == _COMPLETED:
            old = self._times[slot, _COMPLETION]
            if old != old:          # NaN: not recorded yet
                self._times[slot, _COMPLETION] = when
            if type(itl_s) is ITLRef:
                self._log_index.setdefault(itl_s.log, len(self._log_index))
                self._itl[slot] = itl_s
                self._ended_samples += itl_s.head.shape[0]
            elif itl_s is not None:
                itl = np.asarray(itl_s, dtype=np.float64)
                self._itl[slot] = itl
                self._ended_samples += itl.size
        self._end[slot] = when
        if self.watch is not None:
            row = self._times[slot]
            self.watch.ended(rid, outcome, float(row[_ARRIVAL]), float(row[_FIRST]), float(row[_COMPLETION]),
                             self.truncated.get(rid))
        self._open -= 1
        self._ended.append(slot)
        if self.live_front is not None:
            self.send(self.live_front, "request_ended", rid, outcome, reason, float(when),
                      self._times[slot].copy(), self._expanded(self._itl.get(slot)))
        if len(self._ended) >= self.chunk_rows or self._ended_samples >= self.chunk_samples:
            self._flush()
        for dst in self.notify:
            self.send(dst, "ended", rid, float(when))

    def itl_steps(self, now: float, log: str, first: int, gaps: np.ndarray) -> None:
        """A decode engine's step gaps (s) for its steps first, first + 1, ... of step
        log `log` (`devices.engines.common.ITLRef`), before any request refers to them."""
        steps = self._logs.get(log)
        if steps is None:
            steps = self._logs[log] = _StepLog()
        steps.put(int(first), gaps)

    def _expanded(self, itl: np.ndarray | ITLRef | None) -> np.ndarray | None:
        """A request's ITL samples as one array (an `ITLRef` looked up in its log)."""
        if type(itl) is not ITLRef:
            return itl
        if itl.start == itl.stop:
            return itl.head
        return np.concatenate((itl.head, self._logs[itl.log].get(itl.start, itl.stop)))

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

    def note_recomputed(self, now: float, items: Iterable[tuple[int, int]]) -> None:
        """A decode engine re-admitted preempted requests after recomputing their KV:
        (request id, tokens recomputed) pairs, summed per request; in the snapshot under
        "recomputed_tokens" ({id: tokens})."""
        for rid, n in items:
            self.recomputed[int(rid)] = self.recomputed.get(int(rid), 0) + int(n)

    def note_recovery(self, now: float, record: dict) -> None:
        """Keep the router's record of one recovery ({"instance", "t", "ids"}: requests
        re-dispatched); returned under "recoveries" by `snapshot`."""
        self.recoveries.append(dict(record))

    def take_inbox(self, now: float | None) -> None:
        """Records sent straight to the inbox (`workloads.core`: the virtual driver's
        open-loop replays), in the order sent: as the handlers of the same messages.
        now: None when the driver deferred them (`all_ended`, `DEFERRABLE`): each
        record then carries its own time."""
        items = self.inbox[:]
        self.inbox.clear()
        batch: list = []        # consecutive lifecycle events: recorded in one call
        for method, args in items:
            if method == "events":
                batch.extend(args[0])
            elif method == "event":
                batch.append(args)
            else:
                if batch:
                    self._record(batch)
                    batch = []
                getattr(self, method)(now, *args)
        if batch:
            self._record(batch)

    # ----------------------------------------------------------------- driver reads
    def all_ended(self) -> bool:
        """True once every request has ended. Records waiting in the inbox (a driver
        that defers it: `rack.runtime.virtual`) are taken first when they could end
        every open request: a `finish` ends one request, so fewer messages than open
        requests cannot (the check is then O(1), as a done check is made at every
        instant)."""
        if self.inbox and len(self.inbox) >= self._open:
            self.take_inbox(None)
        return self._open == 0

    def open_requests(self) -> list[int]:
        """Ids of requests that have not ended yet."""
        return self.ids[self.outcome == 0].tolist()

    def open_examples(self, k: int = 5) -> list[tuple[int, str | None]]:
        """(id, last lifecycle event recorded, None if none) of the first `k` requests
        that have not ended (deadlock messages)."""
        out = []
        for rid in self.ids[self.outcome == 0][:k].tolist():
            slot = self._slot.get(rid)
            done = np.flatnonzero(~np.isnan(self._times[slot])) if slot is not None else np.zeros(0, int)
            out.append((rid, EVENTS[done.max()] if done.size else None))
        return out

    def still_open(self, ids: Iterable[int]) -> list[int]:
        """Those of `ids` that have not ended yet (unknown ids are left out)."""
        out = []
        for rid in ids:
            pos = self._position(int(rid))
            if pos is not None and not self.outcome[pos]:
                out.append(int(rid))
        return out

    def ended_among(self, ids: Iterable[int]) -> list[int]:
        """Those of `ids` that have ended (unknown ids are left out: a live front's
        request may reach an engine before its first event reaches the collector)."""
        out = []
        for rid in ids:
            pos = self._position(int(rid))
            if pos is not None and self.outcome[pos]:
                out.append(int(rid))
        return out

    def is_idle(self) -> bool:
        return True

    def waiting_for(self) -> str:
        return f"{self._open} request(s) to end" if self._open else ""

    def snapshot(self) -> dict:
        """All records, as plain arrays and dicts (picklable) for the metrics step.

        Rows still held are handed to the sink first (the ended ones as a chunk, the
        open ones as its open rows), so the sink then holds every request once; with
        `records_dir` the per-request arrays are not loaded: the snapshot has
        "records_dir" instead, and `rack.serving.records.assemble` reads them.
        A snapshot may be taken at any time; the run may go on after it.
        """
        self._flush()
        open_pos = np.flatnonzero(self.outcome == 0)
        meta = {"events": list(EVENTS), "outcomes": list(OUTCOMES), "requests": len(self.ids),
                "open": int(open_pos.size)}
        self.sink.set_open(self._chunk([self._slot.get(r, -1) for r in self.ids[open_pos].tolist()],
                                       self.ids[open_pos]), meta)
        names = sorted(self._log_index, key=self._log_index.get)
        self.sink.set_logs([self._logs[k].array() if k in self._logs else np.zeros(0) for k in names])
        out = {
            "ids": self.ids, "events": list(EVENTS), "outcomes": list(OUTCOMES),
            "violations": list(self.violations), "unknown_events": dict(self.unknown_events),
            "late_events": dict(self.late_events),
            "faults": [self.faults[i] for i in sorted(self.faults)],
            "output_tokens_served": dict(self.truncated), "recoveries": list(self.recoveries),
            "recomputed_tokens": dict(self.recomputed), "readmitted_s": dict(self.readmitted),
        }
        if isinstance(self.sink, DiskRecords):
            out["records_dir"] = str(self.sink.folder)
        else:
            out.update(assemble(self.sink.frozen(), self.ids, _E))
        return out

    # ----------------------------------------------------------------- internals
    def _position(self, rid: int) -> int | None:
        """Index of request `rid` in `ids`, None if unknown; live (`live_front`): a
        new position for a new id."""
        if self._live_pos is not None:
            pos = self._live_pos.get(rid)
            return self._open_live(rid) if pos is None else pos
        k = self._cursor
        if k < self._sorted.shape[0] and self.ids[k] == rid:
            # a replay's requests open in the order of `ids` (its run order), mostly: the
            # position after the last one found, checked first (ids are unique)
            self._cursor = k + 1
            return k
        k = int(np.searchsorted(self._sorted, rid))
        if k < len(self._sorted) and self._sorted[k] == rid:
            pos = int(self._order[k])
            self._cursor = pos + 1
            return pos
        return None

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        """Indices in `ids` of the known request ids `ids` (shape (k,))."""
        if self._live_pos is not None:
            return np.array([self._live_pos[int(r)] for r in ids.tolist()], dtype=np.int64)
        return self._order[np.searchsorted(self._sorted, ids)] if ids.size else np.zeros(0, np.int64)

    def _open_live(self, rid: int) -> int:
        """A position for request `rid`, first seen live (`ids` and `outcome` grow by
        doubling; the public arrays are views of their first `_n_live` entries)."""
        n = self._n_live
        if n == self._ids_buf.shape[0]:
            cap = max(64, 2 * n)
            self._ids_buf = np.concatenate((self._ids_buf, np.zeros(cap - n, np.int64)))
            self._outcome_buf = np.concatenate((self._outcome_buf, np.zeros(cap - n, np.int8)))
        self._ids_buf[n] = rid
        self._live_pos[rid] = n
        self._n_live = n + 1
        self.ids, self.outcome = self._ids_buf[:n + 1], self._outcome_buf[:n + 1]
        self._open += 1
        return n

    def _take_slot(self, rid: int, pos: int) -> int:
        """A slot for request `rid` (its position in `ids`: `pos`, kept with the slot so
        that its end needs no search)."""
        if not self._free:
            cap = len(self._slot_id)
            self._slot_id = np.concatenate([self._slot_id, np.zeros(cap, np.int64)])
            self._times = np.concatenate([self._times, np.full((cap, _E), np.nan)])
            self._pre = np.concatenate([self._pre, np.zeros(cap, np.int32)])
            self._end = np.concatenate([self._end, np.full(cap, np.nan)])
            self._free = list(range(2 * cap - 1, cap - 1, -1))
        slot = self._free.pop()
        self._slot[rid] = slot
        self._pos_of_slot[slot] = pos
        self._slot_id[slot] = rid
        return slot

    def _chunk(self, slots: Sequence[int], ids: np.ndarray) -> dict[str, np.ndarray]:
        """A chunk (rack.serving.records) of the rows in `slots` (-1: a request with no
        row: no event yet), for requests `ids`."""
        sl = np.asarray(slots, dtype=np.int64)
        held = sl >= 0
        k = len(sl)
        times = np.full((k, _E), np.nan)
        times[held] = self._times[sl[held]]
        pre = np.zeros(k, np.int32)
        pre[held] = self._pre[sl[held]]
        end = np.full(k, np.nan)
        end[held] = self._end[sl[held]]
        itl = [self._itl.get(x) for x in sl.tolist()]
        explicit = [v.head if type(v) is ITLRef else v for v in itl]
        lengths = np.array([0 if v is None else v.size for v in explicit], dtype=np.int64)
        linked = [(self._log_index[v.log], v.start, v.stop) if type(v) is ITLRef else (-1, 0, 0) for v in itl]
        refs = np.array(linked, dtype=np.int64).reshape(-1, 3)
        ids = np.asarray(ids, np.int64)
        pos = self._positions(ids)
        return {"id": ids, "times": times, "outcome": self.outcome[pos],
                "reason": np.array([self._reason.get(x, "") for x in sl.tolist()], dtype=str),
                "preemptions": pre, "end_s": end, "itl_len": lengths,
                "itl_s": np.concatenate([v for v in explicit if v is not None] or [np.zeros(0)]),
                "itl_log": refs[:, 0].astype(np.int32), "itl_from": refs[:, 1], "itl_to": refs[:, 2]}

    def _flush(self) -> None:
        """Hand the ended rows held to the sink as one chunk and free their slots."""
        if not self._ended:
            return
        slots = self._ended
        self.sink.add(self._chunk(slots, self._slot_id[np.asarray(slots, dtype=np.int64)]))
        for slot in slots:
            del self._slot[int(self._slot_id[slot])]
            del self._pos_of_slot[slot]
            self._reason.pop(slot, None)
            self._itl.pop(slot, None)
        sl = np.asarray(slots, dtype=np.int64)
        self._times[sl] = np.nan
        self._pre[sl] = 0
        self._end[sl] = np.nan
        self._free.extend(reversed(slots))
        self._ended = []
        self._ended_samples = 0

    def _record(self, batch: Iterable[tuple[int, str, float]]) -> None:
        """Record `(request_id, name, t)` lifecycle events in order."""
        slots, col_of = self._slot, _COL
        times = self._times
        for request_id, name, t in batch:
            slot = slots.get(request_id)    # (an int id: no conversion per event)
            if slot is None and (slot := slots.get(int(request_id))) is None:
                rid = int(request_id)
                pos = self._position(rid)
                if pos is None:
                    self.violations.append(f"event {name!r} for unknown request {request_id}")
                    continue
                if self.outcome[pos]:                # its row has left with an earlier chunk
                    self.late_events[name] += 1
                    continue
                slot = self._take_slot(rid, pos)
                times = self._times                  # grown, perhaps
            col = col_of.get(name)
            if col is None:                         # (not a lifecycle column: rare)
                if name == "preempted":
                    self._pre[slot] += 1
                elif name == "decode_readmit":      # after a preemption: the latest (issue 37)
                    self.readmitted[int(request_id)] = float(t)
                else:
                    self.unknown_events[name] += 1
                continue
            # Keep the first occurrence: a re-sent transfer or a recomputed request keeps
            # the time its stage first happened, as a client would observe it...
            old = times[slot, col]
            if old != old:                     # NaN: not recorded yet (no ufunc call per event)
                times[slot, col] = t
                if col == _FIRST and self.watch is not None:
                    self.watch.first_token(int(request_id), t, float(times[slot, _ARRIVAL]))
            elif name in _REDONE:
                # ...except the end of a stage that was redone, whose latest time counts.
                times[slot, col] = t


class _StepLog:
    """A decode engine's step gaps by global step index (`Collector.itl_steps`), kept as
    the arrays the engine sent (one float per decode step, not per token; no copy per
    message: fresh memory is what a large array costs most). Steps never sent are NaN
    in `array()` (no request refers to them)."""

    __slots__ = ("_firsts", "_parts", "_n")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._parts: list[np.ndarray] = []
        self._n = 0

    def put(self, first: int, gaps: np.ndarray) -> None:
        """Steps first, first + 1, ... (after those sent before: an engine sends in order)."""
        if first < self._n:
            raise ValueError(f"step log: steps from {first} sent again (have {self._n})")
        self._firsts.append(first)
        self._parts.append(gaps)
        self._n = first + gaps.shape[0]

    def get(self, start: int, stop: int) -> np.ndarray:
        """The gaps of steps [start, stop) (all sent)."""
        k = max(0, bisect.bisect_right(self._firsts, start) - 1)
        pieces = []
        while start < stop:
            first, part = self._firsts[k], self._parts[k]
            take = part[max(0, start - first): stop - first]
            pieces.append(take)
            start = first + part.shape[0]
            k += 1
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def array(self) -> np.ndarray:
        """Every step sent so far as one array (NaN where none was)."""
        out = np.full(self._n, np.nan)
        for first, part in zip(self._firsts, self._parts):
            out[first:first + part.shape[0]] = part
        return out
