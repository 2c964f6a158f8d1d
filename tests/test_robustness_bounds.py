"""Issue 24's bad inputs, each refused before anything is allocated, generated or read:
one `error:` line naming the file, line, field or option and what was expected (exit
code 2), no traceback, no hang, and never an overflowed integer in the message
(docs/robustness.md section 1). The HTTP endpoint's are in tests/test_serve_limits.py;
the Ray runtime's `--dilation` limits in tests/test_ray_pace.py."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.cli.app import app
from test_config_errors_scenarios import BASE  # the small valid scenario those tests edit
from workloads import load_requests, trace_stats
from workloads.names import DATA_DIR, EXCERPTS

MOONCAKE = DATA_DIR / EXCERPTS["mooncake-excerpt"]
AZURE = DATA_DIR / EXCERPTS["azure-conv-excerpt"]

pytestmark = pytest.mark.timeout(120)          # a FIFO opened by mistake would block: fail, not hang


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)        # a run's default --out lands here, not in the repo


def rack_cli(*args: str):
    rack.cli._register_commands()
    return CliRunner().invoke(app, [str(a) for a in args])


def run(*args: str):
    return rack_cli("run", "--runtime", "virtual", "--max-requests", "3", "--no-plots", *args)


def one_line_error(res, code: int = 2) -> str:
    """The command's single `error:` line (asserting the exit code, no traceback and no
    int64-overflowed number)."""
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and "9223372036854775" not in res.output, res.output
    errors = [ln for ln in res.output.splitlines() if ln.lower().startswith("error: ")]
    assert len(errors) == 1, res.output
    return errors[0]


def _workload(tmp_path, extra: str = "", top: str = "", client: str = "", name="w.toml"):
    path = tmp_path / name
    path.write_text(f'name = "w"\nseed = 0\nduration_s = 10.0\n{top}\n[[clients]]\nname = "a"\nrate_per_s = 1.0\n'
                    'input_tokens = { dist = "fixed", tokens = 100 }\noutput_tokens = { dist = "fixed", tokens = 10 }\n'
                    f"{client}\n{extra}")
    return path


# ------------------------------------------------------------------ tracebacks and runaways

def test_a_trace_row_nested_100000_deep_is_a_bad_row(tmp_path):
    rows = MOONCAKE.read_text().splitlines()[:4]
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(rows[:2] + ["[" * 100_000] + rows[2:]) + "\n")
    want = f"{path}:3: invalid JSON (nested 100,000 levels deep; a trace row nests at most 16)"
    assert want in one_line_error(run("--trace", path))
    assert want in one_line_error(rack_cli("trace", "stats", path))
    kept = load_requests(path, skip_bad_rows=True)
    assert len(kept) == 4 and kept.skipped_by_reason == {"invalid_json": 1}
    assert trace_stats(path, skip_bad_rows=True).skipped_by_reason == {"invalid_json": 1}
    res = run("--trace", path, "--skip-bad-rows", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    first = tmp_path / "first.jsonl"
    first.write_text("{" * 100_000 + "\n")
    assert f"{first}:1: invalid JSON (nested 100,000 levels deep" in one_line_error(rack_cli("trace", "stats", first))


def test_gamma_arrivals_with_an_absurd_cv(tmp_path):
    path = _workload(tmp_path, client='arrival = "gamma"\ncv = 1e300')
    line = one_line_error(run("--workload", path))
    assert f"{path}: field clients[0]: client 'a': cv of Gamma gaps must be at most 10" in line, line
    line = one_line_error(run("--dataset", "random", "--request-rate", "5", "--burstiness", "1e-300"))
    assert "--burstiness: burstiness must be at least 0.01" in line, line


def test_an_out_name_longer_than_the_file_system_allows(tmp_path):
    (tmp_path / "o").mkdir()
    line = one_line_error(run("--out", f"o/{'x' * 300}"))
    assert "--out o/xxx" in line and "(302 characters): has a name of 300 bytes; the file system allows at most" \
        in line and "x" * 100 not in line, line


def test_estimate_batch_and_lengths_are_bounded():
    for args, flag in ((["-b", "1000000000000"], "'--batch' / '-b'"), (["-c", "1000000000000"], "'--context'"),
                       (["-p", "0"], "'--prompt'")):
        res = rack_cli("estimate", "-m", "llama-3.1-8b", "-d", "h100", *args)
        assert res.exit_code == 2 and f"Invalid value for {flag}" in res.output and "Traceback" not in res.output


def test_instances_beyond_any_rack(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace('role = "prefill"', 'role = "prefill"\ninstances = 1000000000000000000'))
    line = one_line_error(run("--scenario", path))
    assert f"{path}: field pools[0].instances: Input should be less than or equal to 4096" in line
    assert "each instance is a core" in line, line


def test_prefix_and_lengths_beyond_any_context_before_a_prompt_is_built():
    line = one_line_error(run("--dataset", "random", "--prefix-len", "1000000000000", "--num-prompts", "2"))
    assert line.startswith("error: --prefix-len: prefix length 1,000,000,000,000 + prompts of up to 1,024 tokens "
                           "is beyond any model's context (at most 100,000,000 tokens"), line
    line = one_line_error(run("--dataset", "random", "--input-len", "1000000000000"))
    assert line.startswith("error: --input-len: input_len must be an integer in [1, 100,000,000]"), line


# ------------------------------------------------------------------ hangs

@pytest.fixture()
def fifo(tmp_path):
    def make(name: str):
        path = tmp_path / name
        os.mkfifo(path)
        return path
    return make


def test_fifos_are_named_not_opened(tmp_path, fifo):
    what = "is a FIFO (named pipe), not a regular file"
    s = fifo("s.toml")
    assert f"error: {s}: {what}; expected a scenario TOML file" in one_line_error(run("--scenario", s))
    assert f"error: {s}: {what}" in one_line_error(rack_cli("estimate", "-m", "kimi-k2", "-d", s))
    assert f"error: {s}: {what}" in one_line_error(rack_cli("estimate", "-m", s, "-d", "h100"))
    scen = tmp_path / "dev.toml"
    scen.write_text(BASE.replace('name = "decode"\ndevice = "h100"', f'name = "decode"\ndevice = "{s}"'))
    assert f"field pools[1].device (pool 'decode'): {s}: {what}" in one_line_error(run("--scenario", scen))
    rows = fifo("rows.csv")
    assert f"error: --rows {rows}: {what}" in one_line_error(rack_cli("validate", "--rows", rows))
    t = fifo("t.jsonl")
    assert f"error: {t}: {what}" in one_line_error(run("--trace", t))
    assert f"error: {t}: {what}" in one_line_error(rack_cli("trace", "stats", t))
    w = fifo("w.toml")
    assert f"error: {w}: {what}; expected a workload TOML file" in one_line_error(run("--workload", w))


# ------------------------------------------------------------------ nonsense accepted

def test_a_link_latency_beyond_a_second(tmp_path):
    path = tmp_path / "lat.toml"
    path.write_text(BASE.replace("bandwidth_GBps = 50.0", "bandwidth_GBps = 50.0\nlatency_us = 1e300"))
    line = one_line_error(run("--scenario", path, "--out", tmp_path / "o"))
    assert f"{path}: field links[0].latency_us: Input should be less than or equal to 1000000 (got 1e+300): " \
           "a KV link latency above a second is a unit mistake" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("field, where", [
    ("think_time_s = inf", "clients[0].session.think_time_s"),
    ("system_prompt_zipf = inf", "clients[0].session.system_prompt_zipf"),
    ("system_prompt_zipf = nan", "clients[0].session.system_prompt_zipf"),
])
def test_non_finite_workload_numbers(tmp_path, field, where):
    path = _workload(tmp_path, extra=f"[clients.session]\nturns_mean = 2.0\n{field}\n")
    line = one_line_error(run("--workload", path))
    assert line == f"error: {path}: field {where}: expected a finite number, got {field.split()[-1]}", line


def test_token_counts_in_other_scripts_digits_are_bad_rows(tmp_path):
    path = tmp_path / "arabic.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,\u0661\u0662,44\n"
                    "2023-11-16 18:15:47.6805900,30,44\n", encoding="utf-8")
    line = one_line_error(rack_cli("trace", "stats", path))
    assert f"{path}:2: field 'ContextTokens': expected an integer token count in ASCII digits" in line, line
    stamp = tmp_path / "stamp.csv"
    stamp.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:4\u0666.6805900,30,44\n",
                     encoding="utf-8")
    assert f"{stamp}:2: field 'TIMESTAMP': expected a date-time" in one_line_error(rack_cli("trace", "stats", stamp))


@pytest.mark.parametrize("window, fragment", [
    ("0:inf", "--window: window end must be a finite number of seconds (leave it empty for an open end: 0:)"),
    ("", "--window: empty; give a value or leave the option out"),
    (":", "--window: window must look like START:END"),
])
def test_windows_that_select_nothing_in_particular(window, fragment):
    assert fragment in one_line_error(run("--window", window))


def test_empty_names_and_paths(tmp_path):
    line = one_line_error(run("--scenario", ""))
    assert line.startswith("error: scenario '': is empty; expected a TOML file path or one of ["), line
    for flag in ("--trace", "--workload"):
        assert f"{flag}: empty; give a value or leave the option out" in one_line_error(run(flag, ""))
    res = run("--out", "")
    assert res.exit_code == 2 and "Invalid value for '--out': empty; expected a path" in res.output
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("fault, fragment", [
    ("decode_crash:decode@1,seed=1,seed=2", "seed given twice"),
    ("link_flap:kv@1+2,duration_s=3", "duration_s given twice (+DURATION_S is duration_s)"),
    ("decode_crash:decode@\u0661", "faults[0].at_s: Input should be a valid number"),
])
def test_fault_options_with_a_parameter_twice_or_foreign_digits(tmp_path, fault, fragment):
    path = tmp_path / "s.toml"
    path.write_text(BASE)
    assert fragment in one_line_error(run("--scenario", path, "--fault", fault))


# ------------------------------------------------------------------ messages that miss the cause

def test_a_negative_workload_seed_names_the_file_and_field(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(_workload(tmp_path).read_text().replace("seed = 0", "seed = -1"))
    assert f"error: {path}: field seed: Input should be greater than or equal to 0 (got -1)" in \
        one_line_error(run("--workload", path))


def test_a_length_cv_that_would_overflow_int64(tmp_path):
    path = _workload(tmp_path).read_text().replace('{ dist = "fixed", tokens = 100 }',
                                                   '{ dist = "lognormal", mean = 100.0, cv = 1e300 }')
    (tmp_path / "cv.toml").write_text(path)
    line = one_line_error(run("--workload", tmp_path / "cv.toml"))
    assert "field clients[0].input_tokens.cv: Input should be less than or equal to 10 (got 1e+300)" in line, line


def test_an_infinite_window_length(tmp_path):
    path = _workload(tmp_path).read_text().replace("duration_s = 10.0", "window_s = inf") \
        .replace("rate_per_s = 1.0", "rates = [1.0]")
    (tmp_path / "win.toml").write_text(path)
    line = one_line_error(run("--workload", tmp_path / "win.toml"))
    assert line == f"error: {tmp_path / 'win.toml'}: field window_s: expected a finite number, got inf", line


def test_symbolic_link_loops_and_directories_are_named(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    assert f"error: {loop}: is a symbolic link loop; expected a CSV or JSON-lines trace file" in \
        one_line_error(run("--trace", loop))
    assert f"error: --out {loop}: is a symbolic link loop (not a directory)" in one_line_error(run("--out", loop))
    assert f"error: {loop}: is a symbolic link loop; expected a workload TOML file" in \
        one_line_error(run("--workload", loop))
    folder = tmp_path / "adir"
    folder.mkdir()
    assert f"error: {folder}: is a directory, not a regular file; expected a workload TOML file" in \
        one_line_error(run("--workload", folder))


def test_the_checks_leave_good_inputs_alone(tmp_path):
    res = run("--trace", MOONCAKE, "--window", "0:", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "results.json").read_text())["requests"]["completed"] == 3
