"""Interactivity curves (rack.experiments.interactivity): the ratio of two curves read at
equal tokens/s per user, interpolated along each and never extrapolated; a point's
figures from its closed-loop run; the points' requests; `rack sweep interactivity`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from rack.experiments.interactivity import (interactivity_sweep, interpolate, point_metrics, point_requests,
                                         ratio_at_equal_interactivity)
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads.load import LoadControls, LoadPlan


def _curve(*xy):
    """Points at concurrency 1, 2, 4, ... with tokens/s per user x and tokens/s per kW y."""
    return [{"concurrency": 2 ** i, "tps_user_p50": x, "output_tps_per_kw": y} for i, (x, y) in enumerate(xy)]


A = _curve((100.0, 10.0), (80.0, 30.0), (50.0, 60.0))    # faster per user at low load
B = _curve((90.0, 5.0), (40.0, 40.0))


def test_interpolation_along_a_curve_and_never_past_its_ends():
    assert interpolate(A, 70.0)["value"] == pytest.approx(40.0)          # 30 + (70-80)/(50-80) x 30
    assert interpolate(A, 70.0)["between"] == [2, 4]
    assert interpolate(A, 80.0) == {"value": 30.0, "status": "measured", "range": [50.0, 100.0], "between": [2, 2],
                                    "segments": 1}
    assert interpolate(A, 100.5) == {"value": None, "status": "above_range", "range": [50.0, 100.0]}
    assert interpolate(A, 49.0)["status"] == "below_range" and interpolate(A, 49.0)["value"] is None
    assert interpolate([], 1.0)["status"] == "no_points"
    # a curve that turns back covers x twice: the better of the two segments (its frontier)
    back = _curve((100.0, 10.0), (60.0, 50.0), (90.0, 70.0))
    r = interpolate(back, 80.0)
    assert r["segments"] == 2 and r["value"] == pytest.approx(70.0 - (90.0 - 80.0) / 30.0 * 20.0)
    # a measured point competes with the segments at its x: at x=90 the point C=4 (70)
    # beats the segment C=1-C=2 (20)
    assert interpolate(back, 90.0)["value"] == 70.0 and interpolate(back, 90.0)["status"] == "measured"
    with pytest.raises(ValueError, match="reading"):
        interpolate(A, 70.0, reading="closest")


def test_the_at_least_reading_takes_the_best_point_giving_that_interactivity_or_more():
    # every user must get >= 70 tokens/s: A's best is on the C=2..C=4 segment at 70 (40);
    # >= 85: the best of C=1 (10) and the segment C=1..C=2 crossing 85 (25)
    assert interpolate(A, 70.0, reading="at_least")["value"] == pytest.approx(40.0)
    assert interpolate(A, 85.0, reading="at_least")["value"] == pytest.approx(25.0)
    # below the curve's lowest x every point qualifies: its best point, not an extrapolation
    low = interpolate(A, 10.0, reading="at_least")
    assert (low["value"], low["status"], low["between"]) == (60.0, "measured", [4, 4])
    assert interpolate(A, 101.0, reading="at_least")["value"] is None          # none is that fast
    r = ratio_at_equal_interactivity({"a": A, "b": B}, "a", "b", reading="at_least")
    # read at every measured x up to the lower top (90): 40, 50, 80, 90
    assert [x["x"] for x in r["readings"]] == [40.0, 50.0, 80.0, 90.0]
    assert r["readings"][0]["ratio"] == pytest.approx(60.0 / 40.0) and r["reading"] == "at_least"


def test_ratio_at_equal_interactivity_of_two_small_curves():
    curves = {"deployments": {"a": {"points": A}, "b": {"points": B}}}
    r = ratio_at_equal_interactivity(curves, "a", "b", at=[70.0, 95.0, 45.0])
    at70, at95, at45 = r["readings"]
    assert at70["a"] == pytest.approx(40.0) and at70["b"] == pytest.approx(5.0 + 0.4 * 35.0)
    assert at70["ratio"] == pytest.approx(40.0 / 19.0)
    assert at95["ratio"] is None and (at95["a_status"], at95["b_status"]) == ("interpolated", "above_range")
    assert at45["ratio"] is None and at45["a_status"] == "below_range"
    assert r["overlap"] == [50.0, 90.0]
    # by default: every measured tokens/s per user of either curve inside the overlap
    d = ratio_at_equal_interactivity(curves, "a", "b")
    assert [x["x"] for x in d["readings"]] == [50.0, 80.0, 90.0]
    assert d["readings"][0]["ratio"] == pytest.approx(60.0 / (5.0 + 0.8 * 35.0))
    assert d["ratio_min"] == min(x["ratio"] for x in d["readings"])
    # disjoint curves: no overlap, no ratio
    far = {"a": A, "c": _curve((10.0, 1.0), (5.0, 2.0))}
    n = ratio_at_equal_interactivity(far, "a", "c")
    assert n["overlap"] is None and n["readings"] == [] and n["ratio_min"] is None
    with pytest.raises(KeyError, match="no curve named 'z'"):
        ratio_at_equal_interactivity(far, "a", "z")
    with pytest.raises(ValueError, match="metric"):
        ratio_at_equal_interactivity(far, "a", "c", metric="goodput")


def test_point_metrics_follow_their_definitions():
    sc = load_scenario("wafer-only-kimi-k2")
    plan = LoadPlan("trace", "mooncake-excerpt", max_requests=12)
    reqs, have = point_requests(plan, 8)
    assert (len(reqs), have) == (8, 12) and all(r.arrival_s == 0.0 for r in reqs)
    out = run_scenario(sc, reqs, runtime="virtual", max_concurrency=4)
    p = point_metrics(out)
    tpot = out.columns["tpot_s"][np.isfinite(out.columns["tpot_s"])]
    assert p["tps_user_p50"] == pytest.approx(np.median(1 / tpot))
    assert p["tps_user_p90"] == pytest.approx(np.percentile(1 / tpot, 10)) and p["tps_user_p90"] <= p["tps_user_p50"]
    e = out.results["energy"]
    tokens = int(out.columns["output_tokens"].sum())
    assert p["output_tps"] == pytest.approx(tokens / e["window_s"])
    assert p["devices"] == 28 and p["output_tps_per_device"] == pytest.approx(p["output_tps"] / 28)
    assert p["output_tps_per_kw"] == pytest.approx(1e3 * tokens / e["joules"])       # idle energy included
    assert p["output_tps_per_usd_per_hour"] == pytest.approx(p["output_tps"] / out.results["cost"]["usd_per_hour"])
    assert p["kv_bytes_per_turn"] == 0 and p["prompt_tokens_computed"] + p["prompt_tokens_cached"] == \
        sum(r.prompt_tokens for r in reqs)
    # requests in the rack on average: their spans over the window, at most the 4 slots
    spans = (out.columns["t_end"] - out.columns["t_arrival"]).sum() / e["window_s"]
    assert point_metrics(out, reqs)["mean_concurrency"] == pytest.approx(spans) and 1 < spans <= 4


def test_a_session_workload_gives_whole_sessions_and_is_generated_longer_when_short():
    plan = LoadPlan("workload", "agentic-sessions", controls=LoadControls(duration_s=20.0))
    reqs, have = point_requests(plan, 12)
    sessions = {r.turn.session for r in reqs}
    assert len(sessions) == 12 and have >= 12                 # 20 s at 0.4/s: ~8, generated longer
    for s in sessions:
        turns = sorted(r.turn.index for r in reqs if r.turn.session == s)
        assert turns == list(range(len(turns)))


def test_a_sweep_and_its_command(tmp_path):
    scs = [load_scenario("wafer-only-kimi-k2"), load_scenario("gpu-only-kimi-k2")]
    plan = LoadPlan("trace", "mooncake-excerpt", max_requests=8)
    curves = interactivity_sweep(scs, plan, [2, 1], per_slot=2, workers=1, progress=False)
    assert curves["concurrencies"] == [1, 2] and not curves["errors"]
    pts = curves["deployments"]["wafer-only-kimi-k2"]["points"]
    assert [p["concurrency"] for p in pts] == [1, 2] and [p["units"] for p in pts] == [2, 4]
    json.dumps(curves)                                        # JSON-ready as it is
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    res = CliRunner().invoke(app, ["sweep", "interactivity", "wafer-only-kimi-k2", "helios-cs3-kimi-k2",
                                   "--concurrency", "1,2", "--per-slot", "1", "--max-requests", "4",
                                   "--workers", "1", "--out", str(tmp_path), "--no-plots"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "interactivity.json").read_text())
    assert doc["ratios"][0]["a"] == "helios-cs3-kimi-k2" and doc["ratios"][0]["b"] == "wafer-only-kimi-k2"
    assert "tokens/s per user" in res.output
    bad = CliRunner().invoke(app, ["sweep", "interactivity", "--max-concurrency", "4", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "pure closed loop" in bad.output
    assert math.isfinite(doc["deployments"]["helios-cs3-kimi-k2"]["points"][0]["kv_bytes_per_turn"])


def test_a_tolerance_makes_nearly_equal_interactivity_comparable():
    flat = _curve((1271.0, 1.4), (1267.0, 4.2), (1221.0, 10.4))      # the wafer's: nearly vertical
    other = _curve((1272.0, 6.7),)
    strict = ratio_at_equal_interactivity({"w": flat, "s": other}, "s", "w", reading="at_least", at=[1271.0])
    within = ratio_at_equal_interactivity({"w": flat, "s": other}, "s", "w", reading="at_least", at=[1271.0],
                                          tolerance=0.01)
    assert strict["readings"][0]["ratio"] == pytest.approx(6.7 / 1.4)
    # within 1 % of 1271 is 1258.29 or more: the segment 1267 -> 1221 crosses it
    at = 4.2 + (1258.29 - 1267.0) / (1221.0 - 1267.0) * (10.4 - 4.2)
    assert within["readings"][0]["ratio"] == pytest.approx(6.7 / at)
    with pytest.raises(ValueError, match="tolerance"):
        ratio_at_equal_interactivity({"w": flat, "s": other}, "s", "w", tolerance=0.01)
