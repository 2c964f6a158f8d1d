"""The load options on rack run / compare / sweep: closed loop, workload files, random
dataset, generic trace columns, and clear refusals."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def cli():
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    return lambda args: CliRunner().invoke(app, [str(a) for a in args])


def _rows(folder):
    with open(folder / "requests.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_random_dataset_closed_loop_never_more_than_8_in_flight(cli, tmp_path):
    out = tmp_path / "run"
    r = cli(["run", "--runtime", "virtual", "--dataset", "random", "--input-len", 1024,
             "--output-len", 256, "--range-ratio", 0.5, "--max-concurrency", 8, "--num-prompts", 200,
             "--out", out])
    assert r.exit_code == 0, r.output
    rows = _rows(out)
    assert len(rows) == 200 and all(row["outcome"] == "completed" for row in rows)
    p = np.array([int(row["prompt_tokens"]) for row in rows])
    assert p.min() >= 512 and p.max() <= 1536                  # vLLM's [L(1-X), L(1+X)]
    events = sorted([(float(row["t_arrival"]), 1) for row in rows] +
                    [(float(row["t_end"]), -1) for row in rows])   # an end before a same-time start
    in_flight = np.cumsum([d for _, d in events])
    assert in_flight.max() == 8
    res = json.loads((out / "results.json").read_text())
    # rack run ships real KV bytes (payload accounting is for sweeps only)
    assert res["provenance"]["load"] == {"max_concurrency": 8, "think_time_s": 0.0, "kv_payload": "bytes",
                                         "kv_verify_every": None}
    assert res["provenance"]["trace"]["controls"]["source"] == "random"


def test_a_12_client_workload_runs_through_run_and_compare(cli, tmp_path):
    r = cli(["run", "--runtime", "virtual", "--workload", "servegen-example", "--duration", 60,
             "--out", tmp_path / "run"])
    assert r.exit_code == 0, r.output
    assert "requests of workload servegen-example" in r.output
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["provenance"]["trace"]["sha256"]                # the workload file's hash
    assert res["requests"]["submitted"] > 500
    r = cli(["compare", "--workload", "servegen-example", "--duration", 30, "--no-plots",
             "--out", tmp_path / "cmp"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    submitted = {s["name"]: s["requests"]["submitted"] for s in doc["scenarios"]}
    assert len(submitted) == 4 and len(set(submitted.values())) == 1      # the same requests
    assert doc["trace"]["controls"]["source"] == "workload"


def test_request_rate_retimes_a_generic_csv_read_with_a_map(cli, tmp_path):
    trace = tmp_path / "mine.csv"
    lines = ["when_ms,in,out"] + [f"{i * 1000},{100 + i},{10}" for i in range(50)]
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    args = ["run", "--runtime", "virtual", "--trace", trace, "--format", "csv", "--map", "timestamp=when_ms",
            "--map", "prompt_tokens=in", "--map", "output_tokens=out", "--time-unit", "ms", "--out", out]
    r = cli(args)
    assert r.exit_code == 0, r.output
    assert max(float(row["t_arrival"]) for row in _rows(out)) == pytest.approx(49.0)
    r = cli(args + ["--request-rate", "inf", "--num-prompts", 10])
    assert r.exit_code == 0, r.output
    rows = _rows(out)
    assert len(rows) == 10 and {float(row["t_arrival"]) for row in rows} == {0.0}
    assert [int(row["prompt_tokens"]) for row in rows] == list(range(100, 110))


@pytest.mark.parametrize("load", [["--request-rate", 2], ["--max-concurrency", 2]])
def test_a_trace_without_timestamps_runs_with_a_request_rate(cli, tmp_path, load):
    """arxiv_lengths (vidur: lengths only) re-timed by --request-rate, or sent as slots
    free: the file's first rows, in order, every one completed; arrivals spread in time
    (the rate's, or the closed loop's), not all at 0 s."""
    from workloads import open_trace

    first = [(r.prompt_tokens, r.output_tokens) for r, _ in zip(open_trace("arxiv_lengths"), range(6))]
    out = tmp_path / "run"
    r = cli(["run", "--runtime", "virtual", "--trace", "arxiv_lengths", *load, "--num-prompts", 6, "--out", out])
    assert r.exit_code == 0, r.output
    rows = sorted(_rows(out), key=lambda row: int(row["id"]))
    assert [(int(row["prompt_tokens"]), int(row["output_tokens"])) for row in rows] == first
    assert all(row["outcome"] == "completed" for row in rows)
    arrivals = [float(row["t_arrival"]) for row in rows]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0 and arrivals[-1] > 0.0
    res = json.loads((out / "results.json").read_text())
    assert res["provenance"]["trace"]["reader"]["format"] == "vidur"
    if "--max-concurrency" in load:     # the arrivals line says what paced them
        assert "in the source's schedule (asked: the source's own timing), each sent as a slot frees " \
            "(--max-concurrency 2)" in r.output and "realised" not in r.output, r.output


def test_rack_run_names_skip_bad_rows_for_a_bad_row_as_trace_stats_does(cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                   "2023-11-16 18:15:50.9951690,396,109,7\n")
    r = cli(["run", "--runtime", "virtual", "--trace", bad, "--out", tmp_path / "run"])
    assert r.exit_code == 2
    assert f"{bad}:3: the row has 4 fields" in r.output and "(use --skip-bad-rows to skip and count such rows)" \
        in r.output, r.output
    r = cli(["run", "--runtime", "virtual", "--trace", bad, "--skip-bad-rows", "--out", tmp_path / "run"])
    assert r.exit_code == 0, r.output


def test_a_sweep_re_times_a_trace_without_timestamps_at_each_rate(cli, tmp_path):
    r = cli(["sweep", "rate", "helios-cs3-kimi-k2", "--trace", "arxiv_lengths", "--request-rate", 2,
             "--num-prompts", 5, "--rates", "1,4", "--workers", 1, "--no-plots", "--json",
             "--out", tmp_path / "sw"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert [p["submitted"] for p in doc["points"]] == [5, 5]


@pytest.mark.parametrize("args,match", [
    ([], "has no timestamps .*: give it arrivals with --request-rate R"),
    (["--request-rate", "inf", "--duration", 5], "--duration keeps the arrivals before it.* finite --request-rate"),
    (["--request-rate", 2, "--window", "0:10"], "--window and --rate-scale act on trace seconds"),
])
def test_a_trace_without_timestamps_names_the_options_it_needs(cli, tmp_path, args, match):
    r = cli(["run", "--runtime", "virtual", "--trace", "arxiv_lengths", "--num-prompts", 5, *args,
             "--out", tmp_path / "x"])
    assert r.exit_code == 2 and __import__("re").search(match, r.output), r.output
    assert "synthesize(" not in r.output and "load_requests(" not in r.output     # no Python call


@pytest.mark.parametrize("args,match", [
    (["--dataset", "random", "--trace", "azure-conv-excerpt"], "give one source"),
    (["--dataset", "random", "--trace", "mooncake-excerpt"], "give one source"),    # the default's name
    (["--workload", "servegen-example", "-t", "mooncake-excerpt"], "give one source"),
    (["--dataset", "sharegpt"], "--dataset: expected random"),
    (["--input-len", 10], "applies to --dataset random"),
    (["--burstiness", 0.5], "--burstiness: .*give a request rate"),
    (["--think-time", 1], "--think-time: .*give max concurrency"),
    (["--request-rate", 0], "--request-rate: request rate must be"),
    (["--workload", "no-such-thing"], "no such workload file"),
    (["--dataset", "random", "--duration", 10], "a duration needs a finite request rate"),
    (["--dataset", "random", "--format", "csv"], "read a trace"),
    (["--dataset", "random", "--seed", -1], r"--seed: seed must be an integer in \[0, 2\^63\)"),
    (["--dataset", "random", "--num-prompts", 10**9], "num-prompts 1000000000 .*at most 20,000,000"),
    (["--dataset", "random", "--request-rate", 1e9, "--duration", 1e5], "request rate 1e.09 .*at most"),
])
def test_bad_combinations_are_one_line_errors(cli, tmp_path, args, match):
    r = cli(["run", "--runtime", "virtual", "--out", tmp_path / "x", *args])
    assert r.exit_code == 2
    assert __import__("re").search(match, r.output), r.output


def test_a_workload_that_draws_no_request_says_so(cli, tmp_path):
    # 1 req/s for 0.5 s: nothing drawn, and no load control to blame (new-user trial)
    path = tmp_path / "zero.toml"
    path.write_text("duration_s=0.5\n[[clients]]\nname='a'\nrate_per_s=1\n"
                    "input_tokens={dist='fixed',tokens=10}\noutput_tokens={dist='fixed',tokens=1}\n")
    r = cli(["run", "--runtime", "virtual", "--workload", path, "--out", tmp_path / "x"])
    assert r.exit_code == 2 and "gives no requests" in r.output and "load controls" not in r.output, r.output


def test_sweep_rate_refuses_a_closed_loop(cli, tmp_path):
    r = cli(["sweep", "rate", "helios-cs3-kimi-k2", "--dataset", "random", "--max-concurrency", 8,
             "--num-prompts", 20, "--rates", "1,4", "--out", tmp_path / "sw"])
    assert r.exit_code == 2 and "--max-concurrency: a closed loop" in r.output, r.output
    assert not (tmp_path / "sw").exists()


def test_sweep_rate_on_a_random_dataset(cli, tmp_path):
    r = cli(["sweep", "rate", "helios-cs3-kimi-k2", "--dataset", "random", "--input-len", 2000,
             "--output-len", 50, "--num-prompts", 40, "--request-rate", 2, "--rates", "1,4",
             "--workers", 1, "--no-plots", "--json", "--out", tmp_path / "sw"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert "random dataset (2000 in / 50 out tokens)" in doc["workload"]
    assert [p["submitted"] for p in doc["points"]] == [40, 40]


def test_sweep_prompt_refuses_fractional_lengths(cli, tmp_path):
    """--lengths 1.5 ran a 1-token prompt (int() cut it); now one line, exit code 2."""
    r = cli(["sweep", "prompt", "--lengths", "1.5,100", "--out", tmp_path / "s"])
    assert r.exit_code == 2 and "--lengths: expected whole token counts" in r.output, r.output
