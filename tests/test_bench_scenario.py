"""The plain GPU deployment `rack bench` replays (rack/scenarios/a100-llama2-70b.toml)."""

from __future__ import annotations

from rack.wiring.load import load_scenario
from rack.wiring.topology import build_topology


def test_a100_llama2_scenario_is_eight_tp2_colocated_replicas():
    sc = load_scenario("a100-llama2-70b")
    assert sc.model == "llama-2-70b" and sc.weight_dtype == "bf16" and sc.kv_dtype == "bf16"
    assert [p.role for p in sc.pools] == ["both"]
    pool = sc.pools[0]
    assert pool.device == "a100" and pool.instances == 8 and pool.tp == 2 and pool.pp == 1
    assert (sc.slo.ttft_ms, sc.slo.tpot_ms) == (2000.0, 200.0)
    specs = build_topology(sc, [0, 1])
    engines = [s for s in specs if s.kind == "both"]
    assert len(engines) == 8
    assert all(s.factory.endswith("ColocatedEngine") for s in engines)
    assert not any(s.kind in ("prefill", "decode", "interconnect") for s in specs)
    # every request goes to a colocated instance (no prefill pool)
    router = next(s for s in specs if s.kind == "router")
    assert not router.kwargs["prefill"] and len(router.kwargs["local"]) == 8
