"""`rack run`: replay a trace through a scenario and write a results folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from rack.cli.app import app

DEFAULT_TRACE = "mooncake-excerpt"
# The Ray runtime paces on the wall clock at `dilation` x real time (100 for the default
# scenario: its wafer decodes a token in ~0.77 ms); the excerpt's first 3-second tick
# (10 requests, ~1.5 s of emulated time with their decode) keeps the default run near
# three minutes on a 2-core machine.
DEFAULT_RAY_WINDOW = "0:3"


def fail(message: str, code: int = 2) -> None:
    """Print `message` as a one-line error and exit with `code` (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_inputs(scenario: Optional[str], trace: str, window: Optional[str], rate_scale: float,
                max_requests: Optional[int], output_scale: float, skip_bad_rows: bool,
                **overrides):
    """The scenario (with overrides) and the request list, or a clean CLI error."""
    from devices.catalog import CatalogError
    from devices.planner import ModelDoesNotFit
    from rack.scenario import ScenarioError, load_scenario
    from workloads import TraceError, load_requests, parse_window, resolve_trace

    try:
        sc = load_scenario(scenario)
        sc = sc.with_overrides(**overrides)
        win = parse_window(window) if window else None
        path = resolve_trace(trace)
        reqs = load_requests(trace, window=win, rate_scale=rate_scale, max_requests=max_requests,
                             skip_bad_rows=skip_bad_rows, output_scale=output_scale)
    except (ScenarioError, CatalogError, ModelDoesNotFit, TraceError, ValueError) as exc:
        fail(str(exc))
    if len(reqs) == 0:
        fail(f"trace {trace!r} with window {window!r} has no requests")
    return sc, reqs, path


@app.command()
def run(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario name or TOML file [default: helios-cs3-kimi-k2]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t", help="trace name or path"),
    runtime: str = typer.Option("ray", "--runtime", help="ray (actors, wall clock) or virtual (in-process, virtual time)"),
    window: Optional[str] = typer.Option(None, "--window", help=f"START:END seconds of the trace [default: all; ray runtime: {DEFAULT_RAY_WINDOW}]"),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="arrival rate multiplier (2 = twice as fast)"),
    dilation: Optional[float] = typer.Option(None, "--dilation", help="ray runtime: wall seconds per emulated second [default: the scenario's; 100 for helios-cs3-kimi-k2]"),
    payload_scale: Optional[float] = typer.Option(None, "--payload-scale", help="shipped KV bytes / logical KV bytes"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start Ray locally)"),
    out: Path = typer.Option(Path("rack-results/run"), "--out", help="results folder"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1,
                                               help="keep the first N requests (after the window) [default: all]"),
    output_scale: float = typer.Option(1.0, "--output-scale", help="multiply every output length"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="skip and count bad trace rows"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="ray runtime: wall-clock limit (s)"),
    as_json: bool = typer.Option(False, "--json", help="print results.json instead of the summary"),
    fault: Optional[List[str]] = typer.Option(None, "--fault", help="inject a fault (repeatable): "
                                              "KIND:TARGET@AT_S[+DURATION_S][,factor=F][,count=N][,seed=S], KIND one of "
                                              "decode_crash, prefill_crash, link_degrade, link_flap, frame_corrupt "
                                              "(docs/robustness.md)"),
) -> None:
    """Replay a trace through the emulated rack and report TTFT, TPOT, ITL, goodput, KV traffic."""
    from rack.results import summary_text, to_json, write_results
    from rack.runner import run_scenario, trace_info

    if runtime not in ("ray", "virtual"):
        fail(f"--runtime: expected 'ray' or 'virtual', got {runtime!r}")
    if runtime == "ray" and window is None and trace == DEFAULT_TRACE:
        window = DEFAULT_RAY_WINDOW
    for name, value in (("--dilation", dilation), ("--timeout", timeout)):
        if runtime == "virtual" and value is not None:
            typer.echo(f"warning: {name} applies to the ray runtime only; the virtual runtime ignores it", err=True)
    sc, reqs, path = load_inputs(scenario, trace, window, rate_scale, max_requests, output_scale,
                                 skip_bad_rows, dilation=dilation, payload_scale=payload_scale)
    if fault:
        from rack.faults import parse_fault_option
        from rack.scenario import ScenarioError

        try:
            sc = sc.with_overrides(faults=[*sc.model_dump()["faults"], *(parse_fault_option(f) for f in fault)])
        except (ScenarioError, ValueError) as exc:
            fail(str(exc))
    info = trace_info(path, reqs.summary(), window=window, rate_scale=rate_scale,
                      max_requests=max_requests, output_scale=output_scale)
    if not as_json:
        typer.echo(f"replaying {len(reqs)} requests of {trace} through {sc.name} on the {runtime} runtime"
                   + (f" (dilation {sc.dilation}, arrivals over about {reqs[-1].arrival_s * sc.dilation:.0f} s of wall time)"
                      if runtime == "ray" else ""), err=True)
    try:
        output = run_scenario(sc, reqs, runtime=runtime, address=address, trace_info=info,
                              progress=not as_json and sys.stderr.isatty(), timeout_s=timeout)
    except Exception as exc:  # a stalled or refused run: say what happened, keep the traceback out
        from rack.runtime.virtual import VirtualTimeDeadlock
        from rack.scenario import ScenarioError

        if isinstance(exc, ScenarioError):     # refused before any component started
            fail(str(exc))
        known = (VirtualTimeDeadlock,)
        try:
            from rack.runtime.ray_runtime import RayRunError
            known = known + (RayRunError,)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(exc, known):
            fail(str(exc), code=1)
        raise
    finally:
        if runtime == "ray" and address is None:
            import ray

            if ray.is_initialized():
                ray.shutdown()
    folder = write_results(out, output.results, output.columns)
    if as_json:
        typer.echo(to_json(output.results))
    else:
        typer.echo(summary_text(output.results))
        typer.echo(f"results: {folder}/results.json, {folder}/requests.csv")
