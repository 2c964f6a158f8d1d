"""Byte-exact memory managers: the per-device ledger, paged KV blocks, the prefix cache.

Every byte a device holds is booked in one `MemoryLedger` under a category (weights,
KV blocks, prefix cache, workspace, memory reserved for incoming KV). The ledger never
goes above its capacity nor below zero: an allocation that does not fit is refused
(`try_alloc` -> False) or raises `LedgerOverflow`; what to do then (wait, evict,
preempt) is the engine's decision. All sizes are Python ints (bytes), so the totals are
exact; floats are refused.

`KVBlockPool` books paged KV blocks (vLLM's PagedAttention scheme: fixed-size blocks of
`block_tokens` tokens, so a request of n tokens holds ceil(n / block_tokens) blocks).
`PrefixCache` keeps finished prompts' full blocks, keyed by the trace's chained block
hashes (Mooncake's 512-token blocks), LRU-evicted, counted against the same ledger.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from dataclasses import dataclass
from typing import AbstractSet, Hashable, Iterable, Sequence


#: Ledger categories. "reserved" is memory promised to a KV transfer not yet arrived
#: (the pull protocol: the receiver reserves before the sender ships).
CATEGORIES: tuple[str, ...] = ("weights", "kv", "prefix_cache", "workspace", "reserved")


class LedgerError(Exception):
    """Base class of ledger errors."""


class LedgerOverflow(LedgerError, MemoryError):
    """An allocation does not fit in the ledger's free bytes."""


class LedgerUnderflow(LedgerError, ValueError):
    """A free of more bytes than the category holds."""


def _as_bytes(nbytes: object, what: str) -> int:
    """Validate a byte count: a non-negative integer (numpy ints accepted)."""
    if type(nbytes) is int and nbytes >= 0:
        return nbytes           # the hot path: skips the ABC check below
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"{what}: byte count must be an integer, got {nbytes!r} "
                        f"({type(nbytes).__name__})")
    value = int(nbytes)
    if value < 0:
        raise ValueError(f"{what}: byte count must be >= 0, got {value}")
    return value


class MemoryLedger:
    """Byte-exact accounting of one device's (or instance's) memory.

    Args:
        capacity_bytes: total bytes the device holds (int >= 0).
        name: label used in error messages and stats (e.g. "prefill0/HBM").

    Invariant: 0 <= held(c) for every category c and sum of held <= capacity_bytes,
    after every call. `peak` is the high-water mark of `used`; `category_peak(c)` the
    high-water mark of one category.

    Raises:
        LedgerOverflow (a MemoryError) from `alloc`/`move` when the bytes do not fit;
        LedgerUnderflow (a ValueError) from `free`/`move` when freeing more than held;
        ValueError for an unknown category; TypeError for a non-integer byte count.
    """

    __slots__ = ("name", "capacity", "_held", "_used", "_peak", "_cat_peak")

    def __init__(self, capacity_bytes: int, name: str = "ledger") -> None:
        self.name = name
        self.capacity = _as_bytes(capacity_bytes, f"MemoryLedger({name!r}).capacity_bytes")
        self._held: dict[str, int] = {c: 0 for c in CATEGORIES}
        self._cat_peak: dict[str, int] = {c: 0 for c in CATEGORIES}
        self._used = 0
        self._peak = 0

    # -- queries -----------------------------------------------------------------
    @property
    def used(self) -> int:
        """Bytes held over all categories."""
        return self._used

    @property
    def free_bytes(self) -> int:
        """Bytes still allocatable (capacity - used)."""
        return self.capacity - self._used

    @property
    def peak(self) -> int:
        """High-water mark of `used` (bytes) since construction."""
        return self._peak

    def held(self, category: str) -> int:
        """Bytes held in `category` (ValueError for an unknown one)."""
        n = self._held.get(category)       # the dict's keys are the categories: the check
        return self._held[self._check_cat(category)] if n is None else n

    def category_peak(self, category: str) -> int:
        """High-water mark of `held(category)` (bytes)."""
        return self._cat_peak[self._check_cat(category)]

    def snapshot(self) -> dict:
        """Plain-dict view: capacity, used, free, peak, held and peak per category."""
        return {
            "name": self.name,
            "capacity_bytes": self.capacity,
            "used_bytes": self._used,
            "free_bytes": self.free_bytes,
            "peak_bytes": self._peak,
            "held_bytes": dict(self._held),
            "peak_held_bytes": dict(self._cat_peak),
        }

    # -- updates -----------------------------------------------------------------
    def try_alloc(self, category: str, nbytes: int) -> bool:
        """Book `nbytes` under `category` if they fit; return whether they were booked."""
        cat = self._check_cat(category)
        # (a plain int passes first: the error message is only formatted for a bad count)
        n = nbytes if type(nbytes) is int and nbytes >= 0 else \
            _as_bytes(nbytes, f"ledger {self.name!r} alloc {cat}")
        used = self._used + n
        if used > self.capacity:
            return False
        self._used = used
        if used > self._peak:
            self._peak = used
        held = self._held[cat] + n
        self._held[cat] = held
        if held > self._cat_peak[cat]:
            self._cat_peak[cat] = held
        return True

    def alloc(self, category: str, nbytes: int) -> None:
        """Book `nbytes` under `category`; raise `LedgerOverflow` if they do not fit."""
        if not self.try_alloc(category, nbytes):
            raise LedgerOverflow(
                f"ledger {self.name!r}: cannot allocate {int(nbytes)} bytes of {category!r}: "
                f"{self.free_bytes} free of {self.capacity} (held: {self._held})")

    def free(self, category: str, nbytes: int) -> None:
        """Release `nbytes` from `category`; raise `LedgerUnderflow` if it holds fewer."""
        cat = self._check_cat(category)
        n = nbytes if type(nbytes) is int and nbytes >= 0 else \
            _as_bytes(nbytes, f"ledger {self.name!r} free {cat}")
        if n > self._held[cat]:
            raise LedgerUnderflow(
                f"ledger {self.name!r}: cannot free {n} bytes of {cat!r}: "
                f"it holds {self._held[cat]}")
        self._held[cat] -= n
        self._used -= n

    def move(self, src: str, dst: str, nbytes: int) -> None:
        """Re-book `nbytes` from category `src` to `dst` (e.g. reserved -> kv) atomically.

        Used does not change, so this never overflows; raises `LedgerUnderflow` if `src`
        holds fewer than `nbytes`.
        """
        s, d = self._check_cat(src), self._check_cat(dst)
        n = nbytes if type(nbytes) is int and nbytes >= 0 else \
            _as_bytes(nbytes, f"ledger {self.name!r} move {s}->{d}")
        if n > self._held[s]:
            raise LedgerUnderflow(
                f"ledger {self.name!r}: cannot move {n} bytes from {s!r}: it holds {self._held[s]}")
        self._held[s] -= n
        self._held[d] += n
        if self._held[d] > self._cat_peak[d]:
            self._cat_peak[d] = self._held[d]

    # -- internals ---------------------------------------------------------------
    def _check_cat(self, category: str) -> str:
        if category not in self._held:
            raise ValueError(f"ledger {self.name!r}: unknown category {category!r}; "
                             f"expected one of {CATEGORIES}")
        return category

    def __repr__(self) -> str:
        return (f"MemoryLedger({self.name!r}, used={self._used}/{self.capacity}, "
                f"peak={self._peak})")


def blocks_for(tokens: int, block_tokens: int) -> int:
    """Blocks of `block_tokens` tokens needed to hold `tokens` tokens: ceil(tokens / block)."""
    if tokens <= 0:
        return 0
    return -(-int(tokens) // int(block_tokens))


class KVBlockPool:
    """Paged KV blocks of one device, booked in a `MemoryLedger` under `category`.

    Args:
        ledger: the device's ledger.
        block_tokens: tokens per block (vLLM's default is 16).
        kv_bytes_per_token: KV bytes of one token over all layers (int, from the cost
            model's `kv_bytes_per_token`); a block is exactly block_tokens * that.
        category: ledger category the blocks are booked under ("kv").

    Blocks are held per owner (a request id). Raises `LedgerOverflow` from `allocate`
    when the ledger is full, KeyError when freeing an owner that holds nothing.
    """

    def __init__(self, ledger: MemoryLedger, block_tokens: int, kv_bytes_per_token: int,
                 category: str = "kv") -> None:
        if int(block_tokens) < 1:
            raise ValueError(f"KVBlockPool: block_tokens must be >= 1, got {block_tokens}")
        self.ledger = ledger
        self.block_tokens = int(block_tokens)
        self.kv_bytes_per_token = _as_bytes(kv_bytes_per_token, "KVBlockPool.kv_bytes_per_token")
        self.block_bytes = self.block_tokens * self.kv_bytes_per_token
        self.category = ledger._check_cat(category)
        self._owned: dict[Hashable, int] = {}
        self._blocks = 0

    def blocks_for(self, tokens: int) -> int:
        """ceil(tokens / block_tokens)."""
        return blocks_for(tokens, self.block_tokens)

    def bytes_for(self, tokens: int) -> int:
        """Bytes of the blocks that hold `tokens` tokens."""
        return self.blocks_for(tokens) * self.block_bytes

    @property
    def blocks_in_use(self) -> int:
        """Blocks held by all owners."""
        return self._blocks

    @property
    def free_blocks(self) -> int:
        """Whole blocks that fit in the ledger's free bytes now."""
        return self.ledger.free_bytes // self.block_bytes if self.block_bytes else 0

    def held_blocks(self, owner: Hashable) -> int:
        """Blocks held by `owner` (0 if none)."""
        return self._owned.get(owner, 0)

    def owners(self) -> list:
        """Owners holding blocks."""
        return list(self._owned)

    def try_allocate(self, owner: Hashable, n_blocks: int) -> bool:
        """Add `n_blocks` blocks to `owner` if they fit; return whether they were added."""
        n = int(n_blocks)
        if n < 0:
            raise ValueError(f"KVBlockPool: n_blocks must be >= 0, got {n}")
        if not self.ledger.try_alloc(self.category, n * self.block_bytes):
            return False
        if n:
            self._owned[owner] = self._owned.get(owner, 0) + n
            self._blocks += n
        return True

    def allocate(self, owner: Hashable, n_blocks: int) -> None:
        """Add `n_blocks` blocks to `owner`; raise `LedgerOverflow` if they do not fit."""
        if not self.try_allocate(owner, n_blocks):
            raise LedgerOverflow(
                f"ledger {self.ledger.name!r}: no room for {n_blocks} KV blocks of "
                f"{self.block_bytes} bytes for {owner!r}: {self.ledger.free_bytes} bytes free")

    def adopt(self, owner: Hashable, n_blocks: int, src_category: str) -> None:
        """Turn n_blocks * block_bytes already booked under `src_category` (e.g. memory
        "reserved" for an incoming transfer) into blocks of `owner`, without a moment in
        which the bytes are free. Raises LedgerUnderflow if the category holds fewer."""
        n = int(n_blocks)
        if n < 0:
            raise ValueError(f"KVBlockPool: n_blocks must be >= 0, got {n}")
        self.ledger.move(src_category, self.category, n * self.block_bytes)
        if n:
            self._owned[owner] = self._owned.get(owner, 0) + n
            self._blocks += n

    def try_ensure_tokens(self, owner: Hashable, tokens: int) -> bool:
        """Grow `owner` to hold at least `tokens` tokens; return False (no change) if it
        does not fit. Never shrinks."""
        need = self.blocks_for(tokens) - self.held_blocks(owner)
        return need <= 0 or self.try_allocate(owner, need)

    def shrink_to_tokens(self, owner: Hashable, tokens: int) -> int:
        """Release `owner`'s blocks beyond those needed for `tokens`; return blocks freed."""
        extra = self.held_blocks(owner) - self.blocks_for(tokens)
        if extra > 0:
            self.free_blocks_of(owner, extra)
            return extra
        return 0

    def free_blocks_of(self, owner: Hashable, n_blocks: int) -> None:
        """Release `n_blocks` of `owner`'s blocks; raises ValueError if it holds fewer."""
        held = self._owned.get(owner, 0)
        n = int(n_blocks)
        if n < 0 or n > held:
            raise ValueError(f"KVBlockPool: cannot free {n} blocks of {owner!r}: it holds {held}")
        self.ledger.free(self.category, n * self.block_bytes)
        self._blocks -= n
        if n == held:
            self._owned.pop(owner, None)
        else:
            self._owned[owner] = held - n

    def free(self, owner: Hashable) -> int:
        """Release every block of `owner`; return how many (0 if it held none)."""
        held = self._owned.pop(owner, 0)
        if held:
            self.ledger.free(self.category, held * self.block_bytes)
            self._blocks -= held
        return held


@dataclass
class PrefixCacheStats:
    """Counters of a `PrefixCache`. Blocks are the full hash blocks looked up (hit: the
    leading run found). Tokens, per lookup of a prompt of p tokens with h blocks hit of
    the f full blocks looked up (block size b): `hit_tokens` += min(h b, p - 1) (served
    from the cache: the last position is always computed), `cacheable_tokens` +=
    min(f b, p - 1) (the most the cache could serve), `miss_tokens` += p - min(h b, p - 1)
    (the prompt tokens computed). The hit ratio is hit_tokens / cacheable_tokens."""
    lookups: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    cacheable_tokens: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0

    def as_dict(self) -> dict:
        """Plain-dict copy of the counters."""
        return dict(self.__dict__)


class PrefixCache:
    """LRU cache of prompt prefix blocks, keyed by the trace's chained block hashes.

    A block hash (Mooncake's `hash_ids`) identifies a block of `block_size` tokens *and
    everything before it*, so a request's cached prefix is the longest leading run of
    its hashes present here. Each entry holds block_size * kv_bytes_per_token bytes,
    booked in `ledger` under `category` ("prefix_cache"). Entries in use by a request
    are pinned (never evicted). Eviction is LRU over unpinned entries; a request's
    blocks are touched last-to-first so a prefix's head outlives its tail (the tail is
    useless without the head), as vLLM does.

    Keys are (block_size, hash), so traces with different block sizes never collide.

    `journal`: None (default), or a list to which every change of the cached set is
    appended as ("stored", [keys]) or ("removed", [keys]), in order: the KV events an
    engine publishes to a KV-aware router (as vLLM's BlockStored / BlockRemoved events
    feed Dynamo's KV router). The owner drains it.

    State: `_lru` maps each key to its entry's bytes, least recently used first; `_pins`
    maps each pinned key to its pin count (a key absent from it is unpinned); an
    eviction books all the bytes it frees in one ledger call.
    """

    def __init__(self, ledger: MemoryLedger, kv_bytes_per_token: int,
                 category: str = "prefix_cache") -> None:
        self.ledger = ledger
        self.kv_bytes_per_token = _as_bytes(kv_bytes_per_token, "PrefixCache.kv_bytes_per_token")
        self.category = ledger._check_cat(category)
        self._lru: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._pins: dict[tuple[int, int], int] = {}
        self._pinned_by: dict[Hashable, list[tuple[int, int]]] = {}
        self._unpinned_bytes = 0
        self.stats = PrefixCacheStats()
        self.journal: list | None = None
        #: A host-memory tier the evicted entries go to (`HostKVTier`; None: they are dropped).
        self.host: HostKVTier | None = None

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        """Bytes held by cached entries."""
        return self.ledger.held(self.category)

    def entry_bytes(self, block_size: int) -> int:
        """Bytes of one entry of `block_size` tokens."""
        return int(block_size) * self.kv_bytes_per_token

    def match(self, hashes: Sequence[int], block_size: int) -> int:
        """Length of the longest leading run of `hashes` present (no side effects)."""
        return len(self._run(hashes, int(block_size)))

    def _run(self, hashes: Sequence[int], bs: int) -> list[tuple[int, int]]:
        """Keys of the longest leading run of `hashes` present."""
        lru = self._lru
        keys = []
        for h in hashes:
            key = (bs, h)
            if key not in lru:
                break
            keys.append(key)
        return keys

    def acquire(self, owner: Hashable, hashes: Sequence[int], block_size: int,
                count: bool = True, prompt_tokens: int | None = None) -> int:
        """Pin the longest leading run of `hashes` present for `owner`, mark it recently
        used and return the run's length in blocks. With `count`, add the run to the hit
        counters and the rest of `hashes` to the miss counters (`count_lookup`, with
        `prompt_tokens`; an engine that may release and retry the same request passes
        False and calls `count_lookup` once). `owner` must not already hold pins
        (release first)."""
        if owner in self._pinned_by:
            raise ValueError(f"PrefixCache: {owner!r} already holds pinned blocks")
        bs = int(block_size)
        keys = self._run(hashes, bs)
        if keys:
            lru, pins = self._lru, self._pins
            touch = lru.move_to_end
            unpinned = 0
            for key in reversed(keys):
                n = pins.get(key, 0)
                if not n:
                    unpinned += lru[key]
                pins[key] = n + 1
                touch(key)
            self._unpinned_bytes -= unpinned
            self._pinned_by[owner] = keys
        if count:
            self.count_lookup(len(keys), len(hashes), bs, prompt_tokens)
        return len(keys)

    def count_lookup(self, hit_blocks: int, looked_up_blocks: int, block_size: int,
                     prompt_tokens: int | None = None) -> None:
        """Add one lookup of `looked_up_blocks` full blocks of a `prompt_tokens`-token
        prompt, `hit_blocks` of them hits (the token counters: `PrefixCacheStats`).
        prompt_tokens None: a prompt of exactly the looked-up blocks."""
        st = self.stats
        p = looked_up_blocks * block_size if prompt_tokens is None else int(prompt_tokens)
        served = min(hit_blocks * block_size, max(p - 1, 0))
        st.lookups += 1
        st.hit_blocks += hit_blocks
        st.miss_blocks += looked_up_blocks - hit_blocks
        st.hit_tokens += served
        st.cacheable_tokens += min(looked_up_blocks * block_size, max(p - 1, 0))
        st.miss_tokens += p - served

    def release(self, owner: Hashable) -> int:
        """Unpin `owner`'s blocks; return how many were pinned (0 if none)."""
        keys = self._pinned_by.pop(owner, None)
        if not keys:
            return 0
        lru, pins = self._lru, self._pins
        unpinned = 0
        for key in keys:
            n = pins[key] - 1
            if n:
                pins[key] = n
            else:
                del pins[key]
                unpinned += lru[key]
        self._unpinned_bytes += unpinned
        return len(keys)

    def insert(self, hashes: Iterable[int], block_size: int) -> int:
        """Add blocks (already present ones are only touched), evicting LRU unpinned
        entries to make room; stop at the first block that cannot fit. Returns the number
        of new entries. The given order must be the prefix order (head first)."""
        bs = int(block_size)
        nbytes = self.entry_bytes(bs)
        lru = self._lru
        keys = [(bs, h) for h in hashes]
        fresh = dict.fromkeys([key for key in keys if key not in lru])   # (a list: no generator step per key)
        need = nbytes * len(fresh)
        if need <= self.ledger.free_bytes:
            # Everything fits without evicting (the common case): what the loop below
            # would do, booked at once instead of block by block. Touching the keys
            # last-to-first adds each fresh one where the loop's final touches put it.
            if need:
                self.ledger.alloc(self.category, need)
                self._unpinned_bytes += need
                self.stats.inserted_blocks += len(fresh)
                if self.journal is not None:
                    self.journal.append(("stored", list(fresh)))
            touch = lru.move_to_end
            for key in reversed(keys):
                if key in lru:
                    touch(key)
                else:
                    lru[key] = nbytes
            return len(fresh)
        added: list[tuple[int, int]] = []
        protected: set[tuple[int, int]] = set()
        stored: list[tuple[int, int]] = []
        new = 0
        for key in keys:
            if key in lru:
                added.append(key)
                protected.add(key)
                continue
            if not self.make_room(nbytes, protect=protected):
                break
            self.ledger.alloc(self.category, nbytes)
            lru[key] = nbytes
            self._unpinned_bytes += nbytes
            new += 1
            stored.append(key)
            added.append(key)
            protected.add(key)
        self.stats.inserted_blocks += new
        if self.journal is not None and new:
            self.journal.append(("stored", stored))
        for key in reversed(added):
            lru.move_to_end(key)
        return new

    def make_room(self, nbytes: int, protect: AbstractSet[tuple[int, int]] = frozenset()) -> bool:
        """Evict LRU unpinned entries until the ledger has `nbytes` free; return whether
        it has (nothing is evicted if it cannot). Keys in `protect` are not evicted."""
        need = _as_bytes(nbytes, "PrefixCache.make_room")
        free = self.ledger.free_bytes
        if free >= need:
            return True
        if free + self._unpinned_bytes < need:
            return False                    # even evicting every unpinned entry falls short
        pins = self._pins
        victims = []
        freed = free
        for key, size in self._lru.items():
            if freed >= need:
                break
            if key in pins or key in protect:
                continue
            victims.append(key)
            freed += size
        if freed < need:
            return False
        lru = self._lru
        sizes = [lru.pop(key) for key in victims]
        if self.host is not None:
            self.host.demote(victims, sizes)
        self.ledger.free(self.category, freed - free)
        self._unpinned_bytes -= freed - free
        self.stats.evicted_blocks += len(victims)
        if self.journal is not None:
            self.journal.append(("removed", victims))
        return True

    def evictable_bytes(self) -> int:
        """Bytes of unpinned entries (what `make_room` could free without `protect`); O(1)."""
        return self._unpinned_bytes

    def clear(self) -> None:
        """Drop every unpinned entry."""
        pins = self._pins
        victims = [k for k in self._lru if k not in pins]
        freed = 0
        for key in victims:
            freed += self._lru.pop(key)
        self.ledger.free(self.category, freed)
        self._unpinned_bytes = 0
        if self.journal is not None and victims:
            self.journal.append(("removed", victims))


class HostKVTier:
    """Prefix blocks evicted from a device's prefix cache, kept in its host's memory.

    A second, larger and slower tier under `PrefixCache` (as LMCache and vLLM's CPU
    offloading keep evicted KV in host DRAM, and Mooncake's store in pooled DRAM): a
    block the device evicts is kept here (LRU within `capacity_bytes`), and a request
    whose prefix continues into these blocks loads them back instead of recomputing
    them. Loading moves the bytes over the host link: `bandwidth_Bps` is the instance's
    host-to-device bandwidth (all its devices' links together: each device loads its
    own share of the layers and heads), `joules_per_byte` the energy of moving a byte
    from host DRAM to the device (DRAM read, the link, the device write).

    Keys are the prefix cache's (block_size, hash). `stats`: blocks demoted, dropped
    (evicted here too), looked up and hit, loads, bytes loaded, seconds and joules.
    Raises ValueError on a negative capacity, a bandwidth <= 0 or a negative energy.
    """

    def __init__(self, capacity_bytes: int, bandwidth_Bps: float, joules_per_byte: float) -> None:
        if int(capacity_bytes) < 0 or not bandwidth_Bps > 0 or not joules_per_byte >= 0:
            raise ValueError(f"HostKVTier: need capacity_bytes >= 0, bandwidth_Bps > 0, joules_per_byte >= 0; "
                             f"got {capacity_bytes}, {bandwidth_Bps}, {joules_per_byte}")
        self.capacity_bytes = int(capacity_bytes)
        self.bandwidth_Bps = float(bandwidth_Bps)
        self.joules_per_byte = float(joules_per_byte)
        self._lru: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.used_bytes = 0
        self.stats = {"demoted_blocks": 0, "dropped_blocks": 0, "hit_blocks": 0, "loads": 0,
                      "bytes_loaded": 0, "load_s": 0.0, "joules": 0.0}

    def __len__(self) -> int:
        return len(self._lru)

    def demote(self, keys: Sequence[tuple[int, int]], sizes: Sequence[int]) -> None:
        """Keep evicted entries (most recently used last), dropping the least recently
        used beyond the capacity; an entry larger than the whole tier is dropped."""
        lru = self._lru
        for key, size in zip(keys, sizes):
            if key in lru:
                lru.move_to_end(key)
                continue
            if size > self.capacity_bytes:
                self.stats["dropped_blocks"] += 1
                continue
            lru[key] = int(size)
            self.used_bytes += int(size)
            self.stats["demoted_blocks"] += 1
        while self.used_bytes > self.capacity_bytes:
            _, size = lru.popitem(last=False)
            self.used_bytes -= size
            self.stats["dropped_blocks"] += 1

    def run(self, hashes: Sequence[int], block_size: int) -> int:
        """Length of the leading run of `hashes` held here (the run is touched)."""
        lru, bs, n = self._lru, int(block_size), 0
        for h in hashes:
            key = (bs, h)
            if key not in lru:
                break
            lru.move_to_end(key)
            n += 1
        self.stats["hit_blocks"] += n
        return n

    def load(self, nbytes: int) -> float:
        """Book a load of `nbytes` back to the device; returns its time (s) over the link."""
        nbytes = int(nbytes)
        seconds = nbytes / self.bandwidth_Bps
        st = self.stats
        st["loads"] += 1
        st["bytes_loaded"] += nbytes
        st["load_s"] += seconds
        st["joules"] += nbytes * self.joules_per_byte
        return seconds

    def as_dict(self) -> dict:
        """The counters with the capacity and what is held."""
        return {**self.stats, "capacity_bytes": self.capacity_bytes, "used_bytes": self.used_bytes,
                "blocks": len(self._lru), "bandwidth_Bps": self.bandwidth_Bps}
