"""Agentic sessions (workloads/data/agentic_sessions.toml and its generator): each turn's
prompt extends the last, so a prefix cache that kept a session's blocks serves them to
its next turn; the wafer alone keeps what fits in SRAM and recomputes the rest, and the
recomputation is counted (results.json `prefix_cache.recomputed_tokens`)."""

from __future__ import annotations

import numpy as np
import pytest

from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import generate_workload, load_workload
from workloads.load import LoadControls, apply_load
from workloads.workload_spec import parse_workload


def _agents(n_sessions: int, turns: int, context: int, think_s: float) -> list:
    """`n_sessions` sessions of exactly `turns` turns (fixed lengths), replayed turn by
    turn, every session starting at 0 s."""
    spec = parse_workload({
        "duration_s": 1.0, "block_size": 512,
        "clients": [{"name": "agent", "rate_per_s": float(n_sessions), "arrival": "constant",
                     "input_tokens": {"dist": "fixed", "tokens": 2000},
                     "output_tokens": {"dist": "fixed", "tokens": 40},
                     "session": {"turns_mean": 1e6, "max_turns": turns, "think_after": "answer",
                                 "think_time_s": think_s, "system_prompt_tokens": 4096,
                                 "initial_context_tokens": {"dist": "fixed", "tokens": context}}}]})
    reqs = apply_load(generate_workload(spec), LoadControls(request_rate=float("inf")))
    assert len({r.turn.session for r in reqs}) == n_sessions and len(reqs) == n_sessions * turns
    return reqs


def test_the_shipped_workload_chains_turns_that_extend_the_last():
    reqs = generate_workload(load_workload("agentic-sessions"), duration_s=60)
    by_session: dict[str, list] = {}
    for r in reqs:
        by_session.setdefault(r.turn.session, []).append(r)
    assert len(by_session) > 5
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn.index)
        assert [r.turn.index for r in turns] == list(range(len(turns)))
        assert turns[0].turn.think_time_s == 0 and all(r.turn.think_time_s > 0 for r in turns[1:])
        for a, b in zip(turns, turns[1:]):
            full = a.prompt_tokens // a.block_size
            # b's prompt is a's prompt + a's answer + a tool output: a's full blocks lead b's
            assert b.prompt_tokens >= a.prompt_tokens + a.output_tokens
            assert b.block_hashes[:full] == a.block_hashes[:full]
            assert b.block_hashes[full] != a.block_hashes[full]      # a's partial block grew
    p = np.array([r.prompt_tokens for r in reqs])
    assert 60_000 < np.median(p) < 130_000 and p.max() <= 126_000


def test_a_later_turn_hits_the_earlier_turns_blocks_on_the_wafer():
    reqs = _agents(2, 4, 40_000, think_s=0.5)
    out = run_scenario(load_scenario("wafer-only-kimi-k2"), reqs, runtime="virtual")
    assert out.results["requests"]["completed"] == len(reqs)
    pc = out.results["prefix_cache"]
    # turn j > 0 hits all of turn j-1's full blocks, nothing is evicted
    assert pc["hit_blocks"] == sum(r.prompt_tokens // 512 for r in reqs if r.turn.index < 3)
    assert pc["evicted_blocks"] == 0
    # the two first turns start together: both compute the agent's 4,096-token system
    # prompt, and the second computation is counted as recomputed
    assert pc["recomputed_tokens"] == 4096


def test_the_wafer_alone_recomputes_evicted_prefixes_and_counts_them():
    # 64 agents x ~100k tokens of context: more than the 28 CS-3's ~5.1 M tokens of KV
    reqs = _agents(64, 3, 90_000, think_s=2.0)
    wafer = run_scenario(load_scenario("wafer-only-kimi-k2"), reqs, runtime="virtual", max_concurrency=64)
    assert wafer.results["requests"]["completed"] == len(reqs)
    pc = wafer.results["prefix_cache"]
    assert pc["evicted_blocks"] > 0 and pc["recomputed_tokens"] > 0
    assert pc["hit_ratio"] < pc["ideal_hit_ratio"]
    assert pc["recomputed_tokens"] == 512 * (round(pc["ideal_block_hit_ratio"] * (pc["hit_blocks"] + pc["miss_blocks"]))
                                             - pc["hit_blocks"])
    # the work is counted: every prompt token is either served from cache or computed
    st = [s for s in wafer.stats.values() if s.get("role") == "both"]
    assert sum(s["tokens_computed"] + s["tokens_cached"] for s in st) == sum(r.prompt_tokens for r in reqs)
    # a full Helios rack's HBM keeps every session's prefix (nothing evicted; KV-aware
    # routing keeps most sessions on one instance: what it recomputes is sessions it
    # moved off a long queue) and ships each turn's whole context to the wafer
    split_sc = load_scenario("helios72-cs3-kimi-k2").with_router(policy="prefix_aware")
    split = run_scenario(split_sc, reqs, runtime="virtual", max_concurrency=64)
    spc, kv = split.results["prefix_cache"], split.results["kv_transfer"]
    assert spc["evicted_blocks"] == 0 and spc["recomputed_tokens"] < pc["recomputed_tokens"] / 2
    # every turn ships its whole context: prompt tokens x Kimi-K2's fp8 MLA KV per token
    assert kv["transfers"] == len(reqs)
    assert kv["bytes_logical"] == sum(r.prompt_tokens for r in reqs) * 35_136
    prefill_work = sum(s["tokens_computed"] for s in split.stats.values() if s.get("role") == "prefill")
    wafer_work = sum(s["tokens_computed"] for s in st)
    assert prefill_work < wafer_work
