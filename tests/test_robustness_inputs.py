"""Every bad argument, scenario field and trace file is refused before anything starts,
with one line that names the option, field, file or line, and no traceback
(issue 18, build item 2; docs/robustness.md section 1)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.cli.app import app
from rack.wiring.scenario import ScenarioError
from rack.wiring.load import load_scenario
from test_config_errors_scenarios import BASE  # the small valid scenario those tests edit
from workloads import TraceError, load_requests, open_trace
from workloads.names import DATA_DIR, EXCERPTS
from workloads.request import MAX_TOKENS

MOONCAKE = DATA_DIR / EXCERPTS["mooncake-excerpt"]
AZURE = DATA_DIR / EXCERPTS["azure-conv-excerpt"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)        # a run's default --out lands here, not in the repo


def cli(*args: str):
    rack.cli._register_commands()
    return CliRunner().invoke(app, ["run", "--runtime", "virtual", "--max-requests", "5", *args])


def one_line_error(res, code: int = 2) -> str:
    """The run's single `error:` line (asserting the exit code and no traceback)."""
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output, res.output
    errors = [l for l in res.output.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1, res.output
    return errors[0]


# ------------------------------------------------------------------ scenario numbers

NUMBER_CASES = {
    "fixed_stage_inf": ('\n[[fixed_stages]]\nname = "gw"\nlatency_ms = inf\n',
                        "fixed_stages[0].latency_ms: expected a finite number, got inf"),
    "fixed_stage_1e300": ('\n[[fixed_stages]]\nname = "gw"\nlatency_ms = 1e300\n',
                          "fixed_stages[0].latency_ms: Input should be less than or equal to 3600000"),
    "cost_inf": ("\n[cost]\nelectricity_usd_per_kwh = inf\n",
                 "cost.electricity_usd_per_kwh: expected a finite number, got inf"),
    "cost_negative": ("\n[cost]\nprice_per_hour_usd = {h100 = -2.0}\n",
                      "cost.price_per_hour_usd.h100: Input should be greater than or equal to 0"),
    "cost_nan": ("\n[cost]\ncapex_usd = {h100 = nan}\n", "cost.capex_usd.h100: expected a finite number, got nan"),
    "cost_as_text": ('\n[cost]\npue = "1.2"\n', "cost.pue: Input should be a valid number"),
    "seed_negative": ("\nseed = -1\n", "field seed: Input should be greater than or equal to 0 (got -1)"),
    "fault_seed_negative": ('\n[[faults]]\nkind = "decode_crash"\nat_s = 1.0\ntarget = "decode"\nseed = -5\n',
                            "faults[0].seed: Input should be greater than or equal to 0 (got -5)"),
}
EDIT_CASES = {
    "resources_nan": (("max_queue = 64", "max_queue = 64\nresources = {GPU = nan}"),
                      "pools[0].resources.GPU: expected a finite number, got nan"),
    "resources_negative": (("max_queue = 64", "max_queue = 64\nresources = {GPU = -1.0}"),
                           "pools[0].resources: Ray resource amounts must be positive and finite"),
    "bandwidth_as_text": (("bandwidth_GBps = 50.0", 'bandwidth_GBps = "400"'),
                          "links[0].bandwidth_GBps: Input should be a valid number (got '400')"),
    "bandwidth_inf": (("bandwidth_GBps = 50.0", "bandwidth_GBps = inf"),
                      "links[0].bandwidth_GBps: expected a finite number, got inf"),
}


def _scenario_text(case: str) -> str:
    if case in NUMBER_CASES:
        # top-level keys must come before the first table: put them at the top
        extra = NUMBER_CASES[case][0]
        return (extra + BASE) if not extra.lstrip().startswith("[") else BASE + extra
    (old, new), _ = EDIT_CASES[case]
    assert old in BASE
    return BASE.replace(old, new)


@pytest.mark.parametrize("case", sorted(NUMBER_CASES) + sorted(EDIT_CASES))
def test_bad_numbers_are_refused_with_the_field(tmp_path, case):
    path = tmp_path / f"{case}.toml"
    path.write_text(_scenario_text(case))
    fragment = (NUMBER_CASES.get(case) or EDIT_CASES[case])[1]
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert str(e.value).startswith(f"{path}: field ") and fragment in str(e.value), str(e.value)
    line = one_line_error(cli("--scenario", str(path), "--out", str(tmp_path / "out")))
    assert fragment in line and not (tmp_path / "out").exists()


def test_device_file_with_infinite_bandwidth(tmp_path):
    dev = tmp_path / "fast.toml"
    dev.write_text('extends = "h100"\nname = "fast"\nmemory_bandwidth_Bps = inf\n')
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace('name = "decode"\ndevice = "h100"', f'name = "decode"\ndevice = "{dev}"'))
    line = one_line_error(cli("--scenario", str(path), "--out", str(tmp_path / "out")))
    for frag in ("pools[1].device", str(dev), "memory_bandwidth_Bps", "finite number"):
        assert frag in line, line


@pytest.mark.parametrize("args, fragment", [
    (["--dilation", "inf"], "--dilation: expected a finite number > 0, got inf"),
    (["--dilation", "nan"], "--dilation: expected a finite number > 0, got nan"),
    (["--runtime", "ray", "--dilation", "inf"], "--dilation: expected a finite number > 0, got inf"),
    (["--payload-scale", "nan"], "--payload-scale: expected a finite number > 0, got nan"),
    (["--rate-scale", "inf"], "--rate-scale: expected a finite number > 0, got inf"),
    (["--output-scale", "-1"], "--output-scale: expected a finite number > 0, got -1"),
    (["--timeout", "nan"], "--timeout: expected a finite number > 0, got nan"),
    (["--fault", "decode_crash:decode@1,seed=-5"], "faults[0].seed: Input should be greater than or equal to 0"),
])
def test_bad_numeric_options(tmp_path, args, fragment):
    line = one_line_error(cli(*args, "--out", str(tmp_path / "out")))
    assert fragment in line and not (tmp_path / "out").exists(), line


# ------------------------------------------------------------------ paths

def test_out_must_be_a_writable_folder(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, fragment in ((afile, "exists and is not a directory"),
                          (afile / "sub", "cannot write a results folder there (Not a directory"),
                          ("/dev/null", "is a character device (not a directory)"),
                          ("/proc/rack-results", "cannot write a results folder there")):
        line = one_line_error(cli("--out", str(out)))
        assert line.startswith(f"error: --out {out}: ") and fragment in line, line
    # a missing parent is created (as mkdir -p), and the probe file is not left behind
    res = cli("--out", str(tmp_path / "new" / "deep"))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "new" / "deep").iterdir()) == \
        ["requests.csv", "results.json", "summary.txt", "timelines.json", "timeseries.csv", "timeseries.png"]


def test_scenario_paths(tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    assert f"error: {folder}: is a directory" in one_line_error(cli("--scenario", str(folder)))
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert f"error: {binary}: not UTF-8 text (byte 0xff at offset 0)" in one_line_error(cli("--scenario", str(binary)))
    dev = tmp_path / "dev.toml"
    dev.write_bytes(b'extends = "h100"\nname = "caf\xe9"\n')
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace('name = "decode"\ndevice = "h100"', f'name = "decode"\ndevice = "{dev}"'))
    line = one_line_error(cli("--scenario", str(path)))
    assert f"pools[1].device (pool 'decode'): {dev}: not UTF-8 text (byte 0xe9" in line, line
    path.write_text(BASE.replace('name = "decode"\ndevice = "h100"', f'name = "decode"\ndevice = "{folder}"'))
    assert f"{folder}: is a directory, not a regular file" in one_line_error(cli("--scenario", str(path)))


# ------------------------------------------------------------------ traces

def _trace_error(path, **kw) -> str:
    with pytest.raises(TraceError) as e:
        load_requests(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg


def test_binary_and_foreign_trace_files(tmp_path):
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(bytes(range(256)) * 8)
    assert "binary data (a NUL byte at offset 0): not a text trace" in _trace_error(garbage)
    line = one_line_error(cli("--trace", str(garbage), "--out", str(tmp_path / "out")))
    assert line.startswith(f"error: {garbage}:1: binary data"), line
    # valid header, then bytes that are not UTF-8 on line 4
    head = AZURE.read_bytes().splitlines(True)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"".join(head[:3]) + b"2023-11-16 18:15:46.68,caf\xe9,12\n")
    assert f"{latin1}:4: the file is not UTF-8 text (byte 0xe9" in _trace_error(latin1)
    # ... and beyond the part checked up front: found while reading, with its line
    n = 2000                                   # ~130 KB of rows before the bad byte
    body = "".join(json.dumps({"timestamp": i, "input_length": 10, "output_length": 5}) + "\n"
                   for i in range(n)).encode()
    assert len(body) > 64 * 1024
    late = tmp_path / "late.jsonl"
    late.write_bytes(body + b'{"timestamp": 1\xff}\n')
    assert f"{late}:{n + 1}: not UTF-8 text" in _trace_error(late)
    folder = tmp_path / "adir"
    folder.mkdir()
    assert f"error: {folder}: is a directory, not a regular file" in one_line_error(cli("--trace", str(folder), "--out", str(tmp_path / "out")))
    import bz2
    packed = tmp_path / "t.csv.bz2"
    packed.write_bytes(bz2.compress(AZURE.read_bytes()))
    assert "is bzip2-compressed; decompress it first" in _trace_error(packed)


def test_gzip_traces_are_read_as_they_are(tmp_path):
    plain = load_requests(MOONCAKE)
    for name in ("t.jsonl.gz", "no-suffix.jsonl"):       # recognised by its bytes, not its name
        packed = tmp_path / name
        with gzip.open(packed, "wb") as g:
            g.write(MOONCAKE.read_bytes())
        assert list(load_requests(packed)) == list(plain)
    azure = tmp_path / "azure.csv.gz"
    with gzip.open(azure, "wb") as g:
        g.write(AZURE.read_bytes())
    assert list(open_trace(azure)) == list(open_trace(AZURE))
    res = cli("--trace", str(azure), "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes((tmp_path / "t.jsonl.gz").read_bytes()[:4000])
    assert "gzip data is corrupt or truncated" in _trace_error(truncated)


@pytest.mark.parametrize("value", [10 ** 30, 1e30, MAX_TOKENS + 1])
def test_lengths_beyond_any_model_are_bad_rows(tmp_path, value):
    rows = MOONCAKE.read_text().splitlines()
    d = json.loads(rows[3])
    d["input_length"] = value
    rows[3] = json.dumps(d)
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(rows) + "\n")
    msg = _trace_error(path)
    assert msg.startswith(f"{path}:4: field 'input_length': ") and "beyond any model's context" in msg, msg
    assert "error: " + msg in one_line_error(cli("--trace", str(path), "--out", str(tmp_path / "out")))
    kept = load_requests(path, skip_bad_rows=True)
    assert kept.skipped_by_reason == {"too_long": 1} and 3 not in [r.id for r in kept]


def test_output_length_beyond_any_model(tmp_path):
    path = tmp_path / "huge.csv"
    lines = AZURE.read_text().splitlines()
    ts, ctx, _ = lines[2].split(",")
    lines[2] = f"{ts},{ctx},{10 ** 30}"
    path.write_text("\n".join(lines) + "\n")
    assert f"{path}:3: field 'GeneratedTokens': 1e+30 tokens is beyond any model's context" in _trace_error(path)


def test_a_shipped_trace_is_untouched_by_the_checks(tmp_path):
    shutil.copy(MOONCAKE, tmp_path / "m.jsonl")
    assert len(load_requests(tmp_path / "m.jsonl")) == len(load_requests("mooncake-excerpt"))
