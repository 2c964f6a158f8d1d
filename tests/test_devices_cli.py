"""`rack estimate` and `rack validate`."""

import json

import pytest
from typer.testing import CliRunner

import rack.cli
from devices.validation import CALIBRATION_FILE, load_rows
from rack.cli.app import app

rack.cli._register_commands()
runner = CliRunner()


FIGURES = str(CALIBRATION_FILE)


def test_validate_published_figures_json():
    r = runner.invoke(app, ["validate", "--rows", FIGURES, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(out["figures"]) == len(load_rows()) == 14 and out["serving_rows"] == [] and out["summary"]["failures"] == []
    for row in out["figures"]:
        assert {"name", "predicted", "published", "unit", "relative_error"} <= set(row)
        assert abs(row["relative_error"]) <= (0.35 if row["unit"] == "ms" else 0.15)   # prompt rows: 35 %


def test_validate_names_a_file_that_is_not_text(tmp_path):
    for name in ("rows.csv", "rows.toml"):
        path = tmp_path / name
        path.write_bytes(b"\xc9\xff\x00\x17" * 64)
        r = runner.invoke(app, ["validate", "--rows", str(path)])
        assert r.exit_code == 2 and str(path) in r.output and "Traceback" not in r.output, r.output


def test_validate_table_and_tolerance_exit_code():
    r = runner.invoke(app, ["validate", "--rows", FIGURES])
    assert r.exit_code == 0 and "MI300X" in r.output and "every enforced criterion met" in r.output
    r = runner.invoke(app, ["validate", "--rows", FIGURES, "--tolerance", "0.001"])
    assert r.exit_code == 1 and "tolerance 0%" in r.output


def test_validate_refuses_what_checks_nothing_and_bad_paths_in_one_line(tmp_path):
    """A rows file without rows is an error, not "every criterion met"; an unknown field
    is named; --tolerance <= 0 and a --plot folder under a file fail before any work."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty.toml").write_text("x = 1\n")
    (tmp_path / "bogus.toml").write_text("[[row]]\nname = 'a'\nbogus = 1\n")
    for args, said in ((["--rows", str(tmp_path / "empty.toml")], "no rows"),
                       (["--rows", str(tmp_path / "bogus.toml")], "unknown field(s) bogus"),
                       (["--tolerance", "-1"], "--tolerance: expected a finite number > 0"),
                       (["--plot", str(tmp_path / "afile" / "x")], "--plot")):
        r = runner.invoke(app, ["validate", *args])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, (args, r.output)


#: Rows the model misses by more than the worst-case limit, and why (docs/hardware.md, "rack
#: validate"): none since the serving harness (scheduler receive interval, SGLang's
#: two drafted tokens) and B300 SGLang's measured compute efficiency explain C35.
KNOWN_MISSES: set[str] = set()


def test_validate_every_row_meets_the_criteria():
    """The built-in table: every published figure and every measured serving row of
    gpu-calibration.csv (replayed through the engines), within issue 14's criteria
    (median |error| <= 15 % on TPOT and throughput per GPU, <= 25 % on TTFT; worst
    <= 35 %), the worst-case limit holding for every row but KNOWN_MISSES."""
    r = runner.invoke(app, ["validate", "--json"])
    out = json.loads(r.stdout)
    assert len(out["figures"]) == 14 and len(out["serving_rows"]) == 40
    assert all(abs(f["relative_error"]) <= (0.35 if f["unit"] == "ms" else 0.15) for f in out["figures"])
    med = out["summary"]["median_abs_error"]
    assert med["tpot_s"] <= 0.15 and med["throughput_per_gpu"] <= 0.15 and med["ttft_s"] <= 0.25
    for row in out["serving_rows"]:
        if row["id"] not in KNOWN_MISSES:
            for m in ("tpot_s", "throughput_per_gpu"):
                assert abs(row["relative_error"][m]) <= 0.35, (row["id"], m, row["relative_error"][m])


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


def test_estimate_names_the_option_of_a_count_below_one():
    for flag in ("-n", "--tp", "--pp", "--ep"):
        r = runner.invoke(app, ["estimate", "-m", "kimi-k2", "-d", "cs3", flag, "0"])
        assert r.exit_code == 2 and flag in r.output, (flag, r.output)


def test_estimate_tables_and_gpu_defaults():
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-70b", "-d", "mi455x", "-n", "8", "-b", "64", "-c", "4096"])
    assert r.exit_code == 0, r.output
    assert "tp=8 pp=1" in r.output and "decode" in r.output and "KV cache" in r.output
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-70b", "-d", "cs3-2024q4", "-n", "4", "--weight-dtype",
                            "bf16", "--draft-tokens", "3", "--acceptance-rate", "0.8", "--spec-method",
                            "draft_model", "--draft-model", "llama-3.2-1b", "--json"])
    est = json.loads(r.output)
    assert est["decode"]["tokens_per_s_per_user"] == pytest.approx(2200, rel=0.05)


def test_estimate_names_the_stack_and_splits_a_step():
    r = runner.invoke(app, ["estimate", "-m", "deepseek-r1", "-d", "h200", "-n", "8", "-b", "4", "--json"])
    est = json.loads(r.output)
    assert est["stack"] == "SGLang 0.5.9" and est["instance"]["stack"] == "SGLang 0.5.9"
    s = est["decode"]["split"]
    assert s["roofline_s"] == max(s["compute_s"], s["memory_s"])
    assert s["roofline_s"] + s["collectives_s"] + s["fixed_s"] == pytest.approx(s["time_s"])
    assert s["collectives_s"] > 0 and s["fixed_s"] > 0
    r = runner.invoke(app, ["estimate", "-m", "deepseek-r1", "-d", "b200", "--stack", "sglang", "-n", "8"])
    assert r.exit_code == 0 and "software stack: SGLang 0.5.9" in r.output
    # MLA's latent is held by each of the 8 TP devices: the table says so (new-user trial)
    assert "x 8 copies across TP" in " ".join(r.output.split())
    assert "collectives" in r.output and "fixed" in r.output
    # a framework without a stack file on this device borrows one and says whose (issue 22)
    r = runner.invoke(app, ["estimate", "-m", "deepseek-r1", "-d", "b200", "--stack", "vllm", "-n", "8"])
    assert r.exit_code == 0 and "(terms of " in " ".join(r.output.split())
    r = runner.invoke(app, ["estimate", "-m", "deepseek-r1", "-d", "b200", "--stack", "no-such-engine", "-n", "8"])
    assert r.exit_code == 2 and "no software stack 'no-such-engine'" in r.output


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
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-d", "h100", "-n", "3"])
    assert r.exit_code == 2 and "tensor parallelism 3 does not divide llama-3.1-8b's 32 attention heads" in r.output
    r = runner.invoke(app, ["estimate", "-m", "llama-3.2-1b", "-d", "cs3", "-n", "200"])
    assert r.exit_code == 2 and "200 pipeline stages for llama-3.2-1b's 16 layers" in r.output, r.output
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-d", "h100", "-n", "1", "-b", "100000", "-c", "1"])
    assert r.exit_code == 0 and "max_num_seqs 512" in r.output, r.output
    for flag in ("-c", "-p"):
        r = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-d", "h100", "-n", "1", flag, "10000000"])
        assert r.exit_code == 2 and "above Llama-3.1-8B's context window of 131,072 tokens" in r.output, r.output


def test_estimate_batch_one_prints_one_prefill_row():
    r = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-d", "h100", "-n", "1", "-b", "1"])
    assert r.exit_code == 0
    phases = r.output.split("Where a step's time goes")[0]
    assert phases.count("prefill 1 x") == 1, r.output
