"""Time series per instance and per KV link, from the components' stats (never from a
running core): what `timeseries.csv` holds, its plot (`rack.measure.plots.timeseries`)
and the engine tracks of the Perfetto timeline (`rack.measure.breakdown`).

Engines record a row at each event that may change their gauges (an iteration, a batch
boundary, a submission, a handoff; `devices.engines.common.EventSeries`), never per
token; each value holds until the next row (a step function). The interconnect records
each link's utilisation (rate / bandwidth) at every flow event.

`timeseries.csv` (one row per sample, long format; empty cells where a column does
not apply):

    component, role, t_s               instance or link name; prefill | decode | both |
                                       link; emulated seconds
    queue_depth, running               requests waiting / in the running batch (see
                                       `devices.engines.common.SERIES_COLUMNS`)
    kv_bytes, kv_capacity_bytes,       KV blocks held and reserved (bytes), the
    kv_occupancy                       instance's KV capacity, and the share held by
                                       KV and prefix cache together (0..1)
    prefix_cache_bytes                 bytes held by the prefix cache
    prefix_hit_blocks,                 the prefix cache's cumulative hit and looked-up
    prefix_lookup_blocks               full blocks (their differences over a window
                                       give the hit ratio in it)
    link_utilisation                   a link's carried rate / bandwidth (0..1)
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Mapping

import numpy as np

from devices.engines.common import SERIES_COLUMNS

CSV_COLUMNS = ("component", "role", "t_s", *SERIES_COLUMNS[:3], "kv_capacity_bytes", "kv_occupancy",
               *SERIES_COLUMNS[3:], "link_utilisation")


def instance_series(stats: Mapping[str, dict]) -> dict[str, dict]:
    """{instance: {"role", "kv_capacity_bytes", "t_s", column: array, "kv_occupancy"}}
    for every engine whose stats carry a "timeseries", rows sorted by time (stable: a
    wall-clock run may record an iteration's start after a later submission)."""
    out = {}
    for name, st in stats.items():
        ts = st.get("timeseries")
        if not ts:
            continue
        order = np.argsort(np.asarray(ts["t_s"], dtype=np.float64), kind="stable")
        d = {k: np.asarray(v, dtype=np.float64)[order] for k, v in ts.items()}
        cap = float(st.get("kv_capacity_bytes") or 0.0)
        d["kv_occupancy"] = (d["kv_bytes"] + d["prefix_cache_bytes"]) / cap if cap > 0 else \
            np.full_like(d["t_s"], math.nan)
        out[name] = {"role": st.get("role", ""), "kv_capacity_bytes": cap, **d}
    return out


def link_series(stats: Mapping[str, dict]) -> dict[str, dict]:
    """{link: {"t_s", "utilisation"}} from the interconnect's stats ({} without one)."""
    ic = stats.get("interconnect") or {}
    out = {}
    for name, link in (ic.get("links") or {}).items():
        s = np.asarray(link.get("series") or [], dtype=np.float64).reshape(-1, 2)
        out[name] = {"t_s": s[:, 0], "utilisation": s[:, 1]}
    return out


def write_timeseries_csv(path: Path | str, stats: Mapping[str, dict]) -> int:
    """Write `timeseries.csv` (module docstring) and return its number of rows."""
    rows = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for name, d in instance_series(stats).items():
            cols = [d[c] for c in ("t_s", *SERIES_COLUMNS[:3])]
            occ = d["kv_occupancy"]
            rest = [d[c] for c in SERIES_COLUMNS[3:]]
            cap = int(d["kv_capacity_bytes"])
            for i in range(d["t_s"].shape[0]):
                w.writerow([name, d["role"], repr(float(cols[0][i])), *(int(c[i]) for c in cols[1:]), cap,
                            f"{occ[i]:.6g}", *(int(c[i]) for c in rest), ""])
                rows += 1
        for name, d in link_series(stats).items():
            for t, u in zip(d["t_s"].tolist(), d["utilisation"].tolist()):
                w.writerow([name, "link", repr(t), "", "", "", "", "", "", "", "", f"{u:.6g}"])
                rows += 1
    return rows


def step_means(t: np.ndarray, v: np.ndarray, end_s: float, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Time-weighted mean per bin of the step function (t, v) (t sorted; 0 before the
    first sample) over `bins` equal bins of [0, end_s], the exact integral over each
    bin: (bin centres, means), shape (bins,)."""
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    edges = np.linspace(0.0, max(end_s, 1e-9), bins + 1)
    if t.size == 0:
        return 0.5 * (edges[1:] + edges[:-1]), np.zeros(bins)
    cum = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])   # integral up to t[i]

    def integral(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(t, x, side="right") - 1
        kk = np.clip(k, 0, None)
        return np.where(k >= 0, cum[kk] + v[kk] * (x - t[kk]), 0.0)

    return 0.5 * (edges[1:] + edges[:-1]), np.diff(integral(edges)) / np.diff(edges)


def windowed_hit_ratio(t: np.ndarray, hits: np.ndarray, looked: np.ndarray, end_s: float,
                       bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefix-cache hit ratio within each of `bins` windows of [0, end_s], from the
    cumulative counters: (window centres, hit / looked-up blocks; NaN where nothing was
    looked up)."""
    edges = np.linspace(0.0, max(end_s, 1e-9), bins + 1)
    idx = np.searchsorted(t, edges, side="right") - 1
    h = np.where(idx >= 0, hits[np.clip(idx, 0, None)] if hits.size else 0.0, 0.0)
    lk = np.where(idx >= 0, looked[np.clip(idx, 0, None)] if looked.size else 0.0, 0.0)
    dh, dl = np.diff(h), np.diff(lk)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(dl > 0, dh / dl, np.nan)
    return 0.5 * (edges[1:] + edges[:-1]), ratio


def counter_points(t: np.ndarray, v: np.ndarray, end_s: float, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """A step series for a trace viewer's counter track: every sample when there are at
    most `max_points`, else the time-weighted mean over `max_points` equal windows
    (each at its window's start)."""
    if t.shape[0] <= max_points:
        return t, v
    centres, means = step_means(t, v, end_s, max_points)
    half = 0.5 * (centres[1] - centres[0]) if centres.shape[0] > 1 else 0.0
    return centres - half, means


__all__ = ["CSV_COLUMNS", "counter_points", "instance_series", "link_series", "step_means",
           "windowed_hit_ratio", "write_timeseries_csv"]
