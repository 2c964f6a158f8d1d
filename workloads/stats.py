"""`trace_stats`: the figures `rack trace stats` prints for a trace.

Definitions (the shared traces' READMEs were computed the same way, and tests pin
them against those READMEs):
- span_s: last arrival - first arrival; rate_mean_per_s: count / span_s.
- rate_peak_per_min: most requests in one minute, minutes counted in fixed 60 s bins
  from the first arrival; rate_peak_1min_per_s is that divided by 60 (None when the
  trace spans under 60 s: its one bin is not a whole minute).
- interarrival_cv: population standard deviation / mean of the gaps between
  consecutive arrivals (numpy ``std``, ddof=0).
- percentiles: linear interpolation (numpy's default), as everywhere in the project.
- prefix_hit_ratio: the project's one prefix-cache hit ratio (`ideal_prefix_hits`), of
  an unbounded cache shared by every instance: prompt tokens served from the cache
  over the prompts' cacheable tokens (their full blocks, less the last position),
  the same figure as a run's `prefix_cache.ideal_hit_ratio` on the same requests;
  prefix_hit_tokens / prefix_cacheable_tokens are its terms.
- prefix_block_hit_ratio: a block-level figure apart, the traces' READMEs' definition:
  the share of hash blocks (partial last blocks included) whose hash appeared in an
  earlier request (prefix_blocks_hit / prefix_blocks).
Rate, span and CV are None for a source without timestamps; the prefix figures are
None for one without hashes.
"""

from __future__ import annotations

import os
from array import array
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from .errors import TraceError
from .reader import TraceReader, open_trace
from .request import Request


@dataclass(frozen=True)
class LengthStats:
    """Token-length summary (tokens): mean, median, p90, p99, min, max."""

    mean: float
    median: float
    p90: float
    p99: float
    min: int
    max: int

    @classmethod
    def of(cls, values: "Any") -> "LengthStats":
        import numpy as np
        a = np.asarray(values, dtype=np.float64)
        med, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(float(a.mean()), float(med), float(p90), float(p99), int(a.min()), int(a.max()))


@dataclass(frozen=True)
class TraceStats:
    """Statistics of one trace (see the module docstring for every definition).

    Units: seconds, requests per second / per minute, tokens. Fields that do not apply
    (no timestamps, no hashes) are None.
    """

    name: str | None
    path: str | None
    format: str | None
    count: int
    has_timestamps: bool
    span_s: float | None
    rate_mean_per_s: float | None
    rate_peak_per_min: int | None
    rate_peak_1min_per_s: float | None
    interarrival_cv: float | None
    input_tokens: LengthStats
    output_tokens: LengthStats
    has_hashes: bool
    block_size: int | None
    prefix_blocks: int | None
    prefix_blocks_hit: int | None
    prefix_block_hit_ratio: float | None
    prefix_hit_ratio: float | None
    prefix_hit_tokens: int | None
    prefix_cacheable_tokens: int | None
    distinct_hashes: int | None
    rows_read: int
    skipped_rows: int
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    failed_requests: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the object `rack trace stats --json` prints)."""
        return asdict(self)


def trace_stats(source: str | os.PathLike | TraceReader | Iterable[Request], *,
                format: str | None = None, skip_bad_rows: bool = False,
                mapping: Mapping[str, Any] | None = None) -> TraceStats:
    """Statistics of a trace NAME/PATH (opened with `open_trace`), an open `TraceReader`,
    or any iterable of `Request`s in arrival order (e.g. a generator's output).

    Streams the input once, keeping 8 bytes per request per column plus the set of
    block hashes seen. Raises TraceError for bad input (see `open_trace`) or when no
    valid request is left.
    """
    import numpy as np

    if isinstance(source, (str, os.PathLike)):
        source = open_trace(source, format=format, skip_bad_rows=skip_bad_rows, mapping=mapping)
    reader = source if isinstance(source, TraceReader) else None

    arrivals = array("d")
    prompts = array("q")
    outputs = array("q")
    seen: set[int] = set()
    blocks = blocks_hit = 0
    ideal = _IdealCache(None)
    has_hashes = False
    block_size: int | None = None
    for r in source:
        arrivals.append(r.arrival_s)
        p = r.prompt_tokens
        prompts.append(p)
        outputs.append(r.output_tokens)
        hashes = r.block_hashes
        if hashes is not None:
            has_hashes = True
            block_size = r.block_size
            blocks += len(hashes)
            blocks_hit += sum(1 for h in hashes if h in seen)
            seen.update(hashes)
            ideal.add(r)

    n = len(prompts)
    name = reader.name if reader else getattr(source, "name", None)
    path = str(reader.path) if reader else getattr(source, "path", None)
    if n == 0:
        detail = ""
        if reader is not None and reader.rows_skipped:
            detail = f": all {reader.rows_read} rows were skipped as bad ({reader.skipped})"
        raise TraceError(str(path or name or "<requests>"), None, None,
                         f"no valid requests{detail}")

    has_ts = reader.has_timestamps if reader else True
    span = rate = cv = peak_rate = None
    peak = None
    if has_ts:
        t = np.frombuffer(arrivals, dtype=np.float64)
        span = float(t[-1] - t[0])
        rate = n / span if span > 0 else None
        peak = int(np.bincount(((t - t[0]) // 60.0).astype(np.int64)).max())
        # a trace shorter than a minute has no whole minute to take a per-minute peak of
        peak_rate = peak / 60.0 if span >= 60.0 else None
        if n >= 2:
            gaps = np.diff(t)
            mean_gap = gaps.mean()
            cv = float(gaps.std() / mean_gap) if mean_gap > 0 else None

    if reader is not None:
        counters = reader.counters()
    else:
        counters = {
            "format": getattr(source, "format", None),
            "rows_read": getattr(source, "rows_read", n),
            "skipped_by_reason": dict(getattr(source, "skipped_by_reason", {})),
            "failed_requests": getattr(source, "failed_requests", 0),
        }
    skipped = counters["skipped_by_reason"]
    return TraceStats(
        name=name, path=path, format=counters["format"], count=n, has_timestamps=has_ts,
        span_s=span, rate_mean_per_s=rate, rate_peak_per_min=peak,
        rate_peak_1min_per_s=peak_rate, interarrival_cv=cv,
        input_tokens=LengthStats.of(np.frombuffer(prompts, dtype=np.int64)),
        output_tokens=LengthStats.of(np.frombuffer(outputs, dtype=np.int64)),
        has_hashes=has_hashes, block_size=block_size,
        prefix_blocks=blocks if has_hashes else None,
        prefix_blocks_hit=blocks_hit if has_hashes else None,
        prefix_block_hit_ratio=(blocks_hit / blocks if blocks else 0.0) if has_hashes else None,
        prefix_hit_ratio=(ideal.hits.hit_ratio or 0.0) if has_hashes else None,
        prefix_hit_tokens=ideal.hits.hit_tokens if has_hashes else None,
        prefix_cacheable_tokens=ideal.hits.cacheable_tokens if has_hashes else None,
        distinct_hashes=len(seen) if has_hashes else None,
        rows_read=counters["rows_read"], skipped_rows=sum(skipped.values()),
        skipped_by_reason=dict(skipped), failed_requests=counters["failed_requests"],
    )


@dataclass
class PrefixHits:
    """Prefix-cache hits of an ideal cache over a request stream (`ideal_prefix_hits`).

    Tokens (the project's one hit ratio, `hit_ratio` = hit_tokens / cacheable_tokens):
    a prompt of p tokens with f full blocks of b tokens, the leading h of them found,
    is served min(h b, p - 1) tokens from the cache out of min(f b, p - 1) it could be
    (the last position is always computed, as vLLM computes it for the first output
    token's logits). Blocks: `hit_blocks` of `looked_blocks` full blocks
    (`block_hit_ratio`), a figure apart.
    """

    hit_blocks: int = 0
    looked_blocks: int = 0
    hit_tokens: int = 0
    cacheable_tokens: int = 0

    @property
    def hit_ratio(self) -> float | None:
        """hit_tokens / cacheable_tokens (None when nothing was cacheable)."""
        return self.hit_tokens / self.cacheable_tokens if self.cacheable_tokens else None

    @property
    def block_hit_ratio(self) -> float | None:
        """hit_blocks / looked_blocks (None when no full block was looked up)."""
        return self.hit_blocks / self.looked_blocks if self.looked_blocks else None


class _IdealCache:
    """The cache of `ideal_prefix_hits`, fed one request at a time (`add`)."""

    def __init__(self, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"ideal_prefix_hits: capacity_blocks must be >= 0 or None, got {capacity_blocks}")
        self.capacity = capacity_blocks
        # unbounded: a set of hashes per block size (nothing is evicted, no recency to
        # keep; no (block size, hash) key built per block, the cost of a whole-trace run)
        self.sets: dict[int, set] = {}
        # bounded: one LRU of (block size, hash) keys, as the capacity is shared by them all
        self.keys: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.hits = PrefixHits()

    def add(self, r: Request) -> None:
        if not r.block_hashes:
            return
        bs, p = r.block_size, r.prompt_tokens
        full = r.block_hashes[: p // bs]
        if self.capacity is None:
            cache = self.sets.get(bs)
            if cache is None:
                cache = self.sets[bs] = set()
            keys = full
        else:
            cache = self.keys
            keys = [(bs, h) for h in full]
        run = 0                                 # the leading blocks the cache holds
        for k in keys:
            if k not in cache:
                break
            run += 1
        if self.capacity is None:
            cache.update(keys)
        else:
            for k in reversed(keys):
                cache[k] = None
                cache.move_to_end(k)
            while len(cache) > self.capacity:
                cache.popitem(last=False)
        n = len(full)
        h = self.hits
        h.hit_blocks += run
        h.looked_blocks += n
        h.hit_tokens += min(run * bs, p - 1)
        h.cacheable_tokens += min(n * bs, p - 1)


def ideal_prefix_hits(requests: Iterable[Request], capacity_blocks: int | None = None) -> PrefixHits:
    """The `PrefixHits` of an ideal prefix cache over `requests` in arrival order:
    shared by every instance and filled the moment a request arrives. Only a prompt's
    full blocks count (prompt_tokens // block_size of its hashes), as an engine's prefix
    cache holds full blocks only (vLLM) and looks up those, and a request hits the
    longest leading run of them the cache holds (a block is reused only after its whole
    prefix; for a trace whose repeated blocks always form a prefix, as Mooncake's, that
    is every full block seen before).

    capacity_blocks: None, an unbounded cache (the upper bound any routing could
        reach); or at most that many blocks, least recently used evicted first, a
        request's blocks touched last to first (as `devices.memory.PrefixCache`): what
        routing could reach with that much cache, were it pooled. Raises ValueError
        for capacity_blocks < 0.
    """
    cache = _IdealCache(capacity_blocks)
    for r in requests:
        cache.add(r)
    return cache.hits
