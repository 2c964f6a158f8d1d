"""PNG plots of comparisons and sweeps (matplotlib, headless "Agg" backend).

Every function writes one PNG file and returns its path; inputs are plain data
(per-request columns, component stats, sweep points), so the plots can be redrawn
from saved JSON. matplotlib is imported on first use, never at `import rack`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

#: Stages are coloured from matplotlib's "tab20"; deployments from "tab10" (`palette`).
_STAGE_COLOURS = "tab20"
_DEPLOYMENT_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                       "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")   # tab10, in order


def palette(names: Sequence[str]) -> dict[str, str]:
    """One colour per deployment name, in the given order (tab10, then repeating).
    A report passes the same palette to every plot, so a deployment keeps its colour
    across all of them, also in a plot that shows only some deployments."""
    return {n: _DEPLOYMENT_COLOURS[i % len(_DEPLOYMENT_COLOURS)] for i, n in enumerate(dict.fromkeys(names))}


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (files only, no screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path | str) -> Path:
    """Write `fig` to `path` (PNG at 110 dpi, parent folders made), close it; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def latency_cdfs(runs: Mapping[str, Mapping[str, np.ndarray]], path: Path | str,
                 itl: Optional[Mapping[str, np.ndarray]] = None,
                 colours: Optional[Mapping[str, str]] = None) -> Path:
    """Empirical CDFs of TTFT, TPOT and E2E (and ITL if given) per scenario.

    runs: label -> per-request columns (ttft_s, tpot_s, e2e_s); itl: label -> ITL samples (s).
    colours: label -> colour (`palette`; default: `palette(runs)`).
    Log x axis (latencies span decades); NaNs (rejected/failed, one-token TPOT) skipped.
    """
    plt = pyplot()
    colours = colours or palette(list(runs))
    keys = [("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency")]
    n = len(keys) + (1 if itl else 0)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6))
    for ax, (key, title) in zip(axes, keys):
        for label, cols in runs.items():
            _cdf(ax, np.asarray(cols[key], dtype=np.float64), label, colours.get(label))
        ax.set_title(title)
    if itl:
        for label, v in itl.items():
            _cdf(axes[-1], np.asarray(v, dtype=np.float64), label, colours.get(label))
        axes[-1].set_title("ITL")
    from matplotlib.ticker import NullFormatter

    for ax in axes:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1.0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)


def _cdf(ax, v: np.ndarray, label: str, colour: Optional[str] = None, points: int = 1000) -> None:
    """Empirical CDF; large samples are drawn at `points` evenly spaced ranks (ITL has
    one sample per output token, and drawing them all only costs time)."""
    v = np.sort(v[~np.isnan(v) & (v > 0)])
    if v.size:
        y = np.arange(1, v.size + 1) / v.size
        if v.size > points:
            idx = np.unique(np.linspace(0, v.size - 1, points).astype(np.int64))
            v, y = v[idx], y[idx]
        ax.step(v, y, where="post", label=label, color=colour)


def _step_on_grid(t: np.ndarray, v: np.ndarray, grid: np.ndarray, before: float = 0.0) -> np.ndarray:
    """A step function sampled at (t, v) evaluated on `grid` (`before` before the first sample)."""
    if t.size == 0:
        return np.full_like(grid, before)
    idx = np.searchsorted(t, grid, side="right") - 1
    return np.where(idx >= 0, v[np.clip(idx, 0, None)], before)


def pool_memory_series(specs: Sequence[Any], stats: Mapping[str, dict], end_s: float,
                       points: int = 400) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per pool: (time grid, used / capacity) summing its instances' ledgers (0..1)."""
    grid = np.linspace(0.0, max(end_s, 1e-9), points)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    used: dict[str, np.ndarray] = {}
    cap: dict[str, float] = {}
    for s in specs:
        st = stats.get(s.name)
        if s.pool is None or st is None or "memory_t_s" not in st:
            continue
        t = np.asarray(st["memory_t_s"], dtype=np.float64)
        v = np.asarray(st["memory_used_bytes"], dtype=np.float64)
        # Weights and workspace are booked at construction, before the first sample.
        held = st["memory"].get("held_bytes", {})
        fixed = float(held.get("weights", 0) + held.get("workspace", 0))
        used[s.pool] = used.get(s.pool, np.zeros_like(grid)) + _step_on_grid(t, v, grid, fixed)
        cap[s.pool] = cap.get(s.pool, 0.0) + float(st["memory"]["capacity_bytes"])
    for pool, u in used.items():
        out[pool] = (grid, np.asarray(u) / cap[pool])
    return out


def memory_over_time(runs: Mapping[str, tuple[Sequence[Any], Mapping[str, dict], float]],
                     path: Path | str) -> Path:
    """Memory occupancy (used / capacity, weights included) of every pool over time,
    one panel per scenario.

    runs: label -> (component specs, component stats, run end in s).
    """
    plt = pyplot()
    n = max(1, len(runs))
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.9 * n + 0.6), sharex=True, squeeze=False)
    for ax, (label, (specs, stats, end)) in zip(axes[:, 0], runs.items()):
        for pool, (t, frac) in pool_memory_series(specs, stats, end).items():
            ax.plot(t, frac * 100, label=pool, lw=1.2)
        ax.set_ylim(0, 105)
        ax.set_ylabel("% used")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("emulated time (s)")
    fig.suptitle("Memory occupancy (weights + KV + prefix cache + workspace)", fontsize=10)
    return save_figure(fig, path)


def binned_utilisation(series: np.ndarray, end_s: float, bins: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """Mean utilisation per time bin of a step series [[t, u], ...] (exact integral of
    the step function over each bin). Returns (bin centres, means), shape (bins,)."""
    from rack.measure.timeseries import step_means

    s = np.asarray(series, dtype=np.float64).reshape(-1, 2)
    return step_means(s[:, 0], s[:, 1], end_s, bins)


def link_utilisation(runs: Mapping[str, Mapping[str, dict]], path: Path | str, end_s: Optional[float] = None,
                     bins: int = 120, colours: Optional[Mapping[str, str]] = None) -> Path:
    """KV link utilisation over time, averaged over `bins` equal time bins (a transfer
    holds a link at 100 % for milliseconds, so instantaneous values only flicker).

    runs: label -> interconnect stats (or {} for a run without a link); colours: label
    -> colour (`palette`).
    """
    plt = pyplot()
    colours = colours or palette(list(runs))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    drawn = False
    series = {(label, name): np.asarray(link.get("series") or [], dtype=np.float64).reshape(-1, 2)
              for label, ic in runs.items() for name, link in (ic or {}).get("links", {}).items()}
    end = end_s if end_s is not None else max((float(s[-1, 0]) for s in series.values() if s.size), default=1.0)
    for (label, name), s in series.items():
        if s.size:
            x, y = binned_utilisation(s, end, bins)
            ax.plot(x, y * 100, label=f"{label}: {name}", lw=1.0, color=colours.get(label))
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no KV link in these scenarios", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("emulated time (s)")
    ax.set_ylabel(f"link utilisation (%, {end / bins:.2g} s bins)")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    ax.set_title("KV link utilisation")
    return save_figure(fig, path)


def timeseries(stats: Mapping[str, dict], path: Path | str, end_s: Optional[float] = None,
               bins: int = 200, title: str = "") -> Path:
    """Per-instance time series of one run (`rack.measure.timeseries`): queue depth,
    running batch, KV occupancy (KV + prefix cache over KV capacity), prefix-cache hit
    ratio and KV link utilisation, one panel each, one line per instance (or link).
    Each value is its time-weighted mean over `bins` equal windows (the hit ratio:
    hits / lookups within bins / 5 windows), since a gauge changes at every event.

    stats: component stats of the run; end_s: the run's end (default: the last sample).
    """
    from rack.measure.timeseries import instance_series, link_series, step_means, windowed_hit_ratio

    plt = pyplot()
    inst, links = instance_series(stats), link_series(stats)
    end = end_s if end_s is not None else max(
        [float(d["t_s"][-1]) for d in (*inst.values(), *links.values()) if d["t_s"].size] or [1.0])
    colours = palette(list(inst) + list(links))
    panels = [("queue_depth", "waiting requests"), ("running", "running batch"),
              ("kv_occupancy", "KV occupancy (%)"), ("hit", "prefix-cache hit ratio"),
              ("link", "link utilisation (%)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.75 * len(panels) + 0.8), sharex=True)
    for ax, (key, label) in zip(axes, panels):
        drawn = False
        if key == "link":
            for name, d in links.items():
                x, y = step_means(d["t_s"], d["utilisation"], end, bins)
                ax.plot(x, y * 100, lw=1.0, label=name, color=colours[name])
                drawn = True
        for name, d in inst.items() if key != "link" else ():
            if key == "hit":
                if not d["prefix_lookup_blocks"].any():
                    continue
                # fewer, longer windows: lookups are per request, not per event
                x, y = windowed_hit_ratio(d["t_s"], d["prefix_hit_blocks"], d["prefix_lookup_blocks"], end,
                                          max(10, bins // 5))
                ax.plot(x, y, lw=1.0, marker=".", ms=2, label=name, color=colours[name])
            else:
                x, y = step_means(d["t_s"], d[key], end, bins)
                ax.plot(x, y * 100 if key == "kv_occupancy" else y, lw=1.0, label=name, color=colours[name])
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "none in this run", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper right", ncol=4)
    axes[-1].set_xlabel(f"emulated time (s); means over {end / bins:.2g} s windows")
    fig.suptitle(f"Per-instance time series{': ' + title if title else ''}", fontsize=10)
    return save_figure(fig, path)


def stage_breakdown(breakdowns: Mapping[str, Mapping[str, Any]], path: Path | str) -> Path:
    """Stacked bars of mean time per stage (left) and p99 per stage (right) per scenario.

    breakdowns: label -> `rack.measure.breakdown.stage_breakdown` output. p99 bars are per stage
    (p99s do not add up: the right panel is grouped, not stacked).
    """
    plt = pyplot()
    labels = list(breakdowns)
    from rack.measure.breakdown import stage_order

    stages = stage_order(breakdowns)
    cmap = plt.get_cmap(_STAGE_COLOURS)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, st in enumerate(stages):
        vals = np.array([next((r["mean_s"] for r in breakdowns[l]["stages"] if r["stage"] == st), 0.0)
                         for l in labels])
        a1.bar(x, vals, bottom=bottom, label=st, color=cmap(i % 20))
        bottom += vals
    a1.set_xticks(x, labels, rotation=15, fontsize=8)
    a1.set_ylabel("mean seconds per request")
    a1.set_title("Mean request time by stage (stacked = mean E2E)")
    a1.legend(fontsize=7)
    width = 0.8 / max(1, len(stages))
    for i, st in enumerate(stages):
        vals = np.array([next((r["p99_s"] for r in breakdowns[l]["stages"] if r["stage"] == st), 0.0)
                         for l in labels])
        a2.bar(x - 0.4 + width * (i + 0.5), vals, width, color=cmap(i % 20))
    a2.set_xticks(x, labels, rotation=15, fontsize=8)
    a2.set_yscale("symlog", linthresh=1e-3)
    a2.set_ylabel("p99 seconds (per stage)")
    a2.set_title("p99 time by stage")
    for a in (a1, a2):
        a.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def sweep_metric(points: Sequence[Mapping[str, Any]], x: str, y: str, path: Path | str, *,
                 xlabel: str, ylabel: str, title: str, logx: bool = False,
                 vlines: Optional[Mapping[str, float]] = None,
                 colours: Optional[Mapping[str, str]] = None) -> Path:
    """One line per scenario of `y` against `x` over sweep points ({"scenario", x, y}).

    vlines: label -> x value drawn as a dashed vertical line (a crossover, a max rate).
    colours: scenario -> colour (`palette`). The y axis starts at 0 (every swept metric
    is a rate, a ratio or a count); so does a linear x axis.
    """
    plt = pyplot()
    colours = colours or palette([p["scenario"] for p in points])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    by: dict[str, list] = {}
    for p in points:
        if p.get(y) is not None:
            by.setdefault(p["scenario"], []).append((p[x], p[y]))
    for name, xy in by.items():
        xy.sort()
        ax.plot([a for a, _ in xy], [b for _, b in xy], marker="o", ms=4, label=name, color=colours.get(name))
    ax.set_ylim(bottom=0)
    if not logx:
        ax.set_xlim(left=0)
    for label, v in (vlines or {}).items():
        if v is not None:
            ax.axvline(v, ls="--", color="grey", lw=1)
            ax.text(v, ax.get_ylim()[1], f" {label}", rotation=90, va="top", fontsize=7)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


#: Panels of `interactivity_curves`: (point key, y label), InferenceX's y axes.
_INTERACTIVITY_PANELS = (("output_tps_per_device", "output tokens/s per device"),
                         ("output_tps_per_mw", "output tokens/s per MW"),
                         ("output_tps_per_usd_per_hour", "output tokens/s per $/h"))


def interactivity_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: Path | str, *,
                         title: str, x: str = "tps_user_p50",
                         colours: Optional[Mapping[str, str]] = None) -> Path:
    """InferenceX's trade-off, one curve per deployment: throughput per device, per MW
    and per $/h (three panels) against tokens/s per user (`x`), points joined in
    concurrency order and labelled with their concurrency.

    curves: deployment -> points (`rack.experiments.interactivity.point_metrics` dicts with
    "concurrency"). The x axis is logarithmic when the points span more than a decade
    (a wafer's and a GPU's tokens/s per user differ by that much); y axes start at 0.
    """
    plt = pyplot()
    colours = colours or palette(list(curves))
    fig, axes = plt.subplots(1, len(_INTERACTIVITY_PANELS), figsize=(5.0 * len(_INTERACTIVITY_PANELS), 4.0))
    xs = [p[x] for pts in curves.values() for p in pts if p.get(x)]
    logx = bool(xs) and max(xs) > 10 * min(xs)
    for ax, (key, label) in zip(axes, _INTERACTIVITY_PANELS):
        for name, pts in curves.items():
            xy = sorted((p["concurrency"], p[x], p[key]) for p in pts
                        if p.get(x) is not None and p.get(key) is not None)
            if not xy:
                continue
            ax.plot([a for _, a, _ in xy], [b for _, _, b in xy], marker="o", ms=4, label=name,
                    color=colours.get(name))
            for c, a, b in xy:
                ax.annotate(str(c), (a, b), textcoords="offset points", xytext=(3, 3), fontsize=6,
                            color=colours.get(name))
        if logx:
            ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tokens/s per user (p50 of 1/TPOT)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}: throughput against interactivity (labels: concurrency)", fontsize=9)
    return save_figure(fig, path)


def ratio_curves(pairs: Mapping[str, Mapping[str, Any]], path: Path | str, *, title: str,
                 lines: Sequence[tuple[float, str]] = ((1.0, "1x"), (5.0, "5x"))) -> Path:
    """Ratios of two curves read at equal tokens/s per user, one line per pair, with
    their interval (`ratio_at`: bootstrap and ladder) as a band (`rack.experiments.equal_interactivity.ratio_curve`).

    pairs: label -> {"readings": [{"x", "ratio", "interval"}], "named": [{"name", "x",
    "ratio"}] (marked and labelled)}; lines: horizontal reference ratios (value, label).
    Log x (tokens/s per user) and log y (ratio)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for i, (label, pr) in enumerate(pairs.items()):
        rd = [r for r in pr["readings"] if r.get("ratio") is not None]
        if not rd:
            continue
        colour = _DEPLOYMENT_COLOURS[i % len(_DEPLOYMENT_COLOURS)]
        ax.plot([r["x"] for r in rd], [r["ratio"] for r in rd], color=colour, label=label)
        band = [r for r in rd if r.get("interval")]
        if band:
            ax.fill_between([r["x"] for r in band], [r["interval"][0] for r in band],
                            [r["interval"][1] for r in band], color=colour, alpha=0.2, linewidth=0)
        for n in pr.get("named", ()):
            if n.get("ratio") is not None and n.get("x"):
                ax.plot([n["x"]], [n["ratio"]], marker="o", ms=4, color=colour)
                ax.annotate(n["name"], (n["x"], n["ratio"]), textcoords="offset points", xytext=(3, 3), fontsize=6,
                            color=colour)
    for v, text in lines:
        ax.axhline(v, color="grey", linestyle="--" if v == 1.0 else ":", linewidth=0.8)
        ax.annotate(text, (1.0, v), xycoords=("axes fraction", "data"), fontsize=7, ha="right", va="bottom")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="minor", labelsize=6)
    ax.set_xlabel("tokens/s per user (p50 of 1/TPOT), both curves read at the same value")
    ax.set_ylabel("ratio of tokens/s per kW (band: interval)")
    ax.grid(alpha=0.3, which="both")
    if pairs:
        ax.legend(fontsize=7)
    ax.set_title(f"{title}: ratio at equal interactivity", fontsize=9)
    return save_figure(fig, path)


__all__ = ["binned_utilisation", "interactivity_curves", "ratio_curves", "latency_cdfs", "link_utilisation", "memory_over_time",
           "palette", "timeseries", "pool_memory_series", "stage_breakdown", "sweep_metric"]
