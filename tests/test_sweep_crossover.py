"""The split-versus-colocated crossover, both ways, on a synthetic workload.

Llama-3.1-8B (bf16) on two H100s: split = one prefill GPU + one decode GPU joined by a KV
link; colocated = two GPUs each doing both (iso-count). Short prompts over a slow link:
the KV traffic saturates the link and decode waits for it, so colocation wins. Long
prompts over a fast link: colocated decode steps share iterations with 8k-token prefill
chunks (TPOT suffers) while the split decode GPU runs undisturbed, so the split wins.
`rack sweep bandwidth` finds and prints the bandwidth at which they cross.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rack.wiring.scenario import Scenario, parse_scenario

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from rack.experiments.sweep import Task, Workload, find_crossover, run_task, run_tasks, with_link_bandwidth

SPLIT_TOML = """
name = "toy-split"
model = "llama-3.1-8b"
weight_dtype = "bf16"
kv_dtype = "bf16"
[[pools]]
name = "prefill"
device = "h100"
role = "prefill"
[[pools]]
name = "decode"
device = "h100"
role = "decode"
[[links]]
name = "kv"
src = "prefill"
dst = "decode"
bandwidth_GBps = {bw}
latency_us = 5.0
per_message_us = 10.0
[slo]
ttft_ms = {ttft}
tpot_ms = {tpot}
"""
COLOC_TOML = """
name = "toy-coloc"
model = "llama-3.1-8b"
weight_dtype = "bf16"
kv_dtype = "bf16"
[[pools]]
name = "gpu"
device = "h100"
role = "both"
instances = 2
[slo]
ttft_ms = {ttft}
tpot_ms = {tpot}
"""


def _split(bw: float, ttft: float, tpot: float) -> Scenario:
    return parse_scenario(tomllib.loads(SPLIT_TOML.format(bw=bw, ttft=ttft, tpot=tpot)), "toy-split")


def _coloc(ttft: float, tpot: float) -> Scenario:
    return parse_scenario(tomllib.loads(COLOC_TOML.format(ttft=ttft, tpot=tpot)), "toy-coloc")


SHORT = Workload(kind="synthetic", rate_per_s=20.0, prompt_tokens=256, output_tokens=64, n=200, seed=0)
# 1.5 prompts/s of 8k tokens keep the split's one prefill instance busy ~85-90 % of the
# time with the refitted SGLang terms (its 8k prompt pass ~0.6 s; at 3/s its queue grew
# without bound and no request met the TTFT target)
LONG = Workload(kind="synthetic", rate_per_s=1.5, prompt_tokens=8192, output_tokens=128, n=100, seed=0)


def _goodput(sc: Scenario, wl: Workload) -> dict:
    r = run_task(Task(sc.model_dump(mode="json"), wl, labels={"scenario": sc.name}))
    assert "error" not in r, r
    return r


def test_short_prompts_slow_link_colocated_wins():
    split = _goodput(_split(0.5, 500, 30), SHORT)
    coloc = _goodput(_coloc(500, 30), SHORT)
    assert split["link_utilization"] > 0.9                 # the link is the bottleneck
    assert coloc["goodput_rps"] > 2 * split["goodput_rps"]
    assert coloc["slo_attainment"] > split["slo_attainment"]


def test_long_prompts_fast_link_split_wins():
    # TPOT target 15 ms: the split's decode steps, never interrupted by a prompt (~10-11 ms
    # for Llama-3.1-8B on H100 with SGLang's fitted terms), meet it; the colocated
    # engine's prompt passes between its decode steps stretch them far past it
    split = _goodput(_split(64, 2000, 15), LONG)
    coloc = _goodput(_coloc(2000, 15), LONG)
    assert split["goodput_rps"] > 1.5 * coloc["goodput_rps"]
    assert split["tpot_p99_s"] < coloc["tpot_p99_s"]        # no prefill interference


def test_cli_prints_the_crossover(tmp_path):
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    (tmp_path / "toy-split.toml").write_text(SPLIT_TOML.format(bw=1, ttft=2000, tpot=15))
    (tmp_path / "toy-coloc.toml").write_text(COLOC_TOML.format(ttft=2000, tpot=15))
    out = tmp_path / "sweep"
    r = CliRunner().invoke(app, ["sweep", "bandwidth", "--split", str(tmp_path / "toy-split.toml"),
                                 "--colocated", str(tmp_path / "toy-coloc.toml"), "--bandwidths", "0.25,1,4,16",
                                 "--prompt-tokens", "8192", "--output-tokens", "128", "--rate", "1.5", "--n", "100",
                                 "--workers", "2", "--out", str(out), "--no-plots"])
    assert r.exit_code == 0, r.output
    # the measured bracket, and the interpolated estimate named as such
    m = re.search(r"crossover with toy-coloc: between ([0-9.]+) and ([0-9.]+) GB/s, the bandwidths tried "
                  r"around it \(~([0-9.]+) GB/s interpolated\)", r.output)
    assert m and (float(m.group(1)), float(m.group(2))) == (1.0, 4.0) and 1 < float(m.group(3)) < 4, r.output
    doc = json.loads((out / "sweep.json").read_text())
    c = doc["summary"]["crossover"]["toy-coloc"]
    assert c["status"] == "crossover" and c["below"] == "colocated" and c["above"] == "split"
    assert c["x"] == pytest.approx(float(m.group(3)), rel=1e-2) and c["between"] == [1.0, 4.0]
    split = sorted((p for p in doc["points"] if p["role"] == "split"), key=lambda p: p["bandwidth_gbps"])
    assert [p["bandwidth_gbps"] for p in split] == [0.25, 1, 4, 16]
    assert split[0]["goodput_rps"] < split[-1]["goodput_rps"]
    assert len([p for p in doc["points"] if p["role"] == "colocated"]) == 4   # one run, shown per bandwidth
    assert "crossover with toy-coloc" in (out / "report.md").read_text()


def test_find_crossover_cases():
    xs = [1, 10, 100]
    c = find_crossover(xs, [0.0, 1.0, 2.0], [1.0, 1.0, 1.0])
    assert c["status"] == "crossover" and c["x"] == pytest.approx(10.0)
    # Linear in log x: d goes -1 -> +1 between 1 and 100 -> the geometric middle, 10.
    assert find_crossover([1, 100], [0.0, 2.0], [1.0, 1.0])["x"] == pytest.approx(10.0)
    assert find_crossover(xs, [2, 2, 2], [1, 1, 1])["status"] == "split_always"
    assert find_crossover(xs, [0, 0, 0], [1, 1, 1])["status"] == "colocated_always"
    assert find_crossover(xs, [1, 1.005, 1], [1, 1, 1])["status"] == "tie"
    # The split only ties at 64 (0.7 % behind): the crossover is 64, not extrapolated past it.
    c = find_crossover([16, 64], [2.72, 2.74], [2.76, 2.76])
    assert c["status"] == "crossover" and c["above"] == "tie" and c["x"] == pytest.approx(64.0)


def test_with_link_bandwidth_needs_a_link():
    assert with_link_bandwidth(_split(1, 1000, 50), 7.5).links[0].bandwidth_GBps == 7.5
    with pytest.raises(ValueError, match="no KV link"):
        with_link_bandwidth(_coloc(1000, 50), 7.5)


def test_run_tasks_keeps_order_and_reports_errors():
    bad = _split(1, 1000, 50).model_dump(mode="json")
    bad["pools"][1]["device"] = "no-such-gpu"
    wl = Workload(kind="synthetic", rate_per_s=5.0, prompt_tokens=128, output_tokens=4, n=5)
    tasks = [Task(_coloc(1000, 50).model_dump(mode="json"), wl, labels={"scenario": "a", "i": 0}),
             Task(bad, wl, labels={"scenario": "b", "i": 1}),
             Task(_split(1, 1000, 50).model_dump(mode="json"), wl, labels={"scenario": "c", "i": 2})]
    out = run_tasks(tasks, workers=1, progress=False)
    assert [p["i"] for p in out] == [0, 1, 2]
    assert "error" in out[1] and "no-such-gpu" in out[1]["error"]
    assert out[0]["completed"] == 5 and out[2]["completed"] == 5
