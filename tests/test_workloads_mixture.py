"""Workload files: schema errors, per-window rates and lengths of a 12-client mixture,
sessions with shared prefixes, reasoning shares, seeding; the ServeGen converter."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workloads import Request
from workloads.mixture import generate_workload, realised_windows
from workloads.workload_spec import (WorkloadSpecError, load_workload, parse_workload,
                                     workload_names)

ROOT = Path(__file__).resolve().parent.parent


def mixture_toml(exact: bool = True) -> str:
    """12 clients, piecewise schedules (rates per 600 s window, explicit windows with
    their own gap shapes and lengths), every window >= 600 requests."""
    lines = [f"name = 'twelve'\nseed = 7\nwindow_s = 600\nexact_counts = {str(exact).lower()}\n"]
    kinds = ["arrival = 'poisson'", "arrival = 'gamma'\ncv = 2.5", "arrival = 'weibull'\nshape = 0.6",
             "arrival = 'constant'"]
    for i in range(10):
        lens = [("input_tokens = { dist = 'lognormal', mean = %d, cv = 0.3 }" % (500 + 300 * i)),
                ("input_tokens = { dist = 'uniform', min = 100, max = %d }" % (300 + 50 * i)),
                ("input_tokens = { dist = 'pmf', pmf = { '800' = 0.5, '1000' = 0.5 } }"),
                ("input_tokens = { dist = 'fixed', tokens = 777 }")][i % 4]
        lines.append(f"[[clients]]\nname = 'c{i}'\n{kinds[i % 4]}\n"
                     f"rates = [{1 + i % 3}.0, {2 + i % 2}.5, 1.0]\n{lens}\n"
                     f"output_tokens = {{ dist = 'lognormal', mean = {100 + 20 * i}, cv = 0.3 }}\n"
                     f"reasoning_share = {0.1 * (i % 3)}\n")
    lines.append("""[[clients]]
name = 'shifting'
arrival = 'gamma'
cv = 2.0
output_tokens = { dist = 'fixed', tokens = 64 }
input_tokens = { dist = 'fixed', tokens = 256 }
windows = [
  { start_s = 0, rate_per_s = 2.0 },
  { start_s = 600, rate_per_s = 1.0, arrival = 'weibull', cv = 3.0, input_tokens = { dist = 'lognormal', mean = 4000, cv = 0.3 } },
  { start_s = 1200, rate_per_s = 3.0, arrival = 'poisson', reasoning_share = { dist = 'pmf', pmf = { '0.0' = 0.5, '0.8' = 0.5 } } },
]
[[clients]]
name = 'idle-then-busy'
rates = [0.0, 0.0, 1.5]
input_tokens = { dist = 'fixed', tokens = 100 }
output_tokens = { dist = 'fixed', tokens = 10 }
""")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def twelve(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "twelve.toml"
    path.write_text(mixture_toml())
    return path


def test_per_window_rates_and_mean_lengths_match_the_file(twelve):
    spec = load_workload(twelve)
    assert len(spec.clients) == 12 and spec.end_s == 1800
    reqs = generate_workload(spec)
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(reqs, reqs[1:]))
    rows = realised_windows(spec, reqs)
    assert len(rows) == 12 * 3                          # idle windows of a `rates` list included
    for row in rows:
        assert row["realised_rate_per_s"] == pytest.approx(row["rate_per_s"], rel=0.05, abs=1e-9), row
        if row["requests"]:
            # sd of a window's mean length <= 0.3 / sqrt(600) = 1.2%: 5% is > 4 sd
            assert row["realised_input_mean"] == pytest.approx(row["input_mean"], rel=0.05), row
            assert row["realised_output_mean"] == pytest.approx(row["output_mean"], rel=0.05), row
    shares = {r["client"]: r["reasoning_share_realised"] for r in rows if r["start_s"] == 0}
    assert shares["c1"] == pytest.approx(0.1, abs=0.01) and shares["c0"] == 0
    last = [r for r in rows if r["client"] == "shifting"][-1]
    assert last["reasoning_share_realised"] == pytest.approx(0.4, abs=0.05)


def test_stationary_counts_vary_but_match_on_average(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(mixture_toml(exact=False))
    spec = load_workload(path)
    rows = realised_windows(spec, generate_workload(spec))
    got = sum(r["requests"] for r in rows)
    want = sum(r["rate_per_s"] * (r["end_s"] - r["start_s"]) for r in rows)
    # counts of bursty windows vary a lot (Gamma cv 2.5: sd ~ 2.5 sqrt(n)); the total
    # of ~65,000 requests has sd < 1%: allow 4%
    assert got == pytest.approx(want, rel=0.04)
    assert any(abs(r["realised_rate_per_s"] - r["rate_per_s"]) > 0.01 * r["rate_per_s"] for r in rows)


def test_a_workload_too_large_to_generate_is_refused_before_drawing(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\nduration_s = 100000\n[[clients]]\nname = "a"\nrate_per_s = 1e9\n'
                    'input_tokens = {dist = "fixed", tokens = 100}\n'
                    'output_tokens = {dist = "fixed", tokens = 10}\n')
    spec = load_workload(path)
    with pytest.raises(ValueError, match=r"big\.toml: clients\[0\.\.0\] \(up to 'a'\).*1e\+14 requests; "
                                         r"at most 20,000,000"):
        generate_workload(spec, source=str(path))


def test_seeded_and_clients_independent(twelve):
    spec = load_workload(twelve)
    a, b = generate_workload(spec), generate_workload(spec)
    assert a == b and generate_workload(spec, seed=8) != a
    data = spec.model_dump()
    data["clients"][5]["rates"] = [9.0, 9.0, 9.0]        # change one client only
    other = generate_workload(parse_workload(data))
    mine = lambda rs: [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rs if r.tenant == "c0"]
    assert mine(other) == mine(a)
    short = generate_workload(spec, duration_s=300)
    assert max(r.arrival_s for r in short) < 300


def test_sessions_share_system_prompt_and_history_blocks(tmp_path):
    path = tmp_path / "sessions.toml"
    path.write_text("""
duration_s = 3000
block_size = 100
[[clients]]
name = "chat"
rate_per_s = 0.05
input_tokens = { dist = "uniform", min = 50, max = 150 }
output_tokens = { dist = "fixed", tokens = 40 }
session = { turns_mean = 4, think_time_s = 10, system_prompt_tokens = 250, system_prompts = 2 }
[[clients]]
name = "agent"
rate_per_s = 0.05
input_tokens = { dist = "fixed", tokens = 30 }
output_tokens = { dist = "fixed", tokens = 5 }
session = { turns_mean = 1, system_prompt_tokens = 250, system_prompts = 1 }
""")
    reqs = generate_workload(load_workload(path))
    chat = [r for r in reqs if r.tenant == "chat"]
    agent = [r for r in reqs if r.tenant == "agent"]
    assert len(chat) > 1.5 * 150 * 0.9 and all(r.block_size == 100 for r in reqs)
    # every prompt starts with a system prompt of 2 full blocks; a client's system
    # prompts are its own
    sys_chat = {r.block_hashes[:2] for r in chat}
    sys_agent = {r.block_hashes[:2] for r in agent}
    assert len(sys_chat) == 2 and len(sys_agent) == 1 and not sys_chat & sys_agent
    # a later turn's prompt holds the earlier turn's prompt and answer: its full blocks
    # repeat (a prefix-cache hit), and it arrives after a think time
    followers = 0
    for a in chat:
        for b in chat:
            if b.arrival_s > a.arrival_s and b.prompt_tokens > a.prompt_tokens + a.output_tokens \
                    and b.block_hashes[:a.prompt_tokens // 100] == a.block_hashes[:a.prompt_tokens // 100] \
                    and a.prompt_tokens >= 300:
                followers += 1
                break
    assert followers > 20
    assert {r.prompt_tokens for r in agent} == {280}      # single turn: system + message


@pytest.mark.parametrize("text,match", [
    ("[[clients]]\nname='a'\nrate_per_s=1\ninput_tokens={dist='fixed',tokens=1}\n"
     "output_tokens={dist='fixed',tokens=1}\n", "duration_s is required"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\ninput_tokens={dist='fixed',tokens=0}\n"
     "output_tokens={dist='fixed',tokens=1}\n", r"field clients\[0\]\.input_tokens\.tokens: .*greater than or equal to 1 \(got 0\)"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\ninput_tokens={dist='pmf',pmf={'5'=0.5}}\n"
     "output_tokens={dist='fixed',tokens=1}\n", r"clients\[0\]\.input_tokens\.pmf: .*sum to 1"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate=1\ninput_tokens={dist='fixed',tokens=1}\n"
     "output_tokens={dist='fixed',tokens=1}\n", r"unknown field 'clients\[0\]\.rate'; did you mean 'rates'"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\ninput_tokens={dist='zipf'}\n"
     "output_tokens={dist='fixed',tokens=1}\n", r"clients\[0\]\.input_tokens\.dist: expected one of .*got 'zipf'"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\narrival='gamma'\n"
     "input_tokens={dist='fixed',tokens=1}\noutput_tokens={dist='fixed',tokens=1}\n", r"client 'a': gamma arrivals need cv"),
    ("duration_s=10\n[[clients]]\nname='a'\nrates=[1]\nrate_per_s=1\n"
     "input_tokens={dist='fixed',tokens=1}\noutput_tokens={dist='fixed',tokens=1}\n", "exactly one of"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\noutput_tokens={dist='fixed',tokens=1}\n",
     "input_tokens is required"),
    ("duration_s = 10\nclients = [\n", "not valid TOML"),
    ("duration_s=10\n[[clients]]\nname='a'\nrate_per_s=1\ninput_tokens={dist='lognormal',mean=100,cv=1,max=10}\n"
     "output_tokens={dist='fixed',tokens=1}\n", r"clients\[0\]\.input_tokens: max \(10\) must be >= mean \(100\)"),
])
def test_errors_name_the_file_and_the_field(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(WorkloadSpecError, match=match) as e:
        load_workload(path)
    assert str(e.value).startswith(str(path))


def test_shipped_example_is_the_converters_output_and_matches_its_rates(tmp_path):
    assert "servegen-example" in workload_names()
    out = tmp_path / "ex.toml"
    note = "Illustrative numbers, NOT from ServeGen (scripts/examples/servegen_style_pool/README.md)."
    subprocess.run([sys.executable, str(ROOT / "scripts" / "servegen_to_workload.py"),
                    str(ROOT / "scripts" / "examples" / "servegen_style_pool"), "--out", str(out),
                    "--name", "servegen-example", "--note", note], check=True, capture_output=True)
    assert out.read_text() == workload_names()["servegen-example"].read_text()
    spec = load_workload("servegen-example")
    assert len(spec.clients) == 12
    rows = realised_windows(spec, generate_workload(spec))
    for row in rows:
        assert row["realised_rate_per_s"] == pytest.approx(row["rate_per_s"], rel=0.05, abs=1e-9)
    # the pool's Gamma rows: shape k -> cv = 1/sqrt(k); Weibull rows keep k
    first = spec.clients[0].windows
    assert first[0].arrival == "weibull" and first[0].shape == pytest.approx(0.5452)
    assert first[2].arrival == "gamma" and first[2].cv == pytest.approx(1 / math.sqrt(0.112577), rel=1e-5)


def test_converter_keeps_means_and_reports_bad_input(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import servegen_to_workload as conv
    finally:
        sys.path.pop(0)
    pmf = {float(v): 1 / 1000 for v in range(1, 1001)}
    small = conv.compress_pmf(pmf, 16)
    assert len(small) <= 16 and sum(small.values()) == pytest.approx(1)
    assert sum(int(k) * p for k, p in small.items()) == pytest.approx(500.5, rel=0.002)
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "chunk-0-trace.csv").write_text("0,1.0,2.0,Lognormal,1,1\n")
    (pool / "chunk-0-dataset.json").write_text('{"0": {"input_tokens": "{10: 1.0}", "output_tokens": "{5: 1.0}"}}')
    with pytest.raises(conv.ConvertError, match=r"chunk-0-trace.csv:1: unknown arrival pattern 'Lognormal'"):
        conv.convert(pool)
    (pool / "chunk-0-trace.csv").write_text("0,1.0,2.0,Gamma,0.25,4\n600,0,0,,0,0\n")
    doc = conv.convert(pool)
    assert doc["clients"][0]["windows"] == [
        {"start_s": 0, "rate_per_s": 1.0, "arrival": "gamma", "cv": 2.0},
        {"start_s": 600, "rate_per_s": 0.0}]
    spec = parse_workload(__import__("tomllib").loads(conv.to_toml(doc)), "converted")
    assert spec.end_s == 1200 and isinstance(generate_workload(spec)[0], Request)
