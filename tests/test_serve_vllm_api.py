"""vLLM's API pieces that benchmark clients call, on `rack serve` (the shared Ray
cluster, dilation 20, 127.0.0.1, every HTTP call with a timeout): /version,
/tokenize and /detokenize counting what the completion endpoints charge,
`stream_options.continuous_usage_stats`, `usage.prompt_tokens_details.cached_tokens`
from the prefix cache, `/rack/requests/{response id}` answered right after
`[DONE]`, and /metrics with `vllm:` latencies in the clients' clock (wall s) beside
`rack:emulated_` ones (emulated s)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.ray

openai = pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

from _prom import _buckets, _families, histogram_quantile  # noqa: E402

D = 20.0
PROMPT = "The wafer-scale engine keeps every weight in on-chip memory, so decode is bound by latency. " * 12


@pytest.fixture(scope="module")
def server(ray_session):
    from rack.serve.session import LiveServer
    from rack.wiring.load import load_scenario

    sc = load_scenario("helios-cs3-kimi-k2").with_overrides(dilation=D).with_router(policy="prefix_aware")
    srv = LiveServer(sc, host="127.0.0.1", port=0)
    srv.start()
    yield srv
    srv.stop(1.0)


@pytest.fixture(scope="module")
def url(server):
    return server.url


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=60, max_retries=0)


def test_version_tokenize_and_detokenize_count_what_completions_charge(url):
    assert httpx.get(f"{url}/version", timeout=10).json()["server"] == "rack"
    c = _client(url)
    r = c.completions.create(model="kimi-k2", prompt=PROMPT, max_tokens=2, extra_body={"ignore_eos": True})
    t = httpx.post(f"{url}/tokenize", json={"model": "kimi-k2", "prompt": PROMPT, "return_token_strs": True},
                   timeout=10).json()
    assert t["count"] == len(t["tokens"]) == r.usage.prompt_tokens and "".join(t["token_strs"]) == PROMPT
    assert httpx.post(f"{url}/detokenize", json={"tokens": t["tokens"]}, timeout=10).json()["prompt"] == PROMPT
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    chat = c.chat.completions.create(model="kimi-k2", messages=msgs, max_tokens=2)
    tc = httpx.post(f"{url}/tokenize", json={"messages": msgs}, timeout=10).json()
    assert tc["count"] == len(tc["tokens"]) == chat.usage.prompt_tokens
    bad = httpx.post(f"{url}/tokenize", json={"prompt": 3}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert httpx.post(f"{url}/detokenize", json={"model": "nope", "tokens": [1]}, timeout=10).status_code == 404


def test_continuous_usage_cached_tokens_and_the_record_by_response_id_after_done(url):
    c = _client(url)
    usages, rid = [], None
    for attempt in range(2):         # the second send of the same prompt hits the prefix cache
        usages.clear()
        stream = c.chat.completions.create(
            model="kimi-k2", messages=[{"role": "user", "content": PROMPT}], max_tokens=6, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True})
        for ch in stream:
            rid = ch.id
            usages.append(ch.usage)
        # asked at once after [DONE]: the endpoint waits for the record instead of a 404
        rec = httpx.get(f"{url}/rack/requests/{rid}", timeout=40)
        assert rec.status_code == 200, rec.text
        rec = rec.json()
        assert rec["response_id"] == rid and rec["outcome"] == "completed" and rec["tokens_sent"] == 6
    assert all(u is not None for u in usages)
    done = [u.completion_tokens for u in usages]
    assert done[0] == 0 and done == sorted(done) and done[-1] == 6 and usages[-1].total_tokens == \
        usages[-1].prompt_tokens + 6
    cached = usages[-1].prompt_tokens_details.cached_tokens
    assert cached == rec["cached_tokens"] and 0 < cached < usages[-1].prompt_tokens
    assert cached % 16 == 0                      # whole 16-token blocks of the derived hashes
    assert httpx.get(f"{url}/rack/requests/cmpl-rack-99999?wait=0", timeout=10).status_code == 404
    assert httpx.get(f"{url}/rack/requests/banana", timeout=10).status_code == 400


def test_metrics_are_in_the_clients_clock_with_emulated_twins(url):
    c = _client(url)
    before = _families(url)
    n0 = sum(c_ for _, c_ in _buckets(before["vllm:time_to_first_token_seconds"]))
    ttfts, ids = [], []
    for i in range(6):
        t0 = time.perf_counter()
        first = None
        for ch in c.completions.create(model="kimi-k2", prompt=list(range(1 + i, 801 + i)), max_tokens=20,
                                       stream=True, extra_body={"ignore_eos": True}):
            ids.append(ch.id)
            if first is None and ch.choices and ch.choices[0].text:
                first = time.perf_counter()
        ttfts.append(first - t0)
    recs = [httpx.get(f"{url}/rack/requests/{rid}", timeout=40).json() for rid in dict.fromkeys(ids)]
    fams = _families(url)
    wall = fams["vllm:time_to_first_token_seconds"]
    assert sum(c_ for _, c_ in _buckets(wall)) == n0 + 6
    # the histogram's median of these 6 requests (Prometheus' way) against the client's:
    # both measure from the HTTP request to the first token's chunk
    server_med = histogram_quantile(wall, 0.5, before["vllm:time_to_first_token_seconds"])
    assert server_med == pytest.approx(float(np.median(ttfts)), rel=0.05)
    # the emulated twins are rack's records exactly
    def added(name, what):
        return next(s.value for s in fams[name].samples if s.name.endswith(what)) - \
            next(s.value for s in before[name].samples if s.name.endswith(what))

    assert added("rack:emulated_time_to_first_token_seconds", "_sum") == pytest.approx(
        sum(r["t_first_token_s"] - r["t_arrival_s"] for r in recs), rel=1e-9)
    assert added("rack:emulated_inter_token_latency_seconds", "_sum") == pytest.approx(
        sum(sum(r["itl_s"]) for r in recs), rel=1e-9)
    name = "inter_token_latency_seconds"
    assert added(f"rack:emulated_{name}", "_count") == 6 * 19
    assert added(f"vllm:{name}", "_count") == 6 * 19     # one sample per chunk after the first (a token per chunk here)
    les = [le for le, _ in _buckets(fams[f"vllm:{name}"])]
    assert les[0] == 1e-5 and les[1] / les[0] == pytest.approx(10 ** (1 / 40), rel=1e-4)


def test_pacing_window_counts_each_streamed_chunk_once(server):
    """What `rack serve` prints while it runs: the chunks streamed since the last look."""
    server.pacing_window()
    c = _client(server.url)
    for _ in range(2):
        for _ in c.completions.create(model="kimi-k2", prompt=list(range(1, 101)), max_tokens=5, stream=True,
                                      extra_body={"ignore_eos": True}):
            pass
    time.sleep(0.5)
    w = server.pacing_window()
    # one request's decode step on the fixture scenario's wafer pool, in wall seconds
    from rack.wiring.load import load_scenario
    from rack.wiring.sizing import cost_model

    sc = load_scenario("helios-cs3-kimi-k2")
    step = cost_model(sc, sc.pool("decode")).decode_step([102]).time_s
    assert w["chunks"] == 10 and w["responses"] == 2 and w["tpot_wall_s"] == pytest.approx(step * D, rel=0.01)
    assert w["p50_s"] <= w["p99_s"] <= w["max_s"]
    # what a client measures against rack's records: both medians, for both responses
    assert w["compared"] == 2 and w["ttft_dev"] > -1 and w["tpot_dev"] > -1
    assert server.pacing_window()["chunks"] == 0
