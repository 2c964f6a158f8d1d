"""TTFT as the client sees it in the split rack (first_token = "decode"): the first token
comes from the decode engine's first step after the KV has landed, so TTFT carries
the prefill, the waits for decode memory and the link, the KV transfer, the decode
admission and that first step; first_token = "prefill" keeps the earlier behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from rack.experiments.sweep import with_link_bandwidth
from workloads import Request, load_requests

REFERENCE = Path(__file__).parent / "data" / "reference_first_token_prefill.json"


@pytest.fixture(scope="module")
def split():
    return load_scenario("helios-cs3-kimi-k2")


@pytest.fixture(scope="module")
def excerpt_run(split):
    reqs = load_requests("mooncake-excerpt", window=(0, 30))
    return reqs, run_scenario(split, reqs, runtime="virtual")


def test_split_ttft_includes_transfer_and_first_decode_step(excerpt_run):
    reqs, out = excerpt_run
    c = out.columns
    done = c["outcome"] == "completed"
    assert done.sum() == len(reqs)
    first_step = c["t_first_token"] - c["t_decode_admit"]
    assert np.all(first_step[done] > 0)
    bound = (c["t_prefill_end"] - c["t_arrival"]) + (c["t_transfer_end"] - c["t_transfer_start"]) + first_step
    assert np.all(c["ttft_s"][done] >= bound[done] - 1e-12)
    # TPOT stays exact: (E2E - TTFT) / (n - 1), and the mean of the ITL samples
    multi = done & (c["output_tokens"] >= 2)
    np.testing.assert_allclose(c["tpot_s"][multi],
                               (c["e2e_s"] - c["ttft_s"])[multi] / (c["output_tokens"][multi] - 1))


def test_breakdown_counts_each_part_once_and_sums_to_e2e(excerpt_run):
    _, out = excerpt_run
    stages = {s["stage"]: s for s in out.results["breakdown"]["stages"]}
    assert stages["first_decode_step"]["mean_s"] > 0
    assert sum(s["mean_s"] for s in stages.values()) == pytest.approx(out.results["latency"]["e2e_s"]["mean"])


def _one_request_run(scenario, bandwidth_gbps=None):
    sc = scenario if bandwidth_gbps is None else with_link_bandwidth(scenario, bandwidth_gbps)
    req = [Request(id=0, arrival_s=0.0, prompt_tokens=20_000, output_tokens=64)]
    return run_scenario(sc, req, runtime="virtual").columns


def test_halving_the_link_at_idle_moves_ttft_by_the_added_transfer_time_only(split):
    full = _one_request_run(split)
    half = _one_request_run(split, split.links[0].bandwidth_GBps / 2)
    transfer = lambda c: float(c["t_transfer_end"][0] - c["t_transfer_start"][0])  # noqa: E731
    added = transfer(half) - transfer(full)
    assert added > 0
    assert float(half["ttft_s"][0] - full["ttft_s"][0]) == pytest.approx(added, rel=0, abs=1e-12)
    assert float(half["tpot_s"][0]) == pytest.approx(float(full["tpot_s"][0]), rel=1e-12)


def test_a_request_waiting_for_decode_memory_gets_it_in_its_ttft():
    # a decode engine with room for one such request at a time (reserve policy books
    # prompt + output - 1 tokens): the second waits for the first to complete
    from rack.wiring.scenario import parse_scenario
    from rack.wiring.topology import check_fit, cost_model

    sc = load_scenario("helios-cs3-kimi-k2")
    decode = sc.pool("decode")
    cost = cost_model(sc, decode)
    plan = check_fit(sc, decode, cost)
    # hold back all but ~150k tokens of KV as workspace
    keep = 150_000 * cost.kv_bytes_per_token
    data = sc.model_dump()
    data["pools"][[p["name"] for p in data["pools"]].index("decode")]["memory_reserve_fraction"] = \
        1 - (plan.weight_bytes + keep) / plan.capacity_bytes
    sc = parse_scenario(data)
    plan = check_fit(sc, sc.pool("decode"), cost)
    kv_tokens = int(plan.kv_bytes // cost.kv_bytes_per_token)
    assert 140_000 < kv_tokens < 160_000
    prompt = 90_000
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=prompt, output_tokens=40),
            Request(id=1, arrival_s=0.001, prompt_tokens=prompt, output_tokens=40)]
    c = run_scenario(sc, reqs, runtime="virtual").columns
    assert list(c["outcome"]) == ["completed", "completed"]
    order = np.argsort(c["t_completion"])
    a, b = order
    first_step = c["t_first_token"][b] - c["t_decode_admit"][b]
    transfer = c["t_transfer_end"][b] - c["t_transfer_start"][b]
    assert c["t_kv_reserved"][b] >= c["t_completion"][a]
    assert c["ttft_s"][b] >= c["t_completion"][a] - c["t_arrival"][b] + transfer + first_step - 1e-12


def test_first_token_from_prefill_reproduces_the_earlier_figures():
    ref = json.loads(REFERENCE.read_text())
    for name, want in ref.items():
        sc = load_scenario(name).with_overrides(first_token="prefill")
        reqs = load_requests("mooncake-excerpt", window=tuple(want["window"]))
        c = run_scenario(sc, reqs, runtime="virtual").columns
        assert c["id"].tolist() == want["id"]
        assert c["outcome"].tolist() == want["outcome"]
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            got = np.array([np.nan if v is None else v for v in c[key]], float)
            exp = np.array([np.nan if v is None else v for v in want[key]], float)
            np.testing.assert_allclose(got, exp, rtol=0, atol=1e-9, err_msg=f"{name} {key}")


def test_first_token_from_prefill_is_the_end_of_the_prompt(split):
    reqs = [Request(id=i, arrival_s=0.1 * i, prompt_tokens=3000, output_tokens=1 + i) for i in range(4)]
    c = run_scenario(split.with_overrides(first_token="prefill"), reqs, runtime="virtual").columns
    np.testing.assert_array_equal(c["t_first_token"], c["t_prefill_end"])
    # a one-token request completes at prefill and ships nothing
    assert np.isnan(c["t_transfer_start"][0]) and c["e2e_s"][0] == c["ttft_s"][0]
    d = run_scenario(split, reqs, runtime="virtual").columns
    assert not np.isnan(d["t_transfer_start"][0]) and np.all(d["ttft_s"] > c["ttft_s"])
