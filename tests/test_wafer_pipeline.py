"""The wafer serves prompts through its pipeline (issue 33): several requests' prompt
chunks stream through the layer regions at once, beside the decode micro-batches; chunk
sizes come from the TPOT target; a decode tier is sized from the weights plus a
workload's KV; a split rack's gain over the wafer alone stays under the physics ceiling.
"""

from __future__ import annotations

import numpy as np
import pytest

from devices.chunking import tpot_chunks
from devices.costmodel import CostModel, Parallelism
from devices.planner import devices_for_workload
from rack.experiments.ceiling import split_ratio_ceiling
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from rack.wiring.sizing import chunk_sizes, cost_model, prefill_scheduling
from rack.wiring.topology import build_topology
from workloads import Request

WAFERS = [("kimi-k2", "cs3", 28, "fp8"), ("kimi-k2.6", "cs3", 16, "fp4"), ("llama-3.1-70b", "cs3", 4, "bf16"),
          ("llama-3.1-8b", "cs3-2024-08", 1, "bf16"), ("qwen3-1.7b", "cs3-waferengine", 1, "bf16")]


@pytest.mark.parametrize("model, device, pp, wd", WAFERS)
def test_a_prompt_token_never_costs_the_wafer_more_pipeline_time_than_a_decode_token(model, device, pp, wd):
    """B requests each with one prompt token in flight against B requests each with one
    decode token, at the same context: the prompt step never takes longer (the same
    arithmetic without the decode step's weight reads; the streams of several requests
    share the regions as decode micro-batches do). Also in a mixed step: adding B
    prompt streams of one token to B decode tokens costs at most the B decode tokens.
    Batches up to the streams a region interleaves (`prompt_streams`, 512 as shipped:
    the scenarios' max_num_seqs); beyond it the streams queue."""
    c = CostModel(model, device, Parallelism(pp=pp), wd, "fp8")
    assert c.device.prompt_streams == 512
    for b in (1, 2, 7, pp, 64, 256, 512):
        for ctx in (0, 100, 4096, 32768, 131072):
            prompt = c.prefill(np.ones(b), np.full(b, ctx)).time_s
            decode = c.decode_step(np.full(b, ctx)).time_s
            assert prompt <= decode * (1 + 1e-9), (b, ctx, prompt, decode)
            both = c.mixed(np.ones(b), np.full(b, ctx), np.full(b, ctx)).time_s
            assert both - decode <= decode * (1 + 1e-9), (b, ctx, both, decode)


def test_one_request_is_the_stream_the_rows_measure_and_many_stream_at_once():
    c = CostModel("kimi-k2", "cs3", Parallelism(pp=28), "fp8", "fp8")
    tau = c.device.prompt_token_layer_s
    one = c.prefill([8192], [0])
    first = c.prefill([1], [0])
    assert one.time_s == pytest.approx(first.time_s + 8191 * tau, rel=0.02)        # one stream, as fitted
    many = c.prefill(np.full(100, 8192), 0)
    assert 100 * one.time_s / many.time_s >= 5                      # streams in flight at once
    assert many.flops / (many.time_s * c.peak_flops) <= c.device.efficiency.prefill_compute   # never past the roof
    # one stream per region (the lower end of the range): the prompts queue behind one another
    serial = CostModel("kimi-k2", c.device.model_copy(update={"prompt_streams": 1}), Parallelism(pp=28), "fp8", "fp8")
    assert serial.prefill([8192], [0]).time_s == pytest.approx(one.time_s)
    assert serial.prefill(np.full(100, 8192), 0).time_s == pytest.approx(
        first.time_s + (100 * 8192 - 1) * tau + (many.time_s - first.time_s - 8191 * tau), rel=0.01)


def test_estimate_shows_the_pipelines_prompt_rate_and_its_mfu():
    from rack.cli.estimate import build_estimate

    est = build_estimate("kimi-k2", "cs3", 28, None, None, 1, None, "fp8", 1, 4096, 8192)
    w = est["prefill"]["wafer"]
    assert w["aggregate_tokens_per_s"] >= 10 * w["single_tokens_per_s"] and w["gain"] >= 10
    assert w["single_tokens_per_s"] == pytest.approx(est["prefill"]["single"]["tokens_per_s"])
    assert 0 < w["single_mfu"] < w["aggregate_mfu"] <= 0.55
    assert est["chunks"]["step_s"] <= 0.080 and est["sizing"]["devices"] == 24      # weights + one request's KV


def _prefills(sc, n: int, prompt: int = 8192) -> float:
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=4) for i in range(n)]
    out = run_scenario(sc, reqs, runtime="virtual", kv_payload="account")
    assert out.results["requests"]["completed"] == n
    return float(np.max(out.columns["t_prefill_end"]))


def test_a_hundred_prompts_at_once_prefill_far_faster_in_aggregate_than_one():
    """`wafer-only-kimi-k2`: 100 prompts of 8,192 tokens arriving together finish their
    prefills at least 5x faster in aggregate than one alone (1.00x when the wafer
    streamed one prompt at a time)."""
    sc = load_scenario("wafer-only-kimi-k2")
    one, hundred = _prefills(sc, 1), _prefills(sc, 100)
    assert 100 * one / hundred >= 5, (one, hundred)


def test_a_decoding_user_waits_for_no_long_prompt():
    """A prompt of 32k tokens arriving while a user decodes: with chunk sizes from the
    80 ms TPOT target no step holds the user longer than the target (8,192-token chunks
    held it ~333 ms each)."""
    sc = load_scenario("wafer-only-kimi-k2")
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=1000, output_tokens=2000),
            Request(id=1, arrival_s=0.2, prompt_tokens=32768, output_tokens=4)]
    itl = run_scenario(sc, reqs, runtime="virtual", kv_payload="account").results["latency"]["itl_s"]["max"]
    assert itl <= sc.slo.tpot_ms * 1e-3
    fixed = sc.model_copy(update={"pools": [sc.pools[0].model_copy(update={"chunk_tokens": 8192})]})
    held = run_scenario(fixed, reqs, runtime="virtual", kv_payload="account").results["latency"]["itl_s"]["max"]
    assert held > 4 * sc.slo.tpot_ms * 1e-3          # the test can fail: one 8,192-token stream


def test_the_chunk_rule_keeps_steps_within_the_tpot_target_and_the_engine_gets_it():
    sc = load_scenario("wafer-only-kimi-k2")
    pool = sc.pools[0]
    cost = cost_model(sc, pool)
    t = sc.slo.tpot_ms * 1e-3
    rule = tpot_chunks(cost, t, 512)
    n, b = rule["prompt_chunk_tokens"], rule["chunk_tokens"]
    none = np.zeros(0)
    assert cost.mixed([n], [0], none).time_s <= t / 2 < cost.mixed([n + 1], [0], none).time_s
    assert rule["step_s"] <= t and 8192 > n > 100 and b > 10 * n
    assert chunk_sizes(sc, pool, cost) == (b, n)
    engine = next(s for s in build_topology(sc, [0]) if s.kind == "both")
    assert (engine.kwargs["chunk_tokens"], engine.kwargs["prompt_chunk_tokens"]) == (b, n)
    # a user may set the sizes, or the rule's own target (the SLO unchanged); a bad target is refused
    own = pool.model_copy(update={"chunk_tokens": 4096, "prompt_chunk_tokens": 512})
    assert chunk_sizes(sc, own, cost) == (4096, 512)
    tight = pool.model_copy(update={"chunk_tpot_ms": 20.0})
    rule20 = tpot_chunks(cost, 0.020, 512)
    assert chunk_sizes(sc, tight, cost) == (rule20["chunk_tokens"], rule20["prompt_chunk_tokens"])
    assert rule20["prompt_chunk_tokens"] < n
    with pytest.raises(ValueError, match="TPOT target"):
        tpot_chunks(cost, 0.0)


def test_the_study_says_how_the_wafer_alone_schedules_from_its_scenario():
    """findings.md's sentence on the wafer alone's scheduling is built from the chunk
    sizes its engine gets (rack.wiring.sizing.prefill_scheduling)."""
    from rack.experiments.study.findings import _wafer_scheduling
    from rack.experiments.study.config import WAFER

    sc = load_scenario(WAFER)
    budget, per = chunk_sizes(sc, sc.pools[0], cost_model(sc, sc.pools[0]))
    text = _wafer_scheduling()
    assert text == prefill_scheduling(sc)
    assert f"{per:,} tokens of each prompt" in text and f"{budget:,} tokens in all" in text
    assert "fuses" not in text


@pytest.mark.parametrize("name, requests, context", [("wafer-only-kimi-k2", 512, 8192),
                                                     ("wafer-only-kimi-k2.6", 512, 8192),
                                                     ("helios72-cs3-kimi-k2.6", 512, 8192)])
def test_wafer_tiers_are_sized_from_their_weights_and_kv(name, requests, context):
    sc = load_scenario(name)
    pool = next(p for p in sc.pools if p.device == "cs3")
    rule = devices_for_workload(lambda n: CostModel(sc.model, "cs3", Parallelism(pp=n), sc.weight_dtype,
                                                    sc.kv_dtype), requests, context, max_devices=61)
    assert pool.pp == rule["devices"]
    assert pool.max_num_seqs == requests
    if sc.model == "kimi-k2.6":
        assert rule["weights_only_devices"] == 12 and rule["devices"] < 28
        # a study shows 12 or 28 systems by resizing the pool
        for n in (12, 28):
            assert sc.with_pool(pool.name, pp=n).pool(pool.name).pp == n


def test_a_split_racks_gain_stays_under_the_physics_ceiling():
    """1k-in/1k-out chat, closed loop at a few concurrencies: helios-cs3-kimi-k2's
    tokens/s per kW over the wafer alone's, read at equal tokens/s per user (linear
    interpolation on the wafer alone's curve, never extrapolated), stays under
    (1 + prompt/output tokens) x the power ratio (rack.experiments.ceiling)."""
    from rack.experiments.interactivity import LadderTask, interpolate, run_point
    from workloads.load import LoadPlan

    plan = LoadPlan("random", input_len=1024, output_len=1024)
    curves = {n: [run_point(LadderTask(load_scenario(n).model_dump(), plan, c, c)) for c in (1, 16, 128, 512)]
              for n in ("wafer-only-kimi-k2", "helios-cs3-kimi-k2")}
    alone, split = curves["wafer-only-kimi-k2"], curves["helios-cs3-kimi-k2"]
    assert not any("error" in p for p in alone + split)
    read = 0
    for p in split:
        x = p["tps_user_p50"]
        tps = interpolate(alone, x, metric="output_tps_per_kw")
        power = interpolate(alone, x, metric="mean_power_w")
        if tps["value"] is None:
            continue
        prompt = sum(q["prompt_tokens_computed"] for q in alone) / sum(q["output_tokens"] for q in alone)
        ceiling = split_ratio_ceiling(prompt, 1.0, power["value"], p["mean_power_w"])
        assert p["output_tps_per_kw"] / tps["value"] <= ceiling, (x, p["output_tps_per_kw"], tps, ceiling)
        read += 1
    assert read >= 2
    assert split_ratio_ceiling(1024, 1024, 600e3, 700e3) == pytest.approx(2 * 6 / 7)
    with pytest.raises(ValueError, match="output_tokens"):
        split_ratio_ceiling(1, 0, 1, 1)
