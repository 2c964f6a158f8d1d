"""`rack compare`: several deployments on the same trace, side by side, with energy,
cost, a stage breakdown, plots and a one-page report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rack.cli.app import app
from rack.cli._checks import check_positive, out_path, prepare_out_dir, report_failure, stops_on_signal
from rack.cli._terms import BOUNDARY_OPTION, TERM_OPTION, parse_terms, with_boundary, with_terms
from rack.cli._routing import POLICY_OPTION, WEIGHT_OPTION, with_routing
from rack.cli.load import LoadOptions, load_options, rate_line
from rack.cli.run import DEFAULT_TRACE, fail


@app.command()
@stops_on_signal
@load_options
def compare(
    scenarios: Optional[List[str]] = typer.Argument(None, help="scenario names or TOML files [default: gpu-only, wafer-only, split, conditional split (Kimi-K2)]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t", help="trace name or path"),
    runtime: str = typer.Option("virtual", "--runtime", help="virtual (in-process, virtual time) or ray"),
    iso: str = typer.Option("none", "--iso", help="rescale instance counts to the reference's: none, cost, power or count"),
    reference: Optional[str] = typer.Option(None, "--reference", help="scenario the others are scaled to [default: the first split one]"),
    window: Optional[str] = typer.Option(None, "--window", help="START:END seconds of the trace [default: all]"),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="arrival rate multiplier"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1),
    stage: Optional[List[str]] = typer.Option(None, "--stage", help="fixed stage NAME=MS[:before|after] for every scenario (repeatable), e.g. gateway=2"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address: virtual runs go out as Ray tasks over it; ray runtime runs there"),
    out: Path = typer.Option(Path("rack-results/compare"), "--out", parser=out_path, help="results folder"),
    no_plots: bool = typer.Option(False, "--no-plots", help="skip the PNG plots"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON of all scenarios instead of the table"),
    router_policy: Optional[str] = POLICY_OPTION,
    prefix_weight: Optional[float] = WEIGHT_OPTION,
    term: Optional[List[str]] = TERM_OPTION,
    energy_boundary: Optional[str] = BOUNDARY_OPTION,
    load: Optional[LoadOptions] = None,
) -> None:
    """Run deployments on the same requests and compare TTFT/TPOT/ITL/E2E, goodput, tokens/J, $/Mtok."""
    from rack.wiring.settings import parse_stage
    from rack.experiments.compare import (CompareError, compare_document, compare_rich_table, run_compare,
                              write_compare)
    from rack.measure.results import to_json

    if runtime not in ("ray", "virtual"):
        fail(f"--runtime: expected 'ray' or 'virtual', got {runtime!r}")
    check_positive("--rate-scale", rate_scale)
    terms = parse_terms(term)
    try:
        stages = [parse_stage(s) for s in (stage or [])]
    except ValueError as exc:
        fail(str(exc))
    from rack.experiments.compare import ISO_MODES, load_scenarios
    from workloads import TraceError

    if iso not in ISO_MODES:        # before the trace is read and the results folder made
        fail(f"--iso: expected one of {', '.join(ISO_MODES)}, got {iso!r}")

    try:
        # the scenarios first: a misspelt name is refused before the trace is read
        chosen = with_boundary(with_terms(with_routing(load_scenarios(list(scenarios or [])), router_policy,
                                                       prefix_weight), terms), energy_boundary)
    except CompareError as exc:
        fail(str(exc))
    try:
        loaded = load.load(trace, default_trace=DEFAULT_TRACE, window=window, rate_scale=rate_scale,
                           max_requests=max_requests)
    except (TraceError, ValueError) as exc:
        fail(str(exc))
    reqs, info = loaded.requests, loaded.info
    prepare_out_dir("--out", out)
    from rich.console import Console

    err = Console(stderr=True)
    if not as_json:
        err.print(rate_line(reqs, load, rate_scale), markup=False, highlight=False, soft_wrap=True)

    def on_start(name: str, i: int, n: int) -> None:
        if not as_json:
            err.print(f"[{i + 1}/{n}] {name}: {len(reqs)} requests of {loaded.label} on the {runtime} runtime")

    try:
        result = run_compare(chosen, reqs, runtime=runtime, iso=iso, reference=reference,
                             address=address, trace_info=info, fixed_stages=stages, on_start=on_start,
                             run_kwargs=loaded.run_kwargs)
    except CompareError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a deployment's run aborted, or a bug: one line, the rest in the log
        report_failure(out, exc, what="a deployment's run", keep_partial=False)
    finally:
        if runtime == "ray" and address is None:
            try:
                import ray

                if ray.is_initialized():
                    ray.shutdown()
            except ImportError:  # pragma: no cover
                pass
    paths = write_compare(result, out, plots=not no_plots)
    if result.interrupted is not None:          # a signal: the finished deployments are written
        from rack.runtime.interrupt import exit_code

        cut = result.interrupted
        typer.echo(f"interrupted ({cut['signal']}): {cut['finished']} of {cut['deployments']} deployments "
                   f"finished; their comparison is in {paths['json']}", err=True)
        raise typer.Exit(exit_code(cut["signal"]))
    from rack.experiments.compare import model_warning

    warning = model_warning([e.scenario for e in result.entries])
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        typer.echo(to_json(compare_document(result)))
        return
    Console(width=max(160, Console().width)).print(compare_rich_table(result))
    vc = compare_document(result)["vendor_claim"]
    if vc.get("ratio") is not None:
        typer.echo(f"tokens/J, {vc['split']} vs {vc['wafer_only']}: {vc['ratio']:.2f}x measured "
                   f"(vendor claim: up to 5x)")
    typer.echo(f"report: {paths['report_md']} (and .html); JSON: {paths['json']}; "
               f"timelines: {paths['timelines']}" + ("" if no_plots else f"; plots: {out}/plots/"))
