"""Admission: context limits (reject or truncate) and requests whose KV can never fit
are refused by the router at arrival, before any prefill time is spent on them."""

from __future__ import annotations

import numpy as np
import pytest

from rack.serving.admission import KVFit, context_verdict
from rack.run.runner import run_scenario
from rack.wiring.scenario import ScenarioError, parse_scenario
from rack.wiring.load import load_scenario, check_hardware
from workloads import Request


def test_context_verdict_rules():
    assert context_verdict(100, 50, None) == (50, None)
    assert context_verdict(4096, 1, 4096) == (0, "prompt_exceeds_context")
    assert context_verdict(4000, 96, 4096) == (96, None)
    assert context_verdict(4000, 97, 4096) == (0, "exceeds_context")
    assert context_verdict(4000, 500, 4096, "truncate") == (96, None)


def test_kvfit_rounds_to_blocks_and_follows_the_policy():
    fit = KVFit(capacity_bytes=10 * 160, block_tokens=16, block_bytes=160)
    assert fit.fits(160) and not fit.fits(161)
    assert fit.fits_decode(100, 61) and not fit.fits_decode(100, 62)


@pytest.fixture(scope="module")
def llama2():
    return load_scenario("a100-llama2-70b")


def _stats_tokens(out) -> int:
    return sum(int(s.get("tokens_computed", 0)) for s in out.stats.values())


def test_kvfit_max_tokens_is_the_bound_fits_checks():
    # the router compares a request's tokens with max_tokens instead of calling fits:
    # both must agree at every token count, around each capacity's last whole block
    for cap, bt, bb in [(10 * 160, 16, 160), (10 * 160 + 159, 16, 160), (159, 16, 160), (0, 16, 160),
                        (-1, 16, 160), (1000, 1, 7), (5, 16, 0), (-5, 16, 0)]:
        fit = KVFit(capacity_bytes=cap, block_tokens=bt, block_bytes=bb)
        most = fit.max_tokens()
        for tokens in range(0, 400):
            assert fit.fits(tokens) == (tokens <= most), (cap, bt, bb, tokens)


def test_prompt_over_the_context_limit_is_rejected_without_prefill(llama2):
    # Llama-2-70B serves 4,096 tokens: an 18k-token prompt must not be served
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=18_000, output_tokens=100),
            Request(id=1, arrival_s=0.0, prompt_tokens=1_000, output_tokens=100),
            Request(id=2, arrival_s=0.0, prompt_tokens=4_000, output_tokens=200)]
    out = run_scenario(llama2, reqs, runtime="virtual")
    c = out.columns
    assert list(c["outcome"]) == ["rejected", "completed", "rejected"]
    assert list(c["reason"]) == ["prompt_exceeds_context", "", "exceeds_context"]
    assert np.isnan(c["t_prefill_queued"][0]) and np.isnan(c["t_prefill_queued"][2])
    assert _stats_tokens(out) == 1_000           # only the admitted prompt was computed
    assert out.results["requests"]["rejected_by_reason"] == {"prompt_exceeds_context": 1, "exceeds_context": 1}


def test_truncate_serves_limit_minus_prompt_tokens(llama2):
    sc = llama2.with_overrides(context_overflow="truncate", max_model_len=3_000)
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=2_900, output_tokens=400),
            Request(id=1, arrival_s=0.0, prompt_tokens=500, output_tokens=20)]
    out = run_scenario(sc, reqs, runtime="virtual")
    c = out.columns
    assert list(c["outcome"]) == ["completed", "completed"]
    assert list(c["output_tokens"]) == [100, 20] and list(c["requested_output_tokens"]) == [400, 20]
    assert out.results["requests"]["truncated"] == 1
    # TPOT divides by the tokens actually produced, and equals the mean ITL
    assert c["tpot_s"][0] == pytest.approx((c["e2e_s"][0] - c["ttft_s"][0]) / 99)
    per = out.snapshot["itl"].per_request()
    itl = per["itl_flat"][: per["itl_lengths"][0]]
    assert len(itl) == 99 and itl.mean() == pytest.approx(c["tpot_s"][0])


def test_max_model_len_cannot_exceed_the_model(llama2):
    data = llama2.model_dump()
    data["max_model_len"] = 8192
    with pytest.raises(ScenarioError, match="max_model_len: 8192 exceeds Llama-2-70B's context of 4096"):
        check_hardware(parse_scenario(data), "x.toml")


def test_request_too_large_for_decode_kv_is_rejected_at_admission():
    sc = load_scenario("helios-cs3-kimi-k2")
    from rack.wiring.topology import check_fit, cost_model

    decode = sc.pool("decode")
    cost = cost_model(sc, decode)
    plan = check_fit(sc, decode, cost)
    keep = 60_000 * cost.kv_bytes_per_token          # decode KV for ~60k tokens only
    data = sc.model_dump()
    data["pools"][[p["name"] for p in data["pools"]].index("decode")]["memory_reserve_fraction"] = \
        1 - (plan.weight_bytes + keep) / plan.capacity_bytes
    sc = parse_scenario(data)
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=50_000, output_tokens=20_000),   # final 70k: never
            Request(id=1, arrival_s=0.0, prompt_tokens=50_000, output_tokens=100)]
    out = run_scenario(sc, reqs, runtime="virtual")
    c = out.columns
    assert list(c["outcome"]) == ["rejected", "completed"]
    assert c["reason"][0] == "exceeds_decode_kv_capacity"
    assert np.isnan(c["t_prefill_start"][0])
    assert _stats_tokens(out) == 50_000
    # under "preempt" too: it would outgrow the whole capacity even alone
    data["pools"][[p["name"] for p in data["pools"]].index("decode")]["admission_policy"] = "preempt"
    out = run_scenario(parse_scenario(data), reqs, runtime="virtual")
    assert list(out.columns["outcome"]) == ["rejected", "completed"]
    assert _stats_tokens(out) == 50_000


def test_prompt_too_large_for_every_prefill_instance_is_rejected():
    sc = load_scenario("gpu-only-kimi-k2")
    from rack.wiring.topology import check_fit, cost_model

    pool = sc.pools[0]
    cost = cost_model(sc, pool)
    plan = check_fit(sc, pool, cost)
    keep = 30_000 * cost.kv_bytes_per_token
    data = sc.model_dump()
    data["pools"][0]["memory_reserve_fraction"] = 1 - (plan.weight_bytes + keep) / plan.capacity_bytes
    out = run_scenario(parse_scenario(data), [Request(id=0, arrival_s=0.0, prompt_tokens=40_000, output_tokens=5)],
                       runtime="virtual")
    assert out.columns["outcome"][0] == "rejected"
    assert out.columns["reason"][0] == "prompt_exceeds_kv_capacity"
