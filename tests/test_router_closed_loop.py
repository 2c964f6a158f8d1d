"""Closed-loop replay (`max_concurrency`): never more requests in the rack than slots,
each next request sent when one ends (plus the think time), on the virtual runtime."""

from __future__ import annotations

import numpy as np
import pytest

from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import Request


def _in_rack_at_once(cols) -> int:
    """Most requests between their arrival and their end at any instant (an end at t
    frees its slot before an arrival at t is counted)."""
    starts = np.asarray(cols["t_arrival"])
    ends = np.asarray(cols["t_end"])
    ev = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends], key=lambda e: (e[0], e[1]))
    most = cur = 0
    for _, d in ev:
        cur += d
        most = max(most, cur)
    return most


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("gpu-only-kimi-k2")


def _requests(n: int) -> list[Request]:
    return [Request(id=i, arrival_s=0.0, prompt_tokens=2000 + 100 * (i % 5), output_tokens=50 + 10 * (i % 3))
            for i in range(n)]


@pytest.mark.parametrize("slots", [1, 3])
def test_never_more_than_max_concurrency_in_the_rack(scenario, slots):
    reqs = _requests(12)
    out = run_scenario(scenario, reqs, runtime="virtual", max_concurrency=slots)
    assert out.results["requests"]["completed"] == 12
    assert _in_rack_at_once(out.columns) == slots
    # a request is sent exactly when one in flight ends (no think time): every arrival
    # after the first `slots` coincides with an earlier request's end
    arrivals = np.sort(out.columns["t_arrival"])
    ends = set(np.round(out.columns["t_end"], 12).tolist())
    assert all(np.round(a, 12) in ends for a in arrivals[slots:])
    assert out.results["provenance"]["load"]["max_concurrency"] == slots


def test_think_time_delays_the_next_request(scenario):
    reqs = _requests(4)
    out = run_scenario(scenario, reqs, runtime="virtual", max_concurrency=1, think_time_s=0.5)
    order = np.argsort(out.columns["t_arrival"])
    arr, end = out.columns["t_arrival"][order], out.columns["t_end"][order]
    np.testing.assert_allclose(arr[1:], end[:-1] + 0.5, rtol=0, atol=1e-12)


def test_arrival_times_still_bound_a_closed_loop(scenario):
    # slots to spare: every request goes at its own arrival time, as in the open loop
    reqs = [Request(id=i, arrival_s=0.25 * i, prompt_tokens=1000, output_tokens=20) for i in range(6)]
    closed = run_scenario(scenario, reqs, runtime="virtual", max_concurrency=100)
    opened = run_scenario(scenario, reqs, runtime="virtual")
    np.testing.assert_array_equal(closed.columns["t_arrival"], opened.columns["t_arrival"])
    np.testing.assert_array_equal(closed.columns["ttft_s"], opened.columns["ttft_s"])


def test_bad_concurrency_is_refused(scenario):
    with pytest.raises(ValueError, match="max_concurrency"):
        run_scenario(scenario, _requests(2), runtime="virtual", max_concurrency=0)
