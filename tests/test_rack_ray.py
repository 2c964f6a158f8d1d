"""The same components as Ray actors on a dilated wall clock agree with virtual time."""

from __future__ import annotations

import pytest

from rack.runner import run_scenario
from rack.scenario import load_scenario
from workloads import load_requests

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def both_runs(ray_session):
    sc = load_scenario().with_overrides(dilation=10.0)
    # Four 3-second ticks of the Mooncake excerpt (~30 requests) at three times the
    # rate, outputs cut to a quarter, so that the wall-clock run takes about a minute.
    reqs = load_requests("mooncake-excerpt", window=(0, 12), rate_scale=3.0, output_scale=0.25)
    virtual = run_scenario(sc, reqs, runtime="virtual")
    ray_out = run_scenario(sc, reqs, runtime="ray", timeout_s=240)
    return reqs, virtual, ray_out


def test_ray_run_accounts_for_every_request(both_runs):
    reqs, _, out = both_runs
    r = out.results["requests"]
    assert r["submitted"] == len(reqs) == r["completed"]
    assert out.results["emulation"]["violations"] == []
    assert out.results["kv_transfer"]["checksum_failures"] == 0
    assert out.results["provenance"]["event_loop"].startswith("uvloop")
    assert out.results["emulation"]["lateness_s"]["n"] > 0


def test_ray_and_virtual_agree_on_medians(both_runs):
    _, v, r = both_runs
    for key in ("ttft_s", "tpot_s"):
        a = v.results["latency"][key]["p50"]
        b = r.results["latency"][key]["p50"]
        assert b == pytest.approx(a, rel=0.05), key


def test_ray_ledgers_within_capacity(both_runs):
    _, _, out = both_runs
    for pool, m in out.results["memory"].items():
        assert 0 < m["peak_bytes"] <= m["capacity_bytes"], pool
