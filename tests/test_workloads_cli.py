"""`rack trace stats` and `rack trace list`."""

import json

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.cli.app import app
from workloads import trace_stats

rack.cli._register_commands()
runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_stats_json_is_one_object_equal_to_trace_stats():
    result = run("trace", "stats", "mooncake-excerpt", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d == json.loads(json.dumps(trace_stats("mooncake-excerpt").to_dict()))
    for key in ("count", "span_s", "rate_mean_per_s", "rate_peak_per_min", "interarrival_cv",
                "input_tokens", "output_tokens", "prefix_hit_ratio", "prefix_block_hit_ratio",
                "skipped_rows"):
        assert key in d
    assert d["count"] == 339 and set(d["input_tokens"]) >= {"mean", "median", "p90", "p99"}


def test_stats_table():
    result = run("trace", "stats", "mooncake-excerpt")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Trace mooncake-excerpt" in out and "339" in out
    assert "ideal prefix-cache hit ratio" in out and "0.108" in out
    assert "14,335.8" in out  # input mean


def test_stats_of_a_full_trace_matches_its_readme():
    d = json.loads(run("trace", "stats", "azure_code", "--json").stdout)
    assert d["count"] == 8_819 and round(d["interarrival_cv"], 2) == 13.15


def test_bad_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 5, "input_length": -1, "output_length": 1, "hash_ids": [1]}\n')
    result = run("trace", "stats", str(bad))
    assert result.exit_code == 2
    assert result.stderr == (f"error: {bad}:2: field 'input_length': expected a token count >= 1,"
                             " got -1 (use --skip-bad-rows to skip and count such rows)\n")
    ok = run("trace", "stats", str(bad), "--skip-bad-rows", "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["skipped_by_reason"] == {"negative_length": 1}
    missing = run("trace", "stats", "nope")
    assert missing.exit_code == 2 and "not a known trace name" in missing.stderr


def test_generic_mapping_options(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("ms,prompt,gen\n0,10,2\n500,20,3\n2000,30,4\n")
    result = run("trace", "stats", str(p), "--json", "--map", "timestamp=ms",
                 "--map", "prompt_tokens=prompt", "--map", "output_tokens=gen", "--time-unit", "ms")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["count"] == 3 and d["span_s"] == 2.0 and d["input_tokens"]["mean"] == 20.0
    bad = run("trace", "stats", str(p), "--map", "timestamp")
    assert bad.exit_code != 0 and "FIELD=COLUMN" in bad.output


def test_list_names():
    result = run("trace", "list")
    assert result.exit_code == 0
    assert "mooncake-excerpt" in result.stdout and "arxiv_lengths" in result.stdout


@pytest.mark.parametrize("name, fmt, extra", [
    ("mooncake-excerpt", "mooncake", ["--block-size", "512"]),
    ("mooncake-excerpt", "mooncake", ["--time-unit", "ms"]),
    ("azure-conv-excerpt", "azure", ["--block-size", "512"]),
])
def test_block_size_and_time_unit_keep_format_detection(name, fmt, extra):
    """Issue 24: --block-size or --time-unit alone turned detection off ("mapping must
    name the prompt_tokens and output_tokens columns"); they now override the preset."""
    result = run("trace", "stats", name, "--json", *extra)
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["format"] == fmt and d == json.loads(run("trace", "stats", name, "--json").stdout)
