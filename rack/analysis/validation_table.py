"""`rack validate`'s table: every calibration row, predicted against measured.

Two kinds of rows:
- published figures (devices/catalog/calibration.toml: the wafer's per-user speeds
  and MLPerf throughput), priced by the cost model (`devices.validation`), each within
  `figure_tolerance`;
- measured serving rows (gpu-calibration.csv's layout; the catalog ships a copy of
  shared/reference/gpu-calibration.csv, `SERVING_ROWS`), each replayed through the
  engines with closed-loop users (`rack.analysis.validation_runs`). Their criteria are on the
  distribution of errors per metric (`SERVING_LIMITS`): the median and the worst
  |relative error| of TPOT and of throughput per GPU, the median for TTFT (which also
  holds the benchmark client's and scheduler's queueing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.catalog import CATALOG_DIR
from devices.serving_rows import ServingRow, load_serving_rows
from rack.analysis.validation_runs import METRICS, RowReplay, replay_row

SERVING_ROWS = CATALOG_DIR / "gpu-calibration.csv"
#: metric -> (largest median |error|, largest worst |error| or None), issue 14's criteria.
SERVING_LIMITS = {"tpot_s": (0.15, 0.35), "throughput_per_gpu": (0.15, 0.35), "ttft_s": (0.25, None)}
LABELS = {"tpot_s": "TPOT", "ttft_s": "TTFT", "throughput_per_gpu": "tok/s/GPU"}


@dataclass
class Summary:
    """Per metric: median and worst |relative error| over the serving rows, and which
    criteria failed (empty: all met)."""

    median: dict = field(default_factory=dict)
    worst: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)


def replay_rows(rows: list[ServingRow]) -> list[RowReplay]:
    """Every row replayed (rack.analysis.validation_runs.replay_row), in the rows' order."""
    return [replay_row(r) for r in rows]


def summarize(replays: list[RowReplay], figures=(), figure_tolerance: float = 0.15) -> Summary:
    """The error distribution per metric and the criteria that failed."""
    s = Summary()
    for m in METRICS:
        errs = np.abs([r.errors[m] for r in replays]) if replays else np.zeros(0)
        if not errs.size:
            continue
        s.median[m], s.worst[m] = float(np.median(errs)), float(errs.max())
        med_lim, worst_lim = SERVING_LIMITS[m]
        if s.median[m] > med_lim:
            s.failures.append(f"{LABELS[m]}: median |error| {s.median[m]:.1%} > {med_lim:.0%}")
        if worst_lim is not None and s.worst[m] > worst_lim:
            s.failures.append(f"{LABELS[m]}: worst |error| {s.worst[m]:.1%} > {worst_lim:.0%}")
    for f in figures:
        tol = f.tolerance if f.tolerance is not None else figure_tolerance
        if abs(f.relative_error) > tol:
            s.failures.append(f"{f.name}: {f.relative_error:+.1%} (tolerance {tol:.0%})")
    return s


def serving_rows(path: str | Path | None = None) -> list[ServingRow]:
    """The rows of `path` (gpu-calibration.csv's layout), or the catalog's copy."""
    return load_serving_rows(path or SERVING_ROWS)


__all__ = ["LABELS", "SERVING_LIMITS", "SERVING_ROWS", "Summary", "replay_rows", "serving_rows", "summarize"]
