"""`rack validate`: the validation table, the cost model's predictions against every
published figure of shared/reference/calibration.md (rows in
devices/catalog/calibration.toml)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rack.cli.app import app


@app.command("validate")
def validate(
    json_out: bool = typer.Option(False, "--json", help="print a JSON list of rows"),
    tolerance: float = typer.Option(0.15, "--tolerance", help="largest |relative error| accepted"),
    rows_file: Optional[Path] = typer.Option(None, "--rows", help="calibration rows TOML (default: the catalog's)"),
    details: bool = typer.Option(False, "--details", help="with --json: add each row's scenario details"),
) -> None:
    """Predicted vs published for every calibration row; exits 1 if a row misses by more
    than --tolerance."""
    from devices.catalog import CatalogError
    from devices.validation import load_rows
    from devices.validation import validate as run

    try:
        rows = run(load_rows(rows_file) if rows_file else None)
    except (CatalogError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    bad = [r for r in rows if abs(r.relative_error) > tolerance]
    if json_out:
        keys = ("name", "predicted", "published", "unit", "relative_error", "source")
        out = [{k: getattr(r, k) for k in keys} | ({"details": r.details} if details else {}) for r in rows]
        typer.echo(json.dumps(out, indent=2, default=float))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title="Cost model vs published figures (shared/reference/calibration.md)")
        for col, just in (("row", "left"), ("predicted", "right"), ("published", "right"), ("unit", "left"),
                          ("error", "right")):
            t.add_column(col, justify=just)
        for r in rows:
            err = f"{r.relative_error:+.1%}"
            if abs(r.relative_error) > tolerance:
                err = f"[red]{err}[/red]"
            t.add_row(r.name, f"{r.predicted:,.1f}", f"{r.published:,.1f}", r.unit, err)
        con = Console()
        con.print(t)
        worst = max(abs(r.relative_error) for r in rows) if rows else 0.0
        con.print(f"{len(rows)} rows, largest |error| {worst:.1%} (tolerance {tolerance:.0%})"
                  + (f"; [red]{len(bad)} outside[/red]" if bad else ""))
    if bad:
        raise typer.Exit(1)
