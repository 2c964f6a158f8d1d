"""A small pacing soak of `rack serve` on the shared Ray cluster (`rack.serve.soak`;
the full one is scripts/soak_serve.py): two batches of 12 concurrent streams, a fifth
of the clients hanging up part-way; no stream is held (issue 24: streams that got no
token until their decode had ended), every request is recorded and completed. Marked
slow (~1 minute with Ray's start)."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_no_stream_is_held(ray_session):
    from rack.serve.session import LiveServer
    from rack.serve.soak import soak
    from rack.wiring.load import load_scenario

    sc = load_scenario("helios-cs3-kimi-k2").with_overrides(dilation=20.0)
    srv = LiveServer(sc, host="127.0.0.1", port=0, api_key="soak")
    url = srv.start()
    try:
        out = asyncio.run(soak(url, model=sc.model, dilation=sc.dilation, api_key="soak", batches=2, streams=12,
                               prompt_tokens=500, output_tokens=200, seed=1, timeout_s=300))
    finally:
        results = srv.stop(5.0).results
    o = out["overall"]
    assert o["held"] == 0 and o["errors"] == 0 and o["no_record"] == 0, o
    assert o["answered_200"] == o["completed_in_rack"] == 24 and o["hung_up"] >= 1, o
    assert results["requests"]["completed"] == 24 and not results["emulation"]["violations"]
