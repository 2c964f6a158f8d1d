"""One prefix-cache hit ratio (issue 24, build item 5): prompt tokens served from the
cache over the prompts' cacheable tokens (full blocks, less the last position), the
same in a run's summary and results.json (`prefix_cache.hit_ratio`, `ideal_hit_ratio`)
and in `rack trace stats` (`prefix_hit_ratio`); block-level figures are named apart;
`miss_tokens` counts the prompt tokens computed."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.measure.results import summary_text
from rack.cli.app import app
from rack.run.runner import run_scenario
from rack.wiring.scenario import parse_scenario
from test_config_errors_scenarios import BASE  # one prefill and one decode H100, Llama-3.1-8B
from workloads import Request, ideal_prefix_hits, trace_stats

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A: 3 full blocks of 512; B, 5 s later (A long prefilled), shares A's first two blocks,
# then 1 full block of its own and a partial one (1,600 tokens).
REQS = [Request(0, 0.0, 1536, 4, (1, 2, 3), 512), Request(1, 5.0, 1600, 4, (1, 2, 4, 5), 512)]
HIT = 1024                        # B's two shared blocks
CACHEABLE = 1535 + 1536           # A: min(3 x 512, 1536 - 1); B: min(3 x 512, 1600 - 1)
COMPUTED = 1536 + (1600 - HIT)


def test_the_run_trace_stats_and_the_ideal_agree_on_one_definition():
    out = run_scenario(parse_scenario(tomllib.loads(BASE)), REQS, runtime="virtual")
    pc = out.results["prefix_cache"]
    assert (pc["hit_tokens"], pc["cacheable_tokens"], pc["miss_tokens"]) == (HIT, CACHEABLE, COMPUTED)
    prefill = [s for s in out.stats.values() if s.get("role") == "prefill"]
    assert pc["miss_tokens"] == sum(s["tokens_computed"] for s in prefill)      # what was computed
    assert pc["hit_ratio"] == pytest.approx(HIT / CACHEABLE)
    assert pc["ideal_hit_ratio"] == pytest.approx(HIT / CACHEABLE)             # one cache, filled in time
    assert trace_stats(REQS).prefix_hit_ratio == pytest.approx(HIT / CACHEABLE)
    assert ideal_prefix_hits(REQS).hit_ratio == pytest.approx(HIT / CACHEABLE)
    # block-level figures, named apart: 2 of 6 full blocks; the README-style share of
    # blocks seen before counts B's partial block too (2 of 7)
    assert pc["block_hit_ratio"] == pytest.approx(2 / 6) and pc["ideal_block_hit_ratio"] == pytest.approx(2 / 6)
    assert trace_stats(REQS).prefix_block_hit_ratio == pytest.approx(2 / 7)
    line = next(ln for ln in summary_text(out.results).splitlines() if ln.startswith("prefix cache:"))
    assert f"hit ratio {HIT / CACHEABLE:.3f}: 1,024 of 3,071 cacheable prompt tokens" in line, line
    assert "2 of 6 full blocks hit, 2,112 prompt tokens computed" in line, line


def test_trace_stats_prints_the_same_ratio(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": r.arrival_s * 1e3, "input_length": r.prompt_tokens,
                                        "output_length": r.output_tokens, "hash_ids": list(r.block_hashes)}) + "\n"
                            for r in REQS))
    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["trace", "stats", str(path), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["prefix_hit_ratio"] == pytest.approx(HIT / CACHEABLE)
    assert (d["prefix_hit_tokens"], d["prefix_cacheable_tokens"]) == (HIT, CACHEABLE)
    table = CliRunner().invoke(app, ["trace", "stats", str(path)]).stdout
    assert f"{HIT / CACHEABLE:.3f} (1,024 / 3,071 cacheable prompt tokens)" in table, table
