"""Shared-prefix generator: system prompts and multi-turn conversations with block hashes."""

import pytest

from workloads import FixedLengths, shared_prefix_requests, trace_stats


def test_single_turn_shared_system_prompt_hits_exactly():
    n = 50
    reqs = shared_prefix_requests(n, 2.0, system_prompts=1, system_prompt_tokens=1024,
                                  turns_mean=1.0, turn_lengths=FixedLengths(100, 10),
                                  block_size=512, seed=0)
    assert len(reqs) == n and all(r.prompt_tokens == 1124 for r in reqs)
    assert all(len(r.block_hashes) == 3 for r in reqs)  # 2 full system blocks + 1 partial
    assert {r.block_hashes[:2] for r in reqs} == {(0, 1)}
    assert len({r.block_hashes[2] for r in reqs}) == n  # the user part is private
    s = trace_stats(reqs)
    assert (s.prefix_blocks_hit, s.prefix_blocks) == (2 * (n - 1), 3 * n)
    # the 2 full system blocks of every prompt are cacheable; every prompt but the first hits them
    assert (s.prefix_hit_tokens, s.prefix_cacheable_tokens) == (1024 * (n - 1), 1024 * n)
    assert s.prefix_hit_ratio == pytest.approx((n - 1) / n)


def test_multi_turn_prefix_property_and_partial_blocks():
    reqs = shared_prefix_requests(30, 1.0, system_prompts=3, system_prompt_tokens=700,
                                  turns_mean=4.0, turn_lengths=FixedLengths(300, 200),
                                  think_time_mean_s=5.0, block_size=256, seed=3)
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r.tenant, []).append(r)
    assert any(len(turns) > 1 for turns in by_conv.values())
    for turns in by_conv.values():
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.arrival_s >= prev.arrival_s
            # the next prompt holds the previous prompt and its answer
            assert nxt.prompt_tokens == prev.prompt_tokens + 200 + 300
            full = prev.prompt_tokens // 256
            assert nxt.block_hashes[:full] == prev.block_hashes[:full]
            if prev.prompt_tokens % 256:  # a partial block is not reused once it grows
                assert nxt.block_hashes[full] != prev.block_hashes[full]
    # ids follow arrival order; hashes are numbered in order of first appearance
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    seen = -1
    for r in reqs:
        for h in r.block_hashes:
            assert h <= seen + 1
            seen = max(seen, h)
    assert trace_stats(reqs).prefix_hit_ratio > 0.3


def test_reproducible_and_bounded():
    kw = dict(system_prompts=4, turns_mean=3.0, max_prompt_tokens=4096, seed=9)
    a = shared_prefix_requests(40, 3.0, **kw)
    assert a == shared_prefix_requests(40, 3.0, **kw)
    assert a != shared_prefix_requests(40, 3.0, **{**kw, "seed": 10})
    firsts = {}
    for r in a:
        firsts.setdefault(r.tenant, r.id)
    later = [r for r in a if firsts[r.tenant] != r.id]
    assert later and all(r.prompt_tokens <= 4096 for r in later)  # conversations end at the cap
    with pytest.raises(ValueError, match="conversation_rate_per_s > 0"):
        shared_prefix_requests(10, 0.0)
