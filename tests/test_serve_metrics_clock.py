"""`/metrics` in the clients' clock (pure, no server): `vllm:` latencies are what the
client saw (measured at the front, else emulated x dilation), `rack:emulated_` the
rack's emulated seconds, both on 40-per-decade buckets; and the live pacing line
`rack serve` prints, with its warning above a stated share of the ITL."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rack.serve.metrics import REQUEST_BUCKETS, TOKEN_BUCKETS, ServeMetrics
from rack.serve.pacing import AGREEMENT_WARN_SHARE, lateness_line
from rack.serving.collector import EVENTS

D = 20.0
TIMES = dict(zip(EVENTS, (0.0, 0.0, 0.001, 0.05, 0.05, 0.05, 0.06, 0.06, 0.08, 0.08 + 9 * 0.000762)))
ITL = np.full(9, 0.000762)


def _hist(m: ServeMetrics, name: str) -> dict:
    fam = next(f for f in text_string_to_metric_families(m.render().decode()) if f.name == name)
    return {s.name.rsplit("_", 1)[-1]: s.value for s in fam.samples if not s.name.endswith("_bucket")}


def _observe(m: ServeMetrics, sent=None) -> None:
    m.observe_request(outcome="completed", reason=None, finish_reason="length", prompt_tokens=100,
                      output_tokens=10, times=TIMES, itl_s=ITL, lateness_wall_s=0.001, sent_wall=sent)


def test_a_non_streamed_response_counts_emulated_times_dilation():
    m = ServeMetrics("m", D)
    _observe(m)
    assert _hist(m, "vllm:time_to_first_token_seconds")["sum"] == pytest.approx(0.08 * D)
    assert _hist(m, "rack:emulated_time_to_first_token_seconds")["sum"] == pytest.approx(0.08)
    assert _hist(m, "vllm:inter_token_latency_seconds") == pytest.approx({"count": 9, "sum": 9 * 0.000762 * D})
    assert _hist(m, "rack:emulated_inter_token_latency_seconds")["count"] == 9


def test_a_streamed_response_counts_what_the_front_measured():
    m = ServeMetrics("m", D)
    gaps = np.array([0.015, 0.016, 0.0002, 0.030, 0.015, 0.015, 0.015, 0.015, 0.015])
    _observe(m, {"ttft": 1.7, "e2e": 1.7 + gaps.sum(), "itl": gaps, "tokens": 10})
    assert _hist(m, "vllm:time_to_first_token_seconds")["sum"] == pytest.approx(1.7)
    assert _hist(m, "vllm:inter_token_latency_seconds") == pytest.approx({"count": 9, "sum": gaps.sum()})
    assert _hist(m, "vllm:request_time_per_output_token_seconds")["sum"] == pytest.approx(gaps.sum() / 9)
    assert _hist(m, "rack:emulated_e2e_request_latency_seconds")["sum"] == pytest.approx(TIMES["completion"])
    assert _hist(m, "vllm:request_queue_time_seconds")["sum"] == pytest.approx(0.001 * D)   # not seen: x dilation


def test_bucket_edges_are_40_per_decade():
    for edges, lo, hi in ((TOKEN_BUCKETS, 1e-5, 10.0), (REQUEST_BUCKETS, 1e-4, 1e4)):
        assert edges[0] == lo and edges[-1] == hi
        r = np.diff(np.log10(edges))
        assert np.allclose(r, 1 / 40, atol=1e-5)
        assert len(edges) == round(math.log10(hi / lo) * 40) + 1


def test_the_pacing_line_warns_on_what_a_client_measures():
    # judged on the medians a client measures against rack's records, not on the
    # chunks' lateness: a late but steady host (every token late alike) is no warning
    base = {"chunks": 96, "responses": 3, "compared": 3, "p50_s": 0.030, "p99_s": 0.045, "max_s": 0.05}
    ok = lateness_line({**base, "ttft_dev": 0.9 * AGREEMENT_WARN_SHARE, "tpot_dev": -0.004}, 10)
    late = lateness_line({**base, "ttft_dev": 0.004, "tpot_dev": -1.1 * AGREEMENT_WARN_SHARE}, 10)
    assert ok.startswith("clients over the last 10 s: 3 streamed response(s) measured TTFT +4.5%, "
                         "time per output token -0.4% off rack's records x dilation (medians); chunks left late")
    assert late.startswith("WARNING: ") and "raise --dilation" in late
    assert not lateness_line({**base, "ttft_dev": None, "tpot_dev": None}, 10).startswith("WARNING")
    assert lateness_line({"chunks": 0}, 10) is None
