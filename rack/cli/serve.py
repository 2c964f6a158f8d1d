"""`rack serve`: an OpenAI-compatible streaming endpoint in front of the emulated rack."""

from __future__ import annotations

import csv
import math
import os
import signal
import time
from pathlib import Path
from typing import Optional

import typer

from rack.cli._checks import check_positive, fail, out_path, prepare_out_dir, report_failure
from rack.cli.app import app
from rack.serve.limits import HEADER_TIMEOUT_S, MAX_BODY_BYTES, READ_TIMEOUT_S

#: Wall seconds between checks for a failed component while serving.
_POLL_S = 0.5


@app.command()
def serve(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario name or TOML file [default: helios-cs3-kimi-k2]"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (loopback by default; 0.0.0.0 for every interface)"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port (0: any free port)"),
    dilation: Optional[float] = typer.Option(None, "--dilation", help="wall seconds per emulated second [default: the scenario's; 100 for helios-cs3-kimi-k2]"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="RACK_API_KEY", help="require Authorization: Bearer KEY on /v1 and /rack routes (an empty key is refused)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start Ray locally)"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="model name clients send [default: the tokenizer folder's absolute path, which clients load offline, and the scenario's model]"),
    max_outstanding_tokens: Optional[int] = typer.Option(None, "--max-outstanding-tokens", min=1, help="router queue bound per prefill instance (prompt tokens); above it on every instance: 429 [default: the scenario's]"),
    pacing_quantum_ms: float = typer.Option(1.0, "--pacing-quantum-ms", help="tokens due within this many wall ms go in one chunk"),
    eos_mean_tokens: float = typer.Option(256.0, "--eos-mean-tokens", help="mean output length of requests without ignore_eos (geometric)"),
    drain: float = typer.Option(30.0, "--drain", help="on Ctrl-C: wall seconds given to requests in flight before they are ended"),
    out: Path = typer.Option(Path("rack-results/serve"), "--out", parser=out_path, help="results folder, written at shutdown"),
    payload_scale: Optional[float] = typer.Option(None, "--payload-scale", help="shipped KV bytes / logical KV bytes"),
    max_body_bytes: int = typer.Option(MAX_BODY_BYTES, "--max-body-bytes", help="largest request body accepted (413 above it)"),
    header_timeout: float = typer.Option(HEADER_TIMEOUT_S, "--header-timeout", help="wall seconds a client has to send a request's head (then 408 and the connection closes)"),
    read_timeout: float = typer.Option(READ_TIMEOUT_S, "--read-timeout", help="wall seconds a request body may pause between two reads"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="count prompt and output tokens with this Hugging Face tokenizer.json (or a folder holding one), offline [default: rack's own counter, shipped as a tokenizer folder for clients]"),
    pacing_report: float = typer.Option(10.0, "--pacing-report", help="wall seconds between the pacing-lateness lines printed while serving (0: none)"),
) -> None:
    """Serve the emulated rack over HTTP (OpenAI API: /v1/completions, /v1/chat/completions,
    /v1/models; /health, /metrics) until Ctrl-C, then write a results folder."""
    from rack.measure.results import summary_text, write_results
    from rack.serve.pacing import agreement_line
    from rack.serve.session import LiveServer

    from rack.serve.limits import HttpLimits
    from rack.serve.session import check_api_key

    for name, value in (("--dilation", dilation), ("--payload-scale", payload_scale), ("--drain", drain),
                        ("--header-timeout", header_timeout), ("--read-timeout", read_timeout)):
        check_positive(name, value)
    if max_body_bytes < 1:
        fail(f"--max-body-bytes: expected an integer >= 1, got {max_body_bytes}")
    if api_key is None and "RACK_API_KEY" in os.environ:
        api_key = os.environ["RACK_API_KEY"]      # click drops an empty variable: refused below
    try:
        check_api_key(api_key)        # before Ray starts: an empty RACK_API_KEY is a mistake
    except ValueError as exc:
        fail(str(exc))
    if not (math.isfinite(pacing_report) and pacing_report >= 0):
        fail(f"--pacing-report: expected a number of seconds >= 0, got {pacing_report}")
    sc = _scenario(scenario, dilation, payload_scale, max_outstanding_tokens)
    if address is None:
        # the front binds on this machine: a port in use is said now, not after Ray's start
        taken = _bind_problem(host, port)
        if taken is not None:
            fail(f"--host {host} --port {port}: cannot bind ({taken})", code=1)
    folder = prepare_out_dir("--out", out)
    try:
        server = LiveServer(sc, host=host, port=port, api_key=api_key, address=address,
                            served_model_name=served_model_name, pacing_quantum_ms=pacing_quantum_ms,
                            eos_mean_tokens=eos_mean_tokens, tokenizer=tokenizer,
                            limits=HttpLimits(max_body_bytes, header_timeout_s=header_timeout,
                                              read_timeout_s=read_timeout))
    except ValueError as exc:        # TokenizerError is one
        fail(str(exc))
    typer.echo(f"starting {sc.name} on Ray (dilation {sc.dilation:g}) ...", err=True)
    try:
        url = server.start()
    except OSError as exc:
        fail(f"--host {host} --port {port}: cannot bind ({exc.strerror or exc})", code=1)
    except Exception as exc:  # noqa: BLE001 - one line, the traceback in the log
        report_failure(folder, exc, what="serve", keep_partial=False)
    names = server.config.served_model_names
    typer.echo(f"serving model {names[0]}" + (f" (also as {', '.join(names[1:])})" if names[1:] else "")
               + f" at {url}/v1 (OpenAI API); metrics at {url}/metrics; Ctrl-C to stop", err=True)
    typer.echo(_tokenizer_line(server.tokenizer, tokenizer), err=True)
    signals = _Signals()
    try:
        pending = _serve_until_interrupted(server, drain, pacing_report, signals)
        try:
            output = server.stop(drain, pending=pending, hurry=signals.hurry)
        except Exception as exc:  # noqa: BLE001
            report_failure(folder, exc, what="serve", keep_partial=False)
        finally:
            _shutdown_ray(address)
        write_results(folder, output.results, output.columns)
        _write_front_rows(folder / "front.csv", server.front_rows)
    finally:
        signals.restore()
    typer.echo(summary_text(output.results))
    s = output.results["serve"]
    late = s["pacing_lateness_s"]
    answered = s.get("http_answered") or {}
    typer.echo(f"HTTP: {sum(answered.values())} answered (status {answered}); {s['requests']} reached the rack "
               f"({s['streamed']} streamed), status {s['http_status']}, "
               f"{s['client_disconnects']} client disconnect(s)"
               + (f", {s['handler_errors']} handler error(s) (logged)" if s.get("handler_errors") else "")
               + "; pacing lateness (wall) "
               + (f"p50 {late['p50'] * 1e3:.2f} ms, p99 {late['p99'] * 1e3:.2f} ms, max {late['max'] * 1e3:.2f} ms"
                  if late else "n/a"))
    typer.echo(agreement_line(s["client_agreement"], "the whole session"))
    typer.echo(_runs_text(s.get("runs")))
    typer.echo(f"results: {folder}/results.json, {folder}/requests.csv, {folder}/front.csv")


def _bind_problem(host: str, port: int) -> Optional[str]:
    """Why a TCP server could not bind (host, port) here (the OS's message), or None.
    Binds and closes a socket with SO_REUSEADDR, as uvicorn does, so a port that only
    lingers in TIME_WAIT is not refused. With port 0 (any free port) the host is still
    checked: a name that does not resolve or an address not on this machine is said
    before Ray starts."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return str(exc)
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _runs_text(report) -> str:
    """The per-run lines of the shutdown summary (`rack.serve.runs`): each client run
    between idle periods and each `/rack/runs` window, in wall seconds as a client's
    report gives them, emulated beside."""
    from rack.serve.runs import run_line

    if not report or not (report["runs"] or report["windows"]):
        return "per client run: no request reached the rack"
    lines = [f"per client run (runs split by {report['idle_gap_s']:g} wall s idle; the figures above are the whole "
             "session's in emulated seconds):"]
    lines += ["  " + run_line(f"run {r['run'] + 1}", r) for r in report["runs"]]
    lines += ["  " + run_line(f"window {w['id']}" + (f" ({w['name']})" if w.get("name") else ""), w)
              for w in report["windows"]]
    return "\n".join(lines)


def _tokenizer_line(tok, given: Optional[str]) -> str:
    what = "rack's default counter" if given is None else f"counted with {tok.path}"
    return (f"tokens: {what}; a client that counts tokens loads the tokenizer named by the served model id, "
            "the folder above, offline: GuideLLM, AIPerf and inference-perf need no tokenizer flag (docs/serve.md)")


class _Signals:
    """SIGINT and SIGTERM while `rack serve` runs and stops (installed over Ray's SIGTERM
    handler, which exited at once with nothing written, and over a SIGINT ignored by a
    background job's shell): the first raises KeyboardInterrupt (stop serving, drain);
    later ones are counted, and the drain looks (`hurry`): the requests in flight end
    at once, and the results are still gathered and written. `restore()` puts the
    previous handlers back once everything is written."""

    def __init__(self) -> None:
        self.count = 0
        self._old = {s: signal.signal(s, self._on) for s in (signal.SIGINT, signal.SIGTERM)}

    def _on(self, signum, frame) -> None:  # noqa: ARG002 - the signal module's signature
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt

    def hurry(self) -> bool:
        return self.count >= 2

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _serve_until_interrupted(server, drain_s: float, report_s: float = 0.0, signals: "_Signals | None" = None):
    """Wait for Ctrl-C (SIGINT) or SIGTERM (`signals`), watching for a failed component
    and printing the pacing lateness every `report_s` wall seconds (0: never); then ask
    the front to drain. Returns the stop request's reference."""
    from rack.serve.pacing import lateness_line

    signals = signals or _Signals()
    next_check = time.time() + 2.0
    next_report = time.time() + report_s if report_s > 0 else math.inf
    try:
        while True:
            time.sleep(_POLL_S)
            if time.time() >= next_report:
                line = lateness_line(server.pacing_window(), report_s)
                if line:
                    typer.echo(line, err=True)
                next_report = time.time() + report_s
            if time.time() >= next_check:
                failure = server.failure()
                if failure is not None:
                    typer.echo(f"a component failed: {failure}; stopping", err=True)
                    break
                next_check = time.time() + 2.0
    except KeyboardInterrupt:
        pass
    typer.echo(f"stopping: {drain_s:g} s for the requests in flight, then they end as failed "
               "(Ctrl-C again: now)", err=True)
    return server.request_stop(drain_s)


def _scenario(name: Optional[str], dilation, payload_scale, max_outstanding_tokens):
    """The scenario with the command's overrides, or a clean CLI error."""
    from devices.catalog import CatalogError
    from devices.planner import ModelDoesNotFit
    from rack.wiring.scenario import ScenarioError
    from rack.wiring.load import load_scenario

    try:
        sc = load_scenario(name).with_overrides(dilation=dilation, payload_scale=payload_scale)
        if max_outstanding_tokens is not None:
            router = {**sc.router.model_dump(), "max_outstanding_tokens": max_outstanding_tokens}
            sc = sc.with_overrides(router=router)
        return sc
    except (ScenarioError, CatalogError, ModelDoesNotFit, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or name}: {exc.strerror or exc}")


def _write_front_rows(path: Path, rows) -> None:
    names = ["id", "response_id", "endpoint", "stream", "http_status", "outcome", "reason", "prompt_tokens",
             "cached_tokens", "output_tokens", "tokens_sent",
             "chunks", "client_disconnected", "received_wall_s", "lateness_s", "early_s",
             "t_arrival_s", "t_first_token_s", "t_completion_s"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in rows:
            w.writerow(["" if r.get(k) is None else r.get(k) for k in names])


def _shutdown_ray(address: Optional[str]) -> None:
    if address is None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
