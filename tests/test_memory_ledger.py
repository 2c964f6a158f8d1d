"""MemoryLedger, KVBlockPool and PrefixCache: exact accounting, limits, LRU, pins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.memory import (
    CATEGORIES,
    KVBlockPool,
    LedgerOverflow,
    LedgerUnderflow,
    MemoryLedger,
    PrefixCache,
    blocks_for,
)


def test_ledger_alloc_free_peak_and_categories():
    led = MemoryLedger(1000, "dev0/HBM")
    led.alloc("weights", 600)
    assert led.try_alloc("kv", 300)
    assert not led.try_alloc("kv", 101)          # 100 free
    assert led.used == 900 and led.free_bytes == 100 and led.peak == 900
    led.free("kv", 300)
    assert led.held("kv") == 0 and led.used == 600 and led.peak == 900
    assert led.category_peak("kv") == 300
    snap = led.snapshot()
    assert snap["held_bytes"]["weights"] == 600 and snap["capacity_bytes"] == 1000


def test_ledger_overflow_message_names_everything():
    led = MemoryLedger(100, "wafer0/SRAM")
    led.alloc("weights", 90)
    with pytest.raises(LedgerOverflow) as err:
        led.alloc("kv", 11)
    msg = str(err.value)
    assert "wafer0/SRAM" in msg and "'kv'" in msg and "11" in msg and "10 free" in msg
    assert isinstance(err.value, MemoryError)
    assert led.used == 90                          # nothing booked by the failed call


def test_ledger_underflow_and_bad_input():
    led = MemoryLedger(100, "x")
    led.alloc("kv", 10)
    with pytest.raises(LedgerUnderflow, match="holds 10"):
        led.free("kv", 11)
    with pytest.raises(LedgerUnderflow):
        led.free("weights", 1)
    with pytest.raises(ValueError, match="unknown category"):
        led.alloc("activations", 1)
    with pytest.raises(TypeError, match="integer"):
        led.alloc("kv", 1.5)
    with pytest.raises(ValueError, match=">= 0"):
        led.alloc("kv", -1)
    assert led.used == 10


def test_ledger_move_keeps_used():
    led = MemoryLedger(100, "x")
    led.alloc("reserved", 40)
    led.move("reserved", "kv", 30)
    assert led.held("reserved") == 10 and led.held("kv") == 30 and led.used == 40
    with pytest.raises(LedgerUnderflow):
        led.move("reserved", "kv", 11)


def test_block_pool_exact_bytes_and_rounding():
    kv_bpt = 131_072                               # Llama-3.1-8B at 16-bit (hardware.md)
    led = MemoryLedger(10 * 16 * kv_bpt, "h100")
    pool = KVBlockPool(led, 16, kv_bpt)
    assert pool.block_bytes == 16 * kv_bpt
    assert pool.blocks_for(1) == 1 and pool.blocks_for(16) == 1 and pool.blocks_for(17) == 2
    assert blocks_for(0, 16) == 0
    pool.allocate("r1", pool.blocks_for(33))       # 3 blocks
    assert led.held("kv") == 3 * 16 * kv_bpt
    assert pool.try_ensure_tokens("r1", 48) and pool.held_blocks("r1") == 3
    assert pool.try_ensure_tokens("r1", 49) and pool.held_blocks("r1") == 4
    assert not pool.try_allocate("r2", 7) and pool.held_blocks("r2") == 0
    assert pool.try_allocate("r2", 6) and pool.free_blocks == 0
    assert pool.shrink_to_tokens("r1", 20) == 2 and pool.held_blocks("r1") == 2
    assert pool.free("r1") == 2 and pool.free("r2") == 6 and pool.free("r3") == 0
    assert led.used == 0 and pool.blocks_in_use == 0
    with pytest.raises(LedgerOverflow):
        pool.allocate("r4", 11)


def test_prefix_cache_lookup_pin_evict_lru():
    bpt, bs = 10, 4
    led = MemoryLedger(5 * bs * bpt, "hbm")        # room for 5 entries
    pc = PrefixCache(led, bpt)
    assert pc.insert([1, 2, 3], bs) == 3
    assert pc.match([1, 2, 3, 4], bs) == 3 and pc.match([5, 2, 3], bs) == 0
    assert pc.match([1, 2], 8) == 0                # other block size never collides
    assert pc.acquire("a", [1, 2, 9], bs) == 2
    st_ = pc.stats
    assert (st_.hit_blocks, st_.miss_blocks, st_.hit_tokens, st_.miss_tokens) == (2, 1, 8, 4)
    # Fill: 2 new entries fit, the third must evict the only unpinned one (3).
    assert pc.insert([20, 21, 22], bs) == 3
    assert pc.match([1, 2, 3], bs) == 2            # 3 evicted, 1 and 2 pinned
    assert led.used == 5 * bs * bpt
    # Everything pinned or protected: insertion stops without exceeding capacity.
    pc.acquire("b", [20, 21, 22], bs)
    assert pc.insert([30], bs) == 0 and led.used <= led.capacity
    assert not pc.make_room(1)
    pc.release("a")
    assert pc.make_room(2 * bs * bpt)              # evicts the two unpinned: 2, 1 (LRU)
    assert pc.match([1], bs) == 0 and pc.match([20, 21, 22], bs) == 3
    pc.release("b")
    pc.clear()
    assert len(pc) == 0 and led.used == 0


def test_prefix_cache_evicts_tail_before_head():
    bpt, bs = 1, 1
    led = MemoryLedger(3, "hbm")
    pc = PrefixCache(led, bpt)
    pc.insert([1, 2, 3], bs)                       # head 1 is most recently used
    assert pc.make_room(1)
    assert pc.match([1, 2, 3], bs) == 2            # tail block 3 went first


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CATEGORIES), st.integers(0, 400), st.booleans()),
                max_size=60))
def test_ledger_random_sequences_stay_in_bounds(ops):
    led = MemoryLedger(1000, "prop")
    mirror = {c: 0 for c in CATEGORIES}
    for cat, n, is_alloc in ops:
        if is_alloc:
            ok = led.try_alloc(cat, n)
            assert ok == (sum(mirror.values()) + n <= 1000)
            if ok:
                mirror[cat] += n
        else:
            take = min(n, mirror[cat])
            led.free(cat, take)
            mirror[cat] -= take
        assert 0 <= led.used <= led.capacity
        assert all(led.held(c) == mirror[c] >= 0 for c in CATEGORIES)
        assert led.peak <= led.capacity
    for c in CATEGORIES:
        led.free(c, led.held(c))
    assert led.used == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 40)),
                max_size=80))
def test_pool_and_cache_random_sequences(ops):
    """Random mixes of block allocation, frees, cache inserts, acquires and releases:
    the ledger never exceeds capacity or goes negative, held bytes always equal the
    pool's blocks plus the cache's entries, and everything is freed at the end."""
    bpt, bs, kvb = 3, 4, 2
    led = MemoryLedger(40 * bpt * kvb, "prop")
    pool = KVBlockPool(led, kvb, bpt)
    pc = PrefixCache(led, bpt)
    for op, owner, n in ops:
        if op == 0:
            if not pool.try_ensure_tokens(owner, n):
                if pc.make_room(pool.bytes_for(n) - pool.held_blocks(owner) * pool.block_bytes):
                    assert pool.try_ensure_tokens(owner, n)
        elif op == 1:
            pool.free(owner)
        elif op == 2:
            pc.insert(range(n % 7, n % 7 + n % 5), bs)
        elif op == 3:
            pc.release(owner)
            pc.acquire(owner, list(range(0, n % 6)), bs)
        else:
            pc.release(owner)
        assert 0 <= led.used <= led.capacity and led.peak <= led.capacity
        assert led.held("kv") == pool.blocks_in_use * pool.block_bytes
        assert led.held("prefix_cache") == len(pc) * bs * bpt
        assert pc.evictable_bytes() == sum(nb for key, nb in pc._lru.items() if key not in pc._pins)
    for owner in range(4):
        pool.free(owner)
        pc.release(owner)
    pc.clear()
    assert led.used == 0 and len(pc) == 0
