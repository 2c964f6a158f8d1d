"""A host-memory KV tier under the prefix cache (devices.memory.HostKVTier): the
prefixes a device evicts are kept in host DRAM and loaded back over the host link
instead of recomputed, with the load's time in the iteration and its energy in the
run's (issue 33, item 3)."""

from __future__ import annotations

import pytest

from devices.engines.common import HOST_KV_JOULES_PER_BYTE
from devices.memory import HostKVTier, MemoryLedger, PrefixCache
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import Request


def test_the_tier_keeps_what_the_device_evicts_within_its_capacity():
    ledger = MemoryLedger(10 * 16 * 4, "dev")
    cache = PrefixCache(ledger, kv_bytes_per_token=4)
    cache.host = HostKVTier(capacity_bytes=3 * 64, bandwidth_Bps=1e3, joules_per_byte=2.0)
    assert cache.insert(range(10), 16) == 10
    assert cache.make_room(5 * 64)                       # five LRU entries leave the device
    host = cache.host
    assert host.stats["demoted_blocks"] == 5 and host.stats["dropped_blocks"] == 2 and len(host) == 3
    assert host.used_bytes == 3 * 64 <= host.capacity_bytes
    # a prefix's tail is evicted first (its head outlives it): blocks 9..5 went to the
    # host, whose capacity kept the three used last (7, 6, 5)
    assert cache.match(range(10), 16) == 5
    assert host.run(range(5, 10), 16) == 3 and host.run(range(8, 10), 16) == 0
    assert host.load(500) == pytest.approx(0.5) and host.stats["joules"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        HostKVTier(1, 0.0, 1.0)


def _sessions(n_sessions: int, turns: int, step: int, gap_s: float) -> list[Request]:
    """Sessions whose every turn resends the previous turns' prompt (growing by `step`)."""
    reqs, rid, bs = [], 0, 16
    for t in range(turns):
        for s in range(n_sessions):
            n = (t + 1) * step
            hashes = tuple((s << 20) + i for i in range(n // bs))
            reqs.append(Request(id=rid, arrival_s=t * gap_s + s * 0.05, prompt_tokens=n, output_tokens=20,
                                block_hashes=hashes, block_size=bs))
            rid += 1
    return reqs


def _reserve_for(sc, pool: str, kv_tokens: int) -> float:
    """The memory_reserve_fraction that leaves `pool`'s instances ~kv_tokens of KV."""
    from rack.wiring.sizing import check_fit, cost_model

    p = sc.pool(pool)
    cost = cost_model(sc, p)
    plan = check_fit(sc, p, cost)
    return 1 - (plan.weight_bytes + kv_tokens * cost.kv_held_bytes_per_token) / plan.capacity_bytes


def _run(sc, pool: str, gb: float, reqs, **pool_changes):
    pools = [p.model_copy(update={"host_kv_gb": gb, **pool_changes}) if p.name == pool else p for p in sc.pools]
    out = run_scenario(sc.model_copy(update={"pools": pools}), reqs, runtime="virtual", kv_payload="account")
    st = next(v for k, v in out.stats.items() if k.startswith(pool))
    return out, st


@pytest.mark.parametrize("name, pool", [("wafer-only-kimi-k2", "wafer"), ("helios-cs3-kimi-k2", "prefill")])
def test_evicted_session_prefixes_load_back_instead_of_being_recomputed(name, pool):
    """Either side: the wafer alone (its systems' host memory over their I/O) and the
    split's GPU prefill pool (its hosts' DRAM over PCIe). With the tier, fewer prompt
    tokens are computed; the loads' bytes, time and energy are booked and the energy
    joins the run's."""
    sc = load_scenario(name)
    reqs = _sessions(40, 3, 20000, 30.0)
    reserve = _reserve_for(sc, pool, 1_000_000)           # fewer tokens than the sessions' 2.4 M
    base_out, base = _run(sc, pool, 0.0, reqs, memory_reserve_fraction=reserve)
    out, st = _run(sc, pool, 2000.0, reqs, memory_reserve_fraction=reserve)
    assert base["host_kv"] is None and base_out.results["energy"]["host_kv_joules"] == 0.0
    assert base["prefix_cache"]["evicted_blocks"] > 0                       # the device cache overflows
    h = st["host_kv"]
    assert h["demoted_blocks"] > 0 and h["hit_blocks"] > 0 and h["loads"] > 0
    assert st["tokens_computed"] < base["tokens_computed"]
    assert st["tokens_computed"] + st["tokens_cached"] == base["tokens_computed"] + base["tokens_cached"]
    assert h["joules"] == pytest.approx(h["bytes_loaded"] * HOST_KV_JOULES_PER_BYTE)
    assert h["load_s"] == pytest.approx(h["bytes_loaded"] / h["bandwidth_Bps"])
    tiers = [v["host_kv"] for k, v in out.stats.items() if k.startswith(pool)]     # every instance's
    assert out.results["energy"]["host_kv_joules"] == pytest.approx(sum(t["joules"] for t in tiers))
    assert out.results["requests"]["completed"] == len(reqs)


def test_a_load_holds_the_iteration_that_starts_its_request():
    """A prefix evicted to the host tier (the device holds one 32k-token prompt's KV,
    a second prompt pushes the first out) and asked for again: that request's first
    iteration waits for the load over the host link, so a slower link adds exactly the
    longer load to its TTFT."""
    sc = load_scenario("wafer-only-kimi-k2")
    reserve = _reserve_for(sc, "wafer", 50_000)           # room for one prompt and its output

    def req(i, t, prefix):
        return Request(id=i, arrival_s=t, prompt_tokens=32768, output_tokens=2,
                       block_hashes=tuple(range(prefix, prefix + 2048)), block_size=16)

    reqs = [req(0, 0.0, 0), req(1, 5.0, 10_000), req(2, 10.0, 0)]
    ttft, loads = {}, {}
    for gbps in (1.0, 100.0):
        out, st = _run(sc, "wafer", 100.0, reqs, memory_reserve_fraction=reserve, host_kv_GBps=gbps)
        assert out.results["requests"]["completed"] == 3
        assert st["host_kv"]["loads"] == 1 and st["tokens_cached"] == 32767
        ttft[gbps] = float(out.columns["ttft_s"][2])
        loads[gbps] = st["host_kv"]["load_s"]
    assert loads[1.0] > 0.1            # the evicted tail's KV over 1 GB/s (the head stayed on the device)
    assert ttft[1.0] - ttft[100.0] == pytest.approx(loads[1.0] - loads[100.0], rel=1e-6)
