"""DecodeEngine: continuous batching with event skipping, reservations, preemption,
speculative decoding, ITL bookkeeping, frame verification."""

from __future__ import annotations

import math

import numpy as np
import pytest

from devices.engines.decode import DecodeEngine
from interconnect.codec import corrupt_frame, make_kv_frames
from workloads.request import Request

from _engine_fakes import GB, Client, FakeCollector, FakeCost, deliveries, plan, run_cores  # tests/ helpers
from _engine_fakes import frames_for as _frames
from _engine_fakes import make_requests as _reqs
from _engine_fakes import run_decode as _run


def _check_common(eng, col, stats, reqs):
    assert set(col.outcomes) == {r.id for r in reqs}
    assert stats["memory"]["peak_bytes"] <= stats["memory"]["capacity_bytes"]
    held = stats["memory"]["held_bytes"]
    assert held["kv"] == 0 and held["reserved"] == 0          # everything freed
    assert eng.pool.blocks_in_use == 0


def test_itl_samples_and_tpot_identity():
    reqs = _reqs([2, 5, 17, 64, 300])
    eng, col, stats = _run(reqs)
    _check_common(eng, col, stats, reqs)
    admit = col.times("decode_admit")
    for r in reqs:
        o = col.outcomes[r.id]
        assert o["outcome"] == "completed"
        itl = o["itl_s"]
        assert itl.shape == (r.output_tokens - 1,)
        assert np.all(itl > 0)
        # first token at t=0 (the prefill side), so E2E - TTFT = completion time - 0
        tpot = (o["t"] - 0.0) / (r.output_tokens - 1)
        assert np.mean(itl) == pytest.approx(tpot, rel=1e-12)
        assert admit[r.id] == 0.0
    assert stats["completed"] == len(reqs)
    assert stats["tokens_generated"] == sum(r.output_tokens - 1 for r in reqs)


def test_wakeups_independent_of_output_length():
    outputs = [3, 10, 10, 25, 60, 61, 130, 200, 400, 999]
    _, _, s1 = _run(_reqs(outputs))
    _, _, s2 = _run(_reqs([2 * n for n in outputs]))
    assert s1["completed"] == s2["completed"] == len(outputs)
    assert s2["steps"] > 1.9 * s1["steps"]                      # twice the tokens...
    assert s1["wakeups"] == s2["wakeups"]                      # ...same work
    # one wake-up per distinct completion step count (9 distinct), plus the idle wait
    assert s1["wakeups"] <= len(set(outputs)) + 2


def test_wakeups_bounded_by_batch_changes_with_staggered_arrivals():
    outputs = [50 + 13 * i for i in range(30)]
    reqs = _reqs(outputs)
    arrivals = [0.003 * i for i in range(30)]
    _, col, s1 = _run(reqs, arrivals=arrivals)
    _, _, s2 = _run(_reqs([4 * n for n in outputs]), arrivals=arrivals)
    assert s1["wakeups"] <= 2 * len(reqs) + 2 and s2["wakeups"] <= 2 * len(reqs) + 2
    # an admission happens at its arrival (engine idle) or exactly at a step end of a
    # running request (all token times of a request with tps=1 are step ends)
    first = dict(zip((r.id for r in reqs), arrivals))           # first token at delivery
    token_times = np.concatenate([first[rid] + np.cumsum(o["itl_s"])
                                  for rid, o in col.outcomes.items()])
    admits = col.times("decode_admit")
    for r, t_arr in zip(reqs, arrivals):
        t = admits[r.id]
        assert t >= t_arr
        assert t == t_arr or np.min(np.abs(token_times - t)) < 1e-12, (r.id, t, t_arr)


def test_admission_mid_run_happens_at_a_step_boundary():
    cost = FakeCost()
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=8,
                       memory_plan=plan(40 * GB, cost.weight_bytes))
    a = Request(id=0, arrival_s=0, prompt_tokens=500, output_tokens=200)
    b = Request(id=1, arrival_s=0, prompt_tokens=500, output_tokens=20)
    script, deliver = deliveries("d", cost, [a, b], [0.0, 0.0123456])
    drv = run_cores([col, eng, Client(script, deliver=deliver)])
    stats = eng.stats(drv.now)
    t_admit = col.times("decode_admit")[1]
    token_times_a = np.cumsum(col.outcomes[0]["itl_s"])         # first token at 0
    assert t_admit >= 0.0123456
    assert np.min(np.abs(token_times_a - t_admit)) < 1e-15       # a step end of request 0
    assert t_admit - 0.0123456 < np.max(col.outcomes[0]["itl_s"])  # within one step
    # b's first decode token is one step after its admission
    assert col.outcomes[1]["itl_s"].shape == (19,)
    assert stats["wakeups"] <= 5


def test_speculative_decoding_uses_expected_tokens_per_step():
    tps = 2.5
    cost = FakeCost(tokens_per_step=tps)
    reqs = _reqs([2, 7, 11, 100])
    eng, col, stats = _run(reqs, cost=cost)
    _check_common(eng, col, stats, reqs)
    steps_needed = [math.ceil((r.output_tokens - 1) / tps) for r in reqs]
    assert stats["steps"] == max(steps_needed)
    for r in reqs:
        itl = col.outcomes[r.id]["itl_s"]
        assert itl.shape == (r.output_tokens - 1,)
        assert np.mean(itl) == pytest.approx(col.outcomes[r.id]["t"] / (r.output_tokens - 1))
        assert np.all(itl > 0)


def test_reserve_policy_waits_fifo_and_never_preempts():
    cost = FakeCost()
    kv_block = 16 * cost.kv_bytes_per_token
    # room for two requests' final footprints (1000 + 499 tokens -> 94 blocks each)
    capacity = cost.weight_bytes + 2 * 94 * kv_block + kv_block
    reqs = [Request(id=i, arrival_s=0, prompt_tokens=1000, output_tokens=500) for i in range(5)]
    eng, col, stats = _run(reqs, cost=cost, capacity=capacity, arrivals=[1e-6 * i for i in range(5)])
    _check_common(eng, col, stats, reqs)
    assert stats["preemptions"] == 0 and stats["batch_peak"] == 2
    reserved = col.times("kv_reserved")
    assert [reserved[i] for i in range(5)] == sorted(reserved[i] for i in range(5))
    assert reserved[2] > reserved[1]                           # the third had to wait
    assert all(col.outcomes[r.id]["outcome"] == "completed" for r in reqs)


def test_preempt_policy_recomputes_and_stays_within_memory():
    cost = FakeCost()
    kv_block = 16 * cost.kv_bytes_per_token
    capacity = cost.weight_bytes + 300 * kv_block     # prompts 63 blocks; finals 94 blocks
    reqs = [Request(id=i, arrival_s=0, prompt_tokens=1000, output_tokens=500) for i in range(4)]
    eng, col, stats = _run(reqs, cost=cost, capacity=capacity, policy="preempt")
    _check_common(eng, col, stats, reqs)
    assert stats["preemptions"] >= 1 and col.count("preempted") == stats["preemptions"]
    assert stats["recompute_tokens"] > 0
    for r in reqs:
        o = col.outcomes[r.id]
        assert o["outcome"] == "completed" and o["itl_s"].shape == (499,)
        assert np.mean(o["itl_s"]) == pytest.approx(o["t"] / 499)
    # more concurrency than "reserve" would allow in the same memory (3 x 94 > 300 - ...)
    assert stats["batch_peak"] >= 3


def test_request_too_large_for_decode_fails():
    cost = FakeCost()
    capacity = cost.weight_bytes + 100 * 16 * cost.kv_bytes_per_token
    reqs = [Request(id=0, arrival_s=0, prompt_tokens=1500, output_tokens=200)]
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(capacity, cost.weight_bytes))
    client = Client([(0.0, "d", "reserve_kv", reqs[0], 1500, 0.0, "client")])
    run_cores([col, eng, client])
    assert client.of("kv_reserved") == [(0, "refused")]          # the old `reserve_kv` returned False
    assert col.outcomes[0]["outcome"] == "failed"
    assert col.outcomes[0]["reason"] == "exceeds_decode_kv_capacity"


def test_bad_frames_are_counted_never_used():
    cost = FakeCost()
    req = Request(id=7, arrival_s=0, prompt_tokens=300, output_tokens=5)
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(40 * GB, cost.weight_bytes))
    frames = _frames(cost, req)
    bad = [corrupt_frame(frames[0]), frames[1], corrupt_frame(frames[2], seed=3)] + frames[3:]
    other = make_kv_frames(8, 300, cost.kv_bytes_per_token, cost.model.layers, 8, 1e-5)
    out = {}
    client = Client([
        (0.0, "d", "reserve_kv", req, 300, None, "client"),
        (0.0, "d", "receive_kv", req, bad, 0.0, "client", "bad"),
        (0.0, "d", "receive_kv", req, frames[:-1], 0.0, "client", "missing"),
        (0.0, "d", "receive_kv", req, other, 0.0, "client", "wrong_req"),
        (1.0, lambda now: out.update(held=eng.ledger.held("reserved"))),
        (1.0, "d", "abort_kv", req, "kv_checksum"),
    ])
    drv = run_cores([col, eng, client])
    stats = eng.stats(drv.now)
    got = dict(client.of("kv_received"))
    assert got["bad"] == 2 and got["missing"] == 1 and got["wrong_req"] == len(
        make_kv_frames(8, 300, 131_072, 32, 8, 1e-5))
    assert out["held"] > 0
    o = col.outcomes[7]
    assert o["outcome"] == "failed" and o["reason"] == "kv_checksum"
    assert col.count("decode_admit") == 0
    assert stats["memory"]["used_bytes"] == stats["memory"]["held_bytes"]["weights"]


def test_receive_without_reservation_is_refused():
    """KV for a request this engine holds no reservation for (never reserved, or lost in
    a restart) is never used: the reply is -1 (the sender lost the exchange; the old
    engine raised PeerLost, "without a reservation"), nothing is admitted or held."""
    cost = FakeCost()
    req = Request(id=1, arrival_s=0, prompt_tokens=10, output_tokens=5)
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(40 * GB, cost.weight_bytes))
    client = Client([(0.0, "d", "receive_kv", req, _frames(cost, req), 0.0, "client", "t")])
    drv = run_cores([col, eng, client])
    assert client.of("kv_received") == [("t", -1)]
    stats = eng.stats(drv.now)
    assert stats["admitted"] == 0 and col.events_log == [] and col.outcomes == {}
    assert stats["memory"]["used_bytes"] == stats["memory"]["held_bytes"]["weights"]


def test_max_batch_caps_the_batch():
    reqs = _reqs([20] * 10)
    eng, col, stats = _run(reqs, max_batch=3)
    _check_common(eng, col, stats, reqs)
    assert stats["batch_peak"] == 3
    assert 0 < stats["batch_mean_busy"] <= 3


def test_bad_arguments():
    cost = FakeCost()
    with pytest.raises(ValueError, match="admission_policy"):
        DecodeEngine(name="d", cost=cost, collector="collector", max_batch=4,
                     admission_policy="swap", memory_plan=plan(40 * GB, cost.weight_bytes))
    with pytest.raises(ValueError, match="max_batch"):
        DecodeEngine(name="d", cost=cost, collector="collector", max_batch=0,
                     memory_plan=plan(40 * GB, cost.weight_bytes))


def test_real_speculative_cost_model_on_pipelined_wafers():
    """Llama-3.1-70B on 4 CS-3 (pipelined) with an 8B draft model: a request with n
    output tokens takes ceil((n - 1) / tokens_per_step) verification steps, each no
    faster than reading the weights once at the wafers' SRAM bandwidth."""
    from devices.costmodel import CostModel, Parallelism, SpeculativeConfig

    spec = SpeculativeConfig(draft_tokens=3, acceptance_rate=0.7, method="draft_model",
                             draft_model="llama-3.1-8b")
    cost = CostModel("llama-3.1-70b", "cs3", Parallelism(pp=4), weight_dtype="bf16",
                     kv_dtype="bf16", speculative=spec)
    tps = cost.tokens_per_step
    req = Request(id=0, arrival_s=0.0, prompt_tokens=2000, output_tokens=301)
    eng, col, stats = _run([req], cost=cost, capacity=None)
    assert stats["steps"] == math.ceil(300 / tps)
    itl = col.outcomes[0]["itl_s"]
    assert itl.shape == (300,)
    step = cost.decode_steps([2001], 1).time_s[0]
    assert step >= cost.weight_bytes * 0.9 / cost.memory_bandwidth
    # tokens per second per user ~ tps / step time (the first gap includes no wait here)
    assert 300 / col.outcomes[0]["t"] == pytest.approx(tps / step, rel=0.01)


def test_a_decode_engine_releases_an_ended_requests_reservation():
    # The quiescence check's release (rack.runtime.quiescence): a reservation held for a
    # request that has ended is dropped and its memory freed, nobody told.
    from _engine_fakes import GB, Client, FakeCollector, FakeCost, plan, run_cores
    from devices.engines.decode import DecodeEngine

    cost = FakeCost()
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(40 * GB, cost.weight_bytes))
    client = Client([(0.0, "d", "reserve_kv", Request(id=3, arrival_s=0.0, prompt_tokens=300, output_tokens=10), 300, None, "client")])
    run_cores([col, eng, client], idle=False)          # granted, waiting for its KV
    assert eng.held_requests() == [3] and eng.ledger.snapshot()["held_bytes"].get("reserved", 0) > 0
    eng.release(1.0, [3])
    assert eng.held_requests() == [] and eng.is_idle()
    # nothing sent (after a virtual run the outbox is the driver's queue, a deque)
    assert eng.ledger.snapshot()["held_bytes"].get("reserved", 0) == 0 and len(eng.outbox) == 0
