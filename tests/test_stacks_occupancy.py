"""Scenario pools name their software stack and batch cap; energy follows each
device's occupancy (a pipeline stage idles while the others hold the micro-batches)."""

from __future__ import annotations

import numpy as np
import pytest

from devices.costmodel import CostModel, Parallelism
from rack.run.runner import run_scenario
from rack.wiring.scenario import ScenarioError, parse_scenario
from rack.wiring.load import load_scenario
from rack.wiring.topology import build_topology
from workloads import Request


def _scenario(**pool):
    base = {"name": "p", "device": "h200", "role": "both", "tp": 8}
    return parse_scenario({"name": "t", "model": "deepseek-r1", "pools": [{**base, **pool}],
                           "slo": {"ttft_ms": 2000.0, "tpot_ms": 80.0}})


def _engine_kwargs(sc):
    spec = next(s for s in build_topology(sc, [0]) if s.kind == "both")
    return spec.kwargs


def test_pool_stack_and_max_num_seqs_default_from_the_stack():
    kw = _engine_kwargs(_scenario())
    assert kw["cost"].device.key == "h200-sglang" and kw["max_batch"] == 512      # SGLang's cap
    kw = _engine_kwargs(_scenario(device="b200", stack="trtllm", tp=4))
    assert kw["cost"].device.key == "b200-trtllm" and kw["max_batch"] == 1024
    assert _engine_kwargs(_scenario(max_num_seqs=64))["max_batch"] == 64
    assert _engine_kwargs(_scenario(max_batch=32))["max_batch"] == 32              # old files' name
    with pytest.raises(ScenarioError, match="not both"):
        _scenario(max_batch=32, max_num_seqs=64)


def test_unknown_stack_names_the_field():
    sc = _scenario(stack="tgi")
    from rack.wiring.load import check_hardware
    with pytest.raises(ScenarioError, match=r"pools\[0\]\.stack.*no software stack 'tgi'.*sglang"):
        check_hardware(sc, "t.toml")


def test_shipped_wafer_scenarios_run_the_current_stack():
    for name in ("helios-cs3-kimi-k2", "wafer-only-kimi-k2", "conditional-split-kimi-k2"):
        sc = load_scenario(name)
        wafer = next(p for p in sc.pools if p.device == "cs3")
        assert wafer.stack == "2024q4"


def test_pipeline_stages_take_turns():
    cost = CostModel("kimi-k2", "cs3", Parallelism(pp=28), "fp8", "fp8")
    few = cost.decode_steps(np.full(4, 2000), 10)
    full = cost.decode_steps(np.full(56, 2000), 10)
    # 4 requests on 28 stages: each stage works for 4 of the 28 stage-times (plus 27
    # hops) of a step
    assert 0.5 * 4 / 28 < few.busy(10) / float(few.time_s.sum()) <= 4 / 28
    assert full.busy(10) / float(full.time_s.sum()) > 0.75     # full: busy but for the hops
    one = cost.decode_step([2048])
    assert one.device_busy_s < one.time_s / 28          # one request's token crosses 28 stages
    prompt = cost.prefill([2048])                       # 2,048 tokens stream through every system's layers
    assert 0.9 < prompt.device_busy_s / prompt.time_s < 1.0     # idle only while the first token fills in


def test_energy_follows_the_devices_occupancy():
    sc = load_scenario("wafer-only-kimi-k2")
    reqs = [Request(id=i, arrival_s=0.5 * i, prompt_tokens=2000, output_tokens=200) for i in range(6)]
    out = run_scenario(sc, reqs, runtime="virtual")
    st = next(s for n, s in out.stats.items() if n.startswith("wafer"))
    assert 0 < st["device_busy_s"] < 0.5 * st["busy_s"]      # few requests: most stages idle
    u = out.results["utilization"]["wafer"]
    assert u["busy_fraction"] < u["running_fraction"] and u["stack"].startswith("Cerebras")
    inst = out.results["energy"]["instances"]["wafer-0"]
    assert inst["busy_s"] == pytest.approx(st["device_busy_s"])
    assert "busy" in out.results["energy"]["sensitivity"]
