"""A decode engine's actor killed for real on the Ray runtime: Ray restarts it, the
restarted actor rebuilds its component, the peers recover, and every request ends."""

from __future__ import annotations

import pytest

from rack.run.runner import run_scenario
from rack.wiring.scenario import parse_scenario
from workloads import Request

pytestmark = pytest.mark.ray


def test_killed_decode_actor_is_restarted_and_its_requests_recovered(ray_session):
    sc = parse_scenario({
        "name": "ray-decode-crash", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "dilation": 5.0,
        "pools": [{"name": "prefill", "device": "h100", "role": "prefill"},
                  {"name": "decode", "device": "h100", "role": "decode", "max_batch": 64,
                   "memory_reserve_fraction": 0.85}],
        "links": [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0}],
        # at 0.4 s about ten requests are decoding (the virtual run below says how many)
        "faults": [{"kind": "decode_crash", "at_s": 0.4, "target": "decode-0"}]}, "<test>")
    reqs = [Request(id=i, arrival_s=i * 0.01, prompt_tokens=3000, output_tokens=150) for i in range(40)]
    virtual = run_scenario(sc, reqs, runtime="virtual")
    out = run_scenario(sc, reqs, runtime="ray", timeout_s=240)

    r = out.results["requests"]
    assert r["submitted"] == r["completed"] == len(reqs) and r["open"] == 0
    assert out.results["emulation"]["violations"] == []
    f = out.results["faults"]
    print("ray faults:", {k: v for k, v in f.items() if k != "list"})
    assert f["injected"] == f["recovered"] == 1 and f["requests_failed"] == 0
    (rec,) = f["list"]
    before, after = rec["incarnations"]
    assert rec["restarted"] and before != after       # a new process (on Ray the incarnation is its pid)
    assert rec["back_at_s"] > rec["applied_at_s"]                   # it was down a while
    # The KV that was at the decode engine was lost with it and re-prefilled.
    assert f["requests_redispatched"] > 0 and f["requests_recovered"] == f["requests_redispatched"]
    assert virtual.results["faults"]["requests_redispatched"] > 0
    for name, st in out.stats.items():
        mem = st.get("memory")
        if mem:
            assert mem["peak_bytes"] <= mem["capacity_bytes"]
            assert mem["held_bytes"].get("kv", 0) == 0 and mem["held_bytes"].get("reserved", 0) == 0, name
