"""Roofline cost model: physics that must hold, vectorisation, parallelism, speculation."""

import numpy as np
import pytest

from devices.catalog import get_device
from devices.costmodel import CostModel, Parallelism, SpeculativeConfig

CASES = [
    ("llama-3.1-70b", "h100", Parallelism(tp=8), "fp8"),
    ("llama-3.1-70b", "mi300x", Parallelism(tp=1), "fp8"),
    ("llama-3.1-405b", "b200", Parallelism(tp=8), "fp4"),
    ("deepseek-v3", "mi355x", Parallelism(tp=8, ep=8), "fp8"),
    ("kimi-k2", "cs3", Parallelism(pp=24), "fp8"),
    ("llama-3.1-70b", "cs3", Parallelism(pp=4), "bf16"),
    ("gpt-oss-120b", "h200", Parallelism(tp=2), "fp4"),
    ("llama-2-70b", "a100", Parallelism(tp=2), "bf16"),
    ("qwen3-235b-a22b", "mi455x", Parallelism(tp=4, pp=2, ep=4), "fp8"),
]


@pytest.mark.parametrize("model,device,par,wdt", CASES)
def test_decode_step_reads_every_weight_at_most_at_full_bandwidth(model, device, par, wdt):
    c = CostModel(model, device, par, weight_dtype=wdt, kv_dtype="fp8")
    dev = get_device(device)
    floor = c.model.weight_bytes(wdt) / (dev.memory_bandwidth_Bps * par.n_devices)
    for batch in (1, 8, 256):
        s = c.decode_steps(np.full(batch, 2048), 3)
        # dense models read all weights; MoE ones at least the touched experts, so compare
        # with the bytes actually moved and, for dense models, with all weights
        assert np.all(s.time_s >= s.bytes / c.memory_bandwidth * (1 - 1e-9))
        assert np.all(s.time_s >= s.flops / c.peak_flops * (1 - 1e-9))
        if c.model.moe is None:
            assert np.all(s.time_s >= floor)


@pytest.mark.parametrize("model,device,par,wdt", CASES)
def test_prefill_is_never_faster_than_peak_flops(model, device, par, wdt):
    c = CostModel(model, device, par, weight_dtype=wdt, kv_dtype="fp8")
    for n, cached in ((1, 0), (512, 0), (8192, 0), (4096, 60_000)):
        it = c.prefill([n], [cached])
        assert it.time_s >= it.flops / c.peak_flops
        assert it.time_s >= it.bytes / c.memory_bandwidth
        assert it.bound in ("compute", "memory", "communication", "latency")


@pytest.mark.parametrize("model,device,par,wdt", CASES)
def test_time_grows_with_context(model, device, par, wdt):
    c = CostModel(model, device, par, weight_dtype=wdt, kv_dtype="fp8")
    dec = [c.decode_step(np.full(32, ctx)).time_s for ctx in (128, 4096, 32_768, 131_072)]
    pre = [c.prefill([1024], [cached]).time_s for cached in (0, 4096, 32_768, 131_072)]
    assert all(b >= a for a, b in zip(dec, dec[1:])) and dec[-1] > dec[0]
    assert all(b >= a for a, b in zip(pre, pre[1:])) and pre[-1] > pre[0]
    steps = c.decode_steps(np.full(32, 1000), 50).time_s
    assert np.all(np.diff(steps) >= 0)


def test_more_tensor_parallelism_cuts_compute_but_pays_all_reduce():
    prev = None
    for tp in (1, 2, 4, 8):
        c = CostModel("llama-3.1-70b", "h100", Parallelism(tp=tp), "fp8", "fp8")
        it = c.prefill([8192], [0])
        if tp == 1:
            assert it.comm_s == 0
        else:
            assert it.comm_s > 0
            assert it.compute_s < prev.compute_s and it.memory_s < prev.memory_s
            assert it.comm_s > prev.comm_s
        prev = it


def test_tp_beyond_the_scale_up_domain_uses_the_slower_nic():
    inside = CostModel("llama-3.1-405b", "h100", Parallelism(tp=8), "fp8", "fp8").prefill([4096])
    across = CostModel("llama-3.1-405b", "h100", Parallelism(tp=16), "fp8", "fp8").prefill([4096])
    assert across.comm_s > 5 * inside.comm_s


def test_pipeline_pays_hops_and_micro_batches_recover_throughput():
    c = CostModel("llama-3.1-70b", "cs3", Parallelism(pp=4), "bf16", "bf16")
    dev = c.device
    one = c.decode_step([1000])
    # single stream: the sum of stage times plus 3 hops, dominated by the latency terms
    assert one.bound == "latency"
    assert one.time_s >= 80 * dev.layer_latency_s + 3 * (dev.pipeline_hop_latency_s + dev.scale_out_latency_s)
    four = c.decode_step(np.full(4, 1000))
    assert four.time_s == pytest.approx(one.time_s, rel=0.01)   # 4 micro-batches in flight
    many = c.decode_step(np.full(400, 1000))
    assert 400 / many.time_s > 50 / one.time_s


def test_decode_steps_is_the_loop_it_replaces():
    for spec in (None, SpeculativeConfig(3, 0.7, "draft_model", "llama-3.2-1b")):
        c = CostModel("gpt-oss-120b", "h100", Parallelism(tp=2), "fp8", "fp8", speculative=spec)
        ctx = np.array([5, 90, 127, 128, 300, 5000])
        s = c.decode_steps(ctx, 40)
        for j in (0, 1, 17, 39):
            one = c.decode_steps(ctx + j * c.tokens_per_step, 1)
            assert s.time_s[j] == pytest.approx(one.time_s[0], rel=1e-12)
            assert s.bytes[j] == pytest.approx(one.bytes[0], rel=1e-12)
            assert s.flops[j] == pytest.approx(one.flops[0], rel=1e-12)
        assert s.time_s.shape == s.flops.shape == s.bytes.shape == s.comm_s.shape == (40,)


def test_decode_steps_covers_big_batches_and_many_steps():
    # Its speed is a benchmark's (rack bench); a wall-time bound made the outcome depend on the host's load.
    c = CostModel("gpt-oss-120b", "h100", Parallelism(tp=4), "fp8", "fp8",
                  SpeculativeConfig(2, 0.6))
    ctx = np.random.default_rng(0).integers(1, 32_000, 1000)
    s = c.decode_steps(ctx, 10_000)
    assert s.time_s.shape == (10_000,) and np.all(s.time_s > 0)
    assert np.all(np.diff(s.time_s) >= 0)            # the contexts only grow: no step gets cheaper


def test_moe_decode_reads_the_experts_the_batch_touches():
    c = CostModel("deepseek-v3", "h200", Parallelism(tp=8), "fp8", "fp8")
    m = c.model
    active_only = (m.pass_resident_params + m.n_moe_layers * 8 * m.expert_params)
    b1 = c.decode_step([1000]).bytes
    b64 = c.decode_step(np.full(64, 1000)).bytes
    b4k = c.decode_step(np.full(4096, 10)).bytes
    # MLA's latent KV is read by every device of the tp group (`kv_replication` copies)
    rep = c.kv_replication
    assert rep == 8
    kv1 = m.kv_bytes_per_token("fp8") * 1001 * rep
    assert b1 == pytest.approx(active_only + kv1, rel=0.01)
    assert b1 < b64 < b4k
    assert b4k < m.weight_bytes("fp8") * 1.01 + 4096 * 11 * m.kv_bytes_per_token("fp8") * rep
    longer = c.decode_step(np.full(64, 2000)).bytes - b64     # same weights, 1,000 more tokens each
    assert longer == pytest.approx(64 * 1000 * m.kv_bytes_per_token("fp8") * rep, rel=1e-9)


def test_dtypes_change_bytes_and_flops():
    bf = CostModel("llama-3.1-70b", "b200", Parallelism(tp=8), "bf16", "bf16")
    f8 = CostModel("llama-3.1-70b", "b200", Parallelism(tp=8), "fp8", "fp8")
    f4 = CostModel("llama-3.1-70b", "b200", Parallelism(tp=8), "fp4", "fp8")
    assert bf.weight_bytes == 2 * f8.weight_bytes and bf.kv_bytes_per_token == 2 * f8.kv_bytes_per_token
    assert f4.peak_flops == 2 * f8.peak_flops == 4 * bf.peak_flops
    assert f8.decode_step([100]).time_s < bf.decode_step([100]).time_s
    assert f4.prefill([8192]).compute_s < f8.prefill([8192]).compute_s
    h = CostModel("llama-3.1-70b", "h100", Parallelism(tp=8), "fp4", "fp8")
    assert h.peak_flops == CostModel("llama-3.1-70b", "h100", Parallelism(tp=8), "fp8", "fp8").peak_flops
    with pytest.raises(ValueError, match="weight_dtype"):
        CostModel("llama-3.1-70b", "h100", weight_dtype="int8")


def test_speculative_decoding():
    s = SpeculativeConfig(draft_tokens=3, acceptance_rate=0.8)
    assert s.tokens_per_step == pytest.approx((1 - 0.8 ** 4) / 0.2)
    assert SpeculativeConfig(4, 0.0).tokens_per_step == 1.0
    plain = CostModel("deepseek-v3", "b200", Parallelism(tp=8), "fp8", "fp8")
    mtp = CostModel("deepseek-v3", "b200", Parallelism(tp=8), "fp8", "fp8", SpeculativeConfig(1, 0.8, "mtp"))
    assert mtp.tokens_per_step == pytest.approx(1.8)
    assert mtp.weight_bytes > plain.weight_bytes and mtp.kv_bytes_per_token > plain.kv_bytes_per_token
    p, q = plain.decode_step(np.full(8, 2000)), mtp.decode_step(np.full(8, 2000))
    assert q.time_s > p.time_s                        # verifying 2 tokens + one MTP pass costs more...
    assert 1.8 / q.time_s > 1 / p.time_s              # ...but yields more tokens per second
    draft = CostModel("llama-3.1-70b", "h100", Parallelism(tp=8), "fp8", "fp8",
                      SpeculativeConfig(4, 0.7, "draft_model", "llama-3.2-1b"))
    assert draft.draft.key == "llama-3.2-1b"
    assert draft.weight_bytes == draft.model.weight_bytes("fp8") + draft.draft.weight_bytes("fp8")
    for bad in (dict(draft_tokens=0, acceptance_rate=0.5), dict(draft_tokens=2, acceptance_rate=1.0),
                dict(draft_tokens=2, acceptance_rate=0.5, method="draft_model"),
                dict(draft_tokens=2, acceptance_rate=0.5, method="eagle")):
        with pytest.raises(ValueError):
            SpeculativeConfig(**bad)


def test_mixed_iteration_sits_between_its_parts():
    c = CostModel("llama-3.1-70b", "mi300x", Parallelism(tp=1), "fp8", "fp8")
    pre = c.prefill([2048], [0])
    dec = c.decode_step(np.full(64, 3000))
    mix = c.mixed([2048], [0], np.full(64, 3000))
    assert max(pre.time_s, dec.time_s) <= mix.time_s <= pre.time_s + dec.time_s
    assert mix.flops == pytest.approx(pre.flops + dec.flops)
    assert c.mixed([], [], np.full(4, 100)).time_s == pytest.approx(c.decode_step(np.full(4, 100)).time_s)
    assert c.mixed([512], [0], []).time_s > 0
    with pytest.raises(ValueError):
        c.mixed([], [], [])


@pytest.mark.parametrize("name", ["wafer-only-kimi-k2", "conditional-split-kimi-k2", "gpu-only-kimi-k2"])
def test_a_mixed_pass_never_gets_faster_when_decode_requests_join(name):
    """More work in a pass never takes less time. On the wafer (28 pipeline stages) a
    prompt chunk counted as one micro-batch made an 8,192-token chunk cost 44 ms alone
    and 2.3 ms beside 28 decode requests (found by a new-user trial): its tokens
    stream through the stages as in a prefill pass, whatever shares the pass."""
    from rack.wiring.load import load_scenario
    from rack.wiring.sizing import cost_model

    sc = load_scenario(name)
    for pool in sc.pools:
        c = cost_model(sc, pool)
        if not c.device.mixed_prefill:
            continue
        for chunk in (1, 5, 512, 8192):
            times = [c.mixed([chunk], [0], np.full(b, 2000)).time_s for b in (0, 1, 2, 5, 28, 100, 400)]
            assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:])), (pool.name, chunk, times)
        if c.parallelism.pp > 1:   # a chunk alone streams through the stages: no slower than a prefill pass
            assert c.mixed([8192], [0], []).time_s <= c.prefill([8192], [0]).time_s


@pytest.mark.parametrize("model, device, par", [
    ("kimi-k2", "cs3-2024q4", Parallelism(pp=28)),
    ("llama-3.1-70b", "cs3", Parallelism(pp=4)),
    ("llama-3.1-405b", "h200-sglang", Parallelism(tp=8, pp=2)),
])
def test_a_pipelined_prefill_never_pays_for_needless_micro_batches(model, device, par):
    """Each micro-batch pays the per-layer latencies and a weight read, so a stack does
    not split 2 tokens in two: prefill time is non-decreasing in tokens, and one more
    token never adds 10% (with m = min(pp, tokens) it added 50% on two GPU stages)."""
    c = CostModel(model, device, par, "bf16", "bf16")
    times = [c.prefill([t], [0]).time_s for t in range(1, 65)]
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert times[1] < 1.1 * times[0]
    big = c.prefill([8192], [0])          # long prompts still stream through every stage
    if c.device.prompt_token_layer_s > 0:
        # a wafer streams the tokens through its layer regions, one per region at a time
        tau = c.device.prompt_token_layer_s
        assert times[0] + 8191 * tau <= big.time_s < times[0] + 8191 * tau * 1.2
    else:
        assert big.time_s < 8192 * times[0] / par.pp


@pytest.mark.parametrize("model, device, tp, chunk", [
    ("gpt-oss-120b", "b300-trtllm", 1, 512), ("llama-2-70b", "a100-vllm", 2, 16)])
def test_a_decode_request_joining_a_fused_pass_never_speeds_up_its_weight_reads(model, device, tp, chunk):
    """A fused pass (vLLM, TensorRT-LLM) reads the weights once for both parts; it took
    the decode phase's streaming efficiency as soon as one decode request joined, so a
    memory-bound chunk got 6% faster with more work (found by a physics probe)."""
    c = CostModel(model, device, Parallelism(tp=tp), "bf16", "bf16")
    assert c.device.mixed_prefill
    alone = c.mixed([chunk], [0], [])
    assert alone.time_s == pytest.approx(c.prefill([chunk], [0]).time_s)
    assert c.mixed([chunk], [0], [2000]).time_s >= alone.time_s
    assert c.mixed([chunk], [0], [2000]).time_s >= c.decode_step([2000]).time_s


def test_instance_rates_and_bad_inputs():
    c = CostModel("llama-3.1-8b", "h100", Parallelism(tp=4), "fp8", "fp8")
    dev = get_device("h100")
    assert c.peak_flops == 4 * dev.peak_flops["fp8"] and c.memory_bandwidth == 4 * dev.memory_bandwidth_Bps
    with pytest.raises(ValueError, match="empty"):
        c.decode_steps([], 3)
    with pytest.raises(ValueError, match=">= 0"):
        c.decode_steps([-1, 5], 3)
    with pytest.raises(ValueError, match="no new tokens"):
        c.prefill([0, 0], [5, 5])
    assert c.decode_steps([10], 0).time_s.shape == (0,)
    with pytest.raises(ValueError, match="ep"):
        Parallelism(tp=4, ep=3)
    with pytest.raises(ValueError, match="tp"):
        Parallelism(tp=0)


def test_sliding_window_position_sums_match_brute_force():
    from devices.costmodel import _range_min_sum, _shift_min_sum

    rng = np.random.default_rng(1)
    c = rng.integers(0, 300, 50).astype(float)
    n = rng.integers(0, 300, 50).astype(float)
    w = 128.0
    brute = [sum(min(p, w) for p in range(int(ci) + 1, int(ci + ni) + 1)) for ci, ni in zip(c, n)]
    assert np.allclose(_range_min_sum(c, n, w), brute)
    cs = np.sort(c)
    prefix = np.concatenate(([0.0], np.cumsum(cs)))
    shifts = np.array([0.0, 1.0, 2.5, 64.0, 500.0])
    brute = [np.minimum(c + s, w).sum() for s in shifts]
    assert np.allclose(_shift_min_sum(cs, prefix, shifts, w), brute)
