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
    reqs = [Request(id=i, arrival_s=i * 0.01, prompt_tokens=1000, output_tokens=150) for i in range(40)]
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


#: The storm of docs/robustness.md ("A fault storm on Ray"): 16 mixed faults in 1.6 s of
#: emulated time on the default scenario, as `rack run --fault ...` takes them.
STORM = ["decode_crash:decode@0.1", "prefill_crash:prefill-0@0.2", "link_flap:gpu-to-wafer@0.3+0.2",
         "frame_corrupt:*@0.4,count=2", "link_degrade:gpu-to-wafer@0.5+0.5,factor=0.25",
         "decode_crash:decode@0.6", "prefill_crash:prefill-1@0.7", "frame_corrupt:*@0.8,count=2",
         "link_flap:gpu-to-wafer@0.9+0.1", "decode_crash:decode@1.0", "prefill_crash:prefill-0@1.1",
         "link_degrade:gpu-to-wafer@1.2+0.3,factor=0.1", "frame_corrupt:*@1.3,count=3",
         "decode_crash:decode@1.4", "prefill_crash:prefill-1@1.5", "link_flap:gpu-to-wafer@1.6+0.2"]


def storm_scenario():
    from rack.wiring.faults import parse_fault_option
    from rack.wiring.load import load_scenario

    sc = load_scenario("helios-cs3-kimi-k2")
    return sc.with_overrides(faults=[parse_fault_option(f) for f in STORM], dilation=2.0)


def test_a_fault_storm_on_ray_ends_when_its_requests_end(ray_session):
    # Issue 37: after a storm like this every request had ended, but the interconnect
    # kept a transfer whose receiver had died before answering, and the run waited for
    # its whole deadline, then failed with nothing written. The deadline here is a few
    # times the storm's own length (its emulated span on the virtual runtime at the
    # dilation, plus startup): waiting on a phantom would overrun it.
    from workloads.replay import load_requests

    sc = storm_scenario()
    reqs = load_requests("mooncake-excerpt", window=(0.0, 3.0))
    virtual = run_scenario(sc, reqs, runtime="virtual")
    span = virtual.results["emulation"]["emulated_s"]
    assert virtual.results["faults"]["injected"] == len(STORM) >= 16
    out = run_scenario(sc, reqs, runtime="ray", timeout_s=3 * span * sc.dilation + 90)
    r = out.results["requests"]
    assert out.results["status"] == "complete"
    assert r["submitted"] == len(reqs) == r["completed"] + r["rejected"] + r["failed"] and r["open"] == 0
    # the invariant: no component held work for a request that had ended
    assert out.results["emulation"]["held_after_end"] == {}
    assert out.results["emulation"]["violations"] == []
    assert out.results["faults"]["injected"] == len(STORM) and not out.results["faults"]["errors"]


def test_a_ray_run_past_its_deadline_writes_what_finished(ray_session):
    # Issue 37: a run that reached its deadline failed with only error.log; now what
    # finished is kept as for any aborted run (status aborted, the cause in `error`).
    from rack.run.runner import RunAborted

    sc = parse_scenario({
        "name": "ray-deadline", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "dilation": 5.0,
        "pools": [{"name": "prefill", "device": "h100", "role": "prefill"},
                  {"name": "decode", "device": "h100", "role": "decode"}],
        "links": [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0}]}, "<test>")
    # the first requests end within a second of emulated time, the last arrives at 8 s
    reqs = [Request(id=i, arrival_s=i * 0.2, prompt_tokens=1000, output_tokens=20) for i in range(41)]
    with pytest.raises(RunAborted) as err:
        run_scenario(sc, reqs, runtime="ray", timeout_s=12)
    res = err.value.output.results
    assert res["status"] == "aborted" and "did not finish in time" in res["error"]["message"]
    q = res["requests"]
    assert q["completed"] > 0 and q["unfinished"] > 0
    assert q["completed"] + q["rejected"] + q["failed"] + q["unfinished"] == q["submitted"] == 41
