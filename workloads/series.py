"""Gauges over emulated time in bounded memory, for any core (beside `workloads.core`,
the bottom layer every core may import).

An engine's occupancy, a link's utilisation: rows are added at events, never per
token, so a short run keeps every change; a day-long trace would keep millions of rows
per instance. `BoundedSeries` keeps at most `max_rows`: once full it coarsens to the
last row of each window of `dt` emulated seconds, so its memory no longer grows with
the run's length.
"""

from __future__ import annotations

import numpy as np

#: Rows a series keeps at most (each row: time + values, float64): 32,768 rows of an
#: engine's 7 columns are 1.8 MB, whatever the run's length.
MAX_ROWS = 1 << 15


class BoundedSeries:
    """Rows (t, v_1 .. v_k) of k gauges over emulated time (s), at most `max_rows`.

    A row at the same time as the last one replaces it (an instant's several events
    leave its final state). When `max_rows` rows are held, the series coarsens: time is
    cut into windows of `dt` seconds from the first row's time (dt = twice the span over
    `max_rows` the first time, then doubled until at least that) and only the last row of each window
    is kept; from then on a row in the same window as the last one replaces it. Every
    row keeps the exact values at its own time; what a coarsened series loses is the
    states in between (a peak between two kept rows). `dt` is 0 until the first
    coarsening (`resolution_s`).

    k: values per row (>= 1); max_rows: >= 4. Raises ValueError otherwise.
    """

    __slots__ = ("_buf", "_n", "_dt", "_t0", "max_rows", "_pend", "_last")

    #: rows staged in a list before they are copied into the array in one go
    _STAGE = 512

    def __init__(self, k: int, max_rows: int = MAX_ROWS, capacity: int = 256) -> None:
        if k < 1 or max_rows < 4:
            raise ValueError(f"BoundedSeries: k must be >= 1 and max_rows >= 4, got {k}, {max_rows}")
        self.max_rows = int(max_rows)
        self._buf = np.empty((max(4, min(capacity, self.max_rows)), 1 + k), dtype=np.float64)
        self._n = 0
        self._dt = 0.0
        self._t0 = 0.0
        # Rows are added at every event of an engine: the common case (no coarsening
        # near) appends a tuple to `_pend`, copied into `_buf` in blocks; `_last` is the
        # last row's time (None: empty). Rows the array would get one by one, the same.
        self._pend: list[tuple] = []
        self._last: float | None = None

    def __len__(self) -> int:
        return self._n + len(self._pend)

    @property
    def resolution_s(self) -> float:
        """The window (emulated s) rows are coarsened to; 0: every event kept."""
        return self._dt

    @property
    def origin_s(self) -> float:
        """Where the windows start (the first row's time at the first coarsening)."""
        return self._t0

    def last(self) -> tuple[float, ...] | None:
        """The last row (t, v_1 .. v_k), or None if empty."""
        if self._pend:
            return tuple(map(float, self._pend[-1]))
        return tuple(self._buf[self._n - 1].tolist()) if self._n else None

    def add(self, t: float, *values: float) -> None:
        """Append the row (t, *values) (t not before the last row's)."""
        last = self._last
        if last is not None:
            dt = self._dt
            if t == last or dt and (t - self._t0) // dt == (last - self._t0) // dt:
                # the same instant or window: its last state
                if self._pend:
                    self._pend[-1] = (t, *values)
                else:
                    self._buf[self._n - 1] = (t, *values)
                self._last = t
                return
        pend = self._pend
        self._last = t
        if self._n + len(pend) + 1 < self.max_rows:      # no coarsening before this row is in
            pend.append((t, *values))
            if len(pend) >= self._STAGE:
                self._flush()
            return
        self._flush()
        self._add_row(t, values)

    def _flush(self) -> None:
        """Copy the staged rows into the array (none of them coarsens it)."""
        pend = self._pend
        if not pend:
            return
        n, k = self._n, len(pend)
        if n + k > self._buf.shape[0]:
            grow = max(n + k, min(2 * self._buf.shape[0], self.max_rows)) - self._buf.shape[0]
            self._buf = np.concatenate((self._buf, np.empty((grow, self._buf.shape[1]))))
        self._buf[n:n + k] = pend
        self._n = n + k
        pend.clear()

    def _add_row(self, t: float, values: tuple) -> None:
        """`add` on the array, one row (where it may coarsen)."""
        while True:
            n = self._n
            if n and self._joins_last(t):
                self._buf[n - 1] = (t, *values)     # the same instant or window: its last state
                return
            if n < self._buf.shape[0]:
                break
            if n >= self.max_rows:
                self._coarsen(t)                    # then the last row may share t's window
            else:
                grow = min(n, self.max_rows - n)
                self._buf = np.concatenate((self._buf, np.empty((grow, self._buf.shape[1]))))
        self._buf[n] = (t, *values)
        self._n = n + 1

    def _joins_last(self, t: float) -> bool:
        """Whether a row at `t` replaces the last one (same instant, or same window)."""
        last = self._buf[self._n - 1, 0]
        dt = self._dt
        return last == t or bool(dt) and (t - self._t0) // dt == (last - self._t0) // dt

    def _coarsen(self, t_next: float) -> None:
        """Keep the last row of each window of a doubled `dt`."""
        rows = self._buf[: self._n]
        first = not self._dt
        if first:
            self._t0 = float(rows[0, 0])          # windows stay aligned here for good
        want = 2.0 * (max(float(t_next), float(rows[-1, 0])) - self._t0) / self.max_rows
        # later, doubling keeps each new window the union of old ones: rows kept by an
        # earlier coarsening are still each the last of their (larger) window
        dt = want if first else 2.0 * self._dt
        while dt < want:
            dt *= 2.0
        self._dt = dt
        w = (rows[:, 0] - self._t0) // self._dt
        keep = np.ones(len(rows), dtype=bool)
        keep[:-1] = w[1:] != w[:-1]
        kept = rows[keep]
        self._buf[: len(kept)] = kept
        self._n = len(kept)

    def columns(self) -> tuple[np.ndarray, ...]:
        """(t, v_1 .. v_k) as arrays of shape (n,) (copies)."""
        self._flush()
        rows = self._buf[: self._n]
        return tuple(rows[:, i].copy() for i in range(rows.shape[1]))


__all__ = ["BoundedSeries", "MAX_ROWS"]
