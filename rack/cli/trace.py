"""`rack trace stats PATH|NAME` and `rack trace list`: look at a trace before replaying it."""

from __future__ import annotations

import json
from typing import Any, List, Optional

import typer

from rack.cli._checks import bad_row_hint
from rack.cli.app import app, command_group
from rack.cli.load import BLOCK_SIZE_OPTION, FORMAT_OPTION, MAP_OPTION, TIME_UNIT_OPTION, parse_mapping

trace_app = command_group(help="Inspect request traces (Mooncake, Azure, BurstGPT, generic).")
app.add_typer(trace_app, name="trace")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _print_table(d: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=f"Trace {d['name']}", show_header=False, title_justify="left")
    summary.add_column("metric", style="bold")
    summary.add_column("value", justify="right")
    summary.add_row("file", d["path"])
    summary.add_row("format", d["format"] or "n/a")
    summary.add_row("requests", _fmt(d["count"]))
    if d["has_timestamps"]:
        summary.add_row("span", f"{_fmt(d['span_s'])} s ({_fmt(d['span_s'] / 60)} min)")
        summary.add_row("mean rate", f"{_fmt(d['rate_mean_per_s'], 3)} req/s")
        if d["rate_peak_1min_per_s"] is None:
            summary.add_row("peak 1-min rate", "n/a (the trace spans under a minute; "
                            f"{_fmt(d['count'])} request{'' if d['count'] == 1 else 's'})")
        else:
            summary.add_row("peak 1-min rate", f"{_fmt(d['rate_peak_1min_per_s'], 2)} req/s "
                            f"({_fmt(d['rate_peak_per_min'])} in the busiest minute)")
        summary.add_row("inter-arrival CV", _fmt(d["interarrival_cv"], 2))
    else:
        summary.add_row("span / rate / CV", "n/a (no timestamps: a length distribution; replay it with --request-rate R)")
    if d["has_hashes"]:
        summary.add_row("ideal prefix-cache hit ratio",
                        f"{d['prefix_hit_ratio']:.3f} ({_fmt(d['prefix_hit_tokens'])} / "
                        f"{_fmt(d['prefix_cacheable_tokens'])} cacheable prompt tokens)")
        summary.add_row("  blocks seen before", f"{d['prefix_block_hit_ratio']:.3f} ({_fmt(d['prefix_blocks_hit'])} / "
                        f"{_fmt(d['prefix_blocks'])} blocks of {d['block_size']} tokens)")
        summary.add_row("distinct block hashes", _fmt(d["distinct_hashes"]))
    else:
        summary.add_row("prefix-cache hit ratio", "n/a (no block hashes)")
    summary.add_row("skipped bad rows", _fmt(d["skipped_rows"]) + (
        f" {d['skipped_by_reason']}" if d["skipped_rows"] else ""))
    if d["failed_requests"]:
        summary.add_row("failed requests (excluded)", _fmt(d["failed_requests"]))
    console.print(summary)

    lengths = Table(title="Lengths (tokens; percentiles by linear interpolation)",
                    title_justify="left")
    lengths.add_column("")
    for col in ("mean", "median", "p90", "p99", "min", "max"):
        lengths.add_column(col, justify="right")
    for label, key in (("input", "input_tokens"), ("output", "output_tokens")):
        s = d[key]
        lengths.add_row(label, *(_fmt(s[c]) for c in ("mean", "median", "p90", "p99", "min", "max")))
    console.print(lengths)


@trace_app.command("stats")
def stats(
    trace: str = typer.Argument(..., metavar="PATH|NAME",
                                help="A trace file, or a name from `rack trace list`."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    format: Optional[str] = FORMAT_OPTION,
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows",
                                       help="Skip and count bad rows instead of stopping."),
    mapping: List[str] = MAP_OPTION,
    time_unit: Optional[str] = TIME_UNIT_OPTION,
    block_size: Optional[int] = BLOCK_SIZE_OPTION,
) -> None:
    """Count, span, request rate, inter-arrival CV, length percentiles and the ideal
    prefix-cache hit ratio of a trace."""
    from workloads import TraceError, trace_stats

    try:
        result = trace_stats(trace, format=format, skip_bad_rows=skip_bad_rows,
                             mapping=parse_mapping(mapping, time_unit, block_size))
    except TraceError as e:
        typer.echo(f"error: {e}{bad_row_hint(e)}", err=True)
        raise typer.Exit(2) from None
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    d = result.to_dict()
    if as_json:
        typer.echo(json.dumps(d, indent=2))
    else:
        _print_table(d)


@trace_app.command("list")
def list_traces() -> None:
    """Known trace names and where each one is found."""
    from rich.console import Console
    from rich.table import Table

    from workloads import TraceError, resolve_trace, trace_dirs, trace_names

    table = Table(title="Trace names (full files are looked up in: "
                  + "; ".join(str(d) for d in trace_dirs()) + ")", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("what")
    table.add_column("file")
    for name, what in trace_names().items():
        try:
            where = str(resolve_trace(name))
        except TraceError:
            where = "[red]not found[/red] (not shipped: put it in a directory named by RACK_TRACE_DIR)"
        table.add_row(name, what, where)
    Console().print(table)
