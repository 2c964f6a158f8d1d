"""`rack validate`: the cost model and the engines against every calibration row:
the wafer's and MLPerf's published figures (devices/catalog/calibration.toml) and the
measured GPU serving rows (gpu-calibration.csv's layout, replayed with closed-loop
users through the engines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rack.cli._checks import check_positive, prepare_out_dir
from rack.cli.app import app


def _figures_table(con, figures, tolerance: float, title: str) -> None:
    from rich.table import Table

    t = Table(title=title)
    for col, just in (("row", "left"), ("predicted", "right"), ("published", "right"), ("unit", "left"),
                      ("error", "right")):
        t.add_column(col, justify=just)
    for r in figures:
        err = f"{r.relative_error:+.1%}"
        tol = r.tolerance if r.tolerance is not None else tolerance
        num = (lambda v: f"{v:,.1f}") if min(abs(r.predicted), abs(r.published)) >= 100 else (lambda v: f"{v:.4g}")
        t.add_row(r.name, num(r.predicted), num(r.published), r.unit,
                  f"[red]{err}[/red]" if abs(r.relative_error) > tol else err)
    con.print(t)


def _pipeline_table(con, prompt_rows) -> None:
    """Each wafer prompt row's instance: one request's prompt rate (the stream the row
    measures) against the pipeline's with many prompts in flight, and their MFU."""
    from rich.table import Table

    rows = [r for r in prompt_rows if "pipeline" in r.details]
    if not rows:
        return
    t = Table(title="The wafer prompt rows' instances: one request's stream against the pipeline's prompt rate "
              "(CostModel.prompt_throughput)")
    for col in ("row", "prompt", "one request tok/s", "MFU", "prompts at once", "aggregate tok/s", "MFU", "gain"):
        t.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        p = r.details["pipeline"]
        t.add_row(r.name, f"{r.details['prompt_tokens']:,}", f"{p['single_tokens_per_s']:,.0f}",
                  f"{p['single_mfu']:.2%}", f"{p['requests']:,}", f"{p['aggregate_tokens_per_s']:,.0f}",
                  f"{p['aggregate_mfu']:.1%}", f"{p['gain']:.1f}x")
    con.print(t)


def _lodo_table(con, lodo: dict) -> None:
    from rich.table import Table

    from rack.experiments.validation_table import LABELS

    t = Table(title="Leave-one-device-out: each device's rows on the stack it would borrow (median |error|)")
    for col in ("device", "stack", "borrows", "rows", *LABELS.values()):
        t.add_column(col, justify="left" if col in ("device", "stack", "borrows") else "right")
    for d in lodo["devices"]:
        t.add_row(d["device"], d["stack"], d["borrowed_from"], str(len(d["rows"])),
                  *(f"{d['median_abs_error'][m]:.0%}" for m in LABELS))
    t.add_row("all", "", "", str(lodo["rows"]), *(f"{lodo['median_abs_error'][m]:.0%}" for m in LABELS))
    con.print(t)
    con.print(f"a borrowed stack's uncertainty: median |error| {lodo['median_abs_error']['tpot_s']:.0%} TPOT, "
              f"{lodo['median_abs_error']['throughput_per_gpu']:.0%} throughput per GPU, "
              f"{lodo['median_abs_error']['ttft_s']:.0%} TTFT (devices/lodo.py)")


#: The saturated rows' figures, as the table and the closing line name them.
SATURATED_LABELS = {"input_per_prefill_gpu": "input tok/s/prefill GPU", "ttft_s": "TTFT", "tpot_s": "TPOT"}


def _saturated_table(con, sat, sat_summary) -> None:
    from rich.table import Table

    from rack.experiments.validation_table import SATURATED_LIMITS

    t = Table(title="Saturated-prefill rows (devices/catalog/saturated-prefill.csv, InferenceX): closed-loop "
              "estimate (predicted / measured, error)")
    labels = SATURATED_LABELS
    for col in ("row", "deployment", "users", *labels.values()):
        t.add_column(col, justify="left" if col in ("row", "deployment") else "right")
    fmt = {"input_per_prefill_gpu": lambda v: f"{v:,.0f}", "ttft_s": lambda v: f"{v * 1e3:,.0f} ms",
           "tpot_s": lambda v: f"{v * 1e3:.1f} ms"}
    for r in sat:
        curve = r.row.curve + (f" (borrows {r.borrowed_from})" if r.borrowed_from else "")
        t.add_row(r.row.id, curve, str(r.row.concurrency_requests),
                  *(f"{fmt[m](r.predicted[m])} / {fmt[m](r.measured[m])} {r.errors[m]:+.0%}" for m in labels))
    con.print(t)
    med = sat_summary["median_abs_error"]
    con.print("saturated rows, median |error|: " + ", ".join(
        f"{labels[m]} {med[m]:.0%} (criterion {lim:.0%}: {'met' if sat_summary['met'][m] else 'NOT met'})"
        for m, lim in SATURATED_LIMITS.items()) + f"; TPOT {med['tpot_s']:.0%} (reported, not enforced)")


def _serving_table(con, replays, summary, lodo=None) -> None:
    from rich.table import Table

    from rack.experiments.validation_table import LABELS, SERVING_LIMITS

    t = Table(title="Measured serving rows: closed-loop replay through the engines (predicted / measured, error)")
    for col in ("row", "deployment", "users", *LABELS.values()):
        t.add_column(col, justify="left" if col in ("row", "deployment") else "right")
    fmt = {"tpot_s": lambda v: f"{v * 1e3:.1f} ms", "ttft_s": lambda v: f"{v * 1e3:.0f} ms",
           "throughput_per_gpu": lambda v: f"{v:,.0f}"}
    from devices.borrow import resolve_stack
    from devices.serving_rows import deployment

    lodo_err = lodo.get("median_abs_error", {}) if lodo else {}
    for rr in replays:
        dep = deployment(rr.row)
        lender = resolve_stack(dep.device, dep.stack).borrowed_from
        curve = rr.row.curve + (f" (borrows {lender}, +-{lodo_err.get('tpot_s', float('nan')):.0%} TPOT)"
                                if lender else "")
        cells = []
        for m in LABELS:
            e = rr.errors[m]
            lim = SERVING_LIMITS[m][1] or SERVING_LIMITS[m][0]
            err = f"{e:+.0%}"
            cells.append(f"{fmt[m](rr.predicted[m])} / {fmt[m](rr.measured[m])} "
                         + (f"[red]{err}[/red]" if abs(e) > lim else err))
        t.add_row(rr.row.id, curve, str(rr.row.concurrency_requests), *cells)
    con.print(t)
    for m, label in LABELS.items():
        if m in summary.median:
            med_lim, worst_lim = SERVING_LIMITS[m]
            con.print(f"{label}: median |error| {summary.median[m]:.1%} (limit {med_lim:.0%}), worst "
                      f"{summary.worst[m]:.1%}" + (f" (limit {worst_lim:.0%})" if worst_lim else ""))


def _measured_tables(con, res: dict, lodo: dict) -> None:
    """The InferenceX rows: per row predicted / measured, the criteria, the worst rows."""
    from rich.table import Table

    from devices.inferencex import LIMITS

    t = Table(title=f"Measured serving points (InferenceX layout): {res['summary']['priced_by']}, "
                    "predicted / measured (error)")
    labels = {"ttft_s": "TTFT", "tpot_s": "TPOT", "throughput_per_gpu": "tok/s/GPU", "power_w_per_gpu": "W/GPU",
              "tokens_per_joule": "tok/J"}
    fmt = {"ttft_s": lambda v: f"{v:.3g} s", "tpot_s": lambda v: f"{v * 1e3:.1f} ms",
           "throughput_per_gpu": lambda v: f"{v:,.0f}", "power_w_per_gpu": lambda v: f"{v:,.0f}",
           "tokens_per_joule": lambda v: f"{v:.2f}"}
    for col in ("row", "deployment", "users", *labels.values()):
        t.add_column(col, justify="left" if col in ("row", "deployment") else "right")
    for r in res["rows"]:
        if "unanswered" in r:
            t.add_row(r["id"], f"{r['hardware']} {r['framework']} {r['model']}", str(r["concurrency"] or ""),
                      f"[yellow]not priced: {r['unanswered']}[/yellow]", *[""] * 4)
            continue
        cells = []
        for m in labels:
            if m in r["relative_error"]:
                e = r["relative_error"][m]
                cells.append(f"{fmt[m](r['predicted'][m])} / {fmt[m](r['measured'][m])} {e:+.0%}")
            else:
                cells.append(f"{fmt[m](r['predicted'][m])}")
        curve = r["curve"] + (f" (borrows {r['borrowed_from']})" if r["borrowed_from"] else "")
        t.add_row(r["id"], curve, str(r["concurrency"]), *cells)
    con.print(t)
    s = res["summary"]
    con.print(f"{s['answered']} rows priced; not priced: " + (", ".join(f"{n} ({why})" for why, n in
                                                                  s["unanswered"].items()) or "none"))
    if s["criteria_unanswered"]:
        con.print(f"{s['criteria_model']} rows not priced: {', '.join(s['criteria_unanswered'])}")
    for m, lim in LIMITS.items():
        med = s["median_abs_error"][m]
        scope = "saturated rows (8k prompts, >= 64 users)" if m == "ttft_s" else (
            "rows with measured power" if m == "tokens_per_joule" else "rows")
        con.print(f"{labels[m]}: median |error| " + (f"{med:.1%}" if med is not None else "n/a")
                  + f" over {s['n'][m]} {s['criteria_model']} {scope} (criterion {lim:.0%}: "
                  + ("met" if s["met"][m] else "NOT met") + ")")
    by = Table(title=f"Saturated TTFT by hardware and framework ({s['criteria_model']}): signed median error")
    for col in ("hardware", "framework", "rows", "signed median", f"within {LIMITS['ttft_s']:.0%}"):
        by.add_column(col, justify="left" if col in ("hardware", "framework") else "right")
    for g in s["saturated_ttft_by_stack"]:
        by.add_row(g["hardware"], g["framework"], str(g["rows"]), f"{g['signed_median']:+.0%}", str(g["within"]))
    con.print(by)
    w = Table(title="Worst rows (largest |log error| of any metric) and why")
    for col in ("row", "deployment", "users", "metric", "error", "why"):
        w.add_column(col)
    for r in res["worst"]:
        w.add_row(r["id"], r["curve"], str(r["concurrency"]), labels.get(r["metric"], r["metric"]),
                  f"{r['error']:+.0%}", r["why"])
    con.print(w)
    if lodo:
        _lodo_table(con, lodo)


def _lender(row) -> str:
    """The catalog entry whose software terms a row's (device, framework) borrows ('' : its own)."""
    from devices.borrow import resolve_stack
    from devices.serving_rows import deployment

    dep = deployment(row)
    return resolve_stack(dep.device, dep.stack).borrowed_from


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
    inferencex: bool = typer.Option(False, "--inferencex", help="check the packaged InferenceX measured rows "
                                    "(devices/catalog/inferencex/measured_rows.csv), as --rows with that file"),
    replay: bool = typer.Option(False, "--replay", help="InferenceX rows: replay each row's benchmark client "
                                "(10 x concurrency prompts, all users starting together) through the engines "
                                "instead of the closed-loop estimate (minutes for the packaged file)"),
) -> None:
    """Predicted vs measured for every calibration row; exits 1 when a criterion fails
    (published figures: each within --tolerance, wafer prompt rows within 35 %; serving
    rows: median |error| <= 15 % and worst <= 35 % on TPOT and throughput per GPU,
    median <= 25 % on TTFT). Also prints the leave-one-device-out table of borrowed
    stacks and the saturated-prefill rows (their 25 % criterion is reported, not enforced).
    A (device, framework) pair without a stack file borrows the nearest calibrated one
    (devices/borrow.py), marked in the table."""
    from devices.catalog import CatalogError
    from devices.validation import load_rows
    from devices.validation import validate as run_figures
    from rack.wiring.scenario import ScenarioError
    from rack.experiments.validation_table import replay_rows, serving_rows, summarize
    from workloads.paths import file_problem

    check_positive("--tolerance", tolerance)
    if plot_dir is not None:
        prepare_out_dir("--plot", plot_dir)    # before the work: a bad folder fails at once, in one line
    bad = file_problem(rows_file) if rows_file is not None else None
    if bad is not None:            # a FIFO would block the read
        typer.echo(f"error: --rows {rows_file}: {bad}; expected a CSV or TOML file", err=True)
        raise typer.Exit(2)
    from devices.inferencex import PACKAGED_ROWS, is_inferencex_csv

    if inferencex or (rows_file is not None and rows_file.suffix.lower() == ".csv" and is_inferencex_csv(rows_file)):
        _validate_measured(rows_file or PACKAGED_ROWS, json_out, replay)
        return
    if replay:
        typer.echo("error: --replay applies to InferenceX rows (--inferencex or --rows with that layout); "
                   "gpu-calibration rows are always replayed", err=True)
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
    if rows_file is not None and not figures and not replays:
        # nothing checked is not "every criterion met"
        typer.echo(f"error: --rows {rows_file}: no rows; expected [[row]] tables in a TOML file (published "
                   "figures) or a CSV in gpu-calibration.csv's or InferenceX's layout", err=True)
        raise typer.Exit(2)
    summary = summarize(replays, figures, tolerance)
    lodo, sat, sat_summary = None, [], None
    if replays:
        from devices.lodo import leave_one_device_out

        lodo = leave_one_device_out()
    if rows_file is None:
        from rack.experiments.validation_table import saturated_rows, saturated_summary

        sat = saturated_rows()
        sat_summary = saturated_summary(sat)
    if plot_dir is not None:
        from rack.experiments.validation_plots import write_extra_plots, write_plots

        for p in [*write_plots(replays, plot_dir), *write_extra_plots(figures, lodo, plot_dir)]:
            typer.echo(f"wrote {p}", err=json_out)
    if json_out:
        keys = ("name", "kind", "predicted", "published", "unit", "relative_error", "source")
        out = {
            "figures": [{k: getattr(r, k) for k in keys} | ({"details": r.details} if details else {})
                        | ({"pipeline": r.details["pipeline"]} if "pipeline" in r.details else {})
                        for r in figures],
            "serving_rows": [{"id": rr.row.id, "curve": rr.row.curve, "concurrency": rr.row.concurrency_requests,
                              "borrowed_from": _lender(rr.row) or None,
                              "predicted": rr.predicted, "measured": rr.measured, "relative_error": rr.errors}
                             | ({"details": rr.details} if details else {}) for rr in replays],
            "summary": {"median_abs_error": summary.median, "worst_abs_error": summary.worst,
                        "failures": summary.failures},
            "leave_one_device_out": lodo,
            "saturated_rows": [{"id": r.row.id, "curve": r.row.curve, "concurrency": r.row.concurrency_requests,
                                "borrowed_from": r.borrowed_from or None, "predicted": r.predicted,
                                "measured": r.measured, "relative_error": r.errors} for r in sat],
            "saturated_summary": sat_summary,
        }
        typer.echo(json.dumps(out, indent=2, default=float))
    else:
        from rich.console import Console

        con = Console()
        from devices.validation import PROMPT_KINDS

        plain = [f for f in figures if f.kind not in PROMPT_KINDS]
        prompt = [f for f in figures if f.kind in PROMPT_KINDS]
        if plain:
            _figures_table(con, plain, tolerance, "Published figures (devices/catalog/calibration.toml): cost model")
        if prompt:
            _figures_table(con, prompt, tolerance, "Wafer prompt rows (calibration.toml; fitted by "
                           "devices/wafer_prompt.py): a prompt's time or rate at a stated length, within 35 %")
            _pipeline_table(con, prompt)
        if replays:
            _serving_table(con, replays, summary, lodo)
            _lodo_table(con, lodo)
        if sat:
            _saturated_table(con, sat, sat_summary)
        # the saturated rows' criteria are reported beside the enforced ones, not enforced:
        # the closing line names those still unmet rather than saying "every criterion"
        unmet = [SATURATED_LABELS[m] for m, ok in sat_summary["met"].items() if not ok] if sat else []
        reported = (f" (reported, not enforced: the saturated rows' {', '.join(unmet)} criterion NOT met)"
                    if unmet else "")
        con.print(f"{len(figures)} published figures, {len(replays)} serving rows: "
                  + ("[green]every enforced criterion met[/green]" + reported if not summary.failures
                     else "[red]" + "; ".join(summary.failures) + "[/red]"))
    if summary.failures:
        raise typer.Exit(1)


def _validate_measured(path: Path, json_out: bool, replay: bool = False) -> None:
    """`rack validate --rows` on a CSV in InferenceX's layout: every row priced by the
    closed-loop estimate (devices.inferencex.check_rows; with `replay`, by the engine
    replay of its benchmark client, rack.experiments.validation_runs.replay_row), the
    leave-one-device-out table on its rows; exits 1 when a criterion of
    `devices.inferencex.LIMITS` fails."""
    from devices.catalog import CatalogError
    from devices.inferencex import check_rows, load_inferencex_rows
    from devices.lodo import leave_one_device_out
    from rack.wiring.scenario import ScenarioError

    try:
        rows = load_inferencex_rows(path)
        if replay:
            from rack.experiments.validation_runs import replay_row

            res = check_rows(rows, replay=lambda r: replay_row(r).predicted)
        else:
            res = check_rows(rows)
        lodo = leave_one_device_out([m.row for m in rows if m.row is not None])
    except (CatalogError, ScenarioError, ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if json_out:
        typer.echo(json.dumps({"file": str(path), **res, "leave_one_device_out": lodo}, indent=2, default=float))
    else:
        from rich.console import Console

        _measured_tables(Console(width=200), res, lodo)
    if not all(res["summary"]["met"].values()):
        raise typer.Exit(1)
