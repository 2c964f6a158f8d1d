"""Per-request records in chunks: where the collector puts the rows of ended requests.

The collector (`rack.serving.collector`) keeps a row only while its request is in the
rack; rows of ended requests leave it in *chunks* of at most `CHUNK_ROWS` rows or
`CHUNK_SAMPLES` inter-token latencies, whichever fills first. A chunk is a dict of
numpy arrays, one row per request, in the order the requests ended:

| key | dtype, shape | meaning |
|---|---|---|
| `id` | int64 (k,) | request id |
| `times` | float64 (k, len(EVENTS)) | lifecycle times (emulated s, NaN: did not happen) |
| `outcome` | int8 (k,) | 0 open (never ended), 1.. index in OUTCOMES + 1 |
| `reason` | str (k,) | reason of a rejected/failed request, "" otherwise |
| `preemptions` | int32 (k,) | times the request was preempted |
| `end_s` | float64 (k,) | when the request ended (NaN: open) |
| `itl_len` | int64 (k,) | its inter-token latency samples held in `itl_s` (0: none) |
| `itl_s` | float64 (sum(itl_len),) | those samples, request after request |
| `itl_log` | int32 (k,) | the step log its other samples are in (index in the run's logs; -1: none) |
| `itl_from`, `itl_to` | int64 (k,) | its steps [from, to) of that log: step j's sample is the log's j-th gap |

A request's samples are its `itl_s` then its steps' gaps. A decode engine that emits one
token per step sends the collector the gaps of its step log (one float per step, shared
by every request of its batch) and, per request, only the step range
(`devices.engines.common.ITLRef`): the records then hold a float per step rather than
per token, and the run's samples are the explicit ones plus each log gap counted once
per request whose range covers it (`ITLSamples`, with the same exact summaries as the
expanded samples, `rack.measure.quantiles`). The logs are kept whole (`itl_logs.npz` on
disk), one float per decode step of the run.

Two sinks hold the chunks: `MemoryRecords` (a list; the default) and `DiskRecords`, which
writes each chunk to a folder as `part-NNNNNN.npz` (numpy's uncompressed zip of .npy
arrays, readable with `np.load` and nothing else) the moment it is full, plus
`open.npz` (the rows of requests that had not ended, rewritten at each snapshot),
`itl_logs.npz` (the step logs, `log0`, `log1`, ...) and `records.json` (format, event and
outcome names, counts). Streaming to disk keeps the
emulator's memory bounded by the requests in flight, not by the run's length; the rows
are read back one column at a time for the metrics, and the latency samples one chunk
at a time (`SampleChunks`, `ITLSamples`, with exact percentiles by `rack.measure.quantiles`).

Both sinks get the same chunks at the same moments, so a run gives the same records
either way; `assemble` turns them into the collector's snapshot arrays, in the order
of the run's request ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

#: Most rows in one chunk.
CHUNK_ROWS = 1 << 14
#: Most inter-token latency samples in one chunk (16 MiB of float64): a chunk is
#: written once either limit is reached.
CHUNK_SAMPLES = 1 << 21
#: `records.json` "format" of the files this module writes.
FORMAT = "rack-records/2"
#: Columns of a chunk (module docstring).
COLUMNS = ("id", "times", "outcome", "reason", "preemptions", "end_s", "itl_len", "itl_s", "itl_log", "itl_from",
           "itl_to")
#: The columns that place a request's samples (all but the samples).
ITL_PLACES = ("id", "itl_len", "itl_log", "itl_from", "itl_to")


class MemoryRecords:
    """Chunks kept in a list (the default sink)."""

    where = "memory"

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []
        self._open: dict[str, np.ndarray] | None = None
        self._logs: list[np.ndarray] = []

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        """Keep one chunk of ended requests."""
        self._chunks.append(chunk)

    def set_open(self, chunk: dict[str, np.ndarray], meta: dict) -> None:
        """The rows of the requests that have not ended (replacing earlier ones)."""
        self._open = chunk

    def set_logs(self, logs: Sequence[np.ndarray]) -> None:
        """The step logs (module docstring), replacing earlier ones."""
        self._logs = list(logs)

    def logs(self) -> list[np.ndarray]:
        return self._logs

    def frozen(self) -> "MemoryRecords":
        """These records as they are now (a run may go on adding to this sink)."""
        out = MemoryRecords()
        out._chunks, out._open, out._logs = list(self._chunks), self._open, list(self._logs)
        return out

    def chunks(self, keys: Sequence[str] = COLUMNS) -> Iterator[dict[str, np.ndarray]]:
        """Every chunk (ended ones in order, then the open rows), restricted to `keys`."""
        for c in [*self._chunks, *([self._open] if self._open is not None else [])]:
            yield {k: c[k] for k in keys}


class DiskRecords:
    """Chunks written to `folder` (created; earlier records there are removed) as
    `part-NNNNNN.npz`, with `open.npz` and `records.json` (module docstring).

    Raises OSError when the folder cannot be written.
    """

    where = "disk"

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in [*self.folder.glob("part-*.npz"), self.folder / "open.npz"]:
            old.unlink(missing_ok=True)       # a rerun into the same results folder
        self._parts = 0

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        """Write one chunk of ended requests as the next part file."""
        _save(self.folder / f"part-{self._parts:06d}.npz", chunk)
        self._parts += 1

    def set_open(self, chunk: dict[str, np.ndarray], meta: dict) -> None:
        """Write the open rows and `records.json` (`meta` plus the part count)."""
        _save(self.folder / "open.npz", chunk)
        (self.folder / "records.json").write_text(json.dumps(
            {"format": FORMAT, **meta, "parts": self._parts}, indent=1) + "\n")

    def set_logs(self, logs: Sequence[np.ndarray]) -> None:
        """Write the step logs (module docstring) to `itl_logs.npz`."""
        _save(self.folder / "itl_logs.npz", {f"log{i}": v for i, v in enumerate(logs)})

    def chunks(self, keys: Sequence[str] = COLUMNS) -> Iterator[dict[str, np.ndarray]]:
        return DiskRecordSet(self.folder).chunks(keys)

    def logs(self) -> list[np.ndarray]:
        return DiskRecordSet(self.folder).logs()


class DiskRecordSet:
    """Records written by `DiskRecords`, read back one chunk at a time (picklable: it
    is only the folder's path). Raises ValueError for a folder without records.json
    or of another format."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / "records.json"
        try:
            self.meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{meta_path}: cannot read the records' description ({exc})") from None
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path}: format {self.meta.get('format')!r}, expected {FORMAT!r}")

    def chunks(self, keys: Sequence[str] = COLUMNS) -> Iterator[dict[str, np.ndarray]]:
        """Every chunk (parts in order, then the open rows), restricted to `keys`;
        only those arrays are read."""
        names = [f"part-{i:06d}.npz" for i in range(int(self.meta["parts"]))] + ["open.npz"]
        for name in names:
            with np.load(self.folder / name, allow_pickle=False) as z:
                yield {k: z[k] for k in keys}

    def logs(self) -> list[np.ndarray]:
        """The step logs (module docstring), in index order."""
        path = self.folder / "itl_logs.npz"
        if not path.exists():
            return []
        with np.load(path, allow_pickle=False) as z:
            return [z[f"log{i}"] for i in range(len(z.files))]


def _save(path: Path, chunk: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **chunk)
    os.replace(tmp, path)          # a reader never sees half a chunk


class SampleChunks:
    """Latency samples kept as a sequence of chunks (in memory or on disk), for
    summaries that never hold them all at once (`rack.measure.quantiles`).

    `source`: a sink or record set with `chunks(keys)`; `key`: the samples' column.
    Iterating gives float64 arrays, one per chunk, NaN left out (empty ones skipped);
    `size` is the number of samples (counted by one pass).
    """

    def __init__(self, source: Any, key: str = "itl_s") -> None:
        self._source, self._key = source, key
        self.size = sum(len(c) for c in self)

    def __iter__(self) -> Iterator[np.ndarray]:
        for c in self._source.chunks((self._key,)):
            v = np.asarray(c[self._key], dtype=np.float64)
            nan = np.isnan(v)
            if nan.any():
                v = v[~nan]
            if v.size:
                yield v

    def __len__(self) -> int:
        return self.size


def empty_chunk(n_events: int) -> dict[str, np.ndarray]:
    """A chunk of no rows."""
    return {"id": np.zeros(0, np.int64), "times": np.zeros((0, n_events)), "outcome": np.zeros(0, np.int8),
            "reason": np.zeros(0, "U1"), "preemptions": np.zeros(0, np.int32), "end_s": np.zeros(0),
            "itl_len": np.zeros(0, np.int64), "itl_s": np.zeros(0), "itl_log": np.zeros(0, np.int32),
            "itl_from": np.zeros(0, np.int64), "itl_to": np.zeros(0, np.int64)}


def assemble(source: Any, ids: np.ndarray, n_events: int) -> dict[str, Any]:
    """The per-request arrays of a collector snapshot from the chunks of `source`
    (every request of the run once, ended or open), in the order of `ids` (shape (n,)).

    Returns {"times" (n, n_events), "outcome" int8 (n,), "reason" {id: reason},
    "preemptions" int32 (n,), "end_s" (n,), "itl": the inter-token latencies as an
    `ITLSamples` over `source` (its samples are read when asked)}.
    Raises ValueError if the chunks miss a request of `ids` or name one twice.
    """
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    times = np.full((n, n_events), np.nan)
    outcome = np.zeros(n, np.int8)
    preemptions = np.zeros(n, np.int32)
    end_s = np.full(n, np.nan)
    seen = np.zeros(n, bool)
    reason: dict[int, str] = {}
    keys = ("id", "times", "outcome", "reason", "preemptions", "end_s")
    for c in source.chunks(keys):
        cid = c["id"]
        if not cid.size:
            continue
        if n == 0:
            raise ValueError(f"records name request(s) the run did not submit, e.g. {cid[:3].tolist()}")
        k = np.searchsorted(sorted_ids, cid)
        k[k >= n] = 0
        if not np.array_equal(sorted_ids[k], cid):
            raise ValueError(f"records name request(s) the run did not submit, e.g. {cid[sorted_ids[k] != cid][:3].tolist()}")
        pos = order[k]
        if seen[pos].any():
            raise ValueError(f"records hold request(s) twice, e.g. {cid[seen[pos]][:3].tolist()}")
        seen[pos] = True
        times[pos] = c["times"]
        outcome[pos] = c["outcome"]
        preemptions[pos] = c["preemptions"]
        end_s[pos] = c["end_s"]
        for rid, why in zip(cid[c["reason"] != ""].tolist(), c["reason"][c["reason"] != ""].tolist()):
            reason[rid] = why
    if not seen.all():
        raise ValueError(f"records miss request(s), e.g. {ids[~seen][:3].tolist()}")
    return {"times": times, "outcome": outcome, "reason": reason, "preemptions": preemptions, "end_s": end_s,
            "itl": ITLSamples(source)}


class ITLSamples(SampleChunks):
    """Every inter-token latency sample of a run's records (`source`: a sink or record
    set with `chunks(keys)` and `logs()`), without a float per token: iterating gives
    the explicit samples (`itl_s`, as `SampleChunks`) then, per step log, the pair
    (gaps, counts): each gap once with the number of requests whose step range covers
    it (`rack.measure.quantiles` summarizes such runs exactly as the expanded samples).
    `size` is the number of samples; `per_request()` expands them request by request."""

    def __init__(self, source: Any) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []
        super().__init__(source, "itl_s")          # counts the explicit samples
        self.runs = self._runs()
        self.size += sum(int(c.sum()) for _, c in self.runs)

    def _runs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(gaps, counts) of each step log: how many requests' ranges cover each step
        (a difference array over the ranges, summed in place: one array per log, as
        fresh memory is what a large array costs most), steps no request covers left out."""
        logs = self._source.logs()
        if not logs:
            return []
        ranges: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in logs]
        for c in self._source.chunks(("itl_log", "itl_from", "itl_to")):
            log = c["itl_log"]
            linked = (log >= 0) & (c["itl_to"] > c["itl_from"])
            if linked.any():
                for i in np.unique(log[linked]).tolist():
                    mine = linked & (log == i)
                    ranges[i].append((c["itl_from"][mine], c["itl_to"][mine]))
        out = []
        for g, r in zip(logs, ranges):
            if not r:
                continue
            counts = np.zeros(len(g) + 1, np.int64)
            np.add.at(counts, np.concatenate([a for a, _ in r]), 1)
            np.add.at(counts, np.concatenate([b for _, b in r]), -1)
            np.cumsum(counts, out=counts)
            keep = counts[:-1] > 0          # (a covered step's gap was sent: never NaN)
            out.append((g[keep], counts[:-1][keep]))
        return out

    def __iter__(self) -> Iterator[np.ndarray | tuple[np.ndarray, np.ndarray]]:
        yield from super().__iter__()
        yield from self.runs

    def expanded(self) -> np.ndarray:
        """Every sample as one array (explicit ones, then each log's gaps repeated by
        their counts): for plots, not for summaries."""
        parts = [v if type(v) is not tuple else np.repeat(*v) for v in self]
        return np.concatenate(parts) if parts else np.zeros(0)

    def per_request(self) -> dict[str, np.ndarray]:
        """{"itl_ids": ids of the requests with samples (ascending), "itl_lengths": their
        sample counts, "itl_flat": their samples, request after request, each in token
        order}."""
        logs = self._source.logs()
        ids, segments = [], []
        for c in self._source.chunks(ITL_PLACES + ("itl_s",)):
            starts = np.concatenate(([0], np.cumsum(c["itl_len"])))
            for k, rid in enumerate(c["id"].tolist()):
                own = c["itl_s"][starts[k]:starts[k + 1]]
                i = int(c["itl_log"][k])
                seg = own if i < 0 else np.concatenate((own, logs[i][c["itl_from"][k]:c["itl_to"][k]]))
                if seg.size:
                    ids.append(rid)
                    segments.append(seg)
        if not ids:
            return {"itl_ids": np.zeros(0, np.int64), "itl_lengths": np.zeros(0, np.int64), "itl_flat": np.zeros(0)}
        order = np.argsort(np.array(ids, np.int64), kind="stable")
        return {"itl_ids": np.array(ids, np.int64)[order],
                "itl_lengths": np.array([segments[k].size for k in order.tolist()], np.int64),
                "itl_flat": np.concatenate([segments[k] for k in order.tolist()])}


__all__ = ["CHUNK_ROWS", "CHUNK_SAMPLES", "COLUMNS", "DiskRecordSet", "DiskRecords", "FORMAT", "ITLSamples",
           "MemoryRecords", "SampleChunks", "assemble", "empty_chunk"]
