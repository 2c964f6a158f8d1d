"""KV-cache-aware routing (`prefix_aware`): the prefix cache's KV events, the router's
block index built from them, the cost, and the hit ratio it reaches on the Mooncake
conversation trace against round robin and the ideal."""

from __future__ import annotations

import random

import pytest

from devices.memory import MemoryLedger, PrefixCache
from rack.runtime.placement import construct
from rack.runtime.virtual import VirtualDriver
from rack.serving.collector import Collector
from rack.serving.prefix_routing import CachedBlockIndex, cached_tokens, prefix_aware_choice
from rack.serving.router import Router
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from rack.wiring.topology import build_topology
from workloads import Request, ideal_prefix_hits, load_requests
from workloads.core import Core


def req(i, hashes, prompt=None, bs=4, t=0.0):
    prompt = prompt if prompt is not None else len(hashes) * bs
    return Request(id=i, arrival_s=t, prompt_tokens=prompt, output_tokens=2,
                   block_hashes=tuple(hashes), block_size=bs)


def with_policy(policy, **router):
    sc = load_scenario()
    return sc.with_overrides(router={**sc.router.model_dump(), "policy": policy, **router})


# ---------------------------------------------------------------- the cache's events
def test_prefix_cache_journal_replays_to_its_contents():
    """Stored and removed events, replayed in order, give exactly the cached keys,
    through inserts that evict (LRU), pins, and clear."""
    ledger = MemoryLedger(40 * 4, "hbm")          # room for 40 blocks of 4 tokens, 1 B/token
    cache = PrefixCache(ledger, 1)
    cache.journal = []
    rng = random.Random(3)
    held: set = set()
    for step in range(400):
        prefix = [rng.randrange(6)] + [rng.randrange(30) for _ in range(rng.randrange(12))]
        if rng.random() < 0.3:
            cache.acquire(step, prefix, 4)
            cache.make_room(rng.randrange(0, 30) * 4)
            cache.release(step)
        else:
            cache.insert(prefix + [100 + step % 7] * 2, 4)      # a repeated key inside one insert
        if step == 250:
            cache.clear()
        for kind, keys in cache.journal:
            assert kind in ("stored", "removed")
            for k in keys:
                assert (k in held) == (kind == "removed"), (step, kind, k)
                (held.add if kind == "stored" else held.discard)(k)
        cache.journal.clear()
        assert held == set(cache._lru)


def test_journal_off_by_default():
    cache = PrefixCache(MemoryLedger(100, "hbm"), 1)
    cache.insert([1, 2], 4)
    assert cache.journal is None


# ---------------------------------------------------------------- the router's index
def test_index_overlap_is_the_leading_run_per_instance():
    idx = CachedBlockIndex(["a", "b", "c"])
    idx.apply("a", [("stored", [(4, 1), (4, 2), (4, 3)])])
    idx.apply("b", [("stored", [(4, 1), (4, 3)])])          # 2 missing: only 1 counts
    idx.apply("x", [("stored", [(4, 1)])])                  # not tracked: ignored
    assert idx.overlaps([1, 2, 3, 4], 4) == {"a": 3, "b": 1, "c": 0}
    assert idx.overlaps([1, 2, 3], 8) == {"a": 0, "b": 0, "c": 0}     # another block size
    idx.apply("a", [("removed", [(4, 2)]), ("stored", [(4, 4)])])
    assert idx.overlaps([1, 2, 3, 4], 4) == {"a": 1, "b": 1, "c": 0}
    assert idx.blocks("a") == 3 and idx.blocks("b") == 2
    idx.clear("a")
    assert idx.blocks("a") == 0 and idx.overlaps([1], 4) == {"a": 0, "b": 1, "c": 0}
    with pytest.raises(ValueError, match="'stored' or 'removed'"):
        idx.apply("b", [("cleared", [])])


def test_cost_trades_cache_hits_against_backlog():
    idx = CachedBlockIndex(["a", "b"])
    idx.apply("a", [("stored", [(4, h) for h in range(10)])])
    r = req(0, range(10), prompt=41)                 # 10 full blocks cached on a: 40 tokens
    assert cached_tokens(r, 10) == 40
    # a: 0 + 1 new token; b: 0 + 41
    assert prefix_aware_choice(r, ["a", "b"], {"a": 0, "b": 0}, idx) == ("a", 40)
    # a's backlog beyond the 40 tokens its cache saves: b is cheaper
    assert prefix_aware_choice(r, ["a", "b"], {"a": 41, "b": 0}, idx)[0] == "b"
    assert prefix_aware_choice(r, ["a", "b"], {"a": 39, "b": 0}, idx)[0] == "a"
    # a larger weight keeps it on its cache
    assert prefix_aware_choice(r, ["a", "b"], {"a": 41, "b": 0}, idx, weight=3.0)[0] == "a"
    # a full hit still computes one token
    full = req(1, range(10))
    assert prefix_aware_choice(full, ["a", "b"], {"a": 0, "b": 0}, idx) == ("a", 39)


class KVInstance(Core):
    """A prefill instance double: reports its load as the engines do and, on request,
    KV events."""

    def __init__(self, name, router="router"):
        super().__init__(name)
        self.router = router
        self.got = []
        self.send(router, "load", name, 0)

    def submit_many(self, now, items):
        self.got += [r.id for r, _ in items]

    def publish(self, events):
        self.send(self.router, "kv_events", self.name, events)


def test_router_follows_kv_events():
    coll = Collector(request_ids=[0, 1, 2])
    a, b = KVInstance("a"), KVInstance("b")
    router = Router(collector=coll.name, prefill=["a", "b"], decode_targets=["d"], policy="prefix_aware")
    b.publish([("stored", [(4, 7), (4, 8)])])
    drv = VirtualDriver({c.name: c for c in (router, coll, a, b)})
    drv.post("router", "start", [req(0, [7, 8, 9], t=0.0), req(1, [5, 6], t=1.0), req(2, [7, 8], t=2.0)],
             None, 0.0)
    drv.run(lambda: router.is_idle())
    # 0 goes to b (2 blocks cached); 1 (nothing cached) to the lighter a; 2 to b
    assert b.got == [0, 2] and a.got == [1]
    assert router.counts()["expected_cached_tokens"] == 8 + 7
    router.peer_lost(3.0, "b")                   # a restarted instance holds nothing
    assert router._index.blocks("b") == 0


def test_unknown_policy_and_bad_weight_are_refused():
    with pytest.raises(ValueError, match="prefix_aware"):
        Router(collector="c", prefill=["a"], decode_targets=["d"], policy="kv")
    with pytest.raises(ValueError, match="prefix_weight"):
        Router(collector="c", prefill=["a"], decode_targets=["d"], policy="prefix_aware", prefix_weight=-1)


# ---------------------------------------------------------------- the whole rack
SLICE = 1500      # the trace's first ~7 minutes: the caches fill and start evicting


@pytest.fixture(scope="module")
def conv_slice():
    return load_requests("mooncake_conv")[:SLICE]     # shipped with the package


def test_router_index_matches_the_engines_caches(conv_slice):
    """After a run, what the router learnt from KV events is exactly what every prefill
    instance's prefix cache holds (no event lost or out of order)."""
    sc = with_policy("prefix_aware")
    reqs = conv_slice
    specs = build_topology(sc, [r.id for r in reqs])
    drv = VirtualDriver({s.name: construct(s) for s in specs})
    cores = drv.cores
    drv.post("router", "start", list(reqs), None, 0.0)
    drv.run(lambda: cores["collector"].all_ended() and all(c.is_idle() for c in cores.values()))
    index = cores["router"]._index
    prefill = [n for n in cores if n.startswith("prefill")]
    assert len(prefill) == 2
    for n in prefill:
        keys = set(cores[n].prefix._lru)
        assert keys and index.blocks(n) == len(keys)
        assert all(index._where.get(k, 0) & index._bit[n] for k in keys)
    assert all(cores[n].prefix.stats.evicted_blocks > 0 for n in prefill)     # removals were replayed too


def test_prefix_aware_reaches_the_ideal_hit_ratio(conv_slice):
    """On the Mooncake conversation trace through the default scenario, prefix_aware's
    hit ratio is within 0.03 of the ideal and above round robin's and least-outstanding
    work's (the whole trace: scripts/bench_routing.py, README)."""
    got = {}
    for policy in ("round_robin", "least_outstanding_work", "prefix_aware"):
        pc = run_scenario(with_policy(policy), conv_slice, runtime="virtual").results["prefix_cache"]
        got[policy] = pc["hit_ratio"]
    ideal = ideal_prefix_hits(conv_slice).hit_ratio
    assert pc["ideal_hit_ratio"] == pytest.approx(ideal)
    assert pc["capacity_hit_ratio"] <= ideal
    print(f"\nmooncake_conv first {SLICE}: hit ratio " + ", ".join(f"{k} {v:.3f}" for k, v in got.items())
          + f"; ideal {ideal:.3f}, with the caches' capacity pooled {pc['capacity_hit_ratio']:.3f}")
    assert got["prefix_aware"] >= ideal - 0.03
    assert got["prefix_aware"] > got["round_robin"] + 0.03
    assert got["prefix_aware"] > got["least_outstanding_work"] + 0.03
