"""The same requests through `rack run --runtime ray` and through `rack serve` +
the HTTP load generator, side by side: completed count, median TTFT and TPOT (the
issue's agreement check; `scripts/serve_agreement.py` prints it, a slow test asserts it)."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from rack.wiring.scenario import Scenario


def http_vs_ray(scenario: Scenario, requests: Sequence[Any], *, address: str | None = None) -> dict:
    """{"ray": {...}, "http": {...}, "ratio": {...}} of completed, median TTFT and TPOT
    (emulated s; the HTTP side is measured at the client, wall s / dilation). Both runs
    use `scenario.dilation`; Ray must be reachable (`address`, default local)."""
    from rack.serve.loadgen import client_results, replay_http
    from rack.serve.session import LiveServer
    from rack.run.runner import run_scenario

    ray_out = run_scenario(scenario, requests, runtime="ray", address=address)
    server = LiveServer(scenario, host="127.0.0.1", port=0, address=address)
    url = server.start()
    try:
        records = asyncio.run(replay_http(requests, url, model=scenario.model, time_scale=scenario.dilation,
                                          timeout_s=600.0))
    finally:
        live = server.stop(5.0)
    client, _ = client_results(records, requests, time_scale=scenario.dilation,
                               slo_ttft_s=scenario.slo.ttft_ms / 1e3, slo_tpot_s=scenario.slo.tpot_ms / 1e3,
                               provenance={})

    def row(results: dict) -> dict:
        lat = results["latency"]
        return {"completed": results["requests"]["completed"], "ttft_p50_s": lat["ttft_s"]["p50"],
                "tpot_p50_s": lat["tpot_s"]["p50"]}

    a, b = row(ray_out.results), row(client)
    return {"ray": a, "http": b, "rack_during_http": row(live.results),
            "pacing_lateness_s": live.results["serve"]["pacing_lateness_s"],
            "ratio": {k: (b[k] / a[k] if a[k] else None) for k in ("ttft_p50_s", "tpot_p50_s")}}


__all__ = ["http_vs_ray"]
