"""`rack run`: replay a trace through a scenario and write a results folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from rack.cli._checks import bad_row_hint, check_positive, fail, interruptible, out_path, prepare_out_dir, report_failure
from rack.cli._terms import BOUNDARY_OPTION, TERM_OPTION, parse_terms, with_boundary, with_terms
from rack.cli._routing import POLICY_OPTION, WEIGHT_OPTION, with_routing
from rack.cli.app import app
from rack.cli.load import LoadOptions, load_options, rate_line

DEFAULT_TRACE = "mooncake-excerpt"
# The Ray runtime paces on the wall clock at `dilation` x real time (100 for the default
# scenario: its wafer decodes a token in ~0.77 ms); the excerpt's first 3-second tick
# (10 requests, ~1.5 s of emulated time with their decode) keeps the default run near
# three minutes on a 2-core machine.
DEFAULT_RAY_WINDOW = "0:3"
#: `--records auto` streams the per-request records to disk from this many requests on
#: (a virtual replay holds ~1.4 KB per request in memory otherwise; docs/bench.md).
STREAM_FROM_REQUESTS = 100_000


def load_inputs(scenario: Optional[str], trace: str, window: Optional[str], rate_scale: float,
                max_requests: Optional[int], output_scale: float, skip_bad_rows: bool,
                load: Optional[LoadOptions] = None, compact: bool = False, **overrides):
    """The scenario (with overrides) and the requests (`rack.cli.load.Loaded`: the
    trace, or --dataset/--workload, through the load options; `compact`: as a
    `workloads.RequestTable`), or a clean CLI error."""
    from devices.catalog import CatalogError
    from devices.planner import ModelDoesNotFit
    from rack.wiring.scenario import ScenarioError
    from rack.wiring.load import load_scenario
    from workloads import TraceError

    try:
        sc = load_scenario(scenario)
        sc = sc.with_overrides(**overrides)
        loaded = (load or LoadOptions()).load(trace, default_trace=DEFAULT_TRACE, window=window,
                                              rate_scale=rate_scale, max_requests=max_requests,
                                              output_scale=output_scale, skip_bad_rows=skip_bad_rows,
                                              compact=compact)
    except (ScenarioError, CatalogError, ModelDoesNotFit, TraceError, ValueError) as exc:
        fail(str(exc) + bad_row_hint(exc))
    except OSError as exc:        # e.g. a device file that is a directory
        fail(f"{exc.filename or scenario}: {exc.strerror or exc}")
    return sc, loaded


@app.command()
@load_options
def run(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario name or TOML file [default: helios-cs3-kimi-k2]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t", help="trace name or path"),
    runtime: str = typer.Option("ray", "--runtime", help="ray (actors, wall clock) or virtual (in-process, virtual time)"),
    window: Optional[str] = typer.Option(None, "--window", help=f"START:END seconds of the trace [default: all; ray runtime: {DEFAULT_RAY_WINDOW}]"),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="arrival rate multiplier (2 = twice as fast)"),
    dilation: Optional[float] = typer.Option(None, "--dilation", help="ray runtime: wall seconds per emulated second [default: the scenario's; 100 for helios-cs3-kimi-k2]"),
    payload_scale: Optional[float] = typer.Option(None, "--payload-scale", help="shipped KV bytes / logical KV bytes"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start Ray locally)"),
    out: Path = typer.Option(Path("rack-results/run"), "--out", parser=out_path, help="results folder"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1,
                                               help="keep the first N requests (after the window) [default: all]"),
    output_scale: float = typer.Option(1.0, "--output-scale", help="multiply every output length"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="skip and count bad trace rows"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="ray runtime: wall-clock limit (s)"),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, help="ray runtime: real deaths each "
                                               "engine instance's actor survives (restarted, its requests recovered); "
                                               "0 ends the run on a death [default: the scenario's, 0]"),
    as_json: bool = typer.Option(False, "--json", help="print results.json instead of the summary"),
    fault: Optional[List[str]] = typer.Option(None, "--fault", help="inject a fault (repeatable): "
                                              "KIND:TARGET@AT_S[+DURATION_S][,factor=F][,count=N][,seed=S], KIND one of "
                                              "decode_crash, prefill_crash, link_degrade, link_flap, frame_corrupt "
                                              "(docs/robustness.md)"),
    records: str = typer.Option("auto", "--records", help="where per-request records are kept during the run: "
                                "memory, disk (streamed to OUT/records as requests end, requests held as numpy columns: memory stays bounded on "
                                f"day-long traces; virtual runtime), or auto (disk from {STREAM_FROM_REQUESTS:,} "
                                "requests on the virtual runtime)"),
    router_policy: Optional[str] = POLICY_OPTION,
    prefix_weight: Optional[float] = WEIGHT_OPTION,
    no_plots: bool = typer.Option(False, "--no-plots", help="skip timeseries.png"),
    term: Optional[List[str]] = TERM_OPTION,
    energy_boundary: Optional[str] = BOUNDARY_OPTION,
    load: Optional[LoadOptions] = None,
) -> None:
    """Replay a trace through the emulated rack and report TTFT, TPOT, ITL, goodput, KV traffic.

    SIGINT (Ctrl-C) or SIGTERM during the replay stops it and writes the results of what
    finished (status "interrupted"), exit code 130 (SIGINT) or 143 (SIGTERM); a second
    signal exits at once."""
    from rack.measure.results import summary_text, to_json, write_results
    from rack.runtime.interrupt import exit_code

    if runtime not in ("ray", "virtual"):
        fail(f"--runtime: expected 'ray' or 'virtual', got {runtime!r}")
    if records not in ("auto", "memory", "disk"):
        fail(f"--records: expected auto, memory or disk, got {records!r}")
    if records == "disk" and runtime != "virtual":
        fail("--records disk: records stream to the results folder on the virtual runtime only "
             "(a Ray run's collector may run on another node)")
    terms = parse_terms(term)
    with interruptible() as stop:
        for name, value in (("--dilation", dilation), ("--payload-scale", payload_scale),
                            ("--rate-scale", rate_scale), ("--output-scale", output_scale), ("--timeout", timeout)):
            check_positive(name, value)
        from rack.wiring.pace import dilation_error, replay_error

        if dilation is not None and dilation_error(dilation):
            fail(f"--dilation {dilation:g}: {dilation_error(dilation)}")
        if runtime == "ray" and window is None and trace == DEFAULT_TRACE and not (load.dataset or load.workload):
            window = DEFAULT_RAY_WINDOW
        # the virtual runtime runs in this process: no cluster, no wall clock, no actor to restart
        for name, value in (("--dilation", dilation), ("--timeout", timeout), ("--address", address),
                            ("--max-restarts", max_restarts)):
            if runtime == "virtual" and value is not None:
                typer.echo(f"warning: {name} applies to the ray runtime only; the virtual runtime ignores it", err=True)
        sc, loaded = load_inputs(scenario, trace, window, rate_scale, max_requests, output_scale,
                                 skip_bad_rows, load, compact=runtime == "virtual" and records != "memory",
                                 dilation=dilation, payload_scale=payload_scale,
                                 max_restarts=max_restarts)
        sc = with_boundary(with_terms(with_routing([sc], router_policy, prefix_weight), terms), energy_boundary)[0]
        reqs = loaded.requests
        if runtime == "ray" and reqs and replay_error(reqs[-1].arrival_s, sc.dilation, timeout):
            fail(replay_error(reqs[-1].arrival_s, sc.dilation, timeout))
        if fault:
            from rack.wiring.faults import parse_fault_option
            from rack.wiring.scenario import ScenarioError

            try:
                sc = sc.with_overrides(faults=[*sc.model_dump()["faults"], *(parse_fault_option(f) for f in fault)])
            except (ScenarioError, ValueError) as exc:
                fail(str(exc))
        info = loaded.info
        folder = clear_previous_run(prepare_out_dir("--out", out))
        if not as_json:
            typer.echo(f"replaying {len(reqs)} requests of {loaded.label} through {sc.name} on the {runtime} runtime"
                       + (f" (closed loop, at most {load.max_concurrency} in flight)" if load.max_concurrency else "")
                       + (f" (dilation {sc.dilation}, arrivals over about {reqs[-1].arrival_s * sc.dilation:.0f} s of wall time)"
                          if runtime == "ray" else ""), err=True)
            typer.echo(rate_line(reqs, load, rate_scale), err=True)
        stream = records == "disk" or (records == "auto" and runtime == "virtual" and len(reqs) >= STREAM_FROM_REQUESTS)
        output = execute(folder, sc, reqs, runtime=runtime, address=address, trace_info=info,
                         progress=not as_json and sys.stderr.isatty(), timeout_s=timeout,
                         records_dir=str(folder / "records") if stream else None, stop=stop, **loaded.run_kwargs)
        # A signal now waits for the results to be whole (results.json last, atomic),
        # then ends the command with its exit code: the replay's work is not lost.
        with stop.deferred():
            try:
                extras = write_run_series(folder, output, sc, plots=not no_plots)
                write_results(folder, output.results, output.columns)
            except OSError as exc:
                fail(f"--out {folder}: could not write the results ({exc.strerror or exc})", code=1)
        if output.results["status"] != "interrupted" and stop.requested:
            typer.echo(f"interrupted ({stop.signal_name}) after the replay had ended (status "
                       f"{output.results['status']}): its results were written whole, {folder}/results.json",
                       err=True)
            raise typer.Exit(exit_code(stop.signal_name))
        if output.results["status"] == "interrupted":
            typer.echo(interrupted_line(output.results, folder), err=True)
            raise typer.Exit(exit_code((output.results.get("interrupted") or {}).get("signal")))
        if as_json:
            typer.echo(to_json(output.results))
        else:
            typer.echo(summary_text(output.results))
            typer.echo(f"results: {folder}/results.json, {folder}/requests.csv; "
                       + ", ".join(f"{folder}/{x}" for x in extras))


def interrupted_line(results: dict, folder: Path) -> str:
    """The one line `rack run` prints for an interrupted run."""
    from rack.measure.results import not_arrived_note

    r, why = results["requests"], results.get("interrupted") or {}
    at = f" at t={why['t_s']:.3f} s of emulated time" if why.get("t_s") is not None else ""
    return (f"interrupted ({why.get('signal') or 'stop request'}){at}: {r['completed']} completed, "
            f"{r['rejected']} rejected, {r['failed']} failed, {r['unfinished']} unfinished of {r['submitted']} "
            f"submitted{not_arrived_note(r)}; results of what finished in {folder}/results.json (status interrupted)")



#: What `rack run` writes into its results folder (records/ clears its own chunks).
RUN_FILES = ("results.json", "requests.csv", "summary.txt", "timeseries.csv", "timeseries.png",
             "timelines.json", "error.log")


def clear_previous_run(folder: Path) -> Path:
    """Remove an earlier run's RUN_FILES from `folder` before this run starts, so that
    what the folder holds after it (even when stopped before writing, or killed while
    writing) is this run's or nothing, never an earlier run's results read as this
    one's. Fails with one line when a file cannot be removed. Returns `folder`."""
    for name in RUN_FILES:
        try:
            (folder / name).unlink(missing_ok=True)
        except OSError as exc:
            fail(f"--out {folder}: cannot remove the earlier run's {name} ({exc.strerror or exc})", code=1)
    return folder


def write_run_series(folder: Path, output, sc, plots: bool = True) -> list[str]:
    """Beside results.json: timeseries.csv (per instance and link), timeseries.png
    (unless `plots` is False) and timelines.json (Perfetto: 200 sampled requests and
    the engine and link tracks). Returns the file names written."""
    from rack.measure.breakdown import write_chrome_trace
    from rack.measure.timeseries import write_timeseries_csv

    write_timeseries_csv(folder / "timeseries.csv", output.stats)
    write_chrome_trace(folder / "timelines.json", {sc.name: output.columns}, stages={sc.name: sc.fixed_stages},
                       engines={sc.name: output.stats})
    names = ["timeseries.csv", "timelines.json"]
    if plots:
        from rack.measure.plots import timeseries

        timeseries(output.stats, folder / "timeseries.png", end_s=output.results["energy"]["window_s"], title=sc.name)
        names.insert(1, "timeseries.png")
    return names


def execute(folder: Path, sc, reqs, *, runtime: str, address: Optional[str], **kwargs):
    """`run_scenario`, failing with one line for a run that cannot start, stopped or
    broke: an aborted run (a component raised, or the rack stalled) still writes what
    was measured into `folder` (results.json with status "aborted"); the traceback of
    anything but a refused input goes to `folder`/error.log, never to the terminal.
    An interrupted run (`stop` requested) returns its RunOutput (status "interrupted").
    Ray started here is shut down before this returns, whatever happened.
    Exit codes: 2 for input refused before the run, 1 for a run that failed."""
    from rack.run.runner import RunInterrupted, run_scenario
    from rack.wiring.scenario import ScenarioError
    from workloads.clock import TimeSpanError

    try:
        return run_scenario(sc, reqs, runtime=runtime, address=address, **kwargs)
    except RunInterrupted as exc:
        return exc.output
    except (ScenarioError, TimeSpanError) as exc:      # refused before any component started
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - aborted, a stalled Ray run, or a bug: one line, the rest in the log
        report_failure(folder, exc)
    finally:
        # not `import ray`: a signal that stopped its first import leaves it half made
        ray = sys.modules.get("ray")
        if runtime == "ray" and address is None and callable(getattr(ray, "is_initialized", None)):
            try:
                if ray.is_initialized():
                    from rack.runtime.ray_runtime import end_local_ray

                    if end_local_ray():
                        # a Ray daemon died: its processes are killed; Ray's atexit
                        # shutdown would wait on the dead one, so leave now
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(1)
            except (ImportError, AttributeError):     # that half-made module
                pass
