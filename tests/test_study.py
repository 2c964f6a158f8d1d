"""scripts/study.py --quick: the study runs end to end on tiny inputs and writes a
findings page whose every figure comes from its runs (study.json.gz); the comparison
helpers give the verdicts they document."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rack.experiments.study import analysis as A
from rack.experiments.study import text as T
from rack.experiments.study.config import SPLIT72, WAFER, ladder
from rack.experiments.study.output import load_results, write_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One --quick run of the script (in a subprocess, as a user runs it)."""
    out = tmp_path_factory.mktemp("study") / "findings.md"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "study.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, load_results(out.with_suffix("") / "study.json.gz")


def test_quick_writes_page_figures_and_provenance(quick):
    md_path, results = quick
    md = md_path.read_text()
    assert md.startswith("# Findings")
    assert "--quick" in md and "smoke test" in md
    meta = results["meta"]
    assert "scripts/study.py --quick" in meta["command"] and meta["date"] in md and meta["version"] in md
    for name, v in meta["traces"].items():        # every input named with its hash
        assert len(v["sha256"]) == 64 and v["sha256"] in md and f"`{name}`" in md
    figs = sorted(p.name for p in md_path.with_suffix("").glob("*.png"))
    assert "load.png" in figs and "prompt_length.png" in figs and "agentic.png" in figs
    for f in figs:
        assert f"findings/{f}" in md
    for section in ("## Load", "## Prompt length", "## Output length", "## KV link bandwidth",
                    "## Long-context agentic traffic", "## A full Helios rack", "## Tighter TPOT targets",
                    "tokens per watt versus the wafer alone", "## GPUs alone", "## Caveats"):
        assert section in md


def test_numbers_come_from_the_runs(quick, tmp_path):
    md_path, results = quick
    md = md_path.read_text()
    for e in results["shipped"]["entries"]:       # the shipped comparison's measured figures
        assert T.tpj(e["tokens_per_joule"]) in md and T.usd(e["usd_per_mtok"]) in md
    c = A.at_capacity(results["load"], WAFER)
    assert T.cap(c) in md
    # Change one measured value: the page follows it (nothing is typed in).
    edited = copy.deepcopy(results)
    edited["shipped"]["entries"][0]["tokens_per_joule"] = 0.000123456
    edited["shipped"]["entries"][0]["usd_per_mtok"] = 98765.4321
    out = tmp_path / "findings.md"
    write_study(edited, out)
    text = out.read_text()
    assert "0.0001235" in text and "98,765.43" in text
    assert "0.0001235" not in md
    # Rendering is a pure function of the saved results.
    again = tmp_path / "again" / "findings.md"
    again.parent.mkdir()
    write_study(json.loads(json.dumps(results)), again)
    assert again.read_text() == md


def test_pair_verdicts():
    def c(rate, held=False, tpj=1.0, usd=1.0):
        return {"rate": rate, "held_all": held, "tokens_per_joule": tpj, "usd_per_mtok": usd}

    assert A.pair_metric(c(2.0), c(1.0), "capacity")["verdict"] == "wins"
    assert A.pair_metric(c(1.0), c(2.0), "capacity")["verdict"] == "loses"
    assert A.pair_metric(c(1.0), c(1.005), "capacity")["verdict"] == "tie"
    # both held every rate: the capacities are lower bounds, not ordered
    assert A.pair_metric(c(8.0, True), c(8.0, True), "capacity")["verdict"] == "undetermined"
    # a lower bound above a measured capacity still wins; one below it cannot lose
    assert A.pair_metric(c(8.0, True), c(4.0), "capacity")["verdict"] == "wins"
    assert A.pair_metric(c(2.0, True), c(4.0), "capacity")["verdict"] == "undetermined"
    assert A.pair_metric(c(None), c(4.0), "capacity")["verdict"] == "loses"
    assert A.pair_metric(c(4.0), c(None), "tokens_per_joule")["verdict"] == "wins"
    # tokens/J of a deployment read below its capacity (it held every rate): a loss is not proven
    assert A.pair_metric(c(8.0, True, tpj=1.0), c(4.0, tpj=2.0), "tokens_per_joule")["verdict"] == "undetermined"
    assert A.pair_metric(c(4.0, tpj=2.0), c(8.0, True, tpj=1.0), "tokens_per_joule")["verdict"] == "undetermined"
    assert A.pair_metric(c(8.0, True, tpj=3.0), c(4.0, tpj=2.0), "tokens_per_joule")["verdict"] == "wins"
    # $/Mtok: lower is better, the ratio is the other's cost over ours
    m = A.pair_metric(c(1.0, usd=2.0), c(1.0, usd=4.0), "usd_per_mtok")
    assert m["ratio"] == pytest.approx(2.0) and m["verdict"] == "wins"


def test_vendor_ratio_at_each_ones_capacity():
    def pt(name, r, att, tpj):
        return {"scenario": name, "rate_scale": r, "rate_per_s": r, "slo_attainment": att, "goodput_rps": r * att,
                "tokens_per_joule": tpj, "usd_per_mtok": 1.0, "output_tokens_per_s": 1.0, "mean_power_w": 1e6}

    pts = [pt(SPLIT72, 1, 1.0, 0.1), pt(SPLIT72, 2, 0.5, 0.2), pt(WAFER, 1, 1.0, 0.2), pt(WAFER, 2, 1.0, 0.4)]
    cap = {"points": pts, "summary": {"held_every_rate": {SPLIT72: False, WAFER: True}},
           "at_max": {SPLIT72: pts[0], WAFER: pts[3]}}
    r = A.vendor_ratios({"load": cap})
    row = next(x for x in r if x["split"] == SPLIT72)
    assert row["ratio"] == pytest.approx(0.1 / 0.4) and row["verdict"] == "loses"


def test_text_helpers():
    assert ladder(1, 4) == (1.0, 1.414, 2.0, 2.828, 4.0)
    assert T.verdict_phrase({"wins": [], "loses": ["1,024", "4,096"], "tie": [], "undetermined": []},
                            "prompt tokens", "prompt length") == "loses at every prompt length tried"
    assert T.verdict_phrase({"wins": ["1,024"], "loses": ["4,096"], "tie": [], "undetermined": []},
                            "prompt tokens", "prompt length") == \
        "wins at 1,024 prompt tokens; loses at 4,096 prompt tokens"
    assert T.cap({"rate": 8.0, "held_all": True}) == ">= 8" and T.cap({"rate": None, "held_all": False}) == "none"
