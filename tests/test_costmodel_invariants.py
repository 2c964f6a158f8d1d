"""Physical invariants of the cost model over the shipped deployments and a few
pipelines (a probe of 1,874 configurations found the violations these guard against:
a colocated prompt chunk that got faster as decode requests joined it, a pipelined
prefill that paid for needless micro-batches, a fused pass whose weight reads sped up
with more work, KV bytes missing their tensor-parallel replicas).

More work never takes less time; every figure is finite and >= 0; a device is never
busy longer than the pass; MFU and MBU never exceed 1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from devices.costmodel import CostModel, Parallelism
from rack.wiring.scenario import scenario_names
from rack.wiring.load import load_scenario
from rack.wiring.sizing import cost_model


def _models():
    out = {}
    for name in scenario_names():
        sc = load_scenario(name)
        for pool in sc.pools:
            out[f"{name}/{pool.name}"] = cost_model(sc, pool)
    out["llama-3.1-405b/h200 tp8 pp2"] = CostModel("llama-3.1-405b", "h200-sglang", Parallelism(tp=8, pp=2))
    out["llama-3.1-70b/cs3 pp4"] = CostModel("llama-3.1-70b", "cs3", Parallelism(pp=4), "bf16", "bf16")
    out["llama-2-70b/a100-vllm tp2"] = CostModel("llama-2-70b", "a100-vllm", Parallelism(tp=2), "bf16", "bf16")
    return out


MODELS = _models()


def _sane(c: CostModel, r, what: str) -> None:
    for k in ("time_s", "flops", "bytes", "comm_s", "compute_s", "memory_s", "device_busy_s"):
        x = getattr(r, k)
        assert math.isfinite(x) and x >= 0, (what, k, x)
    assert r.device_busy_s <= r.time_s * (1 + 1e-9), (what, r.device_busy_s, r.time_s)
    assert r.flops / (r.time_s * c.peak_flops) <= 1 + 1e-9, (what, "MFU")
    assert r.bytes / (r.time_s * c.memory_bandwidth) <= 1 + 1e-9, (what, "MBU")


def _non_decreasing(times: list[float], what: str, rel: float = 1e-9) -> None:
    bad = [i for i, (a, b) in enumerate(zip(times, times[1:])) if b < a * (1 - rel)]
    assert not bad, (what, bad[:3], [times[i:i + 2] for i in bad[:3]])


@pytest.mark.parametrize("key", sorted(MODELS))
def test_more_work_never_takes_less_time(key):
    c = MODELS[key]
    pp = c.parallelism.pp
    tokens = sorted({1, 2, 3, 8, pp - 1, pp, pp + 1, 2 * pp, 64, 512, 2048, 8192} - {0})
    runs = [c.prefill([n], [0]) for n in tokens]
    for n, r in zip(tokens, runs):
        _sane(c, r, f"prefill {n}")
    _non_decreasing([r.time_s for r in runs], "prefill in new tokens")
    _non_decreasing([c.prefill([64], [k]).time_s for k in (0, 100, 4096, 32768)], "prefill in cached tokens")
    batches = sorted({1, 2, 3, pp, pp + 1, 16, 64, 256})
    steps = [c.decode_step(np.full(b, 2000)) for b in batches]
    for b, r in zip(batches, steps):
        _sane(c, r, f"decode {b}")
    _non_decreasing([r.time_s for r in steps], "decode in batch")
    _non_decreasing([c.decode_step(np.full(8, k)).time_s for k in (100, 1000, 8000, 32000)], "decode in context")
    if not c.device.mixed_prefill:
        return
    for chunk in (1, 16, 512, 8192):
        mixed = [c.mixed([chunk], [0], np.full(b, 2000)) for b in sorted({0, 1, 2, 5, pp, 64})]
        for r in mixed:
            _sane(c, r, f"mixed {chunk}")
        _non_decreasing([r.time_s for r in mixed], f"mixed chunk {chunk} in decode requests")
        assert mixed[-1].time_s >= c.decode_step(np.full(64, 2000)).time_s * (1 - 1e-9)
    # A pass's micro-batches are balanced (its tokens spread evenly), a simplification:
    # a few more prompt tokens can make the decode requests' share of a micro-batch
    # lighter (3e-4 on the wafer); 1% still catches a wrong micro-batch count (19x).
    _non_decreasing([c.mixed([n], [0], np.full(4, 2000)).time_s for n in (1, 16, 512, 8192)],
                    "mixed in prompt tokens", rel=0.01)


def test_dp_attention_prompt_waits_for_its_busiest_rank():
    """With data-parallel attention a prompt's attention block runs on one rank
    (`CostModel._dp_skew`): one prompt costs more than an even split over the ranks
    would, R equal prompts cost nothing extra, the extra never makes more work faster,
    and the same prompts without DP attention are untouched."""
    dp = CostModel("deepseek-r1", "gb200-sglang", Parallelism.deployed(tp=1, ep=4, dp_attention=True))
    tp = CostModel("deepseek-r1", "gb200-sglang", Parallelism.deployed(tp=4, ep=4))
    t = dp._t
    one, four = np.array([8192.0]), np.full(4, 8192.0)
    lin, att = dp._dp_skew(t, one, np.zeros(1), 8192.0, 1.0)
    assert lin == pytest.approx(2 * t.attn_weight_bytes / t.wb * 3 * 8192) and att == pytest.approx(3.0)
    assert dp._dp_skew(t, four, np.zeros(4), 4 * 8192.0, 1.0) == (0.0, 0.0)
    assert tp._dp_skew(tp._t, one, np.zeros(1), 8192.0, 1.0) == (0.0, 0.0)
    # one prompt alone is slower than a quarter of four, but four never faster than one
    t1, t4 = dp.prefill([8192]).time_s, dp.prefill(four).time_s
    assert t4 / 4 < t1 <= t4
    # more prompts never take less time (the skew shrinks as the work grows)
    times = [dp.prefill(np.full(k, 4096.0)).time_s for k in range(1, 9)]
    assert all(b >= a for a, b in zip(times, times[1:]))
