"""The study's figures (docs/findings/*.png): one PNG per question, a few panels each,
drawn from the experiments' data with the project's deployment palette
(`rack.measure.plots.palette`), so a deployment keeps its colour in every figure.

Rates and capacities span decades, so those axes are logarithmic (a zero has no place
on them and is left out); SLO attainment is linear from 0 to 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

from rack.experiments.study.analysis import at_capacity


def _series_from_points(points: Sequence[dict], x: str, names: Optional[Sequence[str]] = None,
                        label: Optional[Mapping[str, str]] = None) -> dict:
    """{label: [(x, point)]} of sweep points (errors left out)."""
    out: dict = {}
    for p in points:
        if "error" in p or p.get(x) is None or (names is not None and p["scenario"] not in names):
            continue
        key = (label or {}).get(p["scenario"], p["scenario"])
        out.setdefault(key, []).append((p[x], p))
    return out


def panels(series: Mapping[str, Sequence[tuple]], path: Path | str, *, xlabel: str,
           panels: Sequence[tuple], title: str, colours: Mapping[str, str], logx: bool = True,
           hlines: Optional[Mapping[str, float]] = None) -> Path:
    """One row of panels, one line per series: series {label: [(x, {key: value})]},
    panels [(key, y label, log y)]. `hlines` {panel key: y} draws a dashed reference
    line (the SLO attainment target). Returns the PNG's path."""
    from rack.measure.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.7), squeeze=False)
    for ax, (key, ylabel, logy) in zip(axes[0], panels):
        for name, xy in series.items():
            pts = sorted((x, d[key]) for x, d in xy if d.get(key) is not None and (not logy or d[key] > 0))
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=3.5, label=name,
                        color=colours.get(name))
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0, top=1.02 if key == "slo_attainment" else None)
        if hlines and key in hlines:
            ax.axhline(hlines[key], ls="--", color="grey", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def capacity_series(caps: Mapping[str, dict], names: Sequence[str],
                    label: Optional[Mapping[str, str]] = None) -> dict:
    """{label: [(x, at_capacity figures)]} of an axis ({x label: capacity sweep})."""
    out: dict = {}
    for x, cap in caps.items():
        for n in names:
            if n in cap["at_max"]:
                out.setdefault((label or {}).get(n, n), []).append((float(x), at_capacity(cap, n)))
    return out


CAPACITY_PANELS = (("rate", "capacity (req/s at >= target SLO attainment)", True),
                   ("tokens_per_joule", "output tokens / J at capacity", True),
                   ("usd_per_mtok", "$ / M output tokens at capacity", True))
LOAD_PANELS = (("goodput_rps", "goodput (req/s meeting the SLO)", True),
               ("slo_attainment", "SLO attainment", False),
               ("tokens_per_joule", "output tokens / J", True))


def write_figures(results: dict, out_dir: Path | str, names: Sequence[str]) -> dict[str, str]:
    """Every figure of the study into `out_dir`, section by section of its spec;
    returns {figure key: file name}. `names`: the deployments in palette order."""
    from rack.measure.plots import palette
    from rack.experiments.study import figures_terms as FT
    from rack.experiments.study.layout import CANONICAL, sections_of, view
    from rack.experiments.study.sections import role

    out = Path(out_dir)
    files: dict[str, str] = {}
    every = list(names) + [n for s in sections_of(results) for n in s.scenario_names()]
    colours = palette(every)
    for s in sections_of(results):
        r, res = role(s), results.get(s.key)
        if res is None:
            continue
        if r in CANONICAL:
            v = view(results, s)
            only = {k: v[k] for k in ("config", "deployments", "meta") if k in v}
            got = _legacy_figures({**only, CANONICAL[r]: res}, out, colours)
            if s.key != CANONICAL[r]:      # a user's section: its own file names
                got = {f"{s.key} {k}": _renamed(out, f, s.key) for k, f in got.items()}
            files.update(got)
        elif r == "interactivity":
            files.update(FT.interactivity(res, out, s.key, colours))
        elif r == "tornado":
            files.update(FT.tornado(res, out, s.key))
        elif r == "breakeven_map":
            files.update(FT.breakeven_map(res, out, s.key))
    return files


def _renamed(out: Path, fname: str, prefix: str) -> str:
    new = f"{prefix}_{fname}"
    (out / fname).replace(out / new)
    return new


def _legacy_figures(results: dict, out: Path, colours: Mapping[str, str]) -> dict[str, str]:
    """The figures of the first study's sections present in `results` (by their keys)."""
    from rack.measure.plots import palette

    target = results["config"]["target"]
    names = list(colours)
    files: dict[str, str] = {}

    def put(key: str, fname: str, series: dict, **kw) -> None:
        if series:
            panels(series, out / fname, colours=colours, **kw)
            files[key] = fname

    if "load" in results:
        put("load", "load.png", _series_from_points(results["load"]["points"], "rate_per_s"),
            xlabel="offered rate (req/s, Mooncake trace rate-scaled)", panels=LOAD_PANELS,
            title="Load: the Mooncake trace at rising rates", hlines={"slo_attainment": target})
    for key, xlabel in (("prompt", "prompt tokens"), ("output", "output tokens")):
        if key in results:
            put(key, f"{key}_length.png", capacity_series(results[key]["values"], names), xlabel=xlabel,
                panels=CAPACITY_PANELS, title=f"Capacity and cost at capacity against {xlabel}")
    if "agentic" in results:
        put("agentic", "agentic.png", _series_from_points(results["agentic"]["points"], "rate_per_s"),
            xlabel="offered rate (req/s, agentic sessions rate-scaled)", panels=LOAD_PANELS,
            title="Long-context agentic sessions", hlines={"slo_attainment": target})
    if "bandwidth" in results:
        for i, case in enumerate(results["bandwidth"]["cases"]):
            put(f"bandwidth{i}", f"bandwidth_{case['split']}.png",
                _series_from_points(case["points"], "bandwidth_gbps"), xlabel="KV link bandwidth (GB/s)",
                panels=(("goodput_rps", "goodput (req/s meeting the SLO)", False),
                        ("slo_attainment", "SLO attainment", False), ("ttft_p99_s", "TTFT p99 (s)", True)),
                title=f"KV link bandwidth: {case['split']} at {case['rate_scale']:g}x the trace rate",
                hlines={"slo_attainment": target})
    if "tpot" in results:
        caps = {t: v for t, v in results["tpot"]["values"].items()}
        series: dict = {}
        for t, cap in caps.items():
            for n, vn in cap["names"].items():
                series.setdefault(n, []).append((float(t), at_capacity(cap, vn)))
        if "load" in results:   # the scenarios' own TPOT target, from the load sweep
            own = results["tpot"].get("shipped_tpot_ms")
            for n in results["tpot"]["scenarios"]:
                if own is not None and n in results["load"]["at_max"]:
                    series.setdefault(n, []).append((float(own), at_capacity(results["load"], n)))
        put("tpot", "tpot_slo.png", series, xlabel="TPOT target (ms)", panels=CAPACITY_PANELS[:2],
            title="Capacity under tighter TPOT targets (Mooncake trace)")
    if "gpu_pd" in results:
        for case in results["gpu_pd"]["cases"]:
            for t, cap in case["values"].items():
                colours_pd = palette([cap["colocated"], *cap["disaggregated"]])
                s = _series_from_points(cap["points"], "rate_per_s")
                fname = f"gpu_pd_{case['colocated']}_tpot{t}ms.png"
                panels(s, out / fname, colours=colours_pd, xlabel="offered rate (req/s)",
                       panels=(("goodput_rps", "goodput (req/s meeting the SLO)", True),
                               ("slo_attainment", "SLO attainment", False)),
                       title=f"GPUs alone, {case['gpus'][case['colocated']]} GPUs: colocated vs "
                             f"disaggregated, TPOT target {t} ms", hlines={"slo_attainment": target})
                files[f"gpu_pd {case['colocated']} {t}"] = fname
    return files


__all__ = ["CAPACITY_PANELS", "LOAD_PANELS", "capacity_series", "panels", "write_figures"]
