"""Goodput and SLO attainment on hand-built requests equal the values computed by hand,
and the stage breakdown and fixed stages keep the books."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rack.measure import metrics
from rack.wiring.settings import FixedStage, parse_stage
from rack.measure.breakdown import (apply_fixed_stages, chrome_trace, stage_breakdown,
                            stage_durations)
from rack.serving.collector import EVENTS, OUTCOMES
from rack.run.runner import run_scenario
from rack.wiring.scenario import Scenario
from rack.experiments.sweep import max_sustainable_rate
from workloads import FixedLengths, PoissonArrivals, Request, synthesize

NAN = float("nan")


def _snapshot(rows):
    """A collector snapshot from rows (id, {event: t}, outcome, itl list)."""
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    times = np.full((len(rows), len(EVENTS)), np.nan)
    outcome = np.zeros(len(rows), dtype=np.int8)
    reason = {}
    itl = {}
    for i, (rid, ev, out, gaps) in enumerate(rows):
        for name, t in ev.items():
            times[i, EVENTS.index(name)] = t
        outcome[i] = OUTCOMES.index(out) + 1
        if out != "completed":
            reason[rid] = "test"
        if gaps is not None:
            itl[rid] = np.asarray(gaps, dtype=np.float64)
    order = sorted(itl)
    return {"ids": ids, "times": times, "events": list(EVENTS), "outcome": outcome,
            "outcomes": list(OUTCOMES), "reason": reason, "preemptions": np.zeros(len(rows), np.int32),
            "itl_ids": np.array(order), "itl_lengths": np.array([len(itl[r]) for r in order]),
            "itl_flat": np.concatenate([itl[r] for r in order]) if order else np.zeros(0),
            "violations": [], "unknown_events": {}}


def test_goodput_by_hand():
    # SLO: TTFT <= 1.0 s, TPOT <= 0.15 s.
    reqs = [Request(0, 0.0, 100, 11), Request(1, 1.0, 100, 11), Request(2, 2.0, 100, 6),
            Request(3, 3.0, 100, 1), Request(4, 4.0, 100, 5), Request(5, 5.0, 100, 3)]
    rows = [
        # TTFT 0.5, TPOT (1.5 - 0.5) / 10 = 0.1: meets both.
        (0, {"arrival": 0.0, "first_token": 0.5, "completion": 1.5}, "completed", [0.1] * 10),
        # TTFT 1.2 > 1.0: misses.
        (1, {"arrival": 1.0, "first_token": 2.2, "completion": 3.2}, "completed", [0.1] * 10),
        # TTFT 0.2, TPOT (3.2 - 0.2) / 5 = 0.6 > 0.15: misses.
        (2, {"arrival": 2.0, "first_token": 2.2, "completion": 5.2}, "completed", [0.6] * 5),
        # One output token, TTFT 0.3: no TPOT, meets.
        (3, {"arrival": 3.0, "first_token": 3.3, "completion": 3.3}, "completed", []),
        # Rejected: no latency samples, counts against attainment.
        (4, {"arrival": 4.0}, "rejected", None),
        # TTFT exactly 1.0 and TPOT exactly 0.15 (at the targets): meets. Ends last, at 6.3.
        (5, {"arrival": 5.0, "first_token": 6.0, "completion": 6.3}, "completed", [0.15, 0.15]),
    ]
    res, cols = metrics.compute(_snapshot(rows), reqs, 1.0, 0.15)
    meeting = 3                     # requests 0, 3 and 5
    duration = 6.3 - 0.0            # first arrival to the last end
    assert res["goodput"]["requests_meeting_slo"] == meeting
    assert res["goodput"]["requests_per_s"] == pytest.approx(meeting / duration)
    assert res["goodput"]["slo_attainment"] == pytest.approx(meeting / 6)
    assert res["throughput"]["requests_per_s"] == pytest.approx(5 / duration)
    assert cols["meets_slo"].tolist() == [True, False, False, True, False, True]


def test_max_sustainable_rate_by_hand():
    # Attainment 1.0, 0.95, 0.80 at rates 1, 2, 4: rate 2 is the highest measured point
    # that holds (no interpolation toward 4, which was never seen to hold)
    assert max_sustainable_rate([4, 1, 2], [0.80, 1.0, 0.95], 0.9) == (2.0, False)
    assert max_sustainable_rate([1, 2], [0.5, 0.4], 0.9) == (None, False)
    # every point held: at least the highest rate tried
    assert max_sustainable_rate([1, 2], [1.0, 0.91], 0.9) == (2.0, True)
    # the scan stops at the first miss, even if a higher rate happens to hold again
    assert max_sustainable_rate([1, 2, 4], [1.0, 0.8, 0.95], 0.9) == (1.0, False)


def _toy(stages=()):
    return Scenario.model_validate(dict(
        name="toy-split", model="llama-3.1-8b", weight_dtype="bf16", kv_dtype="bf16",
        pools=[dict(name="prefill", device="h100", role="prefill"), dict(name="decode", device="h100", role="decode")],
        links=[dict(name="kv", src="prefill", dst="decode", bandwidth_GBps=20, latency_us=5, per_message_us=10)],
        slo=dict(ttft_ms=500, tpot_ms=40), fixed_stages=[s.model_dump() for s in stages]))


@pytest.fixture(scope="module")
def toy_requests():
    return synthesize(PoissonArrivals(5.0), FixedLengths(3000, 32), n=40, seed=7)


def test_stages_sum_to_e2e(toy_requests):
    out = run_scenario(_toy(), toy_requests, runtime="virtual")
    d = stage_durations(out.columns)
    done = out.columns["outcome"] == "completed"
    total = sum(d.values())
    assert np.allclose(total, out.columns["e2e_s"][done], rtol=0, atol=1e-9)
    assert all((v >= 0).all() for v in d.values())
    assert d["kv_transfer"].mean() > 0 and d["prefill"].mean() > 0 and d["decode"].mean() > 0
    b = out.results["breakdown"]
    assert b["e2e_mean_s"] == pytest.approx(float(out.columns["e2e_s"][done].mean()))
    assert sum(r["share"] for r in b["stages"]) == pytest.approx(1.0)


def test_fixed_stages_shift_ttft_and_e2e_exactly(toy_requests):
    stages = [parse_stage("gateway=2"), parse_stage("auth=1.5:before"), parse_stage("serialize=0.5:after")]
    base = run_scenario(_toy(), toy_requests, runtime="virtual")
    staged = run_scenario(_toy(stages), toy_requests, runtime="virtual")
    extra = (2 + 1.5 + 0.5) / 1e3
    assert np.allclose(staged.columns["ttft_s"], base.columns["ttft_s"] + extra, equal_nan=True)
    assert np.allclose(staged.columns["e2e_s"], base.columns["e2e_s"] + extra, equal_nan=True)
    assert np.allclose(staged.columns["tpot_s"], base.columns["tpot_s"], equal_nan=True)
    b = stage_breakdown(staged.columns, stages)
    names = [r["stage"] for r in b["stages"]]
    assert names[:2] == ["gateway", "auth"] and names[-1] == "serialize"
    d = stage_durations(staged.columns, stages)
    done = staged.columns["outcome"] == "completed"
    assert np.allclose(sum(d.values()), staged.columns["e2e_s"][done], atol=1e-9)
    assert np.allclose(d["kv_transfer"], stage_durations(base.columns)["kv_transfer"])
    # a request's end moves with its events: a completed one ends at its completion
    assert np.allclose(staged.columns["t_end"][done], staged.columns["t_completion"][done], rtol=0, atol=1e-12)
    assert np.allclose(staged.columns["t_end"], base.columns["t_end"] + np.where(done, extra, 3.5e-3), rtol=0, atol=1e-12)


def test_parse_stage_errors():
    assert parse_stage("gw=3") == FixedStage(name="gw", latency_ms=3.0, where="before")
    for bad in ("gw", "gw=x", "gw=1:sideways", "=1"):
        with pytest.raises(ValueError, match="NAME=MILLISECONDS"):
            parse_stage(bad)


def test_apply_fixed_stages_leaves_input_alone():
    snap = _snapshot([(0, {"arrival": 0.0, "first_token": 0.5, "completion": 1.0}, "completed", [0.5])])
    out = apply_fixed_stages(snap, [FixedStage(name="g", latency_ms=10)])
    assert snap["times"][0, EVENTS.index("first_token")] == 0.5
    assert out["times"][0, EVENTS.index("first_token")] == pytest.approx(0.51)
    assert out["times"][0, EVENTS.index("arrival")] == 0.0


def test_chrome_trace_is_valid_json(toy_requests):
    out = run_scenario(_toy(), toy_requests, runtime="virtual")
    tr = chrome_trace(out.columns, sample=5)
    json.dumps(tr)
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len({e["tid"] for e in xs}) == 5
    assert {e["name"] for e in xs} >= {"prefill", "kv_transfer", "decode"}
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in xs)


def test_goodput_of_a_burst_is_never_above_the_rate_the_rack_served():
    # 40 arrivals within 40 us, each in the rack for ~0.1 s: a 31 us "steady state"
    # window would report a million req/s (new-user trial); the whole run is used.
    arrivals = np.arange(40) * 1e-6
    ends = 0.1 + np.arange(40) * 2e-3
    meets = np.ones(40, dtype=bool)
    duration = float(ends.max() - arrivals.min())
    g = metrics.goodput_section(arrivals, meets, duration, 2.0, 0.08, ends=ends)
    assert g["basis"] == "whole_run" and g["basis_reason"] == "burst"
    assert g["requests_per_s"] == pytest.approx(40 / duration)
    # the same arrivals spread over 400 s, each in the rack 0.1 s: a steady state
    spread = np.arange(40) * 10.0
    g = metrics.goodput_section(spread, meets, 390.1, 2.0, 0.08, ends=spread + 0.1)
    assert g["basis"] == "steady_state" and g["basis_reason"] is None
    assert g["requests_per_s"] == pytest.approx(g["window_requests"] / (g["window_s"][1] - g["window_s"][0]))
    g = metrics.goodput_section(spread[:5], meets[:5], 40.1, 2.0, 0.08, ends=spread[:5] + 0.1)
    assert g["basis"] == "whole_run" and g["basis_reason"] == "too_few_arrivals"
