"""Rate and prompt-length sweeps: more load lowers SLO attainment, the maximum
sustainable rate lies between the rates that bracket the target, and the CLI writes the
sweep's folder."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rack.wiring.scenario import parse_scenario
from rack.experiments.sweep import Workload, prompt_sweep, rate_sweep

# The hardware's roofline stack: the sweeps' mechanics on the dynamics they were tuned on.
COLOC = dict(name="toy-coloc", model="llama-3.1-8b", weight_dtype="bf16", kv_dtype="bf16",
             pools=[dict(name="gpu", device="h100", stack="roofline", role="both", instances=1)],
             slo=dict(ttft_ms=300, tpot_ms=20))


def test_rate_sweep_attainment_falls_with_load():
    sc = parse_scenario(COLOC)
    wl = Workload(kind="synthetic", rate_per_s=2.0, prompt_tokens=4096, output_tokens=64, n=60, seed=1)
    res = rate_sweep([sc], wl, [0.5, 8.0], base_rate=2.0, workers=1, progress=False)
    pts = sorted(res.points, key=lambda p: p["rate_scale"])
    assert [p["rate_per_s"] for p in pts] == [1.0, 16.0]
    assert pts[0]["slo_attainment"] >= 0.9 > pts[1]["slo_attainment"]
    m = res.summary["max_rate_scale"]["toy-coloc"]
    assert m == 0.5 and res.summary["held_every_rate"]["toy-coloc"] is False
    assert res.summary["max_rate_per_s"]["toy-coloc"] == pytest.approx(2.0 * m)
    assert res.summary["tokens_per_joule_at_max"]["toy-coloc"] == pts[0]["tokens_per_joule"]
    assert res.summary["vendor_ratio"] is None          # no split/wafer pair here
    # More load on the same GPU: more tokens per joule (idle power is amortised).
    assert pts[1]["tokens_per_joule"] > pts[0]["tokens_per_joule"]


def test_rate_sweep_reports_tokens_per_joule_at_the_sustained_rate(monkeypatch):
    """Attainment that recovers above the first miss: the capacity is the rate below the
    miss, and tokens/J is that point's, not the higher rate's (new-user trial)."""
    import rack.experiments.sweep as sweep

    att = {1.0: 0.95, 2.0: 0.80, 4.0: 0.93}
    tpj = {1.0: 0.01, 2.0: 0.02, 4.0: 0.04}

    def fake(tasks, **_):
        return [{**t.labels, "slo_attainment": att[t.rate_scale], "tokens_per_joule": tpj[t.rate_scale]}
                for t in tasks]

    monkeypatch.setattr(sweep, "run_tasks", fake)
    wl = Workload(kind="synthetic", rate_per_s=2.0, prompt_tokens=128, output_tokens=8, n=10, seed=1)
    res = rate_sweep([parse_scenario(COLOC)], wl, [1.0, 2.0, 4.0], workers=1, progress=False)
    assert res.summary["max_rate_scale"]["toy-coloc"] == 1.0
    assert res.summary["tokens_per_joule_at_max"]["toy-coloc"] == 0.01


def test_synthetic_duration_keeps_high_rate_points_long():
    wl = Workload(kind="synthetic", rate_per_s=1.0, prompt_tokens=128, output_tokens=8, n=20,
                  duration_s=10.0, seed=1)
    assert len(wl.requests(1.0)) == 20                   # n is the floor
    hi = wl.requests(50.0)                               # 10 s at 50 req/s
    assert len(hi) == 500 and 8.0 < hi[-1].arrival_s < 12.0
    assert len(Workload(kind="synthetic", rate_per_s=1.0, prompt_tokens=128, output_tokens=8,
                        n=20, seed=1).requests(50.0)) == 20
    with pytest.raises(ValueError, match="duration_s"):
        Workload(kind="synthetic", rate_per_s=1.0, prompt_tokens=128, output_tokens=8, n=20,
                 duration_s=float("inf")).requests()


def test_prompt_sweep_longer_prompts_cost_more():
    sc = parse_scenario(COLOC)
    res = prompt_sweep([sc], [256, 8192], rate_per_s=2.0, output_tokens=32, n=30, workers=1, progress=False)
    by = {p["prompt_tokens"]: p for p in res.points}
    assert by[8192]["ttft_p99_s"] > by[256]["ttft_p99_s"]
    assert set(res.summary["best"]) == {256, 8192}


def test_prompt_sweep_names_no_winner_within_one_percent():
    a = parse_scenario(COLOC)
    b = parse_scenario({**COLOC, "name": "toy-coloc-twin"})      # the same rack: a tie
    res = prompt_sweep([a, b], [512], rate_per_s=2.0, output_tokens=16, n=20, workers=1, progress=False)
    assert res.summary["best"] == {512: "tie"}
    from rack.experiments.sweep import summary_lines

    assert "512 prompt tokens: no winner (the best goodputs are within 1%)" in summary_lines(res)


def test_sweep_summary_names_points_whose_requests_were_refused():
    # a prompt above Llama-3.1-8B's 131,072-token window is refused at admission: the
    # summary says so instead of leaving a bare "no winner" (new-user trial)
    from rack.experiments.sweep import summary_lines

    a = parse_scenario(COLOC)
    res = prompt_sweep([a], [512, 200_000], rate_per_s=2.0, output_tokens=16, n=10, workers=1, progress=False)
    by = {p["prompt_tokens"]: p for p in res.points}
    assert by[200_000]["rejected"] == 10 and by[512]["rejected"] == 0
    lines = summary_lines(res)
    refused = [ln for ln in lines if ln.startswith("point toy-coloc prompt_tokens=200000:")]
    assert len(refused) == 1 and "all of 10 requests rejected (" in refused[0]
    assert not any("prompt_tokens=512:" in ln for ln in lines)


def test_goodput_is_the_offered_rate_where_every_request_meets_the_slo():
    # the shipped excerpt through the split rack at several rates (done-when of the
    # client-metrics issue): steady-state goodput equals the offered rate at 100%
    from rack.wiring.load import load_scenario

    wl = Workload(kind="trace", trace="mooncake-excerpt")
    # prefill on the MI455X's roofline: with SGLang's calibrated prompt passes the
    # excerpt's 3-second bursts of ~12k-token prompts queue past the 2 s TTFT target
    data = load_scenario("helios-cs3-kimi-k2").model_dump()
    data["pools"][0]["stack"] = "roofline"
    res = rate_sweep([parse_scenario(data)], wl, [1.0, 4.0, 16.0], base_rate=None,
                     workers=2, progress=False)
    full = [p for p in res.points if p["slo_attainment"] == 1.0]
    assert len(full) >= 2
    for p in full:
        assert p["goodput_basis"] == "steady_state"
        assert p["goodput_rps"] == pytest.approx(p["offered_rps"], rel=0.05)
    top = max(res.points, key=lambda p: p["rate_scale"])
    assert top["offered_rps"] == pytest.approx(16 * min(res.points, key=lambda p: p["rate_scale"])["offered_rps"],
                                                rel=0.1)


def test_sweep_rate_cli(tmp_path):
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    out = tmp_path / "rate"
    r = CliRunner().invoke(app, ["sweep", "rate", "helios-cs3-kimi-k2", "wafer-only-kimi-k2", "--window", "0:4",
                                 "--rates", "1,4", "--workers", "2", "--out", str(out), "--json", "--no-plots"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["kind"] == "rate" and len(doc["points"]) == 4
    assert all("error" not in p and p["tokens_per_joule"] > 0 for p in doc["points"])
    vr = doc["summary"]["vendor_ratio"]
    assert vr["split"] == "helios-cs3-kimi-k2" and vr["wafer_only"] == "wafer-only-kimi-k2"
    assert (out / "sweep.csv").read_text().count("\n") == 5
    for bad in ("1,-2", "1,,2", "", "1,inf", "one"):
        r = CliRunner().invoke(app, ["sweep", "rate", "--rates", bad, "--out", str(tmp_path / "x")])
        assert r.exit_code == 2 and "--rates" in r.output, (bad, r.output)


def test_an_interrupted_sweep_gives_no_verdict_where_nothing_ran():
    """A deployment whose every rate a signal stopped before it ran has no capacity
    verdict ("misses the target already at the lowest rate" would claim a measurement
    that never happened), and the rungs counted as run leave the interrupted ones out."""
    from rack.experiments.sweep import SweepResult, summary_lines

    stopped = {"scenario": "b", "rate_scale": 1.0, "error": "not run: interrupted (SIGINT)", "interrupted": True}
    held = {"scenario": "a", "rate_scale": 1.0, "offered_rps": 2.0}
    res = SweepResult(kind="rate", param="rate_scale", points=[held, stopped], summary={
        "max_rate_scale": {"a": 1.0, "b": None}, "max_rate_per_s": {}, "tokens_per_joule_at_max": {},
        "target": 0.9, "search": {"a": {"method": "ladder", "runs": 1, "rungs": 1, "stopped_early": 0, "note": ""},
                                  "b": {"method": "ladder", "runs": 1, "rungs": 1, "stopped_early": 0, "note": ""}}})
    lines = summary_lines(res)
    assert any(x.startswith("a: sustains") for x in lines)
    assert "b: no verdict (interrupted: no rate finished)" in lines
    assert "b: ladder, 0 of 1 rungs run (1 more not run: interrupted)" in lines


def test_a_points_table_on_a_pipe_keeps_every_digit(capsys):
    """stdout is no terminal here (a pipe, as under CliRunner): the table is printed as
    wide as its columns need, not cut to 80 columns with an ellipsis."""
    from rack.cli.sweep import _print_table

    heads = ["scenario"] + [f"column number {i}" for i in range(12)]
    _print_table("t", heads, [["conditional-split-kimi-k2"] + [f"0.00{i}123456" for i in range(12)]])
    out = capsys.readouterr().out
    assert "\u2026" not in out and "0.009123456" in out
