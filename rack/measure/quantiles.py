"""Exact percentiles, means and extremes of samples too many to hold at once.

A long run's inter-token latencies (one per output token: ~10^8 for a million
requests) are kept in chunks on disk (`rack.serving.records`). Their summary is exact,
not a sketch: the same numbers `numpy.percentile` (linear interpolation, numpy's
default method) and a correctly rounded mean give on the whole array in memory.

- Order statistics by radix selection over the float64 bit patterns: a float64 maps to
  a uint64 whose order is the numbers' order (flip every bit of a negative number, the
  sign bit of a positive one); each pass over the chunks counts, among the samples
  whose leading bits match what is known of the wanted one, how many have each value
  of the next 16 bits, and so fixes those bits. Once the wanted sample's group is small
  (`COLLECT_MAX`) one more pass gathers the group and selects in memory. At most five
  passes for all percentiles together; memory is one chunk plus 2^16 counters per
  wanted sample.
- Interpolation as numpy does it: virtual index (n - 1) * q / 100, neighbours at its
  floor and floor + 1 (both the last at the top end), and numpy's two-sided lerp, so
  the result is bit for bit `np.percentile`'s (checked by tests/test_records_stream.py).
- Mean: `math.fsum` (correctly rounded, so independent of the samples' order and of the
  chunking) divided by n, for arrays in memory too (`rack.measure.metrics.summarize`).
- Runs: a chunk may be a pair (values, counts), value i standing for counts[i] equal
  samples (`rack.serving.records.ITLSamples`: a decode step's gap shared by every
  request in the batch). Every result is the one of the expanded samples, bit for bit:
  ranks count samples, not values; the exact integer sum weighs each value's integer
  mantissa by its count.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

#: A group of candidates this small (8 MiB of float64) is gathered and selected in memory.
COLLECT_MAX = 1 << 20
#: Samples processed at once within a chunk (their keys, digits and Python floats are
#: temporaries).
BLOCK = 1 << 16
_DIGIT_BITS = 16
_SIGN = np.uint64(1 << 63)


def sortable_keys(v: np.ndarray) -> np.ndarray:
    """uint64 keys whose order is the order of the float64 values `v` (no NaN)."""
    u = np.ascontiguousarray(v, dtype=np.float64).view(np.uint64)
    return np.where(u >> np.uint64(63), ~u, u | _SIGN)


def _value(key: int) -> float:
    u = np.uint64(key)
    u = u ^ _SIGN if u & _SIGN else ~u
    return float(np.array([u], dtype=np.uint64).view(np.float64)[0])


def _pairs(chunks: Iterable) -> Iterable[tuple[np.ndarray, np.ndarray | None]]:
    """(values, counts or None: one each) of every chunk: an array or a (values, counts) pair."""
    for c in chunks:
        if type(c) is tuple:
            yield np.asarray(c[0], dtype=np.float64), np.asarray(c[1], dtype=np.int64)
        else:
            yield c, None


def _blocks(chunks: Iterable) -> Iterable[tuple[np.ndarray, np.ndarray | None]]:
    """The (values, counts or None) of `chunks` in pieces of at most BLOCK values."""
    for v, c in _pairs(chunks):
        for start in range(0, len(v), BLOCK):
            yield v[start:start + BLOCK], None if c is None else c[start:start + BLOCK]


def sample_count(chunks: Iterable) -> int:
    """How many samples `chunks` hold (runs counted by their counts)."""
    return sum(len(v) if c is None else int(c.sum()) for v, c in _pairs(chunks))


def exact_fsum(chunks: Iterable[np.ndarray]) -> float:
    """The correctly rounded sum of every sample of `chunks` (math.fsum's result: the
    correctly rounded sum is unique, and math.fsum's errors). Samples are taken as
    float64 (as math.fsum converts them); finite ones are summed exactly in integer
    arithmetic with numpy (`_exact_block`), the per-block totals combined as Python ints
    and rounded once (a Python int over a power of two divides correctly rounded); inf
    and NaN decide the sum as math.fsum does. (Where math.fsum raises OverflowError for
    an intermediate overflow of finite samples whose sum fits, this returns that sum.)"""
    parts: list[tuple[int, int]] = []
    special: list[float] = []
    for b, c in _blocks(chunks):
        b = np.asarray(b, dtype=np.float64)
        if not b.size:
            continue
        finite = np.isfinite(b)
        if not finite.all():
            special.extend(b[~finite].tolist())     # any number of copies: the same inf / NaN
            b = b[finite]
            c = None if c is None else c[finite]
        if b.size:
            parts.append(_exact_block(b, c))
    if special:
        return math.fsum(special)               # inf or NaN: the finite samples do not matter
    if not parts:
        return 0.0
    lo = min(e for _, e in parts)
    total = sum(n << (e - lo) for n, e in parts)     # 0 gives 0.0, as math.fsum (even for -0.0s)
    return float(total << lo) if lo >= 0 else total / (1 << -lo)


#: Largest count a run's value is multiplied by inside `_exact_block`'s float64 sums
#: (a 27-bit half times it, summed over BLOCK values, stays an integer below 2^53).
_COUNT_IN_FLOAT = 1 << 10


def _exact_block(b: np.ndarray, counts: np.ndarray | None = None) -> tuple[int, int]:
    """(n, e) with n * 2**e the exact sum of `b`, finite float64 of at most BLOCK
    values, each taken counts[i] times (None: once)."""
    if not b.size:
        return 0, 0
    m, ex = np.frexp(b)                         # b = m * 2**ex, 0.5 <= |m| < 1 (or 0)
    q = (m * 9007199254740992.0).astype(np.int64)   # m * 2**53: an exact 53-bit integer
    lo = int(ex.min())
    k = ex - lo
    total = 0
    w = None
    if counts is not None:
        big = counts > _COUNT_IN_FLOAT
        if big.any():                           # rare: such runs summed as Python ints
            total += sum(int(x) * int(c) << int(e) for x, c, e in zip(q[big], counts[big], k[big]))
            q = np.where(big, 0, q)
        w = counts.astype(np.float64)
    # halves below 2**27 in magnitude (times a count of at most _COUNT_IN_FLOAT): their
    # float64 sums per exponent over at most BLOCK samples stay integers below 2**53, so exact
    for half, shift in ((q >> 26, 26), (q & ((1 << 26) - 1), 0)):
        h = half.astype(np.float64)
        for j, x in enumerate(np.bincount(k, weights=h if w is None else h * w).tolist()):
            if x:
                total += int(x) << (j + shift)
    return total, lo - 53


def order_statistics(chunks: Iterable, ranks: Sequence[int], n: int | None = None) -> dict[int, float]:
    """{rank: the rank-th smallest sample (0-based)} over the samples of `chunks`, an
    iterable that can be iterated several times (e.g. `rack.serving.records.SampleChunks`),
    of float64 arrays or (values, counts) runs (module docstring), without NaN; `n`:
    their number of samples if known (else counted). Raises IndexError for a rank
    outside [0, n)."""
    wanted = sorted(set(int(r) for r in ranks))
    if n is None:
        n = sample_count(chunks)
    for r in wanted:
        if not 0 <= r < n:
            raise IndexError(f"rank {r} outside [0, {n})")
    # per wanted rank: (known leading bits, how many bits are known, rank within the group);
    # a group is collected once it holds few values (runs count once: memory, not samples)
    state = {r: (0, 0, r) for r in wanted}
    found: dict[int, float] = {}
    group_values = {r: n for r in wanted}     # (at most n values: no pass to count them)
    while len(found) < len(wanted):
        todo = [r for r in wanted if r not in found]
        collect = [r for r in todo if group_values[r] <= COLLECT_MAX]
        count = [r for r in todo if r not in collect]
        hist: dict[tuple[int, int], np.ndarray] = {}
        entries: dict[tuple[int, int], np.ndarray] = {}
        groups: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray | None]]] = {}
        for block, mult in _blocks(chunks):
            keys = sortable_keys(block)
            for prefix, bits in {state[r][:2] for r in todo}:
                if bits == 0:
                    sel, sel_mult = keys, mult
                else:
                    inside = (keys >> np.uint64(64 - bits)) == np.uint64(prefix)
                    sel, sel_mult = keys[inside], None if mult is None else mult[inside]
                if any(state[r][:2] == (prefix, bits) for r in count):
                    digit = ((sel >> np.uint64(64 - bits - _DIGIT_BITS)) & np.uint64((1 << _DIGIT_BITS) - 1)).astype(np.int64)
                    e = np.bincount(digit, minlength=1 << _DIGIT_BITS)
                    # samples per digit: exact in float64 below 2^53 samples
                    h = e if sel_mult is None else np.bincount(digit, weights=sel_mult, minlength=1 << _DIGIT_BITS).astype(np.int64)
                    key = (prefix, bits)
                    hist[key] = hist[key] + h if key in hist else h
                    entries[key] = entries[key] + e if key in entries else e
                if any(state[r][:2] == (prefix, bits) for r in collect):
                    groups.setdefault((prefix, bits), []).append((sel, sel_mult))
        by_group: dict[tuple[int, int], list[int]] = {}
        for r in collect:
            by_group.setdefault(state[r][:2], []).append(r)
        for key, rs in by_group.items():       # one selection per group, for all its ranks
            parts = groups[key]
            g = np.concatenate([p for p, _ in parts])
            ks = [state[r][2] for r in rs]
            if all(m is None for _, m in parts):
                picked = np.partition(g, ks)[ks]
            else:
                mult = np.concatenate([np.ones(len(p), np.int64) if m is None else m for p, m in parts])
                order = np.argsort(g)          # equal keys are equal samples: any order
                cum = np.cumsum(mult[order])
                picked = g[order][np.searchsorted(cum, ks, side="right")]
            for r, key_r in zip(rs, picked.tolist()):
                found[r] = _value(int(key_r))
        for r in count:
            prefix, bits, k = state[r]
            cum = np.cumsum(hist[(prefix, bits)])
            d = int(np.searchsorted(cum, k, side="right"))
            before = int(cum[d - 1]) if d else 0
            group_values[r] = int(entries[(prefix, bits)][d])
            prefix, bits, k = (prefix << _DIGIT_BITS) | d, bits + _DIGIT_BITS, k - before
            if bits == 64:                  # every bit known: the key is the sample
                found[r] = _value(prefix)
            state[r] = (prefix, bits, k)
    return {r: found[r] for r in ranks}


def linear_percentiles(chunks: Iterable, n: int, q: Sequence[float]) -> list[float]:
    """Percentiles `q` (in [0, 100]) of the `n` samples of `chunks` (re-iterable, no
    NaN; arrays or (values, counts) runs), as `np.percentile(all_samples, q)` computes them (module docstring).
    Raises ValueError for n < 1."""
    if n < 1:
        raise ValueError("percentiles of no samples")
    # numpy.lib._function_base_impl._quantile / _get_indexes / _lerp, method "linear"
    virtual = (n - 1) * np.true_divide(np.asarray(q, dtype=np.float64), 100)
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = -1
    nxt[above] = -1
    below = virtual < 0
    prev[below] = 0
    nxt[below] = 0
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    gamma = np.asarray(virtual - prev, dtype=np.float64)
    lo, hi = np.where(prev < 0, n - 1, prev), np.where(nxt < 0, n - 1, nxt)
    stats = order_statistics(chunks, [*lo.tolist(), *hi.tolist()], n)
    a = np.array([stats[i] for i in lo.tolist()])
    b = np.array([stats[i] for i in hi.tolist()])
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out.tolist()


__all__ = ["COLLECT_MAX", "exact_fsum", "linear_percentiles", "order_statistics", "sample_count", "sortable_keys"]
