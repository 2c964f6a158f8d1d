"""Injected faults on the virtual runtime: every request is accounted for, and the
reported counts match what a fault-free run says was in flight at the fault's time.

The virtual runtime is deterministic, so a run with a fault is identical to the
fault-free run up to the fault's time: the fault-free timelines tell exactly which
requests were where when the fault hit.
"""

from __future__ import annotations

import numpy as np
import pytest

from rack.wiring.faults import parse_fault_option
from rack.run.runner import run_scenario
from rack.wiring.scenario import ScenarioError, parse_scenario
from workloads import Request

# A constrained decode instance (14% of an H100's 80 GiB left after the workspace
# reserve: ~4 GB of KV, a dozen requests) so that KV reservations queue up behind it.
# The hardware's roofline stack: these tests exercise fault mechanics on dynamics tuned
# without serving-stack latencies.
DECODE = {"name": "decode", "device": "h100", "stack": "roofline", "role": "decode", "instances": 1, "max_batch": 64,
          "memory_reserve_fraction": 0.86}


def scenario(faults=(), prefill_instances=2, **router):
    return parse_scenario({
        "name": "faults-test", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "pools": [{"name": "prefill", "device": "h100", "stack": "roofline", "role": "prefill",
                   "instances": prefill_instances,
                   "chunk_tokens": 4096}, DECODE],
        "links": [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0,
                   "latency_us": 5.0, "per_message_us": 2.0}],
        "router": router, "faults": list(faults)}, "<test>")


def check_accounting(out, reqs):
    """Each request ends exactly once; no KV is left in any ledger; no ledger overflowed."""
    r = out.results["requests"]
    assert r["submitted"] == len(reqs)
    assert r["completed"] + r["rejected"] + r["failed"] == r["submitted"]
    assert r["open"] == 0
    assert out.results["emulation"]["violations"] == []
    for name, st in out.stats.items():
        mem = st.get("memory")
        if mem is None:
            continue
        assert 0 <= mem["peak_bytes"] <= mem["capacity_bytes"], name
        held = {k: v for k, v in mem["held_bytes"].items() if v and k not in ("weights", "workspace", "prefix_cache")}
        assert held == {}, f"{name} still holds {held}"


def steady_stream(n=120):
    # one arrival every 10 ms: faster than the constrained decode instance drains them
    return [Request(id=i, arrival_s=i * 0.01, prompt_tokens=3000 + 17 * (i % 13),
                    output_tokens=200 + 11 * (i % 9)) for i in range(n)]


@pytest.fixture(scope="module")
def stream_baseline():
    reqs = steady_stream()
    return reqs, run_scenario(scenario(), reqs, runtime="virtual")


def test_decode_crash_resends_held_kv_and_reprefills_the_rest(stream_baseline):
    reqs, base = stream_baseline
    t = 1.2345
    c = base.columns
    # At t, fault-free: KV at the decode engine (arrived, not finished) -> lost with it,
    # re-prefilled; first token made but KV not yet arrived -> still at the prefill side,
    # which sends it again.
    at_decode = int(np.sum((c["t_transfer_end"] <= t) & (c["t_completion"] > t)))
    at_prefill = int(np.sum((c["t_prefill_end"] <= t) & (c["t_transfer_end"] > t)))
    assert at_decode > 0 and at_prefill > 0

    out = run_scenario(scenario([{"kind": "decode_crash", "at_s": t, "target": "decode-0"}]), reqs,
                       runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    assert f["injected"] == 1 and f["recovered"] == 1
    assert f["requests_redispatched"] == at_decode
    assert f["kv_resent_after_restart"] == at_prefill
    assert f["requests_recovered"] == at_decode and f["requests_failed"] == 0
    assert out.results["requests"]["completed"] == len(reqs)
    (rec,) = f["list"]
    assert rec["restarted"] and rec["applied_at_s"] == t and rec["recovered_at_s"] == t
    assert rec["requests_redispatched"] == at_decode == rec["requests_recovered"]
    assert out.stats["decode-0"]["restarts"] == 1
    # The crash costs time: the lost requests decode again from the start.
    assert out.results["latency"]["e2e_s"]["max"] > base.results["latency"]["e2e_s"]["max"]
    # ...and work: the dead incarnation's work still counts. Up to t the run is the
    # fault-free one, so that work is at least what was done there, and in all the
    # decode instance is busier and the run uses more energy than without the crash.
    work = rec["work_before_crash"]
    assert work["busy_s"] > 0 and work["iterations"] > 0
    st, st0 = out.stats["decode-0"], base.stats["decode-0"]
    assert st["incarnations_counted"] == 2 and st["busy_s"] > work["busy_s"]
    assert st["busy_s"] > st0["busy_s"] and st["iterations"] > st0["iterations"]
    assert st["busy_fraction"] == pytest.approx(st["busy_s"] / st["elapsed_s"])
    assert out.results["energy"]["joules"] > base.results["energy"]["joules"]


def burst(n=80):
    return [Request(id=i, arrival_s=0.0, prompt_tokens=6000 + 17 * (i % 13),
                    output_tokens=50 + 11 * (i % 9)) for i in range(n)]


def test_prefill_crash_moves_its_requests_to_another_instance():
    reqs = burst()
    sc = scenario(policy="round_robin")
    base = run_scenario(sc, reqs, runtime="virtual")
    t = 2.5
    c = base.columns
    on_1 = c["id"] % 2 == 1                      # round robin over [prefill-0, prefill-1]
    queued = int(np.sum(on_1 & (c["t_prefill_start"] > t)))
    running = int(np.sum(on_1 & (c["t_prefill_start"] <= t) & (c["t_prefill_end"] > t)))
    handing_off = int(np.sum(on_1 & (c["t_prefill_end"] <= t) & (c["t_transfer_end"] > t)))
    assert queued > 0 and running > 0 and handing_off > 0

    out = run_scenario(scenario([{"kind": "prefill_crash", "at_s": t, "target": "prefill-1"}],
                                policy="round_robin"), reqs, runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    lost = queued + running + handing_off
    assert f["injected"] == f["recovered"] == 1
    assert f["requests_redispatched"] == lost and f["requests_recovered"] == lost
    assert f["requests_failed"] == 0 and out.results["requests"]["completed"] == len(reqs)
    # They went to the other instance; the restarted one starts empty and gets none.
    assert out.stats["prefill-0"]["submitted"] == len(reqs) // 2 + lost
    assert out.stats["prefill-1"]["submitted"] == 0 and out.stats["prefill-1"]["restarts"] == 1
    # The decode engine dropped the reservations the dead instance's handoffs held.
    assert out.stats["decode-0"]["reservations_dropped"] == handing_off


def kv_times(out):
    c = out.columns
    return c["t_transfer_start"], c["t_transfer_end"]


def test_link_degrade_slows_transfers_then_they_resume():
    # Requests 1 s apart: each transfer is alone on the link.
    reqs = [Request(id=i, arrival_s=float(i), prompt_tokens=8000, output_tokens=20) for i in range(6)]
    base = run_scenario(scenario(), reqs, runtime="virtual")
    factor, start, dur = 0.1, 1.9, 2.5               # covers the transfers of requests 2 and 3
    out = run_scenario(scenario([{"kind": "link_degrade", "at_s": start, "target": "kv",
                                  "duration_s": dur, "factor": factor}]), reqs, runtime="virtual")
    check_accounting(out, reqs)
    s0, e0 = kv_times(base)
    s1, e1 = kv_times(out)
    kv_bytes = 8000 * out.specs[1].kwargs["cost"].kv_bytes_per_token
    wire = kv_bytes / 50e9
    for i in range(6):
        slow = start <= s1[i] and e1[i] <= start + dur
        expected = (e0[i] - s0[i]) + (wire / factor - wire if slow else 0.0)
        assert e1[i] - s1[i] == pytest.approx(expected, rel=1e-6), i
    assert sum(start <= s1[i] and e1[i] <= start + dur for i in range(6)) == 3
    f = out.results["faults"]
    assert f["injected"] == f["recovered"] == 1 and out.results["requests"]["completed"] == 6
    assert f["list"][0]["recovered_at_s"] == pytest.approx(start + dur)
    assert out.results["kv_transfer"]["bytes_logical"] == base.results["kv_transfer"]["bytes_logical"]


def test_link_flap_holds_transfers_until_the_link_is_back():
    reqs = [Request(id=i, arrival_s=float(i), prompt_tokens=8000, output_tokens=20) for i in range(5)]
    base = run_scenario(scenario(), reqs, runtime="virtual")
    s0, e0 = kv_times(base)
    start, dur = s0[2] - 0.001, 0.5                  # the link is down when request 2's KV starts
    out = run_scenario(scenario([{"kind": "link_flap", "at_s": start, "target": "kv", "duration_s": dur}]),
                       reqs, runtime="virtual")
    check_accounting(out, reqs)
    s1, e1 = kv_times(out)
    # No byte crosses before the link is back; then the whole payload crosses at full
    # speed and arrives one latency later (5 us; the per-message work overlapped the flap).
    kv_bytes = 8000 * out.specs[1].kwargs["cost"].kv_bytes_per_token
    assert e1[2] == pytest.approx(start + dur + kv_bytes / 50e9 + 5e-6, rel=1e-9)
    assert e1[2] - s1[2] > dur
    for i in (0, 1, 3, 4):
        assert e1[i] - s1[i] == pytest.approx(e0[i] - s0[i], rel=1e-9)
    assert out.results["requests"]["completed"] == 5
    f = out.results["faults"]
    assert f["injected"] == f["recovered"] == 1


def test_corrupted_frames_are_caught_and_resent(stream_baseline):
    reqs, base = stream_baseline
    n = 7
    out = run_scenario(scenario([{"kind": "frame_corrupt", "at_s": 0.5, "target": "kv", "count": n,
                                  "seed": 11}]), reqs, runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    kv = out.results["kv_transfer"]
    assert f["frames_corrupted"] == n and f["checksum_failures"] == n and f["payloads_resent"] == n
    assert kv["checksum_failures"] == n and kv["failed_transfers"] == n
    assert kv["transfers"] == base.results["kv_transfer"]["transfers"] + n
    assert f["list"][0]["payloads_recovered"] == n and f["recovered"] == 1
    assert out.results["requests"]["completed"] == len(reqs) and f["requests_failed"] == 0


def test_every_fault_at_once_is_deterministic():
    reqs = steady_stream(80)
    faults = [parse_fault_option(s) for s in (
        "decode_crash:decode@0.9", "prefill_crash:prefill@0.7,seed=1", "link_degrade:kv@0.2+0.5,factor=0.3",
        "link_flap:kv@1.5+0.2", "frame_corrupt:*@0.1,count=4,seed=2")]
    sc = scenario(faults)
    a = run_scenario(sc, reqs, runtime="virtual")
    b = run_scenario(sc, reqs, runtime="virtual")
    check_accounting(a, reqs)
    assert a.results["faults"]["injected"] == a.results["faults"]["recovered"] == 5
    assert a.results["requests"]["completed"] == len(reqs)
    np.testing.assert_array_equal(a.columns["e2e_s"], b.columns["e2e_s"])
    assert a.results["faults"] == b.results["faults"]


def test_fault_after_the_run_is_reported_as_not_applied():
    reqs = steady_stream(10)
    out = run_scenario(scenario([{"kind": "decode_crash", "at_s": 500.0, "target": "decode"}]), reqs,
                       runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    assert f["injected"] == 0 and f["list"][0]["applied"] is False and f["list"][0]["instance"] == "decode-0"
    from rack.measure.results import summary_text

    text = summary_text(out.results)
    assert "faults: 1 of 1 not applied (scheduled after the run ended: decode_crash at 500 s)" in text
    assert text.splitlines()[0].startswith("scenario faults-test  runtime virtual  wall ")  # no dilation


@pytest.mark.parametrize("fault, field", [
    ({"kind": "decode_crash", "at_s": 1, "target": "decode-5"}, "faults[0].target"),
    ({"kind": "prefill_crash", "at_s": 1, "target": "decode-0"}, "faults[0].target"),
    ({"kind": "link_flap", "at_s": 1, "target": "kv"}, "faults[0]: duration_s"),
    ({"kind": "link_degrade", "at_s": 1, "target": "kv", "duration_s": 1}, "faults[0]: factor"),
    ({"kind": "link_degrade", "at_s": 1, "target": "kv", "duration_s": 1, "factor": 1.5}, "faults[0].factor"),
    ({"kind": "link_degrade", "at_s": 1, "target": "nope", "duration_s": 1, "factor": 0.5}, "faults[0].target"),
    ({"kind": "frame_corrupt", "at_s": -1, "target": "*"}, "faults[0].at_s"),
    ({"kind": "disk_full", "at_s": 1, "target": "*"}, "faults[0].kind"),
])
def test_bad_faults_are_refused_naming_the_field(fault, field):
    with pytest.raises(ScenarioError) as e:
        scenario([fault])
    assert field in str(e.value) and "<test>" in str(e.value)


def test_fault_option_syntax():
    assert parse_fault_option("link_degrade:kv@10+5,factor=0.25,seed=3") == {
        "kind": "link_degrade", "target": "kv", "at_s": 10, "duration_s": 5, "factor": 0.25, "seed": 3}
    assert parse_fault_option("decode_crash:decode-0@2.5") == {"kind": "decode_crash", "target": "decode-0",
                                                               "at_s": 2.5}
    # numbers are read as numbers, so a validation error shows the number given
    assert parse_fault_option("decode_crash:decode-0@-5")["at_s"] == -5
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.at_s: .*greater than or equal to 0 \(got -5\)"):
        scenario([parse_fault_option("decode_crash:decode-0@-5")])
    assert parse_fault_option("decode_crash:decode-0@soon")["at_s"] == "soon"     # left for validation
    for bad in ("decode_crash:decode-0", "decode_crash@3", "link_flap:kv@1+2,color=red"):
        with pytest.raises(ValueError, match="--fault"):
            parse_fault_option(bad)


def test_cli_fault_option(tmp_path):
    import json

    from typer.testing import CliRunner

    import rack.cli
    from rack.cli.app import app

    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--window", "0:10", "--out", str(tmp_path / "r"),
                                   "--fault", "decode_crash:decode@4", "--fault", "frame_corrupt:*@0,count=2",
                                   "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    f = data["faults"]
    assert f["injected"] == 2 and f["frames_corrupted"] == 2
    assert [x["kind"] for x in f["list"]] == ["decode_crash", "frame_corrupt"]
    r = data["requests"]
    assert r["open"] == 0 and r["completed"] + r["rejected"] + r["failed"] == r["submitted"]
    bad = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--window", "0:10", "--out", str(tmp_path / "b"),
                                   "--fault", "decode_crash:decode-9@4"])
    assert bad.exit_code == 2
    assert "faults[0].target" in bad.output and "Traceback" not in bad.output


def test_simultaneous_prefill_and_decode_crash():
    # Regression: the decode recovery re-dispatches a request to the prefill instance
    # that dies at the same instant; the router recovers that instance again.
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=1, output_tokens=1),
            Request(id=1, arrival_s=0.01, prompt_tokens=1, output_tokens=7)]
    out = run_scenario(scenario([{"kind": "prefill_crash", "at_s": 0.03, "target": "prefill"},
                                 {"kind": "decode_crash", "at_s": 0.03, "target": "decode"}],
                                prefill_instances=1), reqs, runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    assert out.results["requests"]["completed"] == 2
    assert f["injected"] == f["recovered"] == 2 and f["requests_redispatched"] == 1


def test_work_before_a_crash_counts_the_run_in_progress():
    """A crash usually lands inside a run of decode steps (priced at once, booked when
    the run ends): the steps that ended before the crash still count. The default
    scenario's wafer on its August 2024 stack (~8.5 ms per token) decodes without a gap
    from its first admission (~130 ms) on, so its work before a crash at 5 s is ~4.87 s of
    busy time."""
    from rack.wiring.load import load_scenario
    from workloads import load_requests

    reqs = load_requests("mooncake-excerpt", window=(0, 20), output_scale=0.5)
    data = load_scenario().model_dump()
    data["pools"][1]["stack"] = "2024-08"
    sc = parse_scenario(data).with_overrides(faults=[parse_fault_option("decode_crash:decode-0@5")])
    out = run_scenario(sc, reqs, runtime="virtual")
    check_accounting(out, reqs)
    (rec,) = out.results["faults"]["list"]
    assert rec["applied"] and 4.8 < rec["work_before_crash"]["busy_s"] <= 5.0


def test_a_fault_with_nothing_to_act_on_says_so():
    """A frame_corrupt whose window sees no payload (requests 1 s apart, a 0.1 s window
    between two transfers) is not a failed recovery: its record says there was no
    target at that time (issue 18, item 5)."""
    reqs = [Request(id=i, arrival_s=float(i), prompt_tokens=8000, output_tokens=20) for i in range(3)]
    out = run_scenario(scenario([{"kind": "frame_corrupt", "at_s": 1.5, "target": "kv", "duration_s": 0.1},
                                 {"kind": "frame_corrupt", "at_s": 0.0, "target": "kv", "count": 1}]),
                       reqs, runtime="virtual")
    check_accounting(out, reqs)
    f = out.results["faults"]
    idle, hit = f["list"]
    assert idle["outcome"] == "no target at that time" and idle["frames_corrupted"] == 0 and idle["recovered"] is None
    assert "outcome" not in hit and hit["frames_corrupted"] == 1 and hit["recovered"] is True
    assert (f["injected"], f["recovered"], f["no_target"]) == (2, 1, 1)
    from rack.measure.results import summary_text

    assert "faults: 2 injected, 1 recovered, 1 with no target at that time, 0 requests failed" in summary_text(out.results)


@pytest.mark.parametrize("kind,target", [("decode_crash", "decode-0"), ("prefill_crash", "prefill-1")])
def test_a_restarted_engine_reloads_its_weights_before_it_serves(kind, target):
    reqs = steady_stream()
    t = 0.4
    out = run_scenario(scenario([{"kind": kind, "at_s": t, "target": target}]), reqs, runtime="virtual")
    check_accounting(out, reqs)
    rec = out.results["faults"]["list"][0]
    # Llama-3.1-8B in fp8 (~8 GB) over the H100's ~55 GB/s host-to-device path
    assert rec["weight_load_s"] == pytest.approx(8.03e9 / 55e9, rel=0.02)
    assert rec["serving_from_s"] == pytest.approx(t + rec["weight_load_s"])
    # nothing runs on the restarted instance before its weights are back: its fresh
    # stats (from the restart on) record no iteration earlier
    starts = out.stats[target]["memory_t_s"]
    assert starts.size and starts.min() >= rec["serving_from_s"] - 1e-12
    if kind == "decode_crash":
        late = out.columns["t_decode_admit"] > t
        assert late.any() and np.all(out.columns["t_decode_admit"][late] >= rec["serving_from_s"] - 1e-12)
    # a faster load path shortens the outage
    fast = scenario([{"kind": kind, "at_s": t, "target": target}]).model_dump()
    for p in fast["pools"]:
        p["weight_load_GBps"] = 1000.0
    quick = run_scenario(parse_scenario(fast), reqs, runtime="virtual").results["faults"]["list"][0]
    assert quick["weight_load_s"] == pytest.approx(8.03e9 / 1e12, rel=0.02)
