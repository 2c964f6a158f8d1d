"""Property: over random small traces, rack configurations and injected faults on the
virtual runtime, every request ends exactly once (completed, or rejected/failed with a
reason), no memory ledger ever exceeds its capacity, every KV byte is freed at the
end, and the link carried exactly the bytes of the transfers it delivered."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rack.run.runner import run_scenario
from rack.wiring.scenario import parse_scenario
from workloads import Request

OUTCOMES = {"completed", "rejected", "failed"}


@st.composite
def traces(draw):
    n = draw(st.integers(1, 24))
    ticks = sorted(draw(st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 1.5]), min_size=n, max_size=n)))
    reqs = []
    for i, t in enumerate(ticks):
        prompt = draw(st.integers(1, 6000))
        out = draw(st.integers(1, 300))
        # prefix blocks of 512 tokens from a small alphabet, so prefix-cache hits happen
        hashes = None
        if draw(st.booleans()):
            full = prompt // 512
            head = draw(st.lists(st.integers(0, 2), min_size=full, max_size=full))
            hashes = tuple(hash((tuple(head[:k + 1]),)) for k in range(full))
        reqs.append(Request(id=i, arrival_s=t, prompt_tokens=prompt, output_tokens=out, block_hashes=hashes))
    return reqs


@st.composite
def scenarios(draw):
    layout = draw(st.sampled_from(["split", "split", "colocated"]))
    decode = {"name": "decode", "device": "h100", "role": "decode",
              "instances": draw(st.integers(1, 2)), "max_batch": draw(st.integers(1, 16)),
              "admission_policy": draw(st.sampled_from(["reserve", "preempt"])),
              "max_reserve_queue": draw(st.integers(1, 8)),
              # tight memory (0.88: ~2 GB of KV) makes requests wait, get refused, be preempted
              "memory_reserve_fraction": draw(st.sampled_from([None, 0.85, 0.88]))}
    prefill = {"name": "prefill", "device": "h100", "role": "prefill", "instances": draw(st.integers(1, 2)),
               "max_queue": draw(st.integers(1, 8)), "chunk_tokens": draw(st.sampled_from([512, 2048, 8192])),
               "prefix_cache": draw(st.booleans())}
    router = {"policy": draw(st.sampled_from(["round_robin", "least_outstanding_work"])),
              "max_outstanding_tokens": draw(st.sampled_from([5000, 50_000, 4_000_000]))}
    data = {"name": "prop", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100}, "router": router}
    if layout == "colocated":
        both = dict(decode, name="both", role="both", max_queue=prefill["max_queue"],
                    chunk_tokens=prefill["chunk_tokens"], prefix_cache=prefill["prefix_cache"])
        data["pools"] = [both]
        return parse_scenario(data, "<prop>")
    data["pools"] = [prefill, decode]
    data["links"] = [{"name": "kv", "src": "prefill", "dst": "decode",
                      "bandwidth_GBps": draw(st.sampled_from([1.0, 10.0, 100.0]))}]
    faults = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["decode_crash", "prefill_crash", "link_degrade", "link_flap", "frame_corrupt"]))
        f = {"kind": kind, "at_s": draw(st.sampled_from([0.0, 0.03, 0.3, 0.7, 1.2])), "seed": draw(st.integers(0, 9))}
        if kind in ("decode_crash", "prefill_crash"):
            f["target"] = kind.split("_")[0]                      # the pool: seed picks the instance
        else:
            f["target"] = "kv"
        if kind in ("link_degrade", "link_flap"):
            f["duration_s"] = draw(st.sampled_from([0.01, 0.2, 1.0]))
        if kind == "link_degrade":
            f["factor"] = draw(st.sampled_from([0.05, 0.5]))
        if kind == "frame_corrupt":
            f["count"] = draw(st.integers(1, 4))
        faults.append(f)
    data["faults"] = faults
    return parse_scenario(data, "<prop>")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=scenarios(), reqs=traces())
def test_every_request_ends_exactly_once(sc, reqs):
    out = run_scenario(sc, reqs, runtime="virtual")
    r = out.results["requests"]
    assert out.results["emulation"]["violations"] == []
    assert r["open"] == 0 and r["submitted"] == len(reqs)
    assert r["completed"] + r["rejected"] + r["failed"] == len(reqs)
    cols = out.columns
    assert sorted(cols["id"].tolist()) == [q.id for q in reqs]
    for outcome, reason in zip(cols["outcome"].tolist(), cols["reason"].tolist()):
        assert outcome in OUTCOMES
        assert (outcome == "completed") == (reason == ""), (outcome, reason)
    # Memory: never above capacity (the peak is the high-water mark); all KV freed.
    for name, stt in out.stats.items():
        mem = stt.get("memory")
        if mem is None:
            continue
        assert 0 <= mem["peak_bytes"] <= mem["capacity_bytes"], name
        left = {k: v for k, v in mem["held_bytes"].items() if v and k not in ("weights", "workspace", "prefix_cache")}
        assert left == {}, (name, left)
    # Link: at most its bandwidth on average; bytes carried == bytes of the transfers that
    # reached a receiver (also one that had restarted: "lost"), unless a prefill crash cut
    # some transfers off half-way.
    ic = out.stats.get("interconnect")
    if ic is not None:
        cut = any(f.kind == "prefill_crash" for f in sc.faults)
        for link in ic["links"].values():
            assert 0.0 <= link["utilisation"] <= 1.0
            if not cut:
                assert link["bytes_carried"] == pytest.approx(link["bytes_logical"] + link["bytes_lost"],
                                                              rel=1e-9, abs=1.0)
    # Completed requests have consistent latencies.
    done = cols["outcome"] == "completed"
    assert (cols["ttft_s"][done] >= 0).all() and (cols["e2e_s"][done] >= cols["ttft_s"][done]).all()
