"""`rack serve`'s per-run figures in the client's clock (`rack.serve.runs`): runs split
by idle time, windows a user opens and closes over HTTP, figures in wall seconds beside
emulated ones; and every route counted in `rack:http_requests_total`. The HTTP checks
run the real app over a rack that answers at once (tests/_serve_fakes.py), no Ray."""

from __future__ import annotations

import httpx
import pytest

from _serve_fakes import KEY, serve_in_thread  # tests/ helpers
from rack.serve.runs import run_figures, run_line, split_runs

H = {"Authorization": f"Bearer {KEY}"}


def _row(received, ended, arrival, first, completion, out=11, outcome="completed"):
    return {"received_wall_s": received, "ended_wall_s": ended, "t_arrival_s": arrival, "t_first_token_s": first,
            "t_completion_s": completion, "output_tokens": out, "outcome": outcome}


def test_runs_split_at_idle_time_and_figures_are_in_both_clocks():
    # dilation 20: two requests in a 4 s burst, 30 s idle, then one more; emulated times
    # are wall / 20 from the session's start at wall 1000 s
    rows = [_row(1000.0, 1003.0, 0.0, 0.05, 0.15), _row(1001.0, 1004.0, 0.05, 0.10, 0.15),
            _row(1034.0, 1035.0, 1.70, 1.74, 1.75, out=1, outcome="failed")]
    runs = split_runs(rows, idle_gap_s=5.0)
    assert [len(r) for r in runs] == [2, 1]
    f = run_figures(runs[0], dilation=20.0, slo_ttft_s=0.06, slo_tpot_s=0.008)
    assert f["requests"] == 2 and f["completed"] == 2 and f["wall_s"] == pytest.approx(4.0)
    assert f["emulated_s"] == pytest.approx(0.2)
    assert f["throughput"]["requests_per_s"] == pytest.approx(0.5)               # what the client reports
    assert f["throughput_emulated"]["requests_per_s"] == pytest.approx(10.0)     # x dilation
    assert f["throughput"]["output_tokens_per_s"] == pytest.approx(22 / 4.0)
    # TTFT 0.05 and 0.05 s; time per output token 0.01 and 0.005 s: one meets the SLO
    assert f["goodput"]["requests_per_s"] == pytest.approx(0.25) and f["goodput"]["slo_attainment"] == 0.5
    assert f["ttft_p50_s"] == pytest.approx(0.05) and f["ttft_p50_wall_s"] == pytest.approx(1.0)
    assert run_line("run 1", f).startswith("run 1: 2/2 completed over 4.0 wall s (0.20 emulated s): 0.5 req/s")
    g = run_figures(runs[1], 20.0, 1.0, 1.0)
    assert g["completed"] == 0 and g["failed"] == 1 and g["goodput"]["requests_per_s"] == 0
    assert run_figures([], 20.0, 1.0, 1.0)["ttft_p50_s"] is None
    assert len(split_runs(rows, idle_gap_s=60.0)) == 1


def _complete(url: str, n: int) -> None:
    for _ in range(n):
        r = httpx.post(f"{url}/v1/completions", headers=H, timeout=30,
                       json={"model": "kimi-k2", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200, r.text


def _wait_recorded(front, n: int) -> None:
    import time

    for _ in range(500):
        if len(front.records) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{len(front.records)} of {n} requests recorded")


def test_a_window_opened_and_closed_over_http_gives_its_runs_figures():
    with serve_in_thread() as st:
        url, front = st["url"], st["front"]
        _complete(url, 1)                                   # before the window: not in it
        w = httpx.post(f"{url}/rack/runs", headers=H, json={"name": "sweep-a"}, timeout=30)
        assert w.status_code == 201 and w.json()["name"] == "sweep-a" and w.json()["id"] == 0
        _complete(url, 3)
        _wait_recorded(front, 4)
        shut = httpx.post(f"{url}/rack/runs/0/close", headers=H, timeout=30).json()
        assert shut["requests"] == 3 and shut["completed"] == 3 and not shut["open"]
        assert shut["throughput"]["requests_per_s"] > 0 and shut["wall_s"] > 0
        _complete(url, 1)                                   # after it: not in it either
        _wait_recorded(front, 5)
        assert httpx.get(f"{url}/rack/runs/0", headers=H, timeout=30).json()["requests"] == 3
        report = httpx.get(f"{url}/rack/runs", headers=H, timeout=30).json()
        assert sum(r["requests"] for r in report["runs"]) == 5 and len(report["windows"]) == 1
        assert httpx.post(f"{url}/rack/runs/7/close", headers=H, timeout=30).status_code == 404
        assert httpx.get(f"{url}/rack/runs/x", headers=H, timeout=30).status_code == 404
        assert httpx.post(f"{url}/rack/runs", json={"name": 3}, headers=H, timeout=30).status_code == 400
        assert httpx.get(f"{url}/rack/runs", timeout=30).status_code == 401


def test_every_route_is_counted_by_its_template():
    with serve_in_thread() as st:
        url, front = st["url"], st["front"]
        _complete(url, 1)
        _wait_recorded(front, 1)
        for path in ("/v1/models", "/version", "/health", "/metrics", "/rack/requests/0", "/rack/requests/cmpl-rack-0",
                     "/rack/runs", "/no/such/route"):
            httpx.get(url + path, headers=H, timeout=30)
        httpx.get(url + "/v1/models", timeout=30)                              # no key: 401
        httpx.post(url + "/tokenize", headers=H, json={"prompt": "hi"}, timeout=30)
        counts = {(e, s): int(n) for (e, s), n in front.metrics.http.items()}
        for key in (("/v1/completions", "200"), ("/v1/models", "200"), ("/v1/models", "401"), ("/version", "200"),
                    ("/health", "200"), ("/metrics", "200"), ("/rack/runs", "200"), ("/tokenize", "200"),
                    ("unmatched", "404")):
            assert counts.get(key) == 1, (key, counts)
        assert counts[("/rack/requests/{key}", "200")] == 2            # one label value for every id
        text = httpx.get(url + "/metrics", timeout=30).text
        assert 'rack:http_requests_total{endpoint="/version",model_name="kimi-k2",status="200"} 1.0' in text


def test_client_agreement_compares_what_a_client_sees_with_rack_records():
    from rack.serve.runs import client_agreement

    # dilation 20: rack's TTFT 0.05 s (1 s of wall), 0.01 s per output token (0.2 s);
    # the client saw its first chunk 1.02 s after sending and 11 tokens over 2.0 s
    row = {**_row(100.0, 103.1, 1.0, 1.05, 1.15), "first_chunk_wall_s": 101.02, "last_chunk_wall_s": 103.02}
    a = client_agreement([row, {**row, "outcome": "failed"}, {**row, "first_chunk_wall_s": None}], 20.0)
    assert a["compared"] == 1 and a["ttft_dev"] == pytest.approx(0.02) and a["tpot_dev"] == pytest.approx(0.0)
    assert a["tpot_wall_s"] == pytest.approx(0.2)
    assert client_agreement([], 20.0) == {"compared": 0, "ttft_dev": None, "tpot_dev": None, "tpot_wall_s": None}
    # a client that went away after 2 of 11 tokens: its TTFT compares, its time per
    # output token (2 tokens' chunks over rack's 11) does not
    gone = {**row, "last_chunk_wall_s": 101.22, "tokens_sent": 2, "client_disconnected": True}
    b = client_agreement([gone], 20.0)
    assert b["compared"] == 1 and b["ttft_dev"] == pytest.approx(0.02) and b["tpot_dev"] is None
