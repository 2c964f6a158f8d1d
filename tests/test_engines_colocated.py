"""ColocatedEngine: prefill and decode on one instance (GPU-only and wafer-only
baselines): mixed iterations, event skipping, prefix cache sharing, preemption."""

from __future__ import annotations

import numpy as np
import pytest

from devices.catalog import get_device
from devices.costmodel import CostModel
from devices.engines.colocated import ColocatedEngine
from workloads.request import Request

from _engine_fakes import Client, FakeCollector, plan, run_cores, submissions


def llama(device):
    return CostModel("llama-3.1-8b", device, weight_dtype="bf16", kv_dtype="bf16")


def _run(requests, cost, in_order=False, **kw):
    """Submit `requests` at their arrival times (or, with `in_order`, all at once in list
    order), drain, return (collector, engine, stats)."""
    col = FakeCollector()
    eng = ColocatedEngine(name="gpu0", cost=cost, collector=col.name,
                          **{"max_batch": 64, "chunk_tokens": 4096, **kw})
    if in_order:
        script = [(0.0, "gpu0", "submit_many", [(r, "gpu0")]) for r in requests]
    else:
        script = submissions(requests, "gpu0", "gpu0", col.name)
    drv = run_cores([col, Client(script), eng])
    return col, eng, eng.stats(drv.now)


def _poisson(n, rate, seed, prompt=(100, 6000), output=(2, 300), shared_blocks=0, bs=512):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    reqs = []
    for i in range(n):
        p = int(rng.integers(*prompt))
        nb = -(-p // bs)
        h = tuple(range(1, 1 + min(shared_blocks, nb))) + tuple(10_000 * (i + 1) + k
                                                             for k in range(nb - min(shared_blocks, nb)))
        reqs.append(Request(id=i, arrival_s=float(t[i]), prompt_tokens=p,
                            output_tokens=int(rng.integers(*output)), block_hashes=h, block_size=bs))
    return reqs


def _check(col, stats, reqs):
    assert set(col.outcomes) == {r.id for r in reqs}
    m = stats["memory"]
    assert m["peak_bytes"] <= m["capacity_bytes"]
    assert m["held_bytes"]["kv"] == 0 and m["held_bytes"]["reserved"] == 0
    first = col.times("first_token")
    for r in reqs:
        o = col.outcomes[r.id]
        assert o["outcome"] == "completed"
        assert first[r.id] >= r.arrival_s
        assert o["itl_s"].shape == (r.output_tokens - 1,)
        if r.output_tokens > 1:
            assert np.mean(o["itl_s"]) == pytest.approx((o["t"] - first[r.id]) / (r.output_tokens - 1),
                                                        rel=1e-9)


@pytest.mark.parametrize("device", ["h100", "cs3"])
def test_colocated_baselines_complete_every_request(device):
    cost = llama(device)
    reqs = _poisson(50, rate=10.0, seed=2)
    col, eng, stats = _run(reqs, cost, prefix_cache=False)
    _check(col, stats, reqs)
    first = col.times("first_token")
    for r in reqs:   # no cache: the whole prompt is computed before the first token
        assert first[r.id] - r.arrival_s >= 2 * cost.model.active_linear_params * r.prompt_tokens \
            / cost.peak_flops
    assert stats["tokens_computed"] == sum(r.prompt_tokens for r in reqs)
    assert stats["mixed_iterations"] > 0 and stats["batch_peak"] > 1
    assert stats["wakeups"] < stats["tokens_generated"] / 5


def test_decode_steps_are_slowed_by_prefill_chunks():
    """Interference, the reason to disaggregate: a long prompt arriving mid-decode
    stretches the running request's ITL during its chunks."""
    cost = llama("h100")
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=500, output_tokens=400),
            Request(id=1, arrival_s=0.5, prompt_tokens=30_000, output_tokens=2)]
    col, eng, stats = _run(reqs, cost, chunk_tokens=8192)
    itl = col.outcomes[0]["itl_s"]
    assert itl.max() > 10 * np.median(itl)
    assert stats["mixed_iterations"] >= 1 + -(-30_000 // (8192 - 1))


def test_wakeups_independent_of_output_length():
    cost = llama("cs3")
    outs = [200, 260, 300, 333, 480, 512, 700, 900]
    mk = lambda k: [Request(id=i, arrival_s=0.0, prompt_tokens=1500 + 100 * i, output_tokens=k * n)
                    for i, n in enumerate(outs)]
    _, _, s1 = _run(mk(1), cost)
    _, _, s2 = _run(mk(2), cost)
    assert s2["steps"] > 1.9 * s1["steps"]
    assert s1["wakeups"] == s2["wakeups"]


def test_prefix_cache_shares_memory_and_skips_compute():
    # the roofline stack: requests finish (and fill the cache) before most later ones start
    cost = llama(get_device("h100", stack="roofline"))
    reqs = _poisson(40, rate=5.0, seed=4, prompt=(3000, 6000), shared_blocks=5)
    col, eng, stats = _run(reqs, cost)
    assert stats["tokens_cached"] > 0
    assert stats["tokens_computed"] + stats["tokens_cached"] == sum(r.prompt_tokens for r in reqs)
    assert stats["prefix_cache"]["hit_blocks"] >= 5 * 30
    m = stats["memory"]
    assert m["peak_bytes"] <= m["capacity_bytes"] and m["held_bytes"]["kv"] == 0
    assert all(o["outcome"] == "completed" for o in col.outcomes.values())


def test_preempt_policy_under_memory_pressure():
    cost = llama("cs3")
    kv_block = 16 * cost.kv_bytes_per_token
    small = plan(cost.weight_bytes + 1500 * kv_block, cost.weight_bytes)
    reqs = _poisson(30, rate=40.0, seed=6, prompt=(2000, 6000), output=(200, 1500))
    col, eng, stats = _run(reqs, cost, admission_policy="preempt", memory_plan=small,
                           prefix_cache=False)
    _check(col, stats, reqs)
    assert stats["preemptions"] > 0 and col.count("preempted") == stats["preemptions"]


def test_rejections_and_capacity_failures():
    cost = llama("h100")
    kv_block = 16 * cost.kv_bytes_per_token
    small = plan(cost.weight_bytes + 200 * kv_block, cost.weight_bytes)
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=3300, output_tokens=5),    # > 200 blocks
            Request(id=1, arrival_s=0.0, prompt_tokens=3000, output_tokens=500),  # final > 200
            Request(id=2, arrival_s=0.0, prompt_tokens=1000, output_tokens=5),
            Request(id=3, arrival_s=0.0, prompt_tokens=1000, output_tokens=5),
            Request(id=4, arrival_s=0.0, prompt_tokens=1000, output_tokens=1)]
    col, eng, stats = _run(reqs, cost, memory_plan=small, max_queue=2, in_order=True)
    oc = col.outcomes
    assert oc[0]["reason"] == "prompt_exceeds_kv_capacity"
    assert oc[1]["reason"] == "exceeds_decode_kv_capacity"
    assert oc[4] == {"outcome": "rejected", "reason": "prefill_queue_full", "itl_s": None, "t": 0.0}
    assert oc[2]["outcome"] == oc[3]["outcome"] == "completed"
    assert set(oc) == {0, 1, 2, 3, 4}


def _step_ends(col, rid):
    """End times of the steps request `rid` decoded in (its token times after the first)."""
    return col.times("first_token")[rid] + np.cumsum(col.outcomes[rid]["itl_s"])


@pytest.mark.parametrize("interval", [1, 10])
def test_receive_interval_holds_prompts_until_the_next_receive(interval):
    """SGLang --scheduler-recv-interval N: a prompt that arrives while the batch decodes
    is taken in only after N decode steps since the last receive (which follows every
    prefill); prompts arriving within one window are prefilled together."""
    cost = llama("h100")
    long = Request(id=0, arrival_s=0.0, prompt_tokens=500, output_tokens=400)
    col, _, _ = _run([long], cost, recv_interval=interval)
    ends = _step_ends(col, 0)                   # decode step m (1-based) ends at ends[m - 1]
    t1 = float(ends[12] + 0.25 * (ends[13] - ends[12]))     # during step 14
    late = [Request(id=1, arrival_s=t1, prompt_tokens=300, output_tokens=20),
            Request(id=2, arrival_s=float(ends[16] + 0.5 * (ends[17] - ends[16])), prompt_tokens=300,
                    output_tokens=20)]                          # during step 18
    col, eng, stats = _run([long, *late], cost, recv_interval=interval)
    _check(col, stats, [long, *late])
    start = col.times("prefill_start")
    if interval == 1:       # at the next step boundary, one after the other
        assert start[1] == pytest.approx(ends[13]) and start[2] > start[1]
    else:                   # at the 20th step since the prompt of request 0, together
        assert start[1] == pytest.approx(ends[19]) and start[2] == start[1]
    assert eng.recv_interval == interval


def test_receive_interval_idle_scheduler_receives_at_once():
    cost = llama("h100")
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=200, output_tokens=5),
            Request(id=1, arrival_s=1.0, prompt_tokens=200, output_tokens=5)]
    col, _, stats = _run(reqs, cost, recv_interval=30)
    _check(col, stats, reqs)
    assert col.times("prefill_start") == {0: 0.0, 1: 1.0}
    with pytest.raises(ValueError, match="recv_interval must be >= 1"):
        ColocatedEngine(name="x", cost=cost, collector="c", recv_interval=0)
