"""`rack bench-serve`: replay a trace or synthetic load against an OpenAI-compatible
endpoint (rack serve, vLLM, SGLang, ...) and write the same results folder as `rack run`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Optional

import typer

from rack.cli._checks import check_positive, fail, out_path, prepare_out_dir
from rack.cli.app import app
from rack.cli.load import LoadOptions, load_options

DEFAULT_TRACE = "mooncake-excerpt"


@app.command("bench-serve")
@load_options
def bench_serve(
    base_url: str = typer.Option("http://127.0.0.1:8000", "--base-url", help="the server (without /v1)"),
    model: Optional[str] = typer.Option(None, "--model", help="model name to send [default: the server's first in /v1/models]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t", help="trace name or path"),
    window: Optional[str] = typer.Option(None, "--window", help="START:END seconds of the trace [default: all]"),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="arrival rate multiplier"),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1, help="keep the first N requests"),
    output_scale: float = typer.Option(1.0, "--output-scale", help="multiply every output length"),
    time_scale: Optional[float] = typer.Option(None, "--time-scale", help="wall seconds per trace second [default: the server's dilation if it is rack serve (GET /health), else 1]"),
    endpoint: str = typer.Option("completions", "--endpoint", help="completions or chat"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="bearer key"),
    no_rack_fields: bool = typer.Option(False, "--no-rack-fields", help="do not send rack_block_hashes (prefix-cache identity)"),
    timeout: float = typer.Option(600.0, "--timeout", help="per-request timeout (wall s)"),
    slo_ttft_ms: float = typer.Option(2000.0, "--slo-ttft-ms", help="goodput TTFT target (the default scenario's)"),
    slo_tpot_ms: float = typer.Option(80.0, "--slo-tpot-ms", help="goodput TPOT target (the default scenario's)"),
    out: Path = typer.Option(Path("rack-results/bench-serve"), "--out", parser=out_path, help="results folder"),
    load: Optional[LoadOptions] = None,
) -> None:
    """Replay requests over HTTP (streaming, ignore_eos) and measure TTFT, TPOT, ITL at the client."""
    import httpx

    from rack.measure.results import summary_text, write_results
    from rack.serve.loadgen import client_results, replay_http

    for name, value in (("--rate-scale", rate_scale), ("--output-scale", output_scale),
                        ("--time-scale", time_scale), ("--timeout", timeout)):
        check_positive(name, value)
    if endpoint not in ("completions", "chat"):
        fail(f"--endpoint: expected completions or chat, got {endpoint!r}")
    try:
        loaded = (load or LoadOptions()).load(trace, default_trace=DEFAULT_TRACE, window=window,
                                              rate_scale=rate_scale, max_requests=max_requests,
                                              output_scale=output_scale, skip_bad_rows=False)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    reqs = list(loaded.requests)
    if not reqs:
        fail("no requests to send (check --window / --max-requests)")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        health = httpx.get(base_url.rstrip("/") + "/health", timeout=10, headers=headers)
        rack_health = health.json() if health.status_code == 200 and "dilation" in health.text else {}
        if model is None:
            models = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10, headers=headers).json()
            model = models["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        fail(f"--base-url {base_url}: not an OpenAI-compatible server that answers /v1/models ({exc})", code=1)
    scale = time_scale if time_scale is not None else float(rack_health.get("dilation", 1.0))
    folder = prepare_out_dir("--out", out)
    mc = load.max_concurrency if load else None
    typer.echo(f"sending {len(reqs)} requests of {loaded.label} to {base_url} ({model}), time scale {scale:g} "
               f"(arrivals over about {reqs[-1].arrival_s * scale:.0f} s of wall time)", err=True)
    wall0 = time.perf_counter()
    records = asyncio.run(replay_http(reqs, base_url, model=model, chat=endpoint == "chat", time_scale=scale,
                                      api_key=api_key, rack_fields=not no_rack_fields, timeout_s=timeout,
                                      max_concurrency=mc))
    prov = {"package": "rack-emulator", "scenario": f"{model} at {base_url}", "trace": loaded.info,
            "runtime": "http", "load": loaded.run_kwargs, "server_health": rack_health}
    results, cols = client_results(records, reqs, time_scale=scale, slo_ttft_s=slo_ttft_ms / 1e3,
                                   slo_tpot_s=slo_tpot_ms / 1e3, provenance=prov)
    results["emulation"] = {"runtime": "http", "dilation": scale, "wall_s": time.perf_counter() - wall0}
    write_results(folder, results, cols)
    typer.echo(summary_text(results))
    typer.echo(f"results: {folder}/results.json, {folder}/requests.csv")
