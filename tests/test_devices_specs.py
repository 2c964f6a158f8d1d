"""Specs: parameter counts and KV bytes against published figures; refusal of bad specs."""

import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from devices.catalog import get_device, get_model, model_names
from devices.specs import CollectiveTable, HardwareSpec, ModelSpec

HARDWARE_MD = Path(__file__).resolve().parents[2] / "shared" / "reference" / "hardware.md"

# Published totals / active counts the issue names (within 2 %).
PUBLISHED = [
    ("llama-3.1-70b", 70.6e9, None),
    ("llama-3.1-405b", 405.9e9, None),
    ("deepseek-v3", 671e9, 37e9),
    # Kimi-K2: the model card's "1 T" is rounded; the technical report says 1.04 T.
    ("kimi-k2", 1.04e12, 32e9),
    ("llama-3.1-8b", 8.03e9, None),
    ("gpt-oss-120b", 116.83e9, 5.13e9),
    ("qwen3-235b-a22b", 235.1e9, None),
]

# KV bytes per token at 16 bit, from reference/hardware.md ("Models").
KV16 = {
    "llama-3.1-8b": 131_072, "llama-3.1-70b": 327_680, "llama-3.1-405b": 516_096,
    "deepseek-v3": 70_272, "kimi-k2": 70_272, "qwen3-235b-a22b": 192_512,
    "gpt-oss-120b": 73_728, "grok-1": 262_144, "llama-2-70b": 327_680,
}


@pytest.mark.parametrize("key,total,active", PUBLISHED)
def test_parameter_counts_match_published(key, total, active):
    m = get_model(key)
    assert m.params_total == pytest.approx(total, rel=0.02)
    if active is not None:
        assert m.params_active == pytest.approx(active, rel=0.02)


def test_kimi_k2_is_a_trillion_parameters():
    m = get_model("kimi-k2")
    assert 1.0e12 <= m.params_total <= 1.04e12
    assert m.params_active < 0.035 * m.params_total


@pytest.mark.parametrize("key,kv", sorted(KV16.items()))
def test_kv_bytes_per_token_exact(key, kv):
    assert get_model(key).kv_bytes_per_token("bf16") == kv
    assert get_model(key).kv_bytes_per_token("fp8") == kv // 2


@pytest.mark.skipif(not HARDWARE_MD.exists(), reason="shared/reference/hardware.md not beside the repo")
def test_kv_bytes_match_reference_file_rows():
    rows = 0
    for line in HARDWARE_MD.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 10 or not re.match(r"^[0-9,]+", cells[-1]):
            continue
        name = re.sub(r"\s*\(.*\)$", "", cells[0])
        expected = int(re.match(r"^([0-9,]+)", cells[-1]).group(1).replace(",", ""))
        assert get_model(name).kv_bytes_per_token("bf16") == expected, name
        rows += 1
    assert rows >= 8


def test_llama2_differs_from_llama31_only_in_vocab():
    a, b = get_model("llama-2-70b"), get_model("llama-3.1-70b")
    assert a.params_total < b.params_total
    assert b.params_total - a.params_total == 2 * (128256 - 32000) * 8192


def test_weight_bytes_per_dtype():
    m = get_model("kimi-k2")
    assert m.weight_bytes("fp8") == pytest.approx(m.params_total, rel=1e-9)
    assert m.weight_bytes("bf16") == 2 * m.weight_bytes("fp8")
    assert m.weight_bytes("fp4") == pytest.approx(m.weight_bytes("fp8") / 2, abs=1)
    with pytest.raises(ValueError, match="unknown dtype"):
        m.weight_bytes("int3")


def test_sliding_window_kv_is_capped_beyond_the_window():
    m = get_model("gpt-oss-120b")
    per_layer = m.kv_elements_per_token_per_layer * 2
    assert m.kv_bytes_for_context(100) == pytest.approx(100 * m.kv_bytes_per_token("bf16"))
    at = m.kv_bytes_for_context(np.array([10_000, 20_000]))
    assert at[1] - at[0] == pytest.approx(10_000 * 18 * per_layer)   # only the 18 full layers grow


def test_flops_per_token_grows_with_context_and_counts_active_params():
    m = get_model("deepseek-v3")
    f = m.flops_per_token(np.array([1, 1000, 100_000]))
    assert np.all(np.diff(f) > 0)
    assert f[0] == pytest.approx(2 * m.params_active, rel=1e-3)


def test_expected_distinct_experts():
    m = get_model("deepseek-v3")
    d = m.expected_distinct_experts(np.array([0, 1, 8, 64, 10_000]))
    assert d[0] == 0 and d[1] == pytest.approx(8)
    assert np.all(np.diff(d) > 0) and d[-1] == pytest.approx(256, rel=1e-6)
    assert get_model("llama-3.1-8b").expected_distinct_experts(5) == 0


def _hw(**over):
    base = dict(key="x", name="X", memory_bytes=80e9, memory_bandwidth_Bps=3e12, peak_flops={"bf16": 1e15},
                scale_out_bandwidth_Bps=50e9, idle_w=50, peak_w=700)
    base.update(over)
    return HardwareSpec(**base)


@pytest.mark.parametrize("field,value", [("memory_bytes", 0), ("memory_bytes", -1e9),
                                         ("memory_bandwidth_Bps", 0), ("scale_out_bandwidth_Bps", -5)])
def test_zero_or_negative_capacity_is_refused_with_a_clear_message(field, value):
    with pytest.raises(ValidationError) as e:
        _hw(**{field: value})
    msg = str(e.value)
    assert field in msg and "greater than 0" in msg


def test_other_bad_hardware_specs_are_refused():
    with pytest.raises(ValidationError, match="bf16"):
        _hw(peak_flops={"fp8": 1e15})
    with pytest.raises(ValidationError, match="peak_flops.fp8"):
        _hw(peak_flops={"bf16": 1e15, "fp8": 0})
    with pytest.raises(ValidationError, match="idle_w"):
        _hw(idle_w=900)
    with pytest.raises(ValidationError, match="efficiency"):
        _hw(efficiency={"decode_memory": 1.5})
    with pytest.raises(ValidationError, match="memroy_bytes"):
        _hw(memroy_bytes=1)


def test_bad_model_specs_are_refused():
    base = get_model("llama-3.1-8b").model_dump()
    with pytest.raises(ValidationError, match="n_layers"):
        ModelSpec(**{**base, "n_layers": 0})
    with pytest.raises(ValidationError, match="n_kv_heads"):
        ModelSpec(**{**base, "n_kv_heads": 64})
    with pytest.raises(ValidationError, match="n_active_experts"):
        ModelSpec(**{**base, "moe": {"n_routed_experts": 4, "n_active_experts": 8, "expert_ffn_size": 10}})


def test_compute_dtype_falls_back_to_a_wider_one():
    h100, a100, b200 = get_device("h100"), get_device("a100"), get_device("b200")
    assert h100.compute_dtype("fp4") == "fp8" and h100.dense_peak_flops("fp4") == h100.peak_flops["fp8"]
    assert a100.compute_dtype("fp8") == "bf16" and a100.compute_dtype("fp4") == "bf16"
    assert b200.compute_dtype("fp4") == "fp4"


def test_wafer_peak_uses_the_dense_fraction():
    cs3 = get_device("cs3")
    # the dense reading: 900,000 PEs x 8-wide FP16 x 2 x 1.1 GHz, ~125 / 8 (cs3.toml)
    assert cs3.peak_flops["bf16"] == pytest.approx(900_000 * 8 * 2 * 1.1e9, rel=0.01)
    assert cs3.dense_peak_flops("bf16") == pytest.approx(cs3.peak_flops["bf16"] * cs3.dense_fraction)
    half = cs3.model_copy(update={"dense_fraction": 0.5})
    assert half.dense_peak_flops("bf16") == pytest.approx(cs3.peak_flops["bf16"] / 2)
    launch = get_device("cs3", stack="2024-08")
    assert launch.kind == "wafer" and launch.layer_latency_s > 0 and launch.pipeline_hop_latency_s > 0
    for key in ("h100", "mi300x", "b300"):       # the hardware alone: no stack latencies
        hw = get_device(key, stack="roofline")
        assert hw.layer_latency_s == hw.moe_layer_latency_s == hw.pipeline_hop_latency_s == 0
        d = get_device(key)           # its default serving stack has them (a per-MoE-layer latency may be
        # folded into the per-iteration overhead where the fitted rows cannot tell them apart)
        assert d.moe_layer_latency_s + d.iteration_overhead_s > 0 and d.prefill_layer_latency_s > 0


def test_capacities_in_the_datasheet_unit():
    # HBM capacities are binary: the "80 GB" H100 and A100 hold 80 GiB
    for key, gib in (("h100", 80), ("a100", 80), ("h200", 141), ("mi300x", 192), ("b300", 288)):
        assert get_device(key).memory_bytes == gib * 2 ** 30
    assert get_device("cs3").memory_bytes == 44e9           # SRAM: 900,000 x 48 KB, decimal
    with pytest.raises(ValidationError, match="memory_gib or memory_bytes"):
        HardwareSpec(key="x", name="x", memory_gib=1, memory_bytes=1e9, memory_bandwidth_Bps=1e12,
                     peak_flops={"bf16": 1e15}, scale_out_bandwidth_Bps=1e10, idle_w=1, peak_w=2)


def test_collective_tables_interpolate_in_log2_and_price_bytes():
    t = CollectiveTable(latency_us={2: 10.0, 8: 30.0}, busbw_GBps={2: 100.0, 8: 100.0})
    xfer, lat = t.parts("all_reduce", 0.0, 4)
    assert lat == pytest.approx(20e-6) and xfer == 0          # halfway between 2 and 8 in log2
    xfer, lat = t.parts("all_reduce", 1e9, 8)
    assert xfer == pytest.approx(1e9 * 2 * 7 / 8 / 100e9)      # nccl-tests busbw convention
    assert t.parts("all_gather", 1e9, 8)[0] == pytest.approx(1e9 * 7 / 8 / 100e9)
    assert t.parts("all_reduce", 1e9, 64)[1] == pytest.approx(30e-6)   # held beyond the table
    with pytest.raises(ValidationError):
        CollectiveTable(latency_us={2: 10.0}, busbw_GBps={4: 100.0})


def test_every_catalog_model_derives_consistently():
    for key in model_names():
        m = get_model(key)
        assert 0 < m.params_active <= m.params_total + m.lm_head_params
        s = m.summary()
        assert s["weight_bytes"]["bf16"] == 2 * s["weight_bytes"]["fp8"]


def test_fp4_kernel_path_efficiency_applies_to_fp4_weights_only():
    """A stack whose FP4 GEMMs run another kernel family (Efficiency.fp4_compute) prices
    FP4 weights at that efficiency and every other dtype at its own; a stack without it
    is the same entry for every dtype. A faster kernel path never makes a pass slower."""
    from devices.costmodel import CostModel, Parallelism
    from devices.specs import Efficiency

    dev = get_device("b300-sglang")
    assert dev.efficiency.fp4_compute is not None
    fp4 = dev.for_weights("fp4").efficiency
    assert fp4.prefill_compute == fp4.decode_compute == dev.efficiency.fp4_compute
    assert dev.for_weights("fp8") is dev
    assert get_device("h200-sglang").for_weights("fp4") is get_device("h200-sglang")
    with pytest.raises(ValidationError, match="fp4_compute"):
        Efficiency(fp4_compute=0.0)

    slow = dev.model_copy(update={"efficiency": dev.efficiency.model_copy(update={"fp4_compute": 0.02})})
    fast = dev.model_copy(update={"efficiency": dev.efficiency.model_copy(update={"fp4_compute": 0.2})})
    steps = [CostModel("deepseek-r1", d, Parallelism(tp=8), weight_dtype="fp4").prefill(8192).time_s for d in (slow, fast)]
    assert steps[1] < steps[0]
    fp8 = [CostModel("deepseek-r1", d, Parallelism(tp=8), weight_dtype="fp8").prefill(8192).time_s for d in (slow, fast)]
    assert fp8[0] == fp8[1]


def test_prefill_attention_efficiency_prices_prompt_attention_only():
    """Efficiency.prefill_attention_compute prices the attention FLOPs of prompt passes:
    a slower attention kernel makes a long prompt slower, by more than a short one (its
    share of the pass grows with the prompt), and leaves decode steps as they were."""
    from devices.costmodel import CostModel, Parallelism

    dev = get_device("h200-sglang")
    assert dev.efficiency.prefill_attention_compute is not None

    def with_att(e):
        return dev.model_copy(update={"efficiency": dev.efficiency.model_copy(
            update={"prefill_attention_compute": e})})

    slow, fast = (CostModel("deepseek-r1", with_att(e), Parallelism(tp=8)) for e in (0.1, 0.6))
    long_ = [c.prefill(8192).time_s for c in (slow, fast)]
    short = [c.prefill(1024).time_s for c in (slow, fast)]
    assert long_[0] > long_[1] and short[0] >= short[1]
    assert long_[0] / long_[1] > short[0] / short[1]
    ctx = np.full(32, 4096)
    assert slow.decode_step(ctx).time_s == fast.decode_step(ctx).time_s
