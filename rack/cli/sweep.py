"""`rack sweep rate|bandwidth|prompt`: goodput, SLO attainment, tokens per joule and
cost of deployments against request rate, KV link bandwidth or prompt length;
`rack sweep interactivity`: throughput against tokens/s per user over closed-loop
concurrency ladders (rack.experiments.interactivity)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from rack.cli.app import app, command_group
from rack.cli._checks import check_positive, interruptible, out_path, positive_numbers, prepare_out_dir
from rack.cli.load import LoadOptions, load_options
from rack.cli._routing import POLICY_OPTION, WEIGHT_OPTION, with_routing
from rack.cli._terms import BOUNDARY_OPTION, with_boundary
from rack.cli.run import DEFAULT_TRACE, fail

sweep_app = command_group(help="Sweep request rate, KV link bandwidth or prompt length across deployments.")
app.add_typer(sweep_app, name="sweep")

DEFAULT_SPLIT = "helios-cs3-kimi-k2"
DEFAULT_COLOCATED = ("gpu-only-kimi-k2", "wafer-only-kimi-k2")


def _scenarios(names: list[str]):
    from rack.experiments.compare import CompareError, check_scenario, load_scenarios

    try:
        scs = load_scenarios(names)
        for s in scs:
            check_scenario(s)
    except CompareError as exc:
        fail(str(exc))
    return scs


def _workload(trace: Optional[str], window: Optional[str], max_requests: Optional[int],
              prompt_tokens: Optional[int], output_tokens: int, rate: float, n: int, seed: int,
              load: LoadOptions):
    """A synthetic workload when --prompt-tokens is given, else the trace (or dataset or
    workload file) through the load options."""
    from rack.experiments.sweep import Workload
    from workloads import TraceError

    if prompt_tokens is not None:
        if load != LoadOptions(seed=load.seed):
            fail("--prompt-tokens makes its own synthetic workload; the load options "
                 "(--dataset, --workload, --request-rate, ...) apply to the trace")
        return Workload(kind="synthetic", rate_per_s=rate, prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens, n=n, seed=seed)
    try:
        plan = load.plan(trace or DEFAULT_TRACE, default_trace=DEFAULT_TRACE, window=window,
                         max_requests=max_requests)
        wl = Workload(kind="plan", plan=plan)
        wl.requests()            # fail fast on a bad trace, with the reader's message
    except (TraceError, ValueError) as exc:
        fail(str(exc))
    return wl


def _print_table(title: str, heads: list[str], rows: list[list[str]], min_width: int = 140) -> None:
    """A points table on stdout (first column left-aligned, the rest right-aligned)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for i, h in enumerate(heads):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    # as wide as the table needs (a pipe or a file has no terminal width: rich would cut
    # the numbers to fit 80 columns)
    natural = Console(width=100_000).measure(t).maximum
    Console(width=max(min_width, Console().width, natural)).print(t)


@contextlib.contextmanager
def _stoppable(out: Path) -> Iterator:
    """SIGINT/SIGTERM during a sweep (`rack.runtime.interrupt`): the first stops it
    (the points in flight are terminated, none more starts) and the points that
    finished are written and summarised as for a whole sweep, with the rest marked
    "interrupted"; then one line and exit code 128 + the signal's number. A second
    signal does not cut that write short (the first already stopped every run); a
    third exits on the spot."""
    from rack.runtime.interrupt import exit_code
    from rack.runtime.parallel import RunsStopped

    with interruptible() as stop, stop.replaying():
        stop.absorb_second = True       # the first already stops at once: let the write finish
        try:
            yield stop
        except RunsStopped as exc:      # a map that cannot keep a partial result (interactivity)
            typer.echo(f"interrupted ({stop.signal_name}): stopped after {sum(exc.done)} of {len(exc.done)} "
                       "points; this sweep writes nothing partial", err=True)
            raise typer.Exit(exit_code(stop.signal_name)) from None
    if stop.requested:
        typer.echo(f"interrupted ({stop.signal_name}): the sweep stopped; the points that finished are in "
                   f"{out}", err=True)
        raise typer.Exit(exit_code(stop.signal_name))


def _finish(result, out: Path, as_json: bool, no_plots: bool) -> None:
    from rack.measure.results import to_json
    from rack.experiments.sweep import points_table, summary_lines, write_sweep

    paths = write_sweep(result, out, plots=not no_plots)
    if as_json:
        typer.echo(to_json(result.as_dict()))
        return
    _print_table(f"rack sweep {result.kind}: {result.workload}", *points_table(result))
    for line in summary_lines(result):
        typer.echo(line)
    typer.echo(f"report: {paths['report_md']} (and .html); JSON: {paths['json']}")


_WORKERS = typer.Option(2, "--workers", min=1, help="parallel processes when no --address is given")
_ADDRESS = typer.Option(None, "--address", help="Ray cluster address: run the points as Ray tasks there")


@sweep_app.command("rate")
@load_options
def sweep_rate(
    scenarios: Optional[List[str]] = typer.Argument(None, help="scenario names or TOML files [default: the four Kimi-K2 deployments]"),
    rates: Optional[str] = typer.Option(None, "--rates", help="request rates to sweep, req/s (each point of a synthetic load draws its own arrivals at that rate, for the whole --duration when given), e.g. 1,2,4,8,16"),
    rate_scales: Optional[str] = typer.Option(None, "--rate-scales", help="multipliers of the source's rate (x the trace's mean rate, or x --request-rate) [default: 0.5,1,2,4,8 when --rates is not given]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t"),
    window: Optional[str] = typer.Option(None, "--window", help="START:END seconds of the trace"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1),
    target: float = typer.Option(0.9, "--target", min=0.0, max=1.0, help="SLO attainment defining the max sustainable rate"),
    search: str = typer.Option("ladder", "--search", help="ladder: run every rate; bisect: find each capacity by bisection over the rates (the same rate when attainment falls with rate; rack.experiments.capacity)"),
    early_stop: Optional[bool] = typer.Option(None, "--early-stop/--no-early-stop", help="end a run once its SLO miss is certain [default: on with --search bisect]"),
    workers: int = _WORKERS, address: Optional[str] = _ADDRESS,
    out: Path = typer.Option(Path("rack-results/sweep-rate"), "--out", parser=out_path),
    no_plots: bool = typer.Option(False, "--no-plots"),
    as_json: bool = typer.Option(False, "--json", help="print sweep.json"),
    load: Optional[LoadOptions] = None,
) -> None:
    """Goodput and tokens/J against request rate; the max rate each deployment sustains (DistServe)."""
    from rack.experiments.capacity import SEARCHES, capacity_sweep

    if search not in SEARCHES:
        fail(f"--search: expected one of {', '.join(SEARCHES)}, got {search!r}")
    if load is not None and load.max_concurrency is not None:
        fail("--max-concurrency: a closed loop sends a request when one ends, so it has no "
             "arrival rate for --rates to set; sweep an open loop (--request-rate, or the "
             "trace's own timing)")
    if rates is not None and rate_scales is not None:
        fail("give --rates (req/s) or --rate-scales (multipliers of the source's rate), not both")
    load = load or LoadOptions()
    asked = positive_numbers(rates, "--rates") if rates is not None else None
    scales = positive_numbers(rate_scales or "0.5,1,2,4,8", "--rate-scales") if asked is None else None
    synthetic_rate = load.request_rate is not None and math.isfinite(load.request_rate)
    if load.dataset and not synthetic_rate:
        if asked is None:
            fail("--rate-scales: the random dataset has no arrival rate to scale (without --request-rate every "
                 "request arrives at 0 s); give --request-rate R, or the rates themselves with --rates")
        # each point draws its own arrivals at its asked rate: any finite base rate will do
        load = dc_replace(load, request_rate=1.0)
    scs = _scenarios(list(scenarios or []))
    wl = _workload(trace, window, max_requests, None, 1, 1.0, 1, 0, load)
    if load.request_rate is not None and math.isfinite(load.request_rate):
        base = load.request_rate                 # the synthetic arrivals' rate
    else:
        reqs = wl.requests()
        span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
        base = (len(reqs) - 1) / span if span > 0 and len(reqs) > 1 else None
        if base is None:
            fail(f"{'--rates' if asked else '--rate-scales'}: {wl.describe()} arrives all at one instant, so it "
                 "has no arrival rate to " + ("set" if asked else "scale") + "; give --request-rate R")
    prepare_out_dir("--out", out)
    with _stoppable(out):
        result = capacity_sweep(scs, wl, [r / base for r in asked] if asked else scales, target=target,
                                base_rate=base, workers=workers, address=address, progress=not as_json,
                                absolute=asked is not None, search=search,
                                early_stop=(search == "bisect") if early_stop is None else early_stop)
        _finish(result, out, as_json, no_plots)


@sweep_app.command("bandwidth")
@load_options
def sweep_bandwidth(
    split: str = typer.Option(DEFAULT_SPLIT, "--split", help="the split deployment (has a KV link)"),
    colocated: Optional[List[str]] = typer.Option(None, "--colocated", help="colocated deployments to cross (repeatable) [default: gpu-only and wafer-only Kimi-K2]"),
    bandwidths: str = typer.Option("1,4,16,64,256,1024", "--bandwidths", help="KV link bandwidths (GB/s)"),
    link: Optional[str] = typer.Option(None, "--link", help="only this link of the split scenario [default: all]"),
    metric: str = typer.Option("goodput_rps", "--metric", help="goodput_rps or slo_attainment"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t"),
    window: Optional[str] = typer.Option(None, "--window"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", min=1, help="synthetic workload: prompt length (replaces the trace)"),
    output_tokens: int = typer.Option(128, "--output-tokens", min=1, help="synthetic workload: output length"),
    rate: float = typer.Option(2.0, "--rate", min=1e-9, help="synthetic workload: Poisson rate (req/s)"),
    n: int = typer.Option(200, "--n", min=1, help="synthetic workload: requests"),
    seed: int = typer.Option(0, "--seed"),
    workers: int = _WORKERS, address: Optional[str] = _ADDRESS,
    out: Path = typer.Option(Path("rack-results/sweep-bandwidth"), "--out", parser=out_path),
    no_plots: bool = typer.Option(False, "--no-plots"),
    as_json: bool = typer.Option(False, "--json"),
    load: Optional[LoadOptions] = None,
) -> None:
    """The split deployment at each KV link bandwidth against colocated ones; prints the crossover."""
    from rack.experiments.sweep import bandwidth_sweep, with_link_bandwidth

    if metric not in ("goodput_rps", "slo_attainment"):
        fail(f"--metric: expected goodput_rps or slo_attainment, got {metric!r}")
    sp = _scenarios([split])[0]
    try:
        with_link_bandwidth(sp, 1.0, link)
    except ValueError as exc:
        fail(str(exc))
    cos = _scenarios(list(colocated or DEFAULT_COLOCATED))
    check_positive("--rate", rate)
    wl = _workload(trace, window, max_requests, prompt_tokens, output_tokens, rate, n, seed, load)
    prepare_out_dir("--out", out)
    with _stoppable(out):
        result = bandwidth_sweep(sp, cos, wl, positive_numbers(bandwidths, "--bandwidths"), link=link, metric=metric,
                                 workers=workers, address=address, progress=not as_json)
        _finish(result, out, as_json, no_plots)


@sweep_app.command("prompt")
def sweep_prompt(
    scenarios: Optional[List[str]] = typer.Argument(None, help="scenario names or TOML files [default: the four Kimi-K2 deployments]"),
    lengths: str = typer.Option("512,2048,8192,32768", "--lengths", help="prompt lengths (tokens)"),
    output_tokens: int = typer.Option(256, "--output-tokens", min=1),
    rate: float = typer.Option(2.0, "--rate", min=1e-9, help="Poisson arrival rate (req/s)"),
    n: int = typer.Option(200, "--n", min=1, help="requests per point"),
    seed: int = typer.Option(0, "--seed"),
    workers: int = _WORKERS, address: Optional[str] = _ADDRESS,
    out: Path = typer.Option(Path("rack-results/sweep-prompt"), "--out", parser=out_path),
    no_plots: bool = typer.Option(False, "--no-plots"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Goodput and tokens/J against prompt length on synthetic Poisson traffic."""
    from rack.experiments.sweep import prompt_sweep

    scs = _scenarios(list(scenarios or []))
    given = positive_numbers(lengths, "--lengths")
    if any(x != int(x) for x in given):         # int() would cut 1.5 to a 1-token prompt
        fail(f"--lengths: expected whole token counts, got {lengths!r}")
    Ls = [int(x) for x in given]
    check_positive("--rate", rate)
    prepare_out_dir("--out", out)
    with _stoppable(out):
        result = prompt_sweep(scs, Ls, rate_per_s=rate, output_tokens=output_tokens, n=n, seed=seed,
                              workers=workers, address=address, progress=not as_json)
        _finish(result, out, as_json, no_plots)


#: `rack sweep interactivity`'s deployments: the wafer alone, the 16- and 72-GPU splits,
#: the GPUs alone (the study's vendor-claim comparison).
INTERACTIVITY_SCENARIOS = ("wafer-only-kimi-k2", "helios-cs3-kimi-k2", "helios72-cs3-kimi-k2", "gpu-only-kimi-k2")


@sweep_app.command("interactivity")
@load_options
def sweep_interactivity(
    scenarios: Optional[List[str]] = typer.Argument(None, help="scenario names or TOML files [default: wafer-only, helios-cs3, helios72-cs3, gpu-only Kimi-K2]"),
    concurrency: str = typer.Option("1,4,16,64", "--concurrency", help="closed-loop concurrencies: requests (or sessions) in the rack at once"),
    per_slot: int = typer.Option(4, "--per-slot", min=1, help="requests (or whole sessions) replayed per slot at each point"),
    pair: Optional[List[str]] = typer.Option(None, "--pair", metavar="A:B", help="ratio A/B read at equal tokens/s per user (repeatable) [default: each GPU-prefill + wafer-decode deployment over the wafer-only one]"),
    metric: str = typer.Option("output_tps_per_kw", "--metric", help="metric of the ratios: output_tps_per_kw, output_tps_per_device, output_tps_per_usd_per_hour, ..."),
    tolerance: float = typer.Option(0.01, "--tolerance", min=0.0, max=0.5, help="the 'at least' ratio: a point gives x tokens/s per user within this fraction"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t"),
    window: Optional[str] = typer.Option(None, "--window", help="START:END seconds of the trace"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1),
    router_policy: Optional[str] = POLICY_OPTION, prefix_weight: Optional[float] = WEIGHT_OPTION,
    workers: int = _WORKERS, address: Optional[str] = _ADDRESS,
    out: Path = typer.Option(Path("rack-results/sweep-interactivity"), "--out"),
    no_plots: bool = typer.Option(False, "--no-plots"),
    as_json: bool = typer.Option(False, "--json", help="print interactivity.json"),
    until_turned: bool = typer.Option(False, "--until-turned", help="the --concurrency values are rungs: each curve "
                                      "climbs them until its --metric falls after its best point or its tokens/s "
                                      "per user falls below its TPOT target's (docs/interactivity.md)"),
    energy_boundary: Optional[str] = BOUNDARY_OPTION,
    load: Optional[LoadOptions] = None,
) -> None:
    """Throughput per device, per kW and per $/h against tokens/s per user, from closed-loop
    concurrency ladders (InferenceX's curves); ratios read at equal interactivity."""
    import dataclasses

    from rack.experiments.compare import is_gpu_prefill_wafer_decode, is_wafer_only
    from rack.experiments.interactivity import METRICS, interactivity_sweep, points_table, summary_lines, \
        write_interactivity
    from workloads import TraceError

    if load is not None and (load.request_rate is not None or load.max_concurrency is not None):
        fail("--request-rate/--max-concurrency: an interactivity sweep is a pure closed loop at each "
             "--concurrency (every request ready at 0 s); give the ladder with --concurrency")
    if metric not in METRICS:
        fail(f"--metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    ladder = positive_numbers(concurrency, "--concurrency")
    if any(c != int(c) for c in ladder):
        fail(f"--concurrency: expected whole numbers, e.g. 1,4,16,64, got {concurrency!r}")
    scs = with_boundary(with_routing(_scenarios(list(scenarios or INTERACTIVITY_SCENARIOS)), router_policy,
                                     prefix_weight), energy_boundary)
    names = [s.name for s in scs]
    pairs = []
    for p in pair or []:
        a, sep, b = p.partition(":")
        if not sep or a not in names or b not in names:
            fail(f"--pair: expected A:B of the swept deployments ({', '.join(names)}), got {p!r}")
        pairs.append((a, b))
    if pair is None:
        wafer = next((s.name for s in scs if is_wafer_only(s)), None)
        pairs = [(s.name, wafer) for s in scs if wafer and is_gpu_prefill_wafer_decode(s)]
    load = load or LoadOptions()
    try:
        # --think-time is between a slot's requests (or sessions): the sweep's, not the plan's
        plan = dataclasses.replace(load, think_time=0.0).plan(trace or DEFAULT_TRACE, default_trace=DEFAULT_TRACE,
                                                             window=window, max_requests=max_requests)
        plan.requests()              # fail fast on a bad trace, with the reader's message
    except (TraceError, ValueError) as exc:
        fail(str(exc))
    prepare_out_dir("--out", out)
    with _stoppable(out):
        curves = interactivity_sweep(scs, plan, [int(c) for c in ladder], per_slot=per_slot,
                                     think_time_s=load.think_time, workers=workers,
                                     address=address, progress=not as_json, until_turned=until_turned,
                                     metric=metric)
    paths = write_interactivity(curves, out, pairs=pairs, plots=not no_plots, metric=metric, tolerance=tolerance)
    if as_json:
        typer.echo(paths["json"].read_text())
        return
    _print_table(f"rack sweep interactivity: {curves['workload']}", *points_table(curves), min_width=200)
    for line in summary_lines(curves, pairs, metric, tolerance):
        typer.echo(line)
    typer.echo(f"report: {paths['report_md']} (and .html); JSON: {paths['json']}"
               + (f"; plot: {paths['png']}" if "png" in paths else ""))
