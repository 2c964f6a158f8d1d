"""Memory planner: weights, reserve and KV; models that do not fit."""

import re

import pytest

from devices.catalog import get_device
from devices.costmodel import CostModel, Parallelism, SpeculativeConfig
from devices.planner import ModelDoesNotFit, format_bytes, plan_memory


def test_kimi_k2_on_four_cs3_says_what_is_needed():
    c = CostModel("kimi-k2", "cs3", Parallelism(pp=4), "fp8", "fp8")
    with pytest.raises(ModelDoesNotFit) as e:
        plan_memory(c)
    msg = str(e.value)
    assert re.match(r"Kimi-K2 \(fp8\) needs 1.03 TB of weights; 4 CS-3 .*hold 176 GB", msg)
    assert msg.endswith("use at least 24 systems")


def test_the_suggested_count_fits():
    plan = plan_memory(CostModel("kimi-k2", "cs3", Parallelism(pp=24), "fp8", "fp8"))
    assert plan.kv_tokens > 100_000 and plan.kv_blocks == plan.kv_tokens // 16
    with pytest.raises(ModelDoesNotFit, match="GPUs"):
        plan_memory(CostModel("llama-3.1-405b", "h100", Parallelism(tp=4), "bf16", "bf16"))


def test_budget_adds_up():
    c = CostModel("llama-3.1-70b", get_device("h100", stack="roofline"), Parallelism(tp=4), "fp8", "fp8")
    p = plan_memory(c)
    assert p.capacity_bytes == 4 * 80 * 2 ** 30                 # "80 GB" HBM is 80 GiB
    assert p.reserve_bytes == int(0.1 * 80 * 2 ** 30) * 4
    assert p.weight_bytes == c.weight_bytes
    assert p.weight_bytes + p.reserve_bytes + p.kv_bytes <= p.capacity_bytes
    assert p.capacity_bytes - (p.weight_bytes + p.reserve_bytes + p.kv_bytes) < 4
    assert p.kv_tokens == p.kv_bytes // c.kv_bytes_per_token
    assert p.max_batch(4096) == p.kv_blocks // 256
    assert plan_memory(c, reserve_fraction=0.0).kv_bytes == p.kv_bytes + p.reserve_bytes


def test_trtllm_kv_cache_is_a_fraction_of_the_memory_left_after_profiling():
    """free_fraction sizes the KV cache as TensorRT-LLM does: fraction x (memory - weights
    - the stack's kv_profile_overhead_gb), per device; the budget still adds up; a smaller
    fraction or more profiling memory never leaves more KV; a stack without the
    overhead term keeps its activation reserve."""
    dev = get_device("b200-trtllm")
    assert dev.kv_profile_overhead_gb is not None
    c = CostModel("deepseek-r1", dev, Parallelism(tp=8), "fp8", "fp8")
    p = plan_memory(c, free_fraction=0.8)
    left = dev.memory_bytes - p.per_device_weight_bytes - dev.kv_profile_overhead_gb * 1e9
    assert p.per_device_kv_bytes == pytest.approx(0.8 * left, abs=2)
    assert p.weight_bytes + p.reserve_bytes + p.kv_bytes <= p.capacity_bytes
    kv = [plan_memory(CostModel("deepseek-r1", dev.model_copy(update={"kv_profile_overhead_gb": gb}),
                                Parallelism(tp=8), "fp8", "fp8"), free_fraction=f).kv_tokens
          for f, gb in ((0.9, 5.0), (0.8, 5.0), (0.8, 20.0), (0.5, 20.0))]
    assert kv == sorted(kv, reverse=True) and kv[0] > kv[-1]
    plain = get_device("h200-sglang")
    assert plain.kv_profile_overhead_gb is None
    h = CostModel("deepseek-r1", plain, Parallelism(tp=8), "fp8", "fp8")
    assert plan_memory(h, free_fraction=0.5).kv_bytes == plan_memory(h).kv_bytes
    with pytest.raises(ValueError, match="free_fraction"):
        plan_memory(c, free_fraction=0.0)


def test_draft_model_weights_and_kv_count():
    base = plan_memory(CostModel("llama-3.1-70b", "h100", Parallelism(tp=2), "fp8", "fp8"))
    spec = plan_memory(CostModel("llama-3.1-70b", "h100", Parallelism(tp=2), "fp8", "fp8",
                                 SpeculativeConfig(3, 0.8, "draft_model", "llama-3.2-1b")))
    assert spec.weight_bytes > base.weight_bytes and spec.kv_tokens < base.kv_tokens


def test_weights_that_leave_no_kv_room():
    c = CostModel("llama-3.1-70b", get_device("h100", stack="roofline"), Parallelism(tp=1), "bf16", "bf16")
    with pytest.raises(ModelDoesNotFit, match="use at least 2 GPUs"):
        plan_memory(c)
    c = CostModel("llama-3.1-70b", "mi300x", Parallelism(tp=1), "bf16", "bf16")
    tight = 1 - (c.weight_bytes + 1e6) / c.device.memory_bytes      # leaves 1 MB: less than one KV block
    with pytest.raises(ModelDoesNotFit, match="less than one block"):
        plan_memory(c, reserve_fraction=tight)


def test_bad_arguments():
    c = CostModel("llama-3.1-8b", "h100")
    with pytest.raises(ValueError):
        plan_memory(c, reserve_fraction=1.0)
    with pytest.raises(ValueError):
        plan_memory(c, block_size=0)


def test_format_bytes():
    assert format_bytes(1.026e12) == "1.03 TB" and format_bytes(176e9) == "176 GB"
    assert format_bytes(44e9) == "44 GB" and format_bytes(512) == "512 B"


def test_mla_kv_is_held_by_every_tp_device_unless_attention_is_data_parallel():
    tp8 = CostModel("deepseek-v3", "h200", Parallelism(tp=8), "fp8", "fp8")
    dp8 = CostModel("deepseek-v3", "h200", Parallelism(tp=8, ep=8, dp_attention=True), "fp8", "fp8")
    a, b = plan_memory(tp8), plan_memory(dp8)
    assert a.kv_replication == 8 and b.kv_replication == 1
    assert tp8.kv_held_bytes_per_token == 8 * tp8.kv_bytes_per_token
    # DP attention keeps 7 more copies of the attention blocks, and 8x the KV tokens
    assert b.weight_bytes - a.weight_bytes == dp8.replicated_weight_bytes > 0
    assert b.kv_tokens > 5 * a.kv_tokens
    llama = CostModel("llama-3.1-70b", "h200", Parallelism(tp=8), "fp8", "fp8")
    assert llama.kv_replication == 1                    # 8 KV heads over 8 devices: no copies
