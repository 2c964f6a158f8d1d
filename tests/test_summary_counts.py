"""What the summary must not leave out: bad rows skipped, requests that failed at the
source, prefix-cache figures beside the ideal, and the minimum of every latency."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def app():
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    return app


def _burstgpt(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "1,ChatGPT,100,0,100,Conversation log\n"       # failed at the source
                 "2,ChatGPT,300,20,320,Conversation log\n"
                 "3,ChatGPT,x,20,20,Conversation log\n"         # bad row
                 "4,GPT-4,500,10,510,API log\n")
    return p


def test_skipped_and_source_failed_rows_are_reported(tmp_path, app):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--scenario", "gpu-only-kimi-k2",
                                   "--trace", str(_burstgpt(tmp_path)), "--skip-bad-rows", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "trace rows not replayed: 1 bad rows skipped {'not_a_number': 1}, 1 requests that failed " \
           "at the source (excluded)" in res.output
    r = json.loads((out / "results.json").read_text())["requests"]
    assert (r["submitted"], r["completed"], r["skipped_rows"], r["source_failed"]) == (2, 2, 1, 1)
    lat = json.loads((out / "results.json").read_text())["latency"]
    assert lat["ttft_s"]["min"] <= lat["ttft_s"]["p50"]
    assert "metric         mean        min        p50" in res.output


def test_prefix_cache_figures_beside_the_ideal(tmp_path, app):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--window", "0:20", "--out", str(out)])
    assert res.exit_code == 0, res.output
    pc = json.loads((out / "results.json").read_text())["prefix_cache"]
    assert pc["lookups"] > 0 and 0 < pc["hit_ratio"] <= pc["ideal_hit_ratio"] <= 1
    assert pc["hit_tokens"] > 0
    assert f"prefix cache: {pc['lookups']} lookups, hit ratio {pc['hit_ratio']:.3f}" in res.output
