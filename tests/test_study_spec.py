"""The study as data (rack/experiments/study/spec.py): a user's small spec writes its own
page through `rack study --spec`; bad specs are refused naming the file and field; the
shipped spec is the study the first findings.md ran; the tornado's and the verdicts'
readings follow their definitions."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from rack.experiments.study import breakeven as B
from rack.experiments.study import terms as TM
from rack.experiments.study import text as T
from rack.experiments.study.config import StudyConfig
from rack.experiments.study.output import load_results
from rack.experiments.study.sections import section_config
from rack.experiments.study.spec import StudySpecError, load_spec, parse_spec

SMALL = """
title = "My two racks"

[[section]]
key = "curves"
kind = "interactivity"
deployments = ["wafer-only-kimi-k2", "helios72-cs3-kimi-k2"]
workloads = [{trace = "mooncake-excerpt", max_requests = 8, label = "my trace"}]
concurrencies = [1, 2]
per_slot = 1
pairs = [["helios72-cs3-kimi-k2", "wafer-only-kimi-k2"]]
metric = "output_tps_per_kw"

[[section]]
key = "terms"
kind = "tornado"
pairs = [["helios72-cs3-kimi-k2", "wafer-only-kimi-k2"]]
workloads = [{trace = "mooncake-excerpt", max_requests = 8, label = "my trace"}]
terms = [{key = "link.bandwidth_GBps", low = 0.5, high = 400.0, scale = "log", label = "my link", unit = "GB/s"}]
concurrencies = [1, 2]
per_slot = 1
metric = "output_tps_per_kw"

[[section]]
key = "verdicts"
kind = "view"
view = "verdicts"
"""


def _app():
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    return app


def test_a_users_small_spec_writes_its_own_page(tmp_path):
    spec = tmp_path / "mine.toml"
    spec.write_text(SMALL)
    out = tmp_path / "page" / "mine.md"
    res = CliRunner().invoke(_app(), ["study", "--spec", str(spec), "--out", str(out), "--workers", "1",
                                      "--no-progress"])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    results = load_results(out.with_suffix("") / "study.json.gz")
    assert md.startswith("# My two racks") and str(spec) in md
    assert [s["key"] for s in results["spec"]["section"]] == ["curves", "terms", "verdicts"]
    assert "## Load" not in md and "## GPUs alone" not in md        # only the sections it declares
    assert set(results["meta"]["traces"]) == {"mooncake-excerpt"}
    # the ratio and its range over the term, from the saved points
    pair = ("helios72-cs3-kimi-k2", "wafer-only-kimi-k2")
    tr = B.tornado_rows(results["terms"], *pair)
    (term,) = tr["terms"]
    assert term["label"] == "my link" and term["low_ratio"] and term["high_ratio"]
    assert T.x(term["low_ratio"]) in md and T.x(term["high_ratio"]) in md
    lo, hi = tr["range"]
    assert f"{T.x(lo)} to {T.x(hi)} over the uncertain terms' ranges; most sensitive to my link" in md
    for name in ("curves_0.png", "terms_0.png"):
        assert (out.with_suffix("") / name).is_file() and f"mine/{name}" in md


def test_bad_specs_name_the_file_and_the_field(tmp_path):
    app = _app()

    def err(text: str) -> str:
        p = tmp_path / "bad.toml"
        p.write_text(text)
        res = CliRunner().invoke(app, ["study", "--spec", str(p), "--out", str(tmp_path / "x.md")])
        assert res.exit_code == 2, res.output
        return res.output

    assert "bad.toml: not valid TOML" in err("[[section]\n")
    out = err('[[section]]\nkey = "load"\nkind = "capacity"\ndeployments = ["wafer-only-kimi-k2"]\n'
              'workloads = [{trace = "mooncake-excerpt"}]\n')
    assert "bad.toml: section[0] ('load'): a 'capacity' section needs rates" in out
    out = err('[[section]]\nkey = "c"\nkind = "interactivity"\ndeployments = ["no-such-rack"]\n'
              'workloads = [{trace = "mooncake-excerpt"}]\nconcurrencies = [1]\n')
    assert "section[0] ('c'): deployment 'no-such-rack'" in out
    out = err('[[section]]\nkey = "c"\nkind = "interactivity"\ndeployments = ["wafer-only-kimi-k2"]\n'
              'workloads = [{trace = "mooncake-excerpt"}]\nconcurrencies = [0, 2]\n')
    assert "section[0] ('c').concurrencies" in out and "integers >= 1" in out
    with pytest.raises(StudySpecError, match=r"<t>: section\[0\] \('v'\)\.workloads\[0\]: expected exactly one of"):
        parse_spec({"section": [{"key": "v", "kind": "interactivity", "deployments": ["a"], "concurrencies": [1],
                                 "workloads": [{"trace": "x", "workload": "y"}]}]}, "<t>")
    with pytest.raises(StudySpecError, match="refers to section 'nope'"):
        parse_spec({"section": [{"key": "v", "kind": "view", "view": "kv_reuse", "source": "nope"}]}, "<t>")


def test_the_shipped_spec_is_the_first_studys_grid():
    spec = load_spec()
    full = StudyConfig.full()
    ran = [s for s in spec.section if s.kind in ("compare", "capacity", "bandwidth", "gpu_pd")]
    assert {s.key for s in ran} == {"shipped", "load", "prompt", "output", "bandwidth", "agentic", "tpot", "gpu_pd"}
    for s in ran:
        assert section_config(s, full) == full, s.key
    quick = spec.quick()
    assert {s.key for s in quick.section} == {s.key for s in spec.section}
    assert next(s for s in quick.section if s.key == "load").rates.as_tuple() == (1.0, 8.0)


def _curve(*xy):
    return [{"concurrency": 2 ** i, "tps_user_p50": x, "output_tps_per_kw": y} for i, (x, y) in enumerate(xy)]


def test_headline_reads_at_the_splits_best_point():
    split = _curve((1300.0, 2.0), (1299.0, 6.0))            # best: 6 at 1,299 tokens/s per user
    wafer = _curve((1310.0, 3.0), (1200.0, 12.0))           # at >= 1,299 x 0.99: the segment crossing 1,286
    h = B.headline(split, wafer, metric="output_tps_per_kw", tolerance=0.01)
    x = 1299.0 * 0.99
    wafer_at = 3.0 + (x - 1310.0) / (1200.0 - 1310.0) * 9.0
    assert h["x"] == 1299.0 and h["ratio"] == pytest.approx(6.0 / wafer_at)
    assert h["range"][0] <= h["ratio"] <= h["range"][1]


def test_tornado_rows_sort_by_span_and_find_where_the_verdict_flips():
    def pts(v):             # a pair whose ratio is v at every reading
        return {"s": _curve((1000.0, v)), "w": _curve((1000.0, 1.0))}

    terms = [{"key": "a.x", "label": "x", "unit": "", "low": 0.0, "nominal": 1.0, "high": 2.0, "scale": "linear",
              "sources": [], "doc": ""},
             {"key": "b.y", "label": "y", "unit": "GB/s", "low": 1.0, "nominal": None, "high": 100.0, "scale": "log",
              "sources": [], "doc": ""}]
    res = {"pairs": [["s", "w"]], "metric": "output_tps_per_kw", "tolerance": 0.0, "at": "a_best",
           "workload": "t", "terms": terms, "baseline": pts(1.2),
           "runs": {"a.x": {"low": pts(0.6), "high": pts(1.5)}, "b.y": {"low": pts(1.1), "high": pts(1.3)}}}
    tr = B.tornado_rows(res, "s", "w")
    assert [t["key"] for t in tr["terms"]] == ["a.x", "b.y"] and tr["most_sensitive"]["key"] == "a.x"
    assert tr["range"] == pytest.approx([0.6, 1.5])
    # 0.6 at x=0 -> 1.2 at the nominal x=1: crosses 1 at x = 2/3, between measured points
    assert tr["terms"][0]["flips_at"] == pytest.approx([2.0 / 3.0])
    assert tr["terms"][1]["flips_at"] == [] and tr["terms"][1]["span"] == pytest.approx(math.log(1.3 / 1.1))
    assert B.tornado_rows({**res, "runs": {}}, "s", "w")["terms"][0]["span"] is None


def test_term_values_and_crossings():
    assert TM.values({"low": 1.0, "high": 100.0, "scale": "log"}, 3) == [1.0, 10.0, 100.0]
    assert TM.values({"low": 0.2, "high": 0.6, "scale": "linear"}, 3) == [0.2, 0.4, 0.6]
    assert TM.crossing([1, 100], [0.5, 1.5], 1.0, "log") == pytest.approx([10.0])
    assert TM.crossing([1, 2], [0.5, 0.9], 1.0) == []                 # never extrapolated
    with pytest.raises(ValueError, match="no documented range"):
        TM.resolve([type("R", (), {"key": "zz.nothing", "low": None, "nominal": None, "high": None, "label": None,
                                   "unit": None, "scale": None, "points": 3})()])


def test_a_tornado_at_capacity_reads_each_ones_capacity_and_says_when_one_holds_no_rate():
    def cap(rate, tpj):
        return {"rate": rate, "held_all": False, "tokens_per_joule": tpj, "usd_per_mtok": 1.0}

    term = {"key": "link.bandwidth_GBps", "label": "link", "unit": "GB/s", "low": 1.0, "nominal": 400.0,
            "high": 4000.0, "scale": "log", "sources": [], "doc": ""}
    res = {"pairs": [["s", "w"]], "metric": "tokens_per_joule", "reading": "at_capacity", "tolerance": 0.01,
           "workload": "t", "terms": [term], "baseline": {"s": cap(2.0, 0.5), "w": cap(8.0, 1.0)},
           "runs": {term["key"]: {"low": {"s": cap(None, None), "w": cap(8.0, 1.0)},
                                  "high": {"s": cap(4.0, 2.0), "w": cap(8.0, 1.0)}}}}
    tr = B.tornado_rows(res, "s", "w")
    (t,) = tr["terms"]
    assert tr["baseline"]["ratio"] == pytest.approx(0.5) and t["high_ratio"] == pytest.approx(2.0)
    assert t["low_ratio"] is None and "only the other sustains a rate tried" in t["notes"]["low"]
    # 0.5 at the nominal 400 GB/s, 2.0 at 4,000: crosses 1x a third of the way, in log x (a log term)
    assert t["flips_at"] == pytest.approx([400.0 * 10 ** (1 / 3)])


def test_a_capacity_tornado_where_the_wafer_never_holds_a_rate_is_a_win_not_a_missing_ratio():
    from rack.experiments.study import findings_terms as FT

    def cap(rate, tpj):
        return {"rate": rate, "held_all": False, "tokens_per_joule": tpj, "usd_per_mtok": 1.0}

    term = {"key": "link.bandwidth_GBps", "label": "link", "unit": "GB/s", "low": 1.0, "nominal": 400.0,
            "high": 4000.0, "scale": "log", "sources": [], "doc": ""}
    none = {"s": cap(2.0, 0.5), "w": cap(None, None)}
    res = {"pairs": [["s", "w"]], "metric": "tokens_per_joule", "reading": "at_capacity", "tolerance": 0.01,
           "workload": "t", "terms": [term], "baseline": none, "runs": {term["key"]: {"low": none, "high": none}}}
    tr = B.tornado_rows(res, "s", "w")
    v = FT._verdict("s / w tokens/J, t: -", None, tr, "no ratio as shipped", {})
    assert v["verdict"] == "wins" and "unbounded" in v["text"] and "not run" not in v["text"]
    # one end where the wafer does hold a rate: a ratio exists there, so no blanket verdict
    res["runs"][term["key"]]["high"] = {"s": cap(2.0, 0.5), "w": cap(1.0, 1.0)}
    assert FT._verdict("h", None, B.tornado_rows(res, "s", "w"), "no ratio as shipped", {})["verdict"] is None


def test_a_crossing_of_the_claim_names_the_side_where_the_ratio_is_above_it():
    from rack.experiments.study import findings_terms as FT

    t = {"label": "prompt time", "unit": "us", "low_ratio": 3.0, "high_ratio": 9.0}
    assert FT._crossing_text(t, 55.3) == "prompt time >= 55.3 us"
    assert FT._crossing_text({**t, "low_ratio": 9.0, "high_ratio": 3.0}, 55.3) == "prompt time <= 55.3 us"


def test_a_missing_trace_is_refused_before_anything_runs(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[[section]]\nkey = "c"\nkind = "interactivity"\ndeployments = ["wafer-only-kimi-k2"]\n'
                 'workloads = [{trace = "no-such-trace.jsonl"}]\nconcurrencies = [1]\n')
    res = CliRunner().invoke(_app(), ["study", "--spec", str(p), "--out", str(tmp_path / "x.md")])
    assert res.exit_code == 2 and "t.toml" in res.output and "no-such-trace.jsonl" in res.output, res.output
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").glob("*.json*"))


def test_an_out_path_that_cannot_be_written_fails_before_the_study_runs(tmp_path):
    """--out under a file: one line and exit code 2 at once (it used to run the study,
    then fail with a traceback when writing its checkpoints)."""
    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(_app(), ["study", "--quick", "--out", str(tmp_path / "afile" / "x.md")])
    assert res.exit_code == 2 and "--out" in res.output and "Traceback" not in res.output, res.output
