"""Figures of the interactivity, tornado and break-even sections, drawn from
study.json.gz's points only (`rack.experiments.study.breakeven` reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from rack.experiments.study import breakeven as B


def interactivity(res: dict, out: Path, key: str, colours: Mapping[str, str]) -> dict[str, str]:
    """One PNG per workload of an interactivity section (`plots.interactivity_curves`:
    throughput per device, per MW and per $/h against tokens/s per user)."""
    from rack.measure.plots import interactivity_curves

    files = {}
    for i, (label, curves) in enumerate(res["workloads"].items()):
        pts = {n: d["points"] for n, d in curves["deployments"].items() if d["points"]}
        for n, d in curves["deployments"].items():       # knob branches: their own curves
            for lab, vpts in (d.get("variants") or {}).items():
                if vpts:
                    pts[f"{n} [{lab}]"] = vpts
        if pts:
            fname = f"{key}_{i}.png"
            interactivity_curves(pts, out / fname, title=label, colours=colours)
            files[f"{key} {label}"] = fname
    if res.get("reading") == "equal_interactivity":
        files.update(_ratio_figures(res, out, key))
    return files


def _ratio_figures(res: dict, out: Path, key: str) -> dict[str, str]:
    """One PNG per workload: each pair's ratio against tokens/s per user with its 90 %
    band and its named readings (`plots.ratio_curves`)."""
    from rack.measure.plots import ratio_curves

    files = {}
    rows = B.interactivity_rows(res)
    for i, label in enumerate(res["workloads"]):
        pairs = {f"{r['a']} / {r['b']}": {"readings": r["readings"]["curve"]["readings"],
                                          "named": r["readings"]["named"]}
                 for r in rows if r["workload"] == label and r.get("readings")}
        if any(p["readings"] for p in pairs.values()):
            fname = f"{key}_ratio_{i}.png"
            ratio_curves(pairs, out / fname, title=label, lines=((1.0, "1x"), (B.CLAIM, f"{B.CLAIM:g}x")))
            files[f"{key} ratio {label}"] = fname
    return files


def tornado(res: dict, out: Path, key: str) -> dict[str, str]:
    """One PNG per pair: a horizontal bar per term from the ratio with the term at its
    low end to the ratio at its high end (log axis), the ratio as shipped and the 1x and
    5x lines drawn."""
    from rack.measure.plots import pyplot, save_figure

    files = {}
    for i, (a, b) in enumerate(res["pairs"]):
        tr = B.tornado_rows(res, a, b)
        rows = [t for t in tr["terms"] if t["low_ratio"] or t["high_ratio"]][::-1]
        base = tr["baseline"]["ratio"]
        if not rows and base is None:
            continue
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.8))
        vals = [base] if base else []
        for j, t in enumerate(rows):
            lo, hi = t["low_ratio"], t["high_ratio"]
            ref = base or lo or hi
            for v, colour, end in ((lo, "tab:blue", "low"), (hi, "tab:orange", "high")):
                if v:
                    ax.barh(j, v - ref, left=ref, color=colour, alpha=0.8, height=0.6)
                    ax.annotate(f"{t[end]:g}", (v, j), fontsize=6, va="center", textcoords="offset points",
                                xytext=(3 if v >= ref else -3, 0), ha="left" if v >= ref else "right")
                    vals.append(v)
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks(range(len(rows)), [f"{t['label']} ({t['unit']})" if t["unit"] else t["label"] for t in rows],
                      fontsize=7)
        for v, style, label in ((base, "-", "as shipped"), (1.0, "--", "1x"), (B.CLAIM, ":", f"{B.CLAIM:g}x")):
            if v:
                ax.axvline(v, color="black" if style == "-" else "grey", ls=style, lw=1, label=label)
        ax.set_xlim(min(vals + [1.0]) / 1.3, max(vals + [B.CLAIM]) * 1.3)
        ax.set_xlabel(f"{res['metric']} ratio at equal interactivity (blue: term at its low end, orange: high; "
                      "labels: the term's value)", fontsize=7)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"Tornado: {a} / {b} on {res['workload']}", fontsize=9)
        fname = f"{key}_{i}.png"
        save_figure(fig, out / fname)
        files[f"{key} {a}"] = fname
    return files


def breakeven_map(res: dict, out: Path, key: str) -> dict[str, str]:
    """One PNG per pair: the ratio over the term (x; the wafer's per-request prefill rate
    in tokens/s where devices.uncertainty gives it) x the input/output ratio (y, log),
    each cell coloured and labelled, the 1x and 5x contours drawn where the ratio
    crosses them."""
    import numpy as np

    from rack.measure.plots import pyplot, save_figure

    files = {}
    for i, (a, b) in enumerate(res["pairs"]):
        g = B.map_grid(res, a, b)
        z = np.array([[np.nan if v is None else v for v in row] for row in g["ratio"]], dtype=float)
        if not np.isfinite(z).any():
            continue
        use_rate = all(v is not None for row in g["rate"] for v in row)
        xs = np.array(g["rate"], dtype=float) if use_rate else np.tile(np.array(g["x"], dtype=float), (len(g["y"]), 1))
        ys = np.tile(np.array(g["y"], dtype=float)[:, None], (1, len(g["x"])))
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6.8, 4.6))
        lz = np.log10(z)
        grid = len(g["x"]) >= 2 and len(g["y"]) >= 2 and np.isfinite(z).all()
        if grid:
            m = ax.contourf(xs, ys, lz, levels=np.linspace(-1, 1, 21), cmap="RdYlGn", extend="both")
        else:
            m = ax.scatter(xs.ravel(), ys.ravel(), c=lz.ravel(), cmap="RdYlGn", s=200, marker="s", vmin=-1, vmax=1)
        ax.plot(xs.ravel(), ys.ravel(), "k.", ms=3)
        for xv, yv, zv in zip(xs.ravel(), ys.ravel(), z.ravel()):
            if np.isfinite(zv):
                ax.annotate(f"{zv:.2f}x", (xv, yv), textcoords="offset points", xytext=(3, 3), fontsize=7)
        drawn = []
        if grid:
            for level, style in ((1.0, "--"), (B.CLAIM, "-")):
                if np.nanmin(z) < level < np.nanmax(z):
                    cs = ax.contour(xs, ys, z, levels=[level], colors="black", linestyles=style)
                    ax.clabel(cs, fmt=f"{level:g}x", fontsize=7)
                    drawn.append(f"{level:g}x")
        cb = fig.colorbar(m, ax=ax, ticks=[-1, -0.5, 0, 0.5, 1])
        cb.ax.set_yticklabels(["0.1x", "0.32x", "1x", "3.2x", "10x"])
        cb.set_label(f"{a} / {b}", fontsize=7)
        t = res["term"]
        ax.set_xscale("log" if use_rate or t.get("scale") == "log" else "linear")
        ax.set_yscale("log")
        ax.set_xlabel("wafer prefill rate per request (tokens/s)" if use_rate else
                      f"{t['label']}" + (f" ({t['unit']})" if t["unit"] else ""))
        ax.set_ylabel("input/output tokens")
        ax.set_title(f"Break-even, {res['metric']} at equal interactivity; contours: "
                     f"{', '.join(drawn) or 'none (not crossed)'}", fontsize=8)
        fname = f"{key}_{i}.png"
        save_figure(fig, out / fname)
        files[f"{key} {a}"] = fname
    return files


__all__ = ["breakeven_map", "interactivity", "tornado"]
