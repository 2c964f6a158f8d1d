"""Capacity by bisection with early stopping (rack.experiments.capacity, rack.experiments.slo_watch):
the same capacity rung as walking the whole ladder, runs cut short only when their miss is
certain, and the ladder walked where attainment contradicts monotonicity."""

from __future__ import annotations

import pytest

import rack.experiments.capacity as C
from rack.experiments.sweep import Task, Workload, max_sustainable_rate, rate_sweep, run_task
from rack.wiring.load import load_scenario

WL = Workload(kind="trace", trace="mooncake_conv", window=(0.0, 30.0))
LADDER = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
NAMES = ("gpu-only-kimi-k2", "helios72-cs3-kimi-k2", "wafer-only-kimi-k2")


def test_bisection_finds_the_full_ladders_capacity_rung():
    scs = [load_scenario(n) for n in NAMES]
    full = rate_sweep(scs, WL, LADDER, workers=1, progress=False)
    bis = C.capacity_sweep(scs, WL, LADDER, workers=1, progress=False)
    assert bis.summary["max_rate_scale"] == full.summary["max_rate_scale"]
    assert bis.summary["held_every_rate"] == full.summary["held_every_rate"]
    assert bis.summary["tokens_per_joule_at_max"] == full.summary["tokens_per_joule_at_max"]
    # fewer runs than the ladder, and at least one overloaded run was cut short
    runs = sum(s["runs"] for s in bis.summary["search"].values())
    assert runs < len(LADDER) * len(scs)
    assert all(s["method"] == "bisection" for s in bis.summary["search"].values())
    stopped = [p for p in bis.points if p.get("stopped_early")]
    assert stopped and all(p["slo_attainment"] < 0.9 for p in stopped)
    # a point bisection ran is the same point the ladder ran (deterministic runs)...
    by = {(p["scenario"], p["rate_scale"]): p for p in full.points}
    for p in bis.points:
        q = by[(p["scenario"], p["rate_scale"])]
        if not p.get("stopped_early"):
            assert p["slo_attainment"] == q["slo_attainment"] and p["tokens_per_joule"] == q["tokens_per_joule"]
        else:       # ...and a run cut short would have missed: the full run misses too
            assert q["slo_attainment"] < 0.9
            assert q["slo_attainment"] <= p["stopped_early"]["attainment_bound"]


def test_early_stop_only_when_the_miss_is_certain():
    sc = load_scenario("gpu-only-kimi-k2").model_dump(mode="json")
    lab = {"scenario": "gpu-only-kimi-k2"}
    over = run_task(Task(sc, WL, rate_scale=64.0, labels=lab, early_stop=0.9))
    rec = over["stopped_early"]
    assert rec["verdict"] == "failed" and rec["missed"] > 0.1 * rec["submitted"]
    assert "already missed the SLO" in rec["reason"]
    full = run_task(Task(sc, WL, rate_scale=64.0, labels=lab))
    assert "stopped_early" not in full and full["slo_attainment"] <= rec["attainment_bound"]
    # a passing run is never cut: its figures are those of the run without a watch
    ok = run_task(Task(sc, WL, rate_scale=0.5, labels=lab, early_stop=0.9))
    ref = run_task(Task(sc, WL, rate_scale=0.5, labels=lab))
    assert "stopped_early" not in ok and ok == ref


def _fake_points(attainment: dict):
    def fake(task: Task) -> dict:
        return {**task.labels, "slo_attainment": attainment[task.rate_scale], "tokens_per_joule": 1.0}
    return fake


def test_non_monotone_attainment_walks_the_ladder(monkeypatch):
    # passes at 1, misses at 2, passes again at 4 and 8, misses from 16 but rises
    # again at 32: bisection runs 8, 32, 16 and sees 16 < 32, so it walks the ladder
    # below 16 and answers the ladder's 1 (the first miss is at 2), not 8
    att = {1.0: 0.95, 2.0: 0.85, 4.0: 0.97, 8.0: 0.96, 16.0: 0.5, 32.0: 0.8, 64.0: 0.0}
    monkeypatch.setattr(C, "run_task", _fake_points(att))
    sc = load_scenario("gpu-only-kimi-k2")
    res = C.capacity_sweep([sc], WL, sorted(att), workers=1, progress=False)
    s = res.summary["search"][sc.name]
    assert s["method"] == "ladder" and "not monotone" in s["note"]
    assert res.summary["max_rate_scale"][sc.name] == max_sustainable_rate(list(att), list(att.values()))[0] == 1.0


def test_monotone_fakes_need_log2_runs(monkeypatch):
    rungs = [2.0 ** k for k in range(15)]
    att = {r: (1.0 if r <= 64 else 0.2) for r in rungs}
    monkeypatch.setattr(C, "run_task", _fake_points(att))
    sc = load_scenario("gpu-only-kimi-k2")
    res = C.capacity_sweep([sc], WL, rungs, workers=1, progress=False)
    assert res.summary["max_rate_scale"][sc.name] == 64.0
    assert res.summary["search"][sc.name]["runs"] == 4          # ceil(log2(15 + 1))
    att_all = {r: 1.0 for r in rungs}
    monkeypatch.setattr(C, "run_task", _fake_points(att_all))
    res = C.capacity_sweep([sc], WL, rungs, workers=1, progress=False)
    assert res.summary["max_rate_scale"][sc.name] == rungs[-1] and res.summary["held_every_rate"][sc.name]
    with pytest.raises(ValueError, match="search"):
        C.capacity_sweep([sc], WL, rungs, search="binary", workers=1, progress=False)
