"""`rack study`: the split-versus-colocated study behind docs/findings.md (the same as
`python scripts/study.py`; see rack.experiments.study)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rack.cli._checks import prepare_out_dir, prepare_out_file, stops_on_signal
from rack.cli.app import app


@app.command()
@stops_on_signal
def study(
    quick: bool = typer.Option(False, "--quick", help="smoke test: every experiment on tiny inputs (seconds, not the study)"),
    out: Path = typer.Option(Path("docs/findings.md"), "--out", help="the findings page to write"),
    figures: Optional[Path] = typer.Option(None, "--figures", help="folder of the figures and study.json.gz [default: --out without .md]"),
    workers: int = typer.Option(2, "--workers", min=1, help="parallel processes for the sweeps (1: in this process)"),
    render_only: bool = typer.Option(False, "--render-only", help="rebuild the page and figures from the folder's study.json.gz, running nothing"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (auto, HOST:PORT, local): run the experiments' runs as Ray tasks there, as rack sweep --address does"),
    spec: Optional[Path] = typer.Option(None, "--spec", help="study spec file (TOML: the sections as grids; "
                                        "default: the shipped rack/experiments/study/findings.toml)"),
    readme: Optional[Path] = typer.Option(None, "--readme", help="also rewrite this README's \"what rack says\" "
                                          "summary (between its rack-says markers) from the study"),
    resume: bool = typer.Option(False, "--resume", help="reuse the experiments already finished by an interrupted run with the same settings (FIGURES/checkpoints/)"),
) -> None:
    """Run the split-versus-colocated study and write findings.md, its figures and study.json.gz."""
    import shutil
    import time

    from rack.cli.run import fail
    from rack.experiments.study.config import StudyConfig
    from rack.experiments.study.output import load_results, write_study
    from rack.experiments.study.run import STUDY_JSON, command_line
    from rack.experiments.study.sections import run_spec
    from rack.experiments.study.spec import StudySpecError, load_spec

    fig_dir = figures if figures is not None else out.with_suffix("")
    # before the study runs: a path that cannot be written fails at once, in one line
    prepare_out_file("--out", out, "a Markdown file")
    prepare_out_dir("--figures" if figures is not None else "--out (its figures folder)", fig_dir)
    if not resume and not render_only and (fig_dir / "checkpoints").is_dir():
        shutil.rmtree(fig_dir / "checkpoints")
    if render_only:
        src = fig_dir / STUDY_JSON
        if not src.is_file():
            fail(f"--render-only: {src} not found; run the study first")
        results = load_results(src)
    else:
        try:
            the_spec = load_spec(spec)
            the_spec = the_spec.quick() if quick else the_spec
        except StudySpecError as exc:
            fail(str(exc))
        cfg = (StudyConfig.quick(workers=1, progress=False) if quick else
               StudyConfig.full(workers=workers, progress=not no_progress))
        t0 = time.perf_counter()
        log = (lambda m: typer.echo(f"[study {time.perf_counter() - t0:5.0f} s] {m}", err=True))
        from rack.runtime.errors import RayRunError

        try:
            results = run_spec(the_spec, cfg, command=command_line(), log=log, checkpoints=fig_dir / "checkpoints",
                               spec_path=None if spec is None else str(spec), address=address)
        except StudySpecError as exc:
            fail(str(exc))
        except RayRunError as exc:
            fail(f"--address {address}: {exc}")
    paths = write_study(results, out, fig_dir)
    if (fig_dir / "checkpoints").is_dir():      # study.json.gz now holds everything
        shutil.rmtree(fig_dir / "checkpoints")
    if readme is not None:
        from rack.experiments.study.summary import update_readme

        try:
            update_readme(readme, results)
        except ValueError as exc:
            fail(str(exc))
    typer.echo(f"wrote {paths['md']}, {paths['json']} and {len(paths['figures'])} figures in {fig_dir}"
               + ("" if render_only else f" ({results['meta']['wall_s']:.0f} s)"))
