"""Readings at equal interactivity (rack.experiments.equal_interactivity): two small
curves read at the same tokens/s per user on both, with intervals from the points'
bootstrap replicates; knees never at a ladder's end; a curve that ends early named;
the energy boundary's terms applied to saved points without a rerun; a ladder run
until its curve turns."""

from __future__ import annotations

import numpy as np
import pytest

from rack.experiments.equal_interactivity import (branches_of, curve_range, knee, pair_readings, ratio_at,
                                                  ratio_curve, rescale_energy, value_at)
from rack.experiments.interactivity import curve_state
from rack.measure.bootstrap import bootstrap


def _pt(c, x, y, spread=0.0, n=50):
    """A point at concurrency c, x tokens/s per user, y tokens/s per kW, with bootstrap
    replicates around (x, y) (spread: their relative scatter; 0: all equal)."""
    rng = np.random.default_rng(c)
    bx = list(x * (1 + spread * rng.standard_normal(n)))
    bt = list(1 + spread * rng.standard_normal(n))
    return {"concurrency": c, "tps_user_p50": x, "output_tps_per_kw": y, "boot_x": bx, "boot_tokens": bt}


# a: fast per user, turns at C=4 (its knee); b: slower per user, higher throughput
A = [_pt(1, 1500.0, 10.0), _pt(2, 1200.0, 20.0), _pt(4, 900.0, 30.0), _pt(8, 500.0, 25.0)]
B = [_pt(1, 1100.0, 40.0), _pt(2, 800.0, 80.0), _pt(4, 400.0, 120.0), _pt(8, 200.0, 100.0)]


def test_ratio_interpolated_at_the_same_tokens_per_user_on_both_curves():
    # x = 1000: a between C=2 (1200, 20) and C=4 (900, 30): 20 + 200/300 x 10 = 26.67;
    #           b between C=1 (1100, 40) and C=2 (800, 80): 40 + 100/300 x 40 = 53.33
    r = ratio_at([A], [B], 1000.0)
    assert r["a"] == pytest.approx(20 + 10 * 200 / 300) and r["b"] == pytest.approx(40 + 40 * 100 / 300)
    assert r["ratio"] == pytest.approx((20 + 10 * 200 / 300) / (40 + 40 * 100 / 300))
    # replicates equal to the point: the requests add nothing, the rungs not measured do.
    # a at 1000: the chord 26.67; the segment (900, 30)-(500, 25) extended gives 31.25,
    # kept within the two rungs' values: [26.67, 30]; its left neighbour (1500, 10)-(1200,
    # 20) is collinear with the chord. b: chord 53.33, (800, 80)-(400, 120) extended gives
    # 60: [53.33, 60]. The ratio's interval: a low over b high, a high over b low.
    assert r["sampled"] == pytest.approx([r["ratio"], r["ratio"]])
    assert r["interval"] == pytest.approx([(20 + 10 * 200 / 300) / 60, 30 / (40 + 40 * 100 / 300)])
    # at a measured point of both curves (a's C=4 at 900 is not b's; b's C=2 at 800 is
    # not a's) the ladder adds nothing where both are measured: read a curve against itself
    at_point = ratio_at([A], [A], 900.0)
    assert at_point["ratio"] == pytest.approx(1.0) and at_point["interval"] == pytest.approx([1.0, 1.0])
    # a finer ladder (a rung measured at 1000 on the same chord) narrows the bracket to nil there
    finer = sorted(A + [_pt(3, 1000.0, 20 + 10 * 200 / 300)], key=lambda p: p["concurrency"])
    assert ratio_at([finer], [finer], 1000.0)["interval"] == pytest.approx([1.0, 1.0])
    # outside b's range: no value, b named as the curve that ends first
    hi = ratio_at([A], [B], 1400.0)
    assert hi["ratio"] is None and hi["short"] == "b" and hi["a"] is not None
    curve = ratio_curve([A], [B])
    assert curve["overlap"] == [500.0, 1100.0]
    xs = [x["x"] for x in curve["readings"]]
    assert xs[0] == pytest.approx(500.0) and xs[-1] == pytest.approx(1100.0) and len(xs) == 24
    assert all(x["ratio"] is not None for x in curve["readings"])


def test_interval_from_the_bootstrap_replicates_contains_the_ratio():
    a = [_pt(c, x, y, spread=0.05, n=400) for c, x, y in ((1, 1500.0, 10.0), (2, 1200.0, 20.0), (4, 900.0, 30.0),
                                                          (8, 500.0, 25.0))]
    b = [_pt(c, x, y, spread=0.05, n=400) for c, x, y in ((1, 1100.0, 40.0), (2, 800.0, 80.0), (4, 400.0, 120.0))]
    r = ratio_at([a], [b], 1000.0)
    lo, hi = r["interval"]
    assert lo < r["ratio"] < hi and hi / lo < 1.5 and r["replicates"] >= 200


def test_knee_is_never_a_curves_last_point():
    k = knee([A])
    assert (k["status"], k["concurrency"], k["x"]) == ("knee", 4, 900.0)
    # a curve still rising at its last point: no knee, and no reading taken there
    rising = A[:3]
    assert knee([rising])["status"] == "at_end"
    # nor is its last point (or the segment to it) read at all: it bounds what a higher rung gives
    assert curve_range([rising]) == [1200.0, 1500.0] and value_at([rising], 900.0) is None
    assert value_at([rising], 1000.0) is None and value_at([A], 1000.0) is not None
    res = pair_readings([rising], [B], names=("split", "wafer"))
    assert all(r["x"] >= 1200.0 for r in res["curve"]["readings"])
    at = {n["name"]: n for n in res["named"]}
    assert at["split's knee"]["ratio"] is None and "not turned" in at["split's knee"]["why"]
    assert at["wafer's knee"]["ratio"] is None or at["wafer's knee"]["x"] != B[-1]["tps_user_p50"]
    # the TPOT target's floor: points below it are not candidates (b's knee at C=4 is at 400 tok/s/user)
    assert knee([B])["concurrency"] == 4 and knee([B], floor=500.0)["status"] == "at_end"
    for r in pair_readings([A], [B], names=("a", "b"))["named"]:
        if r["ratio"] is not None and "knee" in r["name"]:
            assert r["x"] not in (A[-1]["tps_user_p50"], B[-1]["tps_user_p50"])


def test_pair_readings_name_the_curve_that_ends_first():
    res = pair_readings([A], [B], names=("split", "wafer"))
    assert any("wafer reaches no higher than 1,100" in n for n in res["notes"])
    assert any("split reaches no lower than 500" in n for n in res["notes"])
    named = {n["name"]: n for n in res["named"]}
    assert named["1,000 tokens/s per user"]["ratio"] == pytest.approx(ratio_at([A], [B], 1000.0)["ratio"])
    # a's knee (900 tok/s/user): both curves read there
    assert named["split's knee"]["x"] == 900.0 and named["split's knee"]["ratio"] is not None
    assert res["up_to"]["ratio"] == max(r["ratio"] for r in res["curve"]["readings"])


def test_a_knob_branch_raises_the_frontier_where_it_is_better():
    knob = [_pt(1, 1000.0, 60.0), _pt(2, 700.0, 50.0)]
    br = branches_of({"points": B, "variants": {"chunk=512": knob}})
    assert len(br) == 2
    assert value_at(br, 1000.0) == 60.0                        # the knob's point beats the base curve's 53.3
    assert value_at(br, 600.0) == pytest.approx(value_at([B], 600.0))      # the base is better there


def test_boundary_terms_rescale_saved_points_without_a_rerun():
    p = {"concurrency": 1, "tps_user_p50": 100.0, "output_tokens": 1000, "window_s": 10.0, "device_joules": 9000.0,
         "energy_boundary": "system", "joules": 10000.0, "output_tps_per_kw": 100.0,
         "overhead_w_by_device": {"mi455x": {"devices": 2, "host_w": 50.0, "nic_w": 0.0, "switch_w": 0.0}}}
    q = rescale_energy([p], {"mi455x": {"host_w": 100.0}})[0]
    assert q["joules"] == pytest.approx(9000.0 + 10.0 * 2 * 100.0)
    assert q["output_tps_per_kw"] == pytest.approx(1e3 * 1000 / 11000.0)
    dev = {**p, "energy_boundary": "devices"}
    assert rescale_energy([dev], {"mi455x": {"host_w": 100.0}})[0]["joules"] == 10000.0


def test_curve_state_stops_once_turned_or_below_the_slo():
    assert curve_state(A[:2], floor=None, rungs_left=3) is None
    assert curve_state(A, floor=None, rungs_left=3) == "turned"
    assert curve_state(B[:3], floor=500.0, rungs_left=3) == "below_slo"
    assert curve_state(A[:3], floor=None, rungs_left=0) == "ladder_end"


def test_bootstrap_replicates_resample_the_requests():
    speed = np.array([100.0, 200.0, np.nan, 300.0])
    tokens = np.array([10.0, 20.0, 1.0, 30.0])
    b = bootstrap(speed, tokens, replicates=64)
    assert len(b["boot_x"]) == len(b["boot_tokens"]) == 64
    assert all(v is None or 100.0 <= v <= 300.0 for v in b["boot_x"])
    assert np.mean(b["boot_tokens"]) == pytest.approx(1.0, abs=0.1)
    assert bootstrap(speed, tokens, replicates=64) == b                    # seeded
    assert bootstrap(np.array([]), np.array([])) == {"boot_x": [], "boot_tokens": []}


def test_a_ladder_runs_until_its_curve_turns_and_no_further(monkeypatch):
    """With until_turned each curve climbs rung by rung; the rungs after its turn never
    run, and a curve below its TPOT target's speed stops there."""
    from rack.experiments import interactivity as I
    from rack.wiring.load import load_scenario
    from workloads.load import LoadPlan

    ran = []

    def fake(task):
        c = task.concurrency
        ran.append((task.labels["scenario"], c))
        peak = 4 if task.labels["scenario"] == "gpu-only-kimi-k2" else 10 ** 6
        return {**task.labels, "concurrency": c, "tps_user_p50": 1000.0 / c,
                "output_tps_per_kw": float(min(c, peak) - (c > peak))}

    monkeypatch.setattr(I, "run_point", fake)
    I.clear_point_cache()
    scs = [load_scenario("gpu-only-kimi-k2"), load_scenario("wafer-only-kimi-k2")]
    curves = I.interactivity_sweep(scs, LoadPlan("trace", "mooncake-excerpt", max_requests=4),
                                   [1, 2, 4, 8, 16, 32, 64, 128], per_slot=1, workers=1, progress=False,
                                   until_turned=True)
    gpu = curves["deployments"]["gpu-only-kimi-k2"]
    assert gpu["stop"] == "turned" and [p["concurrency"] for p in gpu["points"]] == [1, 2, 4, 8]
    wafer = curves["deployments"]["wafer-only-kimi-k2"]
    floor = 1000.0 / scs[1].slo.tpot_ms            # 1000 / C falls below the TPOT target's speed
    assert wafer["stop"] == "below_slo" and wafer["points"][-1]["tps_user_p50"] < floor
    assert all(p["tps_user_p50"] >= floor for p in wafer["points"][:-1])
    assert ("gpu-only-kimi-k2", 16) not in ran
    # the same ladder again: every point reused, none run
    ran.clear()
    again = I.interactivity_sweep(scs, LoadPlan("trace", "mooncake-excerpt", max_requests=4),
                                  [1, 2, 4, 8, 16, 32, 64, 128], per_slot=1, workers=1, progress=False,
                                  until_turned=True)
    assert not ran and again["deployments"] == curves["deployments"]
    I.clear_point_cache()


def test_physics_ceiling_from_the_runs_own_tokens_and_power():
    """(1 + P/O) x wafer-alone power / split power, read at the same tokens/s per user."""
    from rack.experiments.study.ceiling import physics_ceiling

    wafer = [{"concurrency": c, "tps_user_p50": x, "prompt_tokens_computed": 1000 * c, "output_tokens": 1000 * c,
              "mean_power_w": 600e3, "boot_prompt": [1.0, 1.1, 0.9], "boot_tokens": [1.0, 1.0, 1.0]}
             for c, x in ((1, 1300.0), (2, 1000.0), (4, 600.0))]
    split = [{"concurrency": c, "tps_user_p50": x, "mean_power_w": 700e3}
             for c, x in ((1, 1300.0), (4, 1100.0), (16, 900.0), (64, 700.0))]
    c = physics_ceiling(split, wafer, 1000.0)
    assert c["prompt_per_output"] == pytest.approx(1.0) and c["power_ratio"] == pytest.approx(600 / 700)
    assert c["ceiling"] == pytest.approx(2.0 * 600 / 700)
    lo, hi = c["interval"]
    assert lo < c["ceiling"] < hi
    assert physics_ceiling(split, wafer, 2000.0)["ceiling"] is None         # beyond both curves


def test_a_curve_ending_within_the_resolution_is_read_at_its_end():
    """Nearly vertical curves: a split whose knee sits 0.1 % faster per user than the
    wafer's fastest point is read against that point, and the reading says so."""
    wafer = [_pt(1, 1328.0, 1.5), _pt(2, 1312.0, 1.1), _pt(4, 380.0, 0.8)]
    split = [_pt(1, 1329.5, 2.0), _pt(2, 1329.2, 2.8), _pt(4, 1329.0, 2.7)]
    r = ratio_at([split], [wafer], 1329.2)
    assert r["ratio"] == pytest.approx(2.8 / 1.5) and r["read_at"] == {"a": 1329.2, "b": 1328.0}
    assert ratio_at([split], [wafer], 1400.0)["ratio"] is None                 # 5 % away: no reading


def test_patience_rides_out_a_one_point_dip():
    dip = [_pt(1, 1300.0, 2.0), _pt(2, 1300.0, 4.0), _pt(4, 1300.0, 3.5)]
    assert curve_state(dip, floor=None, rungs_left=3) == "turned"
    assert curve_state(dip, floor=None, rungs_left=3, patience=2) is None
    assert curve_state(dip + [_pt(8, 1300.0, 8.0)], floor=None, rungs_left=2, patience=2) is None
    assert curve_state(dip + [_pt(8, 1300.0, 3.0)], floor=None, rungs_left=2, patience=2) == "turned"


def test_a_plateau_stops_the_climb_and_its_start_is_the_knee():
    flat = [_pt(1, 1300.0, 10.0), _pt(2, 1300.0, 20.0), _pt(4, 1290.0, 30.0), _pt(8, 1280.0, 31.0)]
    assert curve_state(flat, floor=None, rungs_left=3) == "flat"
    assert curve_state(flat[:3], floor=None, rungs_left=3) is None
    k = knee([flat])
    assert k["status"] == "knee" and k["concurrency"] == 4          # 30 is within 5 % of 31: the plateau's start
