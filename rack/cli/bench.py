"""`rack bench`: speed of the emulator itself (replay speed, event cost, Ray pacing,
KV codec and KV link throughput, peak RSS of long replays); see rack.experiments.bench and
docs/bench.md."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rack.cli._checks import check_positive, prepare_out_file, stops_on_signal
from rack.cli.app import app


@app.command()
@stops_on_signal
def bench(
    as_json: bool = typer.Option(False, "--json", help="print the results as JSON instead of tables"),
    repeat: int = typer.Option(3, "--repeat", "-r", min=1, help="runs per figure (the median is reported)"),
    quick: bool = typer.Option(False, "--quick", help="smoke test: 600 s of each trace, one run, short Ray ladder"),
    skip_ray: bool = typer.Option(False, "--skip-ray", help="skip the Ray pacing and actor-link measurements"),
    skip_codec: bool = typer.Option(False, "--skip-codec", help="skip the codec-vs-memcpy measurement"),
    skip_memory: bool = typer.Option(False, "--skip-memory", help="skip the peak-RSS replays (the 1M-request one takes 20-30 min)"),
    memory_requests: Optional[List[int]] = typer.Option(None, "--memory-requests", min=1, help="requests per peak-RSS replay [default: 100000 1000000; --quick: 10000 50000]"),
    trace: Optional[List[str]] = typer.Option(None, "--trace", "-t", help="trace(s) to replay [default: azure_conv mooncake_conv]"),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", "-s", help="scenario(s) [default: helios-cs3-kimi-k2 a100-llama2-70b]"),
    window: Optional[str] = typer.Option(None, "--window", help="START:END seconds of each trace [default: all]"),
    codec_mb: Optional[List[float]] = typer.Option(None, "--codec-mb", help="codec frame sizes in MiB [default: 1 16 128]"),
    rate_scale: Optional[List[float]] = typer.Option(None, "--rate-scale", help="Ray pacing rate-scale ladder [default: 1 2 4 8]"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start Ray locally)"),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="also replay with another version of the code (a git revision of this checkout, or a checkout's path), alternately, and report the speed-up"),
    study_cost: Optional[str] = typer.Option(None, "--study-cost", help="with --baseline: also run these study experiments (comma-separated keys of rack.experiments.study.run.EXPERIMENTS, or 'all') with both versions, alternately: wall time per experiment, runs per capacity search, verdicts compared"),
    peer: bool = typer.Option(False, "--peer", help="also replay the whole traces through NVIDIA Dynamo's mocker (ai-dynamo-runtime, an optional install; docs/bench.md) beside rack (and --baseline's code), alternately, in fresh processes: CPU and wall time per request and their ratios"),
    peer_python: Optional[str] = typer.Option(None, "--peer-python", help="interpreter that has the mocker installed [default: $RACK_PEER_PYTHON, else this one]"),
    peer_matched_blocks: bool = typer.Option(True, "--peer-matched-blocks/--peer-defaults-only", help="with --peer: also run the mocker at the rack scenario's KV block size (16 tokens, the same KV capacity in tokens) beside its own default of 64"),
    skip_replay: bool = typer.Option(False, "--skip-replay", help="skip the in-process replay and event-cost sections (e.g. with --peer, which replays the whole traces itself)"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write the JSON to this file"),
) -> None:
    """Measure how fast the emulator runs: virtual replay of whole traces, cost of doubled
    outputs, Ray pacing lateness, KV codec and KV link throughput, peak RSS of long
    replays (per 100k requests); with --baseline, the speed-up over another version of
    the code measured in the same run; with --peer, rack beside NVIDIA Dynamo's mocker."""
    import sys

    from rack.experiments import bench as B
    from workloads import parse_window

    if out is not None:                 # before the benchmark: a bad path fails at once, in one line
        prepare_out_file("--out", out, "a JSON file")
    for mb in codec_mb or ():
        check_positive("--codec-mb", mb)
    try:
        win = parse_window(window) if window is not None else None
        if baseline:
            from rack.experiments.bench_baseline import check_ref

            check_ref(baseline)
        experiments = None
        if study_cost:
            from rack.experiments.study.run import EXPERIMENTS

            known = [k for k, _ in EXPERIMENTS]
            experiments = known if study_cost == "all" else [k.strip() for k in study_cost.split(",") if k.strip()]
            bad = [k for k in experiments if k not in known]
            if bad or not baseline:
                raise ValueError(f"--study-cost: unknown experiment(s) {bad}; known: {', '.join(known)}" if bad
                                 else "--study-cost needs --baseline REF (the code to compare with)")
            experiments = [k for k in known if k in experiments]     # the study's order
            if "bandwidth" in experiments and "load" not in experiments:
                raise ValueError("--study-cost: bandwidth reads the load experiment's capacities; name load too")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    progress = (lambda msg: typer.echo(f"[bench] {msg}", err=True))
    result = B.run_bench(repeat=repeat, quick=quick, skip_ray=skip_ray, skip_codec=skip_codec,
                         traces=tuple(trace) if trace else B.DEFAULT_TRACES,
                         scenarios=tuple(scenario) if scenario else B.DEFAULT_SCENARIOS,
                         window=win, codec_sizes_mb=tuple(codec_mb) if codec_mb else B.CODEC_SIZES_MB,
                         rate_scales=tuple(rate_scale) if rate_scale else None, address=address,
                         baseline=baseline, progress=progress, skip_memory=skip_memory,
                         memory_sizes=tuple(memory_requests) if memory_requests else None,
                         study_cost=experiments, peer=peer, peer_python=peer_python, skip_replay=skip_replay,
                         peer_matched_blocks=peer_matched_blocks)
    result["settings"]["argv"] = list(sys.argv)
    text = B.to_json(result)
    if out is not None:
        out.write_text(text + "\n")
    if as_json:
        typer.echo(text)
    else:
        B.render(result)
