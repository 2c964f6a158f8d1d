"""`RequestTable`: a run's requests as numpy columns instead of `Request` objects.

A `Request` costs ~200-1,000 bytes as a Python object (more with block hashes: a
tuple of ints); a day of production traffic is ~1.4 M requests (Azure LLM inference
trace 2024), so a list of them takes most of a long replay's memory before it starts.
A table keeps the same fields in arrays (~45 bytes a request, plus 4 or 8 bytes a
block hash) and builds `Request`s on demand, a block at a time: iterating, indexing
and slicing give requests equal, field for field, to the ones it was made from.

Columns (all of length n, in the table's order):

| attribute | dtype | field of `Request` |
|---|---|---|
| `ids` | int64 | id |
| `arrivals` | float64 | arrival_s |
| `prompts` | int64 | prompt_tokens |
| `outputs` | int64 | output_tokens |
| `reasoning` | int64 | reasoning_tokens |
| `block_sizes` | int64 | block_size |
| `hash_start` | int64, n + 1 | request i's hashes are `hash_flat[hash_start[i]:hash_start[i + 1]]` |
| `has_hashes` | bool | block_hashes is not None |

`hash_flat` is int32 when every hash fits, else int64; hashes beyond int64 (any
Python int is a valid hash) are kept as tuples in `_big` by position. Labels
(`tenant`, `slo_class`) are codes into a list of the distinct labels; session turns
(`Request.turn`, rare) are kept as objects by position.

Provenance attributes are those of `workloads.replay.RequestList` (`name`, `path`,
`format`, `controls`, reader counters, `summary()`), so a table stands wherever a
RequestList does for a replay (`rack.run.runner.run_scenario` on the virtual
runtime, the metrics). Tables are immutable; `take`, `where`, `with_arrivals` and
slices give new ones.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .meta import RequestMeta
from .request import Request, Turn

#: Requests built at a time by iteration and indexing (a block's objects are kept
#: until another block is asked for: sequential access builds each request once).
BLOCK = 4096
#: Rows gathered as Python values before they become arrays (`from_requests`).
BUILD_CHUNK = 1 << 16
#: Block hashes gathered as Python ints before they become an array.
BUILD_HASHES = 1 << 18
_I32 = np.iinfo(np.int32)
_I64 = np.iinfo(np.int64)


class RequestTable(RequestMeta, Sequence):
    """Requests as columns (module docstring). Build with `from_requests` (any
    iterable of `Request`s, consumed in chunks: a trace reader streams through it) or
    `from_columns` (generated arrays, no `Request` made)."""

    def __init__(self, cols: dict[str, Any], **meta: Any) -> None:
        self.ids: np.ndarray = cols["ids"]
        self.arrivals: np.ndarray = cols["arrivals"]
        self.prompts: np.ndarray = cols["prompts"]
        self.outputs: np.ndarray = cols["outputs"]
        self.reasoning: np.ndarray = cols["reasoning"]
        self.block_sizes: np.ndarray = cols["block_sizes"]
        self.has_hashes: np.ndarray = cols["has_hashes"]
        self.hash_start: np.ndarray = cols["hash_start"]
        self.hash_flat: np.ndarray = cols["hash_flat"]
        self._big: dict[int, tuple] = cols.get("big", {})
        self._labels: list[str | None] = cols.get("labels", [None])
        self._tenant: np.ndarray = cols["tenant"]
        self._slo: np.ndarray = cols["slo"]
        self._turns: dict[int, Turn] = cols.get("turns", {})
        self._block: tuple[int, list[Request]] = (-1, [])
        self._set_meta(len(self.ids), meta)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_columns(cls, ids: np.ndarray, arrivals: np.ndarray, prompts: np.ndarray,
                     outputs: np.ndarray, *, block_size: int = 512,
                     hashes: Sequence[tuple[int, ...] | None] | None = None, **meta: Any) -> "RequestTable":
        """A table of generated columns (shape (n,) each; lengths are checked as
        `Request` checks them). hashes: per request a tuple or None (None: no
        request has hashes). Raises ValueError for a bad length or block size."""
        n = len(ids)
        b = _Builder()
        prompts = np.asarray(prompts, dtype=np.int64)
        outputs = np.asarray(outputs, dtype=np.int64)
        from .request import MAX_TOKENS

        bad = (prompts < 1) | (prompts > MAX_TOKENS) | (outputs < 1) | (outputs > MAX_TOKENS)
        if bad.any() or block_size < 1:
            i = int(np.flatnonzero(bad)[0]) if bad.any() else 0
            Request(int(ids[i]), float(arrivals[i]), int(prompts[i]), int(outputs[i]), None, block_size)
        cols = {"ids": np.asarray(ids, dtype=np.int64), "arrivals": np.asarray(arrivals, dtype=np.float64),
                "prompts": prompts, "outputs": outputs, "reasoning": np.zeros(n, np.int64),
                "block_sizes": np.full(n, block_size, np.int64),
                "tenant": np.zeros(n, np.int32), "slo": np.zeros(n, np.int32)}
        if hashes is None:
            cols.update(has_hashes=np.zeros(n, bool), hash_start=np.zeros(n + 1, np.int64),
                        hash_flat=np.zeros(0, np.int32))
        else:
            for pos, h in enumerate(hashes):
                b.add_hashes(pos, h)
            cols.update(b.hash_columns(n), has_hashes=np.fromiter((h is not None for h in hashes), bool, n))
        return cls(cols, **meta)

    @classmethod
    def from_requests(cls, requests: Iterable[Request], **meta: Any) -> "RequestTable":
        """A table of `requests` (consumed once, `BUILD_CHUNK` rows at a time; none is
        kept); `meta`: provenance (RequestMeta)."""
        b = _Builder()
        for r in requests:
            b.add(r)
        return cls(b.finish(), **meta)

    # ------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"request position {i} outside a table of {n}")
        start, block = self._block
        if not start <= i < start + len(block):
            start = i - i % BLOCK
            block = self._build(start, min(start + BLOCK, n))
            self._block = (start, block)
        return block[i - start]

    def __iter__(self) -> Iterator[Request]:
        for start in range(0, len(self), BLOCK):
            yield from self._build(start, min(start + BLOCK, len(self)))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"RequestTable({len(self)} requests, name={self.name!r})"

    def _build(self, a: int, b: int) -> list[Request]:
        ids, t = self.ids[a:b].tolist(), self.arrivals[a:b].tolist()
        p, o = self.prompts[a:b].tolist(), self.outputs[a:b].tolist()
        rs, bs = self.reasoning[a:b].tolist(), self.block_sizes[a:b].tolist()
        has = self.has_hashes[a:b].tolist()
        st = self.hash_start[a:b + 1].tolist()
        flat = self.hash_flat[st[0]:st[-1]].tolist()
        base = st[0]
        lab, ten, slo = self._labels, self._tenant[a:b].tolist(), self._slo[a:b].tolist()
        big, turns = self._big, self._turns
        out = []
        for k in range(b - a):
            pos = a + k
            if not has[k]:
                h = None
            elif pos in big:
                h = big[pos]
            else:
                h = tuple(flat[st[k] - base:st[k + 1] - base])
            out.append(Request(ids[k], t[k], p[k], o[k], h, bs[k], lab[ten[k]], lab[slo[k]], rs[k],
                               turns.get(pos)))
        return out

    # ------------------------------------------------------------------ queries
    @property
    def any_hashes(self) -> bool:
        """Some request carries a non-empty tuple of block hashes."""
        return bool(self._big) or bool(np.any(np.diff(self.hash_start) > 0))

    @property
    def has_turns(self) -> bool:
        """Some request is a turn of a session (`Request.turn`)."""
        return bool(self._turns)

    def in_arrival_order(self) -> bool:
        """Sorted by (arrival_s, id), as `run_scenario` replays requests."""
        t, i = self.arrivals, self.ids
        if len(t) < 2:
            return True
        dt = np.diff(t)
        return bool(np.all((dt > 0) | ((dt == 0) & (np.diff(i) > 0))))

    def sorted_by_arrival(self) -> "RequestTable":
        """This table in (arrival_s, id) order (itself when it already is)."""
        if self.in_arrival_order():
            return self
        return self.take(np.lexsort((self.ids, self.arrivals)))

    # ------------------------------------------------------------------ new tables
    def take(self, index: np.ndarray) -> "RequestTable":
        """The requests at positions `index` (int array), in that order."""
        index = np.asarray(index, dtype=np.int64)
        lengths = np.diff(self.hash_start)[index]
        starts = self.hash_start[:-1][index]
        hs = np.zeros(len(index) + 1, np.int64)
        np.cumsum(lengths, out=hs[1:])
        gather = np.repeat(starts - hs[:-1], lengths) + np.arange(int(hs[-1]))
        where = {int(p): k for k, p in enumerate(index.tolist())} if (self._big or self._turns) else {}
        cols = {"ids": self.ids[index], "arrivals": self.arrivals[index], "prompts": self.prompts[index],
                "outputs": self.outputs[index], "reasoning": self.reasoning[index],
                "block_sizes": self.block_sizes[index], "has_hashes": self.has_hashes[index],
                "hash_start": hs, "hash_flat": self.hash_flat[gather], "labels": self._labels,
                "tenant": self._tenant[index], "slo": self._slo[index],
                "big": {where[p]: v for p, v in self._big.items() if p in where},
                "turns": {where[p]: v for p, v in self._turns.items() if p in where}}
        return RequestTable(cols, **self.meta())

    def where(self, mask: np.ndarray) -> "RequestTable":
        """The requests where `mask` (bool, shape (n,)) is True, in order."""
        return self.take(np.flatnonzero(mask))

    def with_arrivals(self, arrivals: np.ndarray) -> "RequestTable":
        """The first len(arrivals) requests with those arrival times (s)."""
        out = self[:len(arrivals)]
        out.arrivals = np.asarray(arrivals, dtype=np.float64).copy()
        out._block = (-1, [])
        return out

    def with_meta(self, **meta: Any) -> "RequestTable":
        """The same requests with other provenance (the columns are shared)."""
        out = RequestTable.__new__(RequestTable)
        out.__dict__.update(self.__dict__)
        out._block = (-1, [])
        out._set_meta(len(self), {**self.meta(), **meta})
        return out

    def positions(self) -> "IdPositions":
        """A mapping request id -> position (`IdPositions`), without a dict of n ids."""
        return IdPositions(self.ids)

    def overlay(self) -> "RequestOverlay":
        """A mutable view (`RequestOverlay`): what the router replays from."""
        return RequestOverlay(self)


class IdPositions:
    """Request id -> position of a table's ids (sorted index and a binary search), with
    positions added later (`pos[id] = p`) kept in a dict: the `dict` interface the
    router uses (`get`, `[]`, `[]=`, `in`)."""

    def __init__(self, ids: np.ndarray) -> None:
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]
        self._extra: dict[int, int] = {}

    def get(self, rid: int, default: Any = None) -> Any:
        k = int(np.searchsorted(self._sorted, rid))
        if k < len(self._sorted) and self._sorted[k] == rid:
            return int(self._order[k])
        return self._extra.get(rid, default)

    def __getitem__(self, rid: int) -> int:
        p = self.get(rid)
        if p is None:
            raise KeyError(rid)
        return p

    def __setitem__(self, rid: int, pos: int) -> None:
        self._extra[int(rid)] = int(pos)

    def __contains__(self, rid: int) -> bool:
        return self.get(rid) is not None


class RequestOverlay(Sequence):
    """A table with some positions replaced (`o[i] = request`: a truncated request)
    and requests appended (a live front's): the list interface the router uses."""

    def __init__(self, table: RequestTable) -> None:
        self._table, self._n = table, len(table)
        self._replaced: dict[int, Request] = {}
        self._extra: list[Request] = []

    def __len__(self) -> int:
        return self._n + len(self._extra)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i >= self._n:
            return self._extra[i - self._n]
        r = self._replaced.get(i)
        return self._table[i] if r is None else r

    def __setitem__(self, i: int, req: Request) -> None:
        if i >= self._n:
            self._extra[i - self._n] = req
        else:
            self._replaced[i] = req

    def append(self, req: Request) -> None:
        self._extra.append(req)

    def __iter__(self) -> Iterator[Request]:
        for i, r in enumerate(self._table):
            yield self._replaced.get(i, r)
        yield from self._extra


class _Builder:
    """Columns of a table, gathered in chunks (`RequestTable.from_requests`)."""

    _FIELDS = ("ids", "arrivals", "prompts", "outputs", "reasoning", "block_sizes", "has_hashes",
               "tenant", "slo")
    _DTYPES = (np.int64, np.float64, np.int64, np.int64, np.int64, np.int64, bool, np.int32, np.int32)

    def __init__(self) -> None:
        self._rows: list[list] = [[] for _ in self._FIELDS]
        self._done: list[list[np.ndarray]] = [[] for _ in self._FIELDS]
        self._hash_len: list[int] = []
        self._hash_vals: list[int] = []
        self._hash_parts: list[np.ndarray] = []
        self._len_parts: list[np.ndarray] = []
        self._wide = False
        self.big: dict[int, tuple] = {}
        self.turns: dict[int, Turn] = {}
        self.labels: list[str | None] = [None]
        self._label_code: dict[str | None, int] = {None: 0}
        self.n = 0

    def _code(self, label: str | None) -> int:
        c = self._label_code.get(label)
        if c is None:
            c = self._label_code[label] = len(self.labels)
            self.labels.append(label)
        return c

    def add(self, r: Request) -> None:
        rows = self._rows
        rows[0].append(r.id)
        rows[1].append(r.arrival_s)
        rows[2].append(r.prompt_tokens)
        rows[3].append(r.output_tokens)
        rows[4].append(r.reasoning_tokens)
        rows[5].append(r.block_size)
        rows[6].append(r.block_hashes is not None)
        rows[7].append(self._code(r.tenant))
        rows[8].append(self._code(r.slo_class))
        if r.turn is not None:
            self.turns[self.n] = r.turn
        self.add_hashes(self.n, r.block_hashes)
        self.n += 1
        if len(rows[0]) >= BUILD_CHUNK:
            self._seal()

    def add_hashes(self, pos: int, h: tuple[int, ...] | None) -> None:
        if h and not (_I64.min <= min(h) and max(h) <= _I64.max):
            self.big[pos] = tuple(h)
            h = ()
        if h:
            self._hash_vals.extend(h)
            if not self._wide and not (_I32.min <= min(h) and max(h) <= _I32.max):
                self._wide = True
        self._hash_len.append(len(h) if h else 0)
        if len(self._hash_len) >= BUILD_CHUNK or len(self._hash_vals) >= BUILD_HASHES:
            self._seal_hashes()

    def _seal_hashes(self) -> None:
        if self._hash_len:
            self._len_parts.append(np.array(self._hash_len, dtype=np.int64))
            # int32 while every hash so far fits: half the bytes of a Mooncake trace's ids
            self._hash_parts.append(np.array(self._hash_vals, dtype=np.int64 if self._wide else np.int32))
            self._hash_len, self._hash_vals = [], []

    def _seal(self) -> None:
        for k, dt in enumerate(self._DTYPES):
            self._done[k].append(np.array(self._rows[k], dtype=dt))
            self._rows[k] = []

    def hash_columns(self, n: int) -> dict[str, Any]:
        self._seal_hashes()
        lengths = _join(self._len_parts, np.int64)
        start = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=start[1:])
        return {"hash_start": start, "hash_flat": _join(self._hash_parts, np.int64 if self._wide else np.int32),
                "big": self.big}

    def finish(self) -> dict[str, Any]:
        self._seal()
        cols = {f: _join(parts, dt) for f, parts, dt in zip(self._FIELDS, self._done, self._DTYPES)}
        return {**cols, **self.hash_columns(self.n), "labels": self.labels, "turns": self.turns}


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The arrays of `parts` end to end as one array of `dtype`, emptying `parts` as
    they are copied (at most one part beside the result: no second copy of a column)."""
    out = np.empty(sum(len(p) for p in parts), dtype=dtype)
    at = 0
    parts.reverse()
    while parts:
        p = parts.pop()
        out[at:at + len(p)] = p
        at += len(p)
    return out


__all__ = ["BLOCK", "IdPositions", "RequestOverlay", "RequestTable"]
