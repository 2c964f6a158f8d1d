"""`rack estimate` and `rack validate`."""

import json

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.cli.app import app

rack.cli._register_commands()
runner = CliRunner()


def test_validate_json_rows():
    r = runner.invoke(app, ["validate", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 9
    for row in rows:
        assert {"name", "predicted", "published", "unit", "relative_error"} <= set(row)
        assert abs(row["relative_error"]) <= 0.15


def test_validate_table_and_tolerance_exit_code():
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 0 and "MI300X" in r.output and "largest |error|" in r.output
    assert runner.invoke(app, ["validate", "--tolerance", "0.001"]).exit_code == 1


def test_estimate_trillion_parameter_model_on_wafers():
    r = runner.invoke(app, ["estimate", "--model", "kimi-k2", "--device", "cs3", "--count", "24",
                            "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--batch", "16",
                            "--context", "8192", "--prompt", "2048", "--json"])
    assert r.exit_code == 0, r.output
    est = json.loads(r.output)
    assert est["fits"] and est["instance"]["pp"] == 24 and est["instance"]["tp"] == 1
    assert est["memory"]["kv_tokens"] > 0 and est["memory"]["batch_fits"]
    d = est["decode"]
    assert d["bound"] == "latency" and d["tokens_per_s"] == pytest.approx(16 * d["tokens_per_s_per_user"])
    assert est["prefill"]["single"]["tokens_per_s"] > 0


def test_estimate_tables_and_gpu_defaults():
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-70b", "-d", "mi455x", "-n", "8", "-b", "64", "-c", "4096"])
    assert r.exit_code == 0, r.output
    assert "tp=8 pp=1" in r.output and "decode" in r.output and "KV cache" in r.output
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-70b", "-d", "cs3-2024q4", "-n", "4", "--weight-dtype",
                            "bf16", "--draft-tokens", "3", "--acceptance-rate", "0.8", "--spec-method",
                            "draft_model", "--draft-model", "llama-3.2-1b", "--json"])
    est = json.loads(r.output)
    assert est["decode"]["tokens_per_s_per_user"] == pytest.approx(2200, rel=0.05)


def test_estimate_model_that_does_not_fit():
    r = runner.invoke(app, ["estimate", "--model", "kimi-k2", "--device", "cs3", "--count", "4"])
    assert r.exit_code == 1
    assert "1.03 TB" in r.output and "use at least 24" in r.output.replace("\n", " ")
    r = runner.invoke(app, ["estimate", "--model", "kimi-k2", "--device", "cs3", "--count", "4", "--json"])
    assert r.exit_code == 1 and json.loads(r.output)["fits"] is False


def test_estimate_bad_input():
    r = runner.invoke(app, ["estimate", "--model", "kimi-k3", "--device", "cs3"])
    assert r.exit_code == 2 and "kimi-k2" in r.output
    r = runner.invoke(app, ["estimate", "--model", "kimi-k2", "--device", "h100", "--count", "8", "--tp", "3"])
    assert r.exit_code == 2 and "tp (3) x pp" in r.output
