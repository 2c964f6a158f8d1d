"""Write a study's results: study.json.gz, its figures and the findings page.

`write_study` can also rebuild the page from a saved study.json.gz (`load_results`), so
the text and figures can be regenerated without rerunning anything. Kept apart from
`rack.experiments.study.run` so running a study does not import the page's renderers
(and the renderers, which read the sections, import nothing that runs them).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Optional

from rack.experiments.study.run import STUDY_JSON, _git_commit


def palette_order(results: dict) -> list[str]:
    """Deployment names in a fixed order, so each keeps its colour in every figure."""
    cfg = results["config"]
    return list(dict.fromkeys([*cfg["shipped"], *cfg["main"]]))


def write_study(results: dict, md_path: Path | str, fig_dir: Optional[Path | str] = None) -> dict:
    """Write study.json.gz and the figures into `fig_dir` (default: `md_path` without its
    suffix, e.g. docs/findings/) and the page at `md_path`. Returns {"md", "json",
    "figures": {key: path}}."""
    from rack.measure.results import to_json
    from rack.experiments.study.figures import write_figures
    from rack.experiments.study.findings import render

    md_path = Path(md_path)
    fig_dir = Path(fig_dir) if fig_dir is not None else md_path.with_suffix("")
    results = {**results, "meta": {**results["meta"], "rendered_commit": _git_commit()}}
    fig_dir.mkdir(parents=True, exist_ok=True)
    # gzip (mtime 0: the same results give the same bytes): every point of every run is
    # ~1.5 MB of JSON, ~10x less compressed
    with gzip.GzipFile(fig_dir / STUDY_JSON, "wb", mtime=0) as f:
        f.write((to_json(results) + "\n").encode())
    figures = write_figures(results, fig_dir, palette_order(results))
    md_path.write_text(render(results, figures, _relative(fig_dir, md_path.parent).as_posix()))
    return {"md": md_path, "json": fig_dir / STUDY_JSON, "figures": {k: fig_dir / v for k, v in figures.items()}}


def _relative(path: Path, start: Path) -> Path:
    import os

    return Path(os.path.relpath(path.resolve(), start.resolve()))


def load_results(path: Path | str) -> dict:
    """The results `write_study` saved (study.json.gz; a plain .json is read too)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)


__all__ = ["load_results", "palette_order", "write_study"]
