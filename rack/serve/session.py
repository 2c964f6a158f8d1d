"""A live serving session: the scenario's rack on Ray with the HTTP front, from start
to a results folder (the Python API under `rack serve`).

    server = LiveServer(load_scenario(), port=8000)
    url = server.start()          # actors placed and built, the router started, HTTP up
    ...                           # clients talk to url
    output = server.stop(drain_s=30)   # drained, every request ended and recorded
    write_results(folder, output.results, output.columns)

`stop` returns the same `RunOutput` as `run_scenario` (results.json sections, one row
per request that reached the router: completed, rejected or failed), plus a `serve`
section: the HTTP front's counts and pacing lateness; `LiveServer.front_rows` then
holds one row per HTTP request the rack saw (`rack.serve.frontend`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rack.measure.metrics import summarize
from rack.serve.frontend import FrontConfig
from rack.serve.limits import HttpLimits
from rack.serve.runs import client_agreement
from rack.serve.tokenizer import client_model_id, load_tokenizer
from rack.serve.topology import FRONT, live_topology
from rack.run.runner import RunOutput, assemble
from rack.wiring.scenario import Scenario
from rack.wiring.sizing import context_limit


class LiveServer:
    """`scenario` served over HTTP (module docstring).

    Keyword args: host, port (0: any free port), api_key (None: open), address (a Ray
    cluster; None: Ray started locally), served_model_name (default: two names, the
    absolute path of the tokenizer's folder, which clients load a tokenizer from
    offline (`rack.serve.tokenizer.client_model_id`), then the scenario's model), pacing_quantum_ms (wall ms; `rack.serve.pacing`), eos_mean_tokens (mean
    output length without `ignore_eos`, `rack.serve.openai_api`), tokenizer (a
    tokenizer.json or its folder, `rack.serve.tokenizer`; None: rack's default counter,
    which the shipped folder `rack.serve.tokenizer.SHIPPED` reproduces), startup_timeout_s,
    limits (`rack.serve.limits.HttpLimits`: body size, JSON depth, header and read
    timeouts; default its defaults). The dilation is the scenario's
    (`Scenario.dilation`). Raises ValueError for a bad setting, e.g. an empty api_key
    (authentication is off only when api_key is None).
    """

    def __init__(self, scenario: Scenario, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, address: str | None = None,
                 served_model_name: str | None = None, pacing_quantum_ms: float = 1.0,
                 eos_mean_tokens: float = 256.0, startup_timeout_s: float = 120.0,
                 tokenizer: str | None = None, limits: HttpLimits | None = None) -> None:
        check_api_key(api_key)
        if not (pacing_quantum_ms >= 0 and math.isfinite(pacing_quantum_ms)):
            raise ValueError(f"pacing_quantum_ms: expected a finite number >= 0, got {pacing_quantum_ms!r}")
        if not eos_mean_tokens >= 1:
            raise ValueError(f"eos_mean_tokens: expected >= 1, got {eos_mean_tokens!r}")
        self.scenario = scenario
        self.host, self.port, self.address = host, int(port), address
        tokenizer = None if tokenizer is None else str(Path(tokenizer).expanduser().resolve())
        self.tokenizer = load_tokenizer(tokenizer)     # TokenizerError before anything starts
        # the tokenizer's folder first (what clients resolve locally), the scenario's
        # model as an alias, as vLLM serving a local path
        names = (served_model_name,) if served_model_name else (client_model_id(self.tokenizer), scenario.model)
        self.config = FrontConfig(
            served_model_names=names, max_model_len=context_limit(scenario),
            dilation=float(scenario.dilation), pacing_quantum_s=pacing_quantum_ms / 1e3,
            eos_mean_tokens=float(eos_mean_tokens), api_key=api_key, vocab_size=_vocab_size(scenario),
            tokenizer=tokenizer, slo_ttft_s=scenario.slo.ttft_ms / 1e3, slo_tpot_s=scenario.slo.tpot_ms / 1e3)
        self.limits = limits or HttpLimits()
        self.startup_timeout_s = startup_timeout_s
        self.specs = live_topology(scenario)          # ScenarioError before anything starts
        self.topo: Any = None
        self.http: dict = {}
        self.front_rows: list[dict] = []          # the front's row per request, after `stop`
        self._wall0 = 0.0

    @property
    def url(self) -> str:
        return self.http.get("url", "")

    def start(self) -> str:
        """Place and build the rack, start the router and the HTTP server; the URL.
        Raises RayRunError (Ray could not place or build it) or OSError (the address
        cannot be bound); nothing is left running when it raises."""
        from rack.runtime.ray_runtime import launch_topology, remove_topology

        self._wall0 = time.perf_counter()
        self.topo = launch_topology(self.specs, dilation=self.scenario.dilation, address=self.address,
                                    startup_timeout_s=self.startup_timeout_s)
        ray = ray_api()
        actors = self.topo.actors
        try:
            ray.get(actors["router"].deliver.remote("start", ([], None, 0.0)), timeout=60)
            stats_names = [s.name for s in self.specs if s.kind in ("prefill", "decode", "both", "interconnect")]
            self.http = ray.get(actors[FRONT].serve_http.remote({
                "host": self.host, "port": self.port, "front": asdict(self.config),
                "info": {"scenario": self.scenario.name, "model": self.scenario.model},
                "stats_names": stats_names, "limits": asdict(self.limits)}), timeout=60)
        except BaseException:
            remove_topology(self.topo)
            self.topo = None
            raise
        wait = self.topo.epoch - time.time()
        if wait > 0:                 # emulated time 0: a request now arrives at t >= 0
            time.sleep(wait)
        return self.url

    def state(self) -> dict:
        """The front's state ({"state", "in_flight", "recorded", "emulated_s"})."""
        return ray_api().get(self.topo.actors[FRONT].front_state.remote(), timeout=30)

    def failure(self):
        """The first component failure (a `ComponentError`), or None."""
        from rack.runtime.ray_runtime import first_failure

        return first_failure(ray_api(), self.topo.actors)

    def pacing_window(self) -> dict:
        """The front's pacing lateness since the last call (`LiveFront.pacing_window`)."""
        return ray_api().get(self.topo.actors[FRONT].pacing_window.remote(), timeout=30)

    def request_stop(self, drain_s: float) -> Any:
        """Ask the front to drain and stop (returns the Ray reference; `stop` waits)."""
        return self.topo.actors[FRONT].stop_http.remote(float(drain_s))

    def stop(self, drain_s: float = 30.0, pending: Any = None,
             hurry: Callable[[], bool] | None = None) -> RunOutput:
        """Drain (`drain_s` wall seconds for the requests in flight, then the rest end
        as failed "server_shutdown"), gather every record, remove the actors; the
        session's RunOutput (module docstring). `pending`: a `request_stop` reference
        already made (e.g. by a signal handler). `hurry`: polled while draining; once
        True (a second signal), the requests in flight end at once (streams with an
        error event and `[DONE]`, others 503), and the records are still gathered."""
        from rack.runtime.ray_runtime import collect_records, remove_topology

        ray = ray_api()
        try:
            ref = pending if pending is not None else self.request_stop(drain_s)
            deadline = time.time() + drain_s + 120.0
            try:
                while not ray.wait([ref], timeout=0.2)[0]:
                    if hurry is not None and hurry():
                        raise KeyboardInterrupt
                    if time.time() > deadline:
                        raise ray.exceptions.GetTimeoutError(f"the front did not drain in {drain_s + 120:g} s")
                ray.get(ref, timeout=60.0)
            except KeyboardInterrupt:            # asked again: end what is in flight now
                ray.get(self.request_stop(0.0), timeout=120.0)
            front = ray.get(self.topo.actors[FRONT].front_records.remote(), timeout=60)
            raw = collect_records(self.topo, time.time() - self.topo.epoch)
            requests = sorted(front["requests"], key=lambda r: r.id)
            load = {"max_concurrency": None, "think_time_s": 0.0, "source": "live HTTP clients"}
            out = assemble(self.scenario, self.specs, requests, raw, "ray", time.perf_counter() - self._wall0,
                           {"source": "live", "url": self.url}, load)
            out.results["serve"] = serve_section(front["records"], self.config, self.url, front["counts"],
                                                 front["http"], front.get("handler_errors", 0))
            out.results["serve"]["http_routes"] = front.get("http_routes", {})
            out.results["serve"]["runs"] = front.get("runs")
            self.front_rows = front["records"]
            return out
        finally:
            remove_topology(self.topo)
            self.topo = None


def serve_section(rows: Sequence[dict], config: FrontConfig, url: str, counts: dict,
                  http: dict | None = None, handler_errors: int = 0) -> dict:
    """results.json `serve`: the HTTP front's counts and pacing (wall seconds).
    `requests` and `http_status` cover the requests that reached the rack (one row each
    in `rows`); `http_answered` every API answer by status, refusals before the rack
    (400, 401, 404, 413) included, as /metrics' `rack:http_requests_total` counts them;
    `handler_errors` the handlers that raised (answered 500, or their stream ended with
    an error event; `rack.serve.limits`)."""
    late = np.array([r["lateness_s"] for r in rows if r.get("lateness_s") is not None], dtype=np.float64)
    early = np.array([r["early_s"] for r in rows if r.get("early_s") is not None], dtype=np.float64)
    status: dict[str, int] = {}
    for r in rows:
        status[str(r["http_status"])] = status.get(str(r["http_status"]), 0) + 1
    return {
        "url": url, "served_model_names": list(config.served_model_names),
        "dilation": config.dilation, "pacing_quantum_s": config.pacing_quantum_s,
        "eos_mean_tokens": config.eos_mean_tokens, "requests": len(rows),
        "streamed": sum(1 for r in rows if r["stream"]), "http_status": status,
        "http_answered": dict(sorted((http or {}).items())), "handler_errors": int(handler_errors),
        "client_disconnects": sum(1 for r in rows if r["client_disconnected"]),
        "pacing_lateness_s": summarize(late) if late.size else None,
        # what the clients measured against rack's records x dilation (medians)
        "client_agreement": client_agreement(rows, config.dilation),
        "pacing_early_max_s": float(early.max()) if early.size else 0.0,
        "gateway": dict(counts),
    }


def check_api_key(api_key: str | None) -> None:
    """Refuse an API key that cannot protect anything: empty or blank (an empty
    RACK_API_KEY used to turn authentication off silently), with surrounding
    whitespace (HTTP strips it from the header), or not printable ASCII (a header
    value clients cannot all send). None (no key) is allowed. Raises ValueError."""
    if api_key is None:
        return
    if not api_key.strip():
        raise ValueError("--api-key / RACK_API_KEY: empty; give a key, or unset RACK_API_KEY to serve "
                         "without authentication")
    if api_key != api_key.strip() or not (api_key.isascii() and api_key.isprintable()):
        raise ValueError("--api-key / RACK_API_KEY: expected printable ASCII without leading or trailing "
                         "whitespace (it travels in an HTTP header)")


def _vocab_size(scenario: Scenario) -> int | None:
    """The served model's vocabulary size (token ids must be below it), or None."""
    from devices.catalog import resolve_model

    vocab = resolve_model(scenario.model).vocab_size
    return int(vocab) if vocab else None


def ray_api():
    from rack.runtime.ray_host import ray_api as ray_module

    return ray_module()


__all__ = ["LiveServer", "check_api_key", "serve_section"]
