"""Rate sweeps that measure rates: `--rates` in req/s, each synthetic point drawing its
own arrivals at its rate for the whole `--duration` (counts equal rate x duration), a
trace replay saying each point's emulated span, `--rate-scales` for multipliers, and
one-line errors when there is no rate to scale; `rack run` and `rack compare` print
the realised rate beside the asked one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rack.experiments.sweep import Workload
from test_sweep_crossover import COLOC_TOML
from workloads.load import LoadControls, LoadPlan

#: A small colocated rack (fast to run): test_sweep_crossover's.
TOY = COLOC_TOML.format(ttft=300, tpot=20)


def _cli(args):
    import rack.cli
    from rack.cli.app import app

    rack.cli._register_commands()
    return CliRunner().invoke(app, [str(a) for a in args])


def _toy_file(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(TOY)
    return path


def test_each_synthetic_point_draws_its_own_arrivals_for_the_whole_duration():
    plan = LoadPlan("random", controls=LoadControls(request_rate=1.0, duration_s=120.0, seed=0),
                    input_len=64, output_len=4)
    wl = Workload(kind="plan", plan=plan)
    for scale in (1, 2, 4, 8, 16):
        reqs = wl.requests(scale)
        t = [r.arrival_s for r in reqs]
        assert len(reqs) == 120 * scale and 0 < min(t) and max(t) < 120.0
        assert max(t) - min(t) > 118.0               # the whole duration, not a compressed burst
    # the same seed: the same lengths in the same order at every rate
    assert [r.prompt_tokens for r in wl.requests(2)[:50]] == [r.prompt_tokens for r in wl.requests(4)[:50]]


def test_a_trace_replay_keeps_its_requests_and_compresses_its_span():
    plan = LoadPlan("trace", "mooncake-excerpt", window=(0.0, 30.0))
    wl = Workload(kind="plan", plan=plan)
    one, two = wl.requests(1.0), wl.requests(2.0)
    assert [r.id for r in one] == [r.id for r in two]
    span = lambda rs: max(r.arrival_s for r in rs) - min(r.arrival_s for r in rs)  # noqa: E731
    assert span(two) == pytest.approx(span(one) / 2)


def test_sweep_rate_cli_in_requests_per_second(tmp_path):
    sc = _toy_file(tmp_path)
    r = _cli(["sweep", "rate", sc, "--dataset", "random", "--input-len", 64, "--output-len", 4,
              "--rates", "1,4", "--duration", 30, "--workers", 1, "--no-plots", "--out", tmp_path / "o", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert doc["param"] == "rate_per_s"
    pts = sorted(doc["points"], key=lambda p: p["rate_per_s"])
    assert [p["rate_per_s"] for p in pts] == [1.0, 4.0]
    assert [p["arrivals"] for p in pts] == [30, 120]
    assert all(p["arrival_span_s"] > 29.0 for p in pts)
    # without --request-rate the points still draw at their asked rates (not one burst twice)
    r = _cli(["sweep", "rate", sc, "--dataset", "random", "--input-len", 64, "--output-len", 4, "--num-prompts",
              20, "--rates", "1,2", "--workers", 1, "--no-plots", "--out", tmp_path / "p", "--json"])
    assert r.exit_code == 0, r.output
    pts = sorted(json.loads(r.output[r.output.index("{"):])["points"], key=lambda p: p["rate_per_s"])
    assert [p["arrivals"] for p in pts] == [20, 20]
    assert pts[0]["arrival_span_s"] == pytest.approx(2 * pts[1]["arrival_span_s"])


def test_summary_and_table_name_the_asked_and_the_offered_rate_apart(tmp_path):
    sc = _toy_file(tmp_path)
    r = _cli(["sweep", "rate", sc, "--dataset", "random", "--input-len", 64, "--output-len", 4,
              "--rates", "2", "--duration", 20, "--workers", 1, "--no-plots", "--out", tmp_path / "o"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("toy-coloc:"))
    assert "req/s asked" in line and "offered" in line and "measured there" in line
    assert "arrivals" in r.output and "offered" in r.output


@pytest.mark.parametrize("args, message", [
    (["--dataset", "random", "--num-prompts", 50, "--rate-scales", "1,2"], "no arrival rate to scale"),
    (["--dataset", "random", "--duration", 120, "--rate-scales", "1,2"], "no arrival rate to scale"),
    (["--rates", "1,2", "--rate-scales", "1"], "not both"),
    (["--dataset", "random", "--num-prompts", 5, "--request-rate", "inf", "--rate-scales", "2"],
     "no arrival rate to scale"),
])
def test_no_rate_to_scale_is_a_one_line_error(tmp_path, args, message):
    r = _cli(["sweep", "rate", _toy_file(tmp_path), *args, "--no-plots", "--out", tmp_path / "o"])
    assert r.exit_code != 0
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0], r.output


def test_run_and_compare_print_the_realised_rate_beside_the_asked_one(tmp_path):
    sc = _toy_file(tmp_path)
    r = _cli(["run", "--runtime", "virtual", "--scenario", sc, "--dataset", "random", "--input-len", 64,
              "--output-len", 4, "--request-rate", 4, "--duration", 30, "--no-plots", "--out", tmp_path / "r"])
    assert r.exit_code == 0, r.output
    assert "arrivals: 120 over" in r.output and "4 req/s realised (asked: --request-rate 4 for --duration 30 s)" \
        in r.output
    r = _cli(["compare", sc, "--dataset", "random", "--input-len", 64, "--output-len", 4, "--request-rate", 4,
              "--duration", 30, "--no-plots", "--out", tmp_path / "c"])
    assert r.exit_code == 0, r.output
    assert "realised (asked: --request-rate 4" in r.output
