"""The wafer's prompt processing (issue 22): prompts stream through the layers' PE
regions, a term fitted on sourced wafer prompt rows; the measured wafer power; and
`rack estimate`'s defaults (issue 26: native weight dtype, the kernels a model uses)."""

from __future__ import annotations

import json

import pytest

from devices.catalog import get_device, get_model, load_hf_config
from devices.costmodel import CostModel, Parallelism
from devices.validation import PROMPT_KINDS, load_rows
from devices.wafer_prompt import fit_wafer_prompt
from rack.cli.estimate import build_estimate


@pytest.fixture(scope="module")
def fit():
    return fit_wafer_prompt()


def test_at_least_three_sourced_prompt_rows_each_within_35_percent(fit):
    rows = [r for r in load_rows() if r.kind in PROMPT_KINDS]
    assert len(rows) >= 3
    assert all(r.source and r.prompt_tokens > 0 for r in rows)
    assert len(fit["rows"]) == len(rows)
    assert all(abs(r["relative_error"]) <= 0.35 for r in fit["rows"]), fit["rows"]
    assert fit["at_bound"] == []


def test_catalog_carries_the_fitted_terms(fit):
    assert get_device("cs3").prompt_token_layer_s == pytest.approx(fit["prompt_token_layer_s"], rel=0.02)
    for stack, value in fit["request_latency_s"].items():
        assert get_device(stack).request_latency_s == pytest.approx(value, rel=0.02)
    # every CS-3 stack runs the hardware's prompt term
    assert {get_device(k).prompt_token_layer_s for k in ("cs3-2024-08", "cs3-2024q4", "cs3-waferengine")} == \
        {get_device("cs3").prompt_token_layer_s}


def test_a_prompt_streams_through_the_layers():
    cost = CostModel("kimi-k2", "cs3", Parallelism(pp=28), "fp8", "fp8")
    tau = cost.device.prompt_token_layer_s
    one, t1k, t8k = (cost.prefill([n], [0]) for n in (1, 1024, 8192))
    # each further token adds its time in a layer region, plus its (small) arithmetic
    assert (t8k.time_s - t1k.time_s) == pytest.approx(7168 * tau, rel=0.05)
    assert t1k.time_s == pytest.approx(one.time_s + 1023 * tau, rel=0.05)
    assert t8k.bound == "latency"
    # a longer cached context costs its attention arithmetic on top
    assert cost.prefill([1024], [100_000]).time_s > t1k.time_s


def test_kimi_prefill_rate_against_decode_inside_the_public_range():
    est = build_estimate("kimi-k2", "cs3", 28, None, None, 1, None, "fp8", 1, 4096, 8192)
    ratio = est["prefill"]["single"]["rate_vs_decode"]
    assert 3 <= ratio <= 20, ratio
    keys = {t["key"] for t in est["uncertain_terms"]}
    assert {"cs3.prompt_token_layer_us", "cs3.idle_power_fraction"} <= keys


def test_wafer_power_as_measured():
    cs3 = get_device("cs3")
    assert cs3.idle_w / cs3.peak_w == pytest.approx(0.8)        # xPU-athalon: ~80 % of TDP at idle
    assert cs3.peak_w == 23000


def test_estimate_defaults_to_the_native_dtype():
    est = build_estimate("gpt-oss-120b", "h100", 1, None, None, 1, None, "fp8", 1, 4096, 1024)
    assert est["fits"] and est["instance"]["weight_dtype"] == "fp4"
    assert build_estimate("kimi-k2", "cs3", 28, None, None, 1, None, "fp8", 1, 4096, 1024)["instance"][
        "weight_dtype"] == "fp8"
    forced = build_estimate("gpt-oss-120b", "h100", 1, None, None, 1, "fp8", "fp8", 1, 4096, 1024)
    assert forced["instance"]["weight_dtype"] == "fp8"


def test_hf_config_native_dtype(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
           "intermediate_size": 128}
    for extra, want in (({"quantization_config": {"quant_method": "mxfp4"}}, "fp4"),
                        ({"quantization_config": {"quant_method": "fp8"}}, "fp8"),
                        ({"torch_dtype": "bfloat16"}, "bf16"), ({}, None)):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, **extra}))
        assert load_hf_config(path).native_dtype == want


def test_stack_line_lists_only_the_kernels_a_model_runs():
    dev = get_device("h200", "sglang")
    dense = dev.software_stack_for(get_model("llama-3.1-70b"))
    assert "MLA" not in dense and "MoE" not in dense and dense.startswith("SGLang 0.5.9:")
    assert "MLA" in dev.software_stack_for(get_model("kimi-k2"))
    moe = dev.software_stack_for(get_model("gpt-oss-120b"))
    assert "MoE" in moe and "MLA" not in moe
    est = build_estimate("llama-3.1-8b", "h200", 1, None, None, 1, None, "fp8", 1, 1024, 128)
    assert "MLA" not in est["software_stack"]
