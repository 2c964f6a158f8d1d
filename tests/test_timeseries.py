"""Time series per instance and link: recorded at events, consistent with the engines'
own counters, written as timeseries.csv, plotted, and drawn as Perfetto counter tracks."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from devices.engines.common import SERIES_COLUMNS, EventSeries
from rack.measure.breakdown import engine_tracks, write_chrome_trace
from rack.measure.timeseries import (CSV_COLUMNS, counter_points, instance_series, link_series, step_means,
                                      windowed_hit_ratio, write_timeseries_csv)
from rack.run.runner import run_scenario
from workloads.series import BoundedSeries
from rack.wiring.load import load_scenario
from workloads import load_requests


def test_event_series_keeps_an_instants_last_state_and_grows():
    s = EventSeries()
    s.add(0.0, 1, 0, 10, 0, 0, 0)
    s.add(0.0, 2, 1, 20, 0, 0, 0)          # same instant: replaces
    for i in range(1, 40):
        s.add(float(i), i, i, i, i, i, 2 * i)
    d = s.as_dict()
    assert len(s) == 40 and list(d) == ["t_s", *SERIES_COLUMNS]
    assert d["queue_depth"][0] == 2 and d["kv_bytes"][0] == 20
    assert d["prefix_lookup_blocks"][-1] == 78 and d["t_s"][-1] == 39.0


def test_bounded_series_keeps_every_event_of_a_short_run_and_bounds_a_long_one():
    short = BoundedSeries(1, max_rows=64)
    for i in range(50):
        short.add(float(i), float(i))
    assert len(short) == 50 and short.resolution_s == 0.0
    s = BoundedSeries(2, max_rows=64)
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1.0, 100_000))
    peak = 0
    for x in t.tolist():
        s.add(x, x, 2 * x)
        peak = max(peak, len(s))
    assert peak <= 64 and s.resolution_s > 0
    ts, v1, v2 = s.columns()
    assert np.array_equal(v1, ts) and np.array_equal(v2, 2 * ts)    # each row's own values
    assert ts[-1] == t[-1]                                          # the latest state is kept
    assert np.all(np.diff(ts) > 0)
    w = (ts - s.origin_s) // s.resolution_s                         # at most one row per window
    assert np.all(np.diff(w) >= 1)
    # every kept row is the last event of its window
    tw = (t - s.origin_s) // s.resolution_s
    last_of = {int(k): x for k, x in zip(tw.tolist(), t.tolist())}
    assert all(last_of[int(k)] == x for k, x in zip(w.tolist(), ts.tolist()))


def test_step_means_and_windowed_hit_ratio_are_exact():
    # 2 on [0, 1), 4 on [1, 3), 0 after: windows [0, 2), [2, 4)
    x, m = step_means(np.array([0.0, 1.0, 3.0]), np.array([2.0, 4.0, 0.0]), 4.0, 2)
    assert x.tolist() == [1.0, 3.0] and m.tolist() == [3.0, 2.0]
    # cumulative hits/lookups: 1/2 by t=1, 4/6 by t=3
    t = np.array([1.0, 3.0])
    _, r = windowed_hit_ratio(t, np.array([1.0, 4.0]), np.array([2.0, 6.0]), 4.0, 2)
    assert r.tolist() == [0.5, 0.75]
    _, r = windowed_hit_ratio(t, np.array([1.0, 1.0]), np.array([2.0, 2.0]), 4.0, 2)
    assert np.isnan(r[1])                      # nothing looked up in [2, 4)
    tt, vv = counter_points(np.arange(10.0), np.ones(10), 10.0, 5)
    assert tt.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and np.allclose(vv, 1.0)


@pytest.fixture(scope="module")
def run():
    sc = load_scenario()
    sc = sc.with_router(policy="prefix_aware")
    reqs = load_requests("mooncake-excerpt")
    return sc, reqs, run_scenario(sc, reqs, runtime="virtual")


def test_series_agree_with_the_engines_counters(run):
    sc, reqs, out = run
    inst = instance_series(out.stats)
    assert set(inst) == {"prefill-0", "prefill-1", "decode-0"}
    for name, d in inst.items():
        st = out.stats[name]
        assert np.all(np.diff(d["t_s"]) >= 0) and d["t_s"].size > 10
        assert np.all((d["kv_occupancy"] >= 0) & (d["kv_occupancy"] <= 1))
        assert np.all(d["kv_bytes"] + d["prefix_cache_bytes"] <= st["kv_capacity_bytes"])
        assert d["queue_depth"].min() >= 0 and d["running"].min() >= 0
        if st["role"] == "prefill":
            pc = st["prefix_cache"]
            # the last row follows the last lookup: the cumulative counters end at the totals
            assert d["prefix_hit_blocks"][-1] == pc["hit_blocks"]
            assert d["prefix_lookup_blocks"][-1] == pc["hit_blocks"] + pc["miss_blocks"]
            assert d["queue_depth"].max() <= st["queue_peak"]
            assert d["running"][-1] == 0 and d["kv_bytes"][-1] == 0      # everything handed off
        else:
            assert d["running"].max() == st["batch_peak"]
    # recorded at events, never per token
    out_tokens = sum(r.output_tokens for r in reqs)
    rows = sum(d["t_s"].size for d in inst.values())
    assert rows < 10 * len(reqs) < out_tokens / 5
    links = link_series(out.stats)
    assert list(links) == ["gpu-to-wafer"] and links["gpu-to-wafer"]["utilisation"].max() <= 1.0 + 1e-12


def test_csv_plot_and_perfetto_tracks(run, tmp_path):
    sc, _, out = run
    n = write_timeseries_csv(tmp_path / "timeseries.csv", out.stats)
    with open(tmp_path / "timeseries.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n and list(rows[0]) == list(CSV_COLUMNS)
    by = {}
    for r in rows:
        by.setdefault(r["component"], []).append(r)
    assert {k: v[0]["role"] for k, v in by.items()} == {"prefill-0": "prefill", "prefill-1": "prefill",
                                                       "decode-0": "decode", "gpu-to-wafer": "link"}
    assert by["gpu-to-wafer"][0]["queue_depth"] == "" and by["decode-0"][0]["link_utilisation"] == ""
    assert int(by["prefill-0"][-1]["prefix_hit_blocks"]) == out.stats["prefill-0"]["prefix_cache"]["hit_blocks"]

    from rack.measure.plots import timeseries

    assert timeseries(out.stats, tmp_path / "ts.png", title=sc.name).stat().st_size > 10_000

    events, nproc = engine_tracks(out.stats, "split", 7, max_points=50)
    assert nproc == 4
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert sorted(procs) == [7, 8, 9, 10] and "split: decode-0" in procs.values()
    per_track = {}
    for e in events:
        if e["ph"] == "C":
            per_track[(e["pid"], e["name"])] = per_track.get((e["pid"], e["name"]), 0) + 1
    assert max(per_track.values()) <= 50
    write_chrome_trace(tmp_path / "t.json", {"split": out.columns}, sample=5, engines={"split": out.stats})
    doc = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {1}
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "C"} == {2, 3, 4, 5}


def test_rack_run_writes_the_series(tmp_path):
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--window", "0:10", "--out", str(out),
                                 "--router-policy", "prefix_aware", "--prefix-weight", "2"])
    assert r.exit_code == 0, r.output
    for f in ("timeseries.csv", "timeseries.png", "timelines.json"):
        assert (out / f).stat().st_size > 100, f
    res = json.loads((out / "results.json").read_text())
    assert res["provenance"]["config"]["router"] == {**res["provenance"]["config"]["router"],
                                                     "policy": "prefix_aware", "prefix_weight": 2.0}
    assert "hit ratio" in r.output and "timeseries.csv" in r.output


def test_bounded_series_staged_rows_equal_row_by_row_adds():
    """Rows staged in a list and copied in blocks (`BoundedSeries.add`) give the series
    that adding them to the array one by one gives, coarsening included."""
    import numpy as np

    from workloads.series import BoundedSeries

    class RowByRow(BoundedSeries):
        __slots__ = ()

        def add(self, t, *values):
            self._last = t
            self._add_row(t, values)

    rng = np.random.default_rng(7)
    for max_rows in (5, 64, 1500):
        a, b = BoundedSeries(2, max_rows), RowByRow(2, max_rows)
        t = 0.0
        for _ in range(6000):
            if rng.random() < 0.7:
                t += float(rng.exponential(rng.choice([1e-3, 1.0, 50.0])))
            v = [float(x) for x in rng.integers(0, 100, 2)]
            a.add(t, *v)
            b.add(t, *v)
            assert a.last() == b.last() and len(a) == len(b)
        assert all(np.array_equal(x, y) for x, y in zip(a.columns(), b.columns()))
        assert a.resolution_s == b.resolution_s > 0


def test_run_without_timeseries_gives_the_same_figures():
    """`run_scenario(timeseries=False)` (sweeps, the study, `rack bench`) records no gauges
    over time and changes no other figure."""
    import numpy as np

    from rack.run.runner import run_scenario
    from rack.wiring.load import load_scenario
    from workloads import load_requests

    sc = load_scenario(None)
    reqs = load_requests("mooncake-excerpt", window=(0.0, 8.0))
    on = run_scenario(sc, reqs, runtime="virtual", kv_payload="account")
    off = run_scenario(sc, reqs, runtime="virtual", kv_payload="account", timeseries=False)
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        assert np.array_equal(np.asarray(on.columns[k]), np.asarray(off.columns[k]), equal_nan=True)
    for section in ("requests", "latency", "throughput", "energy"):
        assert on.results[section] == off.results[section]
    eng = [s for s in off.stats.values() if "timeseries" in s]
    assert eng and all(len(s["timeseries"]["t_s"]) == 0 for s in eng)
    assert all(len(s["timeseries"]["t_s"]) > 0 for s in on.stats.values() if "timeseries" in s)
    # the links' utilisation over time too; their totals stay
    links_on, links_off = on.stats["interconnect"]["links"], off.stats["interconnect"]["links"]
    assert links_on and all(len(ln["series"]) > 0 for ln in links_on.values())
    assert all(ln["series"] == [] for ln in links_off.values())
    for name, ln in links_on.items():
        assert {k: v for k, v in ln.items() if k != "series"} == \
            {k: v for k, v in links_off[name].items() if k != "series"}
