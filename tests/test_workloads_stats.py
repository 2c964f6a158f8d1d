"""trace_stats reproduces the figures of each shipped trace's README (workloads/data/traces/*/README.md).

Counts exactly; means and percentiles to 0.1%; figures the READMEs print with fewer
digits (rates, CV, ratios, spans in minutes) to the printed precision.
"""

import math

import numpy as np
import pytest

from workloads import Request, ideal_prefix_hits, load_requests, trace_stats


def stats_of(name):
    return trace_stats(name)     # shipped with the package


def close(value, printed: float, digits: int) -> bool:
    """`value` rounds to the README's `printed` figure shown with `digits` decimals."""
    return abs(value - printed) <= 0.5 * 10 ** -digits + 1e-12


REL = 1e-3  # "means and percentiles to 0.1%"


@pytest.fixture(scope="module")
def mooncake():
    return stats_of("mooncake_conv")


def test_mooncake_conversation_readme(mooncake):
    s = mooncake
    # mooncake/README.md
    assert s.count == 12_031 and s.format == "mooncake"
    assert s.span_s == pytest.approx(3536.999) and close(s.span_s / 60, 58.9, 1)
    assert s.input_tokens.mean == pytest.approx(12_035.1, rel=REL)
    assert s.input_tokens.median == pytest.approx(6_909, rel=REL)
    assert s.input_tokens.p99 == pytest.approx(85_400, rel=REL)
    assert (s.input_tokens.min, s.input_tokens.max) == (891, 126_195)
    assert s.output_tokens.mean == pytest.approx(342.6, rel=REL)
    assert s.output_tokens.median == pytest.approx(350, rel=REL)
    assert s.output_tokens.p99 == pytest.approx(1_118.5, rel=REL)
    assert (s.output_tokens.min, s.output_tokens.max) == (1, 2_000)
    assert close(s.rate_mean_per_s, 3.401, 3) and close(s.rate_peak_1min_per_s, 4.12, 2)
    assert close(s.interarrival_cv, 3.03, 2)
    assert (s.prefix_blocks_hit, s.prefix_blocks) == (105_710, 288_500)
    assert close(s.prefix_block_hit_ratio, 0.366, 3)      # the README's (blocks seen before)
    # the project's ratio: tokens served over cacheable tokens (full blocks, less the last position)
    assert s.prefix_hit_ratio == ideal_prefix_hits(load_requests("mooncake_conv")).hit_ratio
    assert s.distinct_hashes == 182_790 and s.block_size == 512


@pytest.mark.parametrize("name,count,minutes,ctx,gen,rate,peak,cv", [
    # azure_llm_2023/README.md: (mean, median, p99, max) of ContextTokens / GeneratedTokens
    ("azure_code", 8_819, 57.3, (2_047.8, 1_469, 7_436, 7_437), (27.9, 13, 251.5, 1_899),
     2.567, 10.53, 13.15),
    ("azure_conv", 19_366, 58.4, (1_154.7, 1_020, 4_142, 14_050), (211.1, 129, 601, 1_000),
     5.530, 8.45, 1.09),
])
def test_azure_2023_readme(name, count, minutes, ctx, gen, rate, peak, cv):
    s = stats_of(name)
    assert s.count == count and s.format == "azure" and s.skipped_rows == 0
    assert close(s.span_s / 60, minutes, 1)
    for got, (mean, median, p99, mx) in ((s.input_tokens, ctx), (s.output_tokens, gen)):
        assert got.mean == pytest.approx(mean, rel=REL)
        assert got.median == pytest.approx(median, rel=REL)
        assert got.p99 == pytest.approx(p99, rel=REL)
        assert got.max == mx and got.min >= 1  # "no rows with zero input or output tokens"
    assert close(s.rate_mean_per_s, rate, 3) and close(s.rate_peak_1min_per_s, peak, 2)
    assert close(s.interarrival_cv, cv, 2)
    assert not s.has_hashes and s.prefix_hit_ratio is None


def test_vidur_arxiv_readme():
    s = stats_of("arxiv_lengths")
    # vidur/README.md
    assert s.count == 28_257 and not s.has_timestamps
    assert s.span_s is None and s.rate_mean_per_s is None and s.interarrival_cv is None
    assert s.input_tokens.mean == pytest.approx(2_588.1, rel=REL)
    assert s.input_tokens.median == pytest.approx(2_730, rel=REL)
    assert s.input_tokens.p99 == pytest.approx(3_933, rel=REL)
    assert (s.input_tokens.min, s.input_tokens.max) == (1, 4_054)
    assert s.output_tokens.mean == pytest.approx(291.4, rel=REL)
    assert s.output_tokens.median == pytest.approx(167, rel=REL)
    assert s.output_tokens.p99 == pytest.approx(3_271, rel=REL)
    assert (s.output_tokens.min, s.output_tokens.max) == (5, 4_056)
    assert s.prefix_hit_ratio is None


def test_shipped_excerpts_match_their_readme():
    # workloads/data/README.md
    s = trace_stats("mooncake-excerpt")
    assert s.count == 339 and s.span_s == 117.0
    assert (s.prefix_blocks_hit, s.prefix_blocks) == (1_047, 9_661)
    assert s.input_tokens.mean == pytest.approx(14_335.8, rel=REL)
    a = trace_stats("azure-conv-excerpt")
    assert a.count == 456 and close(a.interarrival_cv, 1.30, 2)
    assert a.output_tokens.median == 217


def test_definitions_on_a_hand_made_trace():
    # arrivals 0, 1, 3, 61, 62 s: gaps 1, 2, 58, 1; minute bins [0,60): 3, [60,120): 2
    reqs = [Request(i, t, p, o, h, 4) for i, (t, p, o, h) in enumerate([
        (0.0, 10, 1, (1, 2, 3)), (1.0, 6, 2, (1, 2)), (3.0, 4, 3, (9,)),
        (61.0, 8, 4, (1, 5)), (62.0, 3, 5, (9,))])]
    s = trace_stats(reqs)
    gaps = np.array([1.0, 2.0, 58.0, 1.0])
    assert s.count == 5 and s.span_s == 62.0 and s.rate_mean_per_s == 5 / 62
    assert s.rate_peak_per_min == 3 and s.rate_peak_1min_per_s == 3 / 60
    # under a minute of arrivals: no whole minute, no per-minute peak rate
    short = trace_stats(reqs[:3])
    assert short.rate_peak_per_min == 3 and short.rate_peak_1min_per_s is None
    assert s.interarrival_cv == pytest.approx(gaps.std() / gaps.mean())
    assert s.input_tokens.p90 == pytest.approx(np.percentile([10, 6, 4, 8, 3], 90))
    # blocks seen before: req1 (1,2), req3 (1), req4 (9) -> 4 of 9 blocks
    assert (s.prefix_blocks_hit, s.prefix_blocks) == (4, 9)
    # full blocks (4 tokens) looked up: req0 (1,2), req1 (1), req2 (9), req3 (1,5); hits:
    # req1 block 1 (min(4, 6 - 1) = 4 tokens), req3 block 1 (4); cacheable:
    # min(8, 9) + min(4, 5) + min(4, 3) + min(8, 7) = 8 + 4 + 3 + 7 = 22; req4 (3 tokens) has none
    assert (s.prefix_hit_tokens, s.prefix_cacheable_tokens) == (8, 22)
    assert s.prefix_hit_ratio == pytest.approx(8 / 22)
    assert s.distinct_hashes == 5
    single = trace_stats(reqs[:1])
    assert single.interarrival_cv is None and single.rate_mean_per_s is None
    assert math.isclose(single.span_s, 0.0)


def test_ideal_prefix_hits_keeps_block_sizes_apart():
    # A hash seen with 16-token blocks is not a hit for a request cut in 32-token blocks
    # (its blocks hold other tokens), bounded or not; each size hits its own blocks.
    def req(i, bs, hashes):
        return Request(id=i, arrival_s=float(i), prompt_tokens=bs * len(hashes) + 1, output_tokens=1,
                       block_hashes=list(hashes), block_size=bs)

    reqs = [req(0, 16, [1, 2]), req(1, 32, [1, 2]), req(2, 16, [1, 2, 3]), req(3, 32, [1, 5])]
    for cap in (None, 100):
        h = ideal_prefix_hits(reqs, cap)
        assert (h.hit_blocks, h.looked_blocks) == (2 + 1, 2 + 2 + 3 + 2), cap
        assert h.hit_tokens == 2 * 16 + 1 * 32 and h.cacheable_tokens == 16 * 5 + 32 * 4, cap
    # a bounded cache of 2 blocks, shared by both sizes: request 1's blocks evict request 0's
    h = ideal_prefix_hits(reqs, 2)
    assert h.hit_blocks == 0
