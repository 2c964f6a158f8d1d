"""Reading `rack serve`'s /metrics in tests: families parsed with prometheus_client,
a histogram's buckets, and Prometheus' histogram_quantile over a scrape's delta."""

from __future__ import annotations

import math

import httpx
from prometheus_client import parser


def _families(url) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _buckets(fam) -> list[tuple[float, float]]:
    """(upper bound, count in that bucket) of a histogram family, non-cumulative."""
    cum = sorted((float(s.labels["le"]), s.value) for s in fam.samples if s.name.endswith("_bucket"))
    return [(le, c - (cum[i - 1][1] if i else 0.0)) for i, (le, c) in enumerate(cum)]


def histogram_quantile(fam, q: float, since=None) -> float:
    """Prometheus' histogram_quantile (linear interpolation inside the bucket) of the
    observations made after the scrape `since` (a family, or None: all)."""
    b = _buckets(fam)
    if since is not None:
        b = [(le, c - c0) for (le, c), (_, c0) in zip(b, _buckets(since))]
    total = sum(c for _, c in b)
    rank, seen, lower = q * total, 0.0, 0.0
    for le, c in b:
        if c and seen + c >= rank:
            return lower + (le - lower) * (rank - seen) / c
        seen += c
        lower = le
    return math.nan
