"""A small study read at equal interactivity (rack study --spec): its ladders run until
each curve turns, the tornado's energy-boundary term rescales the as-shipped runs, and
every ratio on its page carries its interval."""

from __future__ import annotations

import re

import pytest

from rack.experiments.study.config import StudyConfig
from rack.experiments.study.output import write_study
from rack.experiments.study.sections import run_spec
from rack.experiments.study.spec import parse_spec

SPEC = """
title = "A small study"

[[section]]
key = "summary"
kind = "view"
view = "summary"

[[section]]
key = "chat"
kind = "interactivity"
deployments = ["wafer-only-kimi-k2", "helios72-cs3-kimi-k2"]
workloads = [{random = {input_len = 256, output_len = 16}, label = "chat"}]
concurrencies = [1, 2, 4, 8]
until_turned = true
per_slot = 1
pairs = [["helios72-cs3-kimi-k2", "wafer-only-kimi-k2"]]
metric = "output_tps_per_kw"
reading = "equal_interactivity"
at = "up_to"
knobs = {"wafer-only-kimi-k2" = {"pools.wafer.chunk_tokens" = [256]}}

[[section]]
key = "tornado"
kind = "tornado"
pairs = [["helios72-cs3-kimi-k2", "wafer-only-kimi-k2"]]
workloads = [{random = {input_len = 256, output_len = 16}, label = "chat"}]
terms = [{key = "link.bandwidth_GBps", low = 50.0, high = 400.0, scale = "log", label = "KV link bandwidth", unit = "GB/s"},
         {key = "mi455x.host_w"}]
concurrencies = [1, 2, 4, 8]
until_turned = true
per_slot = 1
metric = "output_tps_per_kw"
reading = "equal_interactivity"
at = "up_to"

[[section]]
key = "five_x"
kind = "view"
view = "five_x"

[[section]]
key = "verdicts"
kind = "view"
view = "verdicts"
"""

#: A ratio as the page prints it (two decimals and "x"), and one with its interval after it.
RATIO = re.compile(r"(?<![\d.\[-])\d[\d,]*\.\d\dx")
WITH_INTERVAL = re.compile(r"\d[\d,]*\.\d\dx \[(\d[\d,]*\.\d\d-\d[\d,]*\.\d\dx|no interval)\]")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    import tomllib

    spec = parse_spec(tomllib.loads(SPEC), "small.toml")
    cfg = StudyConfig.quick()
    from dataclasses import replace

    cfg = replace(cfg, workers=1, progress=False)
    results = run_spec(spec, cfg, command="rack study --spec small.toml", spec_path="small.toml")
    out = tmp_path_factory.mktemp("study") / "findings.md"
    write_study(results, out)
    return results, out.read_text()


def test_every_ratio_on_the_page_carries_its_interval(page):
    results, text = page
    bare = []
    for line in text.splitlines():
        stripped = WITH_INTERVAL.sub("", line)
        stripped = re.sub(r"\[\d[\d,]*\.\d\d-\d[\d,]*\.\d\dx\]", "", stripped)     # a range in brackets
        bare += RATIO.findall(stripped)
    assert RATIO.findall(text), "the page prints no ratio at all"
    assert not bare, f"ratios without an interval: {bare}"


def test_the_small_study_reads_at_equal_interactivity(page):
    results, text = page
    chat = results["chat"]["workloads"]["chat"]["deployments"]
    for name, d in chat.items():
        assert d["stop"] in ("turned", "below_slo", "ladder_end", "failed")
        assert all(p["boot_tokens"] for p in d["points"])           # every point carries its replicates
    assert "variants" in chat["wafer-only-kimi-k2"]                 # the knob's ladder, folded in
    tor = results["tornado"]
    assert tor["rerun_free"] == ["mi455x.host_w"]                   # rescaled, not rerun
    base = tor["baseline"]["helios72-cs3-kimi-k2"]
    hi = tor["runs"]["mi455x.host_w"]["high"]["helios72-cs3-kimi-k2"]
    assert [p["concurrency"] for p in hi] == [p["concurrency"] for p in base]
    assert all(h["output_tps_per_kw"] < b["output_tps_per_kw"] for h, b in zip(hi, base))
    assert "Energy counts one boundary for every deployment" in text
    assert "ratio at equal interactivity" in text or "## " in text
