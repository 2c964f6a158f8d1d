"""Plots of `rack validate --plot DIR` (matplotlib, Agg backend).

- One plot per calibrated curve (rows sharing hardware, framework, precision,
  parallelism, speculation and lengths; `ServingRow.curve`): total tokens/s per GPU
  against tokens/s per user, the measured points beside rack's curve, as InferenceX
  draws them. Rack's curve is the same deployment replayed with closed-loop users at
  powers of two from 1 to twice the largest measured concurrency, plus the measured
  concurrencies.
- One parity plot: predicted against measured for every row and metric (TPOT, TTFT,
  throughput per GPU), log-log, with the y = x line and a +-15 % band.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from rack.experiments.validation_runs import METRICS, RowReplay, replay_row


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def curve_points(row, concurrencies) -> list[tuple[float, float]]:
    """(tokens/s per user, tokens/s per GPU) of `row`'s deployment at each concurrency."""
    pts = []
    for c in concurrencies:
        rr = replay_row(dataclasses.replace(row, concurrency_requests=int(c)))
        pts.append((1.0 / rr.predicted["tpot_s"], rr.predicted["throughput_per_gpu"]))
    return pts


def write_plots(replays: list[RowReplay], out_dir: str | Path) -> list[Path]:
    """Write the curve plots and the parity plot into `out_dir` (created); returns the
    files written. Raises OSError if the folder cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    curves: dict[str, list[RowReplay]] = {}
    for rr in replays:
        curves.setdefault(rr.row.curve, []).append(rr)
    for name, rrs in curves.items():
        measured = sorted(rr.row.concurrency_requests for rr in rrs)
        grid = sorted(set([2 ** k for k in range(int(np.log2(2 * measured[-1])) + 1)] + measured))
        pts = curve_points(rrs[0].row, grid)
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, color="tab:blue",
                label="rack (closed-loop replay)")
        for c, p in zip(grid, pts):
            ax.annotate(str(c), p, fontsize=7, color="tab:blue", xytext=(3, 3), textcoords="offset points")
        mx = [1e3 / rr.row.median_tpot_ms for rr in rrs]
        my = [rr.row.total_tokens_per_s_per_gpu for rr in rrs]
        ax.plot(mx, my, "s", color="tab:red", label="measured (gpu-calibration.csv)")
        for rr, x, y in zip(rrs, mx, my):
            ax.annotate(f"{rr.row.id} ({rr.row.concurrency_requests})", (x, y), fontsize=7, color="tab:red",
                        xytext=(3, -9), textcoords="offset points")
        ax.set_xlabel("tokens/s per user (1 / median TPOT)")
        ax.set_ylabel("total tokens/s per GPU")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out / f"curve-{_slug(name)}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    if replays:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
        titles = {"tpot_s": "median TPOT (s)", "ttft_s": "median TTFT (s)",
                  "throughput_per_gpu": "total tokens/s per GPU"}
        for ax, m in zip(axes, METRICS):
            x = np.array([rr.measured[m] for rr in replays])
            y = np.array([rr.predicted[m] for rr in replays])
            lo, hi = min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.fill_between([lo, hi], [lo / 1.15, hi / 1.15], [lo * 1.15, hi * 1.15], color="0.85", label="+-15 %")
            ax.plot(x, y, "o", ms=4, color="tab:blue")
            for rr, a, b in zip(replays, x, y):
                ax.annotate(rr.row.id, (a, b), fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):           # decade labels only: minor ones collide
                axis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("measured")
            ax.set_ylabel("rack")
            ax.set_title(titles[m], fontsize=9)
            ax.legend(fontsize=7)
        fig.suptitle("rack vs measured serving rows (closed-loop replays)", fontsize=10)
        path = out / "parity.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _finish(plt, fig, ax, title: str, path: Path) -> Path:
    """Title, legend, layout; save `fig` to `path` and close it."""
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_extra_plots(figures, lodo: dict | None, out_dir: str | Path) -> list[Path]:
    """The wafer prompt rows (predicted against published, +-35 %) and the
    leave-one-device-out table (median |error| per device and metric) as PNGs in
    `out_dir`; returns the paths written (none for what is empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from devices.validation import PROMPT_KINDS

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    prompt = [f for f in figures if f.kind in PROMPT_KINDS]
    if prompt:
        fig, ax = plt.subplots(figsize=(11, 3.2))
        y = np.arange(len(prompt))
        ax.barh(y, [100 * f.relative_error for f in prompt], color="tab:orange")
        ax.axvspan(-35, 35, color="0.9", zorder=0, label="+-35 % (the criterion)")
        ax.set_yticks(y, [f"{f.name} ({f.published:g} {f.unit})" for f in prompt], fontsize=6)
        ax.set_xlabel("rack / published - 1 (%)")
        written.append(_finish(plt, fig, ax, "Wafer prompt rows: prompts streamed through the layers",
                               out / "wafer-prompt-rows.png"))
    if lodo and lodo.get("devices"):
        devs = lodo["devices"]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        x = np.arange(len(devs))
        for i, m in enumerate(METRICS):
            ax.bar(x + (i - 1) * 0.27, [100 * d["median_abs_error"][m] for d in devs], 0.27, label=m)
        ax.set_xticks(x, [f"{d['device']} <- {d['borrowed_from']}" for d in devs], fontsize=7)
        ax.set_ylabel("median |error| (%)")
        written.append(_finish(plt, fig, ax, "Leave-one-device-out: each device on the stack it would borrow",
                               out / "leave-one-device-out.png"))
    return written


__all__ = ["curve_points", "write_extra_plots", "write_plots"]
