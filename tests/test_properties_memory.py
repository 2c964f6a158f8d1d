"""Property: the memory ledgers (MemoryLedger, KVBlockPool, PrefixCache) never go above
capacity or below zero under any sequence of operations, account byte-exactly, and
return to empty when everything is released."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from devices.memory import KVBlockPool, LedgerError, MemoryLedger, PrefixCache

BLOCK_TOKENS = 4
KV_PER_TOKEN = 8          # bytes: a block is 32 bytes
HASH_BLOCK = 2            # tokens per prefix-cache entry: 16 bytes

owners = st.integers(0, 5)
ops = st.one_of(
    st.tuples(st.just("allocate"), owners, st.integers(0, 12)),
    st.tuples(st.just("grow"), owners, st.integers(0, 60)),
    st.tuples(st.just("shrink"), owners, st.integers(0, 60)),
    st.tuples(st.just("free"), owners),
    st.tuples(st.just("reserve"), st.integers(1, 200)),
    st.tuples(st.just("adopt"), owners, st.integers(0, 6)),
    st.tuples(st.just("unreserve"), st.integers(1, 200)),
    st.tuples(st.just("insert"), st.lists(st.integers(0, 6), max_size=6)),
    st.tuples(st.just("acquire"), owners, st.lists(st.integers(0, 6), max_size=6)),
    st.tuples(st.just("release"), owners),
    st.tuples(st.just("make_room"), st.integers(0, 400)),
)


def check(ledger: MemoryLedger, pool: KVBlockPool, cache: PrefixCache, capacity: int) -> None:
    snap = ledger.snapshot()
    assert 0 <= ledger.used <= capacity
    assert ledger.used + ledger.free_bytes == capacity
    assert all(v >= 0 for v in snap["held_bytes"].values())
    assert ledger.used == sum(snap["held_bytes"].values())
    assert ledger.peak >= ledger.used and ledger.peak <= capacity
    assert ledger.held("kv") == pool.blocks_in_use * pool.block_bytes
    assert pool.blocks_in_use == sum(pool.held_blocks(o) for o in pool.owners())
    assert ledger.held("prefix_cache") == len(cache) * cache.entry_bytes(HASH_BLOCK)
    assert 0 <= cache.evictable_bytes() <= ledger.held("prefix_cache")


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(0, 600), script=st.lists(ops, max_size=60))
def test_ledgers_stay_within_capacity_and_empty_at_the_end(capacity, script):
    ledger = MemoryLedger(capacity, "prop")
    pool = KVBlockPool(ledger, BLOCK_TOKENS, KV_PER_TOKEN)
    cache = PrefixCache(ledger, KV_PER_TOKEN)
    pinned: set[int] = set()
    for op in script:
        kind = op[0]
        try:
            if kind == "allocate":
                pool.try_allocate(op[1], op[2])
            elif kind == "grow":
                pool.try_ensure_tokens(op[1], op[2])
            elif kind == "shrink":
                pool.shrink_to_tokens(op[1], op[2])
            elif kind == "free":
                pool.free(op[1])
            elif kind == "reserve":
                ledger.try_alloc("reserved", op[1])
            elif kind == "adopt":
                if ledger.held("reserved") >= op[2] * pool.block_bytes:
                    pool.adopt(op[1], op[2], "reserved")
            elif kind == "unreserve":
                ledger.free("reserved", min(op[1], ledger.held("reserved")))
            elif kind == "insert":
                cache.insert(op[1], HASH_BLOCK)
            elif kind == "acquire":
                if op[1] not in pinned:
                    cache.acquire(op[1], op[2], HASH_BLOCK)
                    pinned.add(op[1])
            elif kind == "release":
                cache.release(op[1])
                pinned.discard(op[1])
            elif kind == "make_room":
                before = ledger.free_bytes
                ok = cache.make_room(op[1])
                assert ok == (ledger.free_bytes >= op[1]) and (ok or ledger.free_bytes == before)
        except LedgerError:
            raise AssertionError(f"{op} broke the ledger") from None
        check(ledger, pool, cache, capacity)
    for owner in list(pinned):
        cache.release(owner)
    for owner in pool.owners():
        pool.free(owner)
    cache.clear()
    ledger.free("reserved", ledger.held("reserved"))
    check(ledger, pool, cache, capacity)
    assert ledger.used == 0 and len(cache) == 0 and pool.blocks_in_use == 0


class _ReferenceCache:
    """The prefix cache's rules written plainly (a list in LRU order, least recent
    first): what `PrefixCache` must do, entry for entry, however it is built."""

    def __init__(self, capacity: int, entry: int) -> None:
        self.free, self.entry = capacity, entry
        self.order: list[int] = []
        self.pins: dict[int, int] = {}
        self.owners: dict[int, list[int]] = {}
        self.journal: list = []

    def touch(self, keys: list[int]) -> None:
        for k in reversed(keys):            # last-to-first: the head ends most recent
            self.order.remove(k)
            self.order.append(k)

    def make_room(self, need: int, protect: frozenset | set = frozenset()) -> bool:
        victims, freed = [], self.free
        for k in self.order:
            if freed >= need:
                break
            if not self.pins.get(k) and k not in protect:
                victims.append(k)
                freed += self.entry
        if freed < need:
            return False
        for k in victims:
            self.order.remove(k)
        self.free = freed
        if victims:
            self.journal.append(("removed", victims))
        return True

    def insert(self, hashes: list[int]) -> int:
        keys, added, protected, new = list(hashes), [], set(), 0
        fresh = list(dict.fromkeys(k for k in keys if k not in self.order))
        if len(fresh) * self.entry <= self.free:
            self.order += fresh
            self.free -= len(fresh) * self.entry
            self.touch(keys)
            if fresh:
                self.journal.append(("stored", fresh))
            return len(fresh)
        stored = []
        for k in keys:
            if k not in self.order:
                if not self.make_room(self.entry, protected):
                    break
                self.order.append(k)
                self.free -= self.entry
                new += 1
                stored.append(k)
            added.append(k)
            protected.add(k)
        self.touch(added)
        if stored:
            self.journal.append(("stored", stored))
        return new

    def acquire(self, owner: int, hashes: list[int]) -> int:
        run = []
        for k in hashes:
            if k not in self.order:
                break
            run.append(k)
        for k in run:
            self.pins[k] = self.pins.get(k, 0) + 1
        self.touch(run)
        if run:
            self.owners[owner] = run
        return len(run)

    def release(self, owner: int) -> None:
        for k in self.owners.pop(owner, []):
            self.pins[k] -= 1


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 12), script=st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 9), max_size=6)),
    st.tuples(st.just("acquire"), owners, st.lists(st.integers(0, 9), max_size=6)),
    st.tuples(st.just("release"), owners),
    st.tuples(st.just("make_room"), st.integers(0, 14))), max_size=50))
def test_prefix_cache_follows_the_reference_lru(capacity, script):
    """Hits, insertions, evictions, the KV events and the LRU order itself are those of
    the plain reference, after every operation."""
    entry = HASH_BLOCK * KV_PER_TOKEN
    ledger = MemoryLedger(capacity * entry, "prop")
    cache, ref = PrefixCache(ledger, KV_PER_TOKEN), _ReferenceCache(capacity * entry, entry)
    cache.journal = []
    for op in script:
        kind = op[0]
        if kind == "insert":
            assert cache.insert(op[1], HASH_BLOCK) == ref.insert(op[1])
        elif kind == "acquire":
            if op[1] not in ref.owners:
                assert cache.acquire(op[1], op[2], HASH_BLOCK) == ref.acquire(op[1], op[2])
        elif kind == "release":
            cache.release(op[1])
            ref.release(op[1])
        else:
            assert cache.make_room(op[1] * entry // 2) == ref.make_room(op[1] * entry // 2)
        assert [h for _, h in cache._lru] == ref.order
        assert ledger.free_bytes == ref.free
        assert cache.evictable_bytes() == entry * sum(1 for k in ref.order if not ref.pins.get(k))
        assert [(kind, [h for _, h in keys]) for kind, keys in cache.journal] == ref.journal
