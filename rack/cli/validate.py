"""`rack validate`: the cost model and the engines against every calibration row:
the wafer's and MLPerf's published figures (devices/catalog/calibration.toml) and the
measured GPU serving rows (gpu-calibration.csv's layout, replayed with closed-loop
users through the engines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rack.cli.app import app


def _figures_table(con, figures, tolerance: float) -> None:
    from rich.table import Table

    t = Table(title="Published figures (devices/catalog/calibration.toml): cost model")
    for col, just in (("row", "left"), ("predicted", "right"), ("published", "right"), ("unit", "left"),
                      ("error", "right")):
        t.add_column(col, justify=just)
    for r in figures:
        err = f"{r.relative_error:+.1%}"
        tol = r.tolerance if r.tolerance is not None else tolerance
        t.add_row(r.name, f"{r.predicted:,.1f}", f"{r.published:,.1f}", r.unit,
                  f"[red]{err}[/red]" if abs(r.relative_error) > tol else err)
    con.print(t)


def _serving_table(con, replays, summary) -> None:
    from rich.table import Table

    from rack.analysis.validation_table import LABELS, SERVING_LIMITS

    t = Table(title="Measured serving rows: closed-loop replay through the engines (predicted / measured, error)")
    for col in ("row", "deployment", "users", *LABELS.values()):
        t.add_column(col, justify="left" if col in ("row", "deployment") else "right")
    fmt = {"tpot_s": lambda v: f"{v * 1e3:.1f} ms", "ttft_s": lambda v: f"{v * 1e3:.0f} ms",
           "throughput_per_gpu": lambda v: f"{v:,.0f}"}
    for rr in replays:
        cells = []
        for m in LABELS:
            e = rr.errors[m]
            lim = SERVING_LIMITS[m][1] or SERVING_LIMITS[m][0]
            err = f"{e:+.0%}"
            cells.append(f"{fmt[m](rr.predicted[m])} / {fmt[m](rr.measured[m])} "
                         + (f"[red]{err}[/red]" if abs(e) > lim else err))
        t.add_row(rr.row.id, rr.row.curve, str(rr.row.concurrency_requests), *cells)
    con.print(t)
    for m, label in LABELS.items():
        if m in summary.median:
            med_lim, worst_lim = SERVING_LIMITS[m]
            con.print(f"{label}: median |error| {summary.median[m]:.1%} (limit {med_lim:.0%}), worst "
                      f"{summary.worst[m]:.1%}" + (f" (limit {worst_lim:.0%})" if worst_lim else ""))


@app.command("validate")
def validate(
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    tolerance: float = typer.Option(0.15, "--tolerance", help="largest |relative error| of a published figure"),
    rows_file: Optional[Path] = typer.Option(
        None, "--rows", help="rows to check instead of the built-in ones: a CSV in gpu-calibration.csv's layout "
        "(serving rows, replayed) or a TOML of [[row]] tables (published figures)"),
    plot_dir: Optional[Path] = typer.Option(None, "--plot", help="write plots here: per curve, throughput per GPU "
                                            "against tokens/s per user; one parity plot of every row"),
    details: bool = typer.Option(False, "--details", help="with --json: add each row's details"),
) -> None:
    """Predicted vs measured for every calibration row; exits 1 when a criterion fails
    (published figures: each within --tolerance; serving rows: median |error| <= 15 %
    and worst <= 35 % on TPOT and throughput per GPU, median <= 25 % on TTFT)."""
    from devices.catalog import CatalogError
    from devices.validation import load_rows
    from devices.validation import validate as run_figures
    from rack.wiring.scenario import ScenarioError
    from rack.analysis.validation_table import replay_rows, serving_rows, summarize
    from workloads.paths import file_problem

    bad = file_problem(rows_file) if rows_file is not None else None
    if bad is not None:            # a FIFO would block the read
        typer.echo(f"error: --rows {rows_file}: {bad}; expected a CSV or TOML file", err=True)
        raise typer.Exit(2)
    try:
        if rows_file is not None and rows_file.suffix.lower() != ".csv":
            figures, replays = run_figures(load_rows(rows_file)), []
        else:
            figures = run_figures() if rows_file is None else []
            replays = replay_rows(serving_rows(rows_file))
    except (CatalogError, ScenarioError, ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    summary = summarize(replays, figures, tolerance)
    if plot_dir is not None:
        from rack.analysis.validation_plots import write_plots

        for p in write_plots(replays, plot_dir):
            typer.echo(f"wrote {p}", err=json_out)
    if json_out:
        keys = ("name", "predicted", "published", "unit", "relative_error", "source")
        out = {
            "figures": [{k: getattr(r, k) for k in keys} | ({"details": r.details} if details else {})
                        for r in figures],
            "serving_rows": [{"id": rr.row.id, "curve": rr.row.curve, "concurrency": rr.row.concurrency_requests,
                              "predicted": rr.predicted, "measured": rr.measured, "relative_error": rr.errors}
                             | ({"details": rr.details} if details else {}) for rr in replays],
            "summary": {"median_abs_error": summary.median, "worst_abs_error": summary.worst,
                        "failures": summary.failures},
        }
        typer.echo(json.dumps(out, indent=2, default=float))
    else:
        from rich.console import Console

        con = Console()
        if figures:
            _figures_table(con, figures, tolerance)
        if replays:
            _serving_table(con, replays, summary)
        con.print(f"{len(figures)} published figures, {len(replays)} serving rows: "
                  + ("[green]every criterion met[/green]" if not summary.failures
                     else "[red]" + "; ".join(summary.failures) + "[/red]"))
    if summary.failures:
        raise typer.Exit(1)
