"""Bad configuration is refused before any component starts, with a message that names
the file, the field and what was expected: from a TOML file through `load_scenario`
(and `build_topology`), and through `rack run` (exit code 2, one line, no traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import rack.cli
from rack.cli.app import app
from rack.run.runner import run_scenario
from rack.wiring.scenario import ScenarioError, parse_scenario
from rack.wiring.load import load_scenario
from rack.wiring.topology import build_topology
from workloads import Request

BASE = """\
name = "small"
model = "llama-3.1-8b"

[[pools]]
name = "prefill"
device = "h100"
role = "prefill"
max_queue = 64

[[pools]]
name = "decode"
device = "h100"
role = "decode"
max_num_seqs = 32

[[links]]
name = "kv"
src = "prefill"
dst = "decode"
bandwidth_GBps = 50.0

[slo]
ttft_ms = 2000.0
tpot_ms = 100.0
"""

DECODE_POOL = 'name = "decode"\ndevice = "h100"'

# case: (edit of BASE, fragments the message must contain)
CASES = {
    "unknown_device": (lambda b: b.replace(DECODE_POOL, 'name = "decode"\ndevice = "h1000"'),
                       ["pools[1].device", "unknown device 'h1000'", "did you mean 'h100'"]),
    "unknown_model": (lambda b: b.replace('model = "llama-3.1-8b"', 'model = "lama-3.1-8b"'),
                      ["field model", "unknown model 'lama-3.1-8b'", "did you mean 'llama-3.1-8b'"]),
    "zero_instances": (lambda b: b.replace('role = "prefill"', 'role = "prefill"\ninstances = 0'),
                       ["pools[0].instances", "greater than or equal to 1", "got 0"]),
    "zero_tp": (lambda b: b.replace('role = "decode"', 'role = "decode"\ntp = 0'),
                ["pools[1].tp", "greater than or equal to 1"]),
    "tp_as_text": (lambda b: b.replace('role = "decode"', 'role = "decode"\ntp = "8"'),
                   ["pools[1].tp", "valid integer", "got '8'"]),
    "fractional_batch": (lambda b: b.replace("max_num_seqs = 32", "max_num_seqs = 32.5"),
                         ["pools[1].max_num_seqs", "valid integer", "got 32.5"]),
    "negative_batch": (lambda b: b.replace("max_num_seqs = 32", "max_num_seqs = -4"),
                       ["pools[1].max_num_seqs", "greater than or equal to 1", "got -4"]),
    "zero_queue": (lambda b: b.replace("max_queue = 64", "max_queue = 0"),
                   ["pools[0].max_queue", "greater than or equal to 1"]),
    "zero_bandwidth": (lambda b: b.replace("bandwidth_GBps = 50.0", "bandwidth_GBps = 0.0"),
                       ["links[0].bandwidth_GBps", "greater than or equal to 0.001", "got 0.0", "1 MB/s to 1 PB/s"]),
    "negative_bandwidth": (lambda b: b.replace("bandwidth_GBps = 50.0", "bandwidth_GBps = -5.0"),
                           ["links[0].bandwidth_GBps", "greater than or equal to 0.001", "got -5.0"]),
    "model_does_not_fit": (lambda b: b.replace('model = "llama-3.1-8b"', 'model = "llama-3.1-405b"'),
                           ["field pools[0]", "pool 'prefill'", "406 GB of weights", "use at least 6 GPUs"]),
    "link_to_missing_pool": (lambda b: b.replace('dst = "decode"', 'dst = "decoder"'),
                             ["links[0].dst", "no pool named 'decoder'", "did you mean ['decode']"]),
    "ttft_in_seconds": (lambda b: b.replace("ttft_ms = 2000.0", "ttft_ms = 0.002"),
                        ["slo.ttft_ms", "in milliseconds", "0.002 ms is implausibly small", "ttft_ms = 2"]),
    "tpot_in_seconds": (lambda b: b.replace("tpot_ms = 100.0", "tpot_ms = 0.05"),
                        ["slo.tpot_ms", "in milliseconds", "tpot_ms = 50"]),
    "ttft_in_microseconds": (lambda b: b.replace("ttft_ms = 2000.0", "ttft_ms = 2e9"),
                             ["slo.ttft_ms", "implausibly large", "ttft_ms = 2e+06"]),
    "slo_field_in_seconds": (lambda b: b.replace("ttft_ms = 2000.0", "ttft_s = 2.0"),
                             ["unknown field 'slo.ttft_s'", "did you mean 'ttft_ms' (in milliseconds)",
                              "expected one of: ttft_ms, tpot_ms"]),
    "unknown_pool_field": (lambda b: b.replace("max_num_seqs = 32", "max_num_seq = 32"),
                           ["unknown field 'pools[1].max_num_seq'", "did you mean 'max_num_seqs'"]),
    "bad_fault_target": (lambda b: b + '\n[[faults]]\nkind = "decode_crash"\nat_s = 1.0\ntarget = "decode-3"\n',
                         ["faults[0].target", "decode-0"]),
    "bad_toml": (lambda b: b.replace("tpot_ms = 100.0", "tpot_ms = = 100.0"),
                 ["not valid TOML", "line"]),
}


def write(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_base_file_is_valid(tmp_path):
    sc = load_scenario(write(tmp_path, "base", BASE))
    assert [s.name for s in build_topology(sc, [0])][:1] == ["collector"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_scenario_names_file_and_field(tmp_path, case):
    edit, fragments = CASES[case]
    path = write(tmp_path, case, edit(BASE))
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    msg = str(e.value)
    assert msg.startswith(str(path) + ":"), msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert "\n" not in msg, msg                                   # one line


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_exits_2_with_one_line(tmp_path, case):
    rack.cli._register_commands()
    edit, fragments = CASES[case]
    path = write(tmp_path, case, edit(BASE))
    res = CliRunner().invoke(app, ["run", "--scenario", str(path), "--runtime", "virtual",
                                   "--max-requests", "5", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), res.output
    assert fragments[0] in lines[0]
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()


def test_custom_device_file_with_zero_capacity(tmp_path):
    dev = tmp_path / "tiny.toml"
    dev.write_text('extends = "h100"\nname = "tiny"\nmemory_bytes = 0\n')
    path = write(tmp_path, "custom", BASE.replace(DECODE_POOL, f'name = "decode"\ndevice = "{dev}"'))
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    msg = str(e.value)
    for frag in (str(path), "pools[1].device", str(dev), "memory_bytes", "greater than 0"):
        assert frag in msg, (frag, msg)


def _parsed(model: str = "llama-3.1-8b", decode_device: str = "h100"):
    from rack.wiring.load import tomllib

    data = tomllib.loads(BASE)
    data["model"] = model
    data["pools"][1]["device"] = decode_device
    return parse_scenario(data, "<dict>")       # pydantic checks only, no catalog look-up


@pytest.mark.parametrize("kwargs, pattern", [
    ({"decode_device": "h1000"}, r"pool 'decode'.*unknown device 'h1000'; did you mean 'h100'"),
    ({"model": "llama-3.1-405b"}, r"pool 'prefill'.*406 GB of weights.*use at least 6 GPUs"),
])
def test_build_topology_refuses_before_anything_starts(monkeypatch, kwargs, pattern):
    import rack.runtime.virtual_run as vr

    def never(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("a component was started")

    monkeypatch.setattr(vr, "run_topology_virtual", never)
    sc = _parsed(**kwargs)
    with pytest.raises(ScenarioError, match=pattern):
        build_topology(sc, [0])
    with pytest.raises(ScenarioError, match=pattern):
        run_scenario(sc, [Request(id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=2)], runtime="virtual")


def test_ray_only_options_on_the_virtual_runtime_warn(tmp_path):
    """--dilation, --timeout and --address do nothing on the virtual runtime: the run
    says so instead of ignoring them silently; an invalid value still names only that
    option."""
    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--dilation", "5", "--max-requests", "5",
                                   "--address", "127.0.0.1:1", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "warning: --dilation applies to the ray runtime only" in res.output
    assert "warning: --address applies to the ray runtime only" in res.output
    bad = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--dilation", "0", "--max-requests", "5",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "error: --dilation: expected a finite number > 0, got 0" in bad.output, bad.output
