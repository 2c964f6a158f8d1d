"""`rack compare`: iso scaling, clear refusals, and the results folder on a slice of the
shipped trace."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rack.experiments.compare import (DEFAULT_SCENARIOS, CompareError, check_scenario, iso_scale, prepare,
                          provisioned)
from rack.measure.energy import pool_rates
from rack.wiring.load import load_scenario


@pytest.fixture(scope="module")
def cli():
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    return lambda args: CliRunner().invoke(app, args)


def test_iso_count_power_cost_within_one_instance():
    split = load_scenario("helios-cs3-kimi-k2")
    ref = provisioned(split)
    assert ref["devices"] == 16 + 28
    for iso, key in (("count", "devices"), ("power", "peak_w"), ("cost", "usd_per_hour")):
        for name in ("gpu-only-kimi-k2", "wafer-only-kimi-k2"):
            sc = load_scenario(name)
            scaled, note = iso_scale(sc, ref[key], iso)
            unit = {"count": pool_rates(sc)[0].devices_per_instance, "power": pool_rates(sc)[0].peak_w,
                    "cost": pool_rates(sc)[0].usd_per_hour_at_peak}[iso]
            got = provisioned(scaled)[key]
            assert got == pytest.approx(note["achieved"])
            # Nearest instance count: within half an instance, unless held at the 1-instance minimum.
            assert abs(got - ref[key]) <= unit / 2 + 1e-9 or (scaled.pools[0].instances == 1 and got > ref[key])
    # By hand: 44 devices / 8 GPUs per instance = 5.5 -> 6 (ties go up); / 28 CS-3 = 1.57 -> 2.
    assert iso_scale(load_scenario("gpu-only-kimi-k2"), 44, "count")[0].pools[0].instances == 6
    assert iso_scale(load_scenario("wafer-only-kimi-k2"), 44, "count")[0].pools[0].instances == 2
    small, note = iso_scale(load_scenario("wafer-only-kimi-k2"), 10, "count")
    assert small.pools[0].instances == 1 and "minimum" in note["note"]


def test_prepare_scales_all_but_the_reference():
    scs = [load_scenario(n) for n in DEFAULT_SCENARIOS]
    plan, ref = prepare(scs, "power")
    assert ref == "helios-cs3-kimi-k2"
    by = {s.name: (s, n) for s, n in plan}
    assert by[ref][0].pools[0].instances == 2 and by[ref][1]["note"] == "reference"
    # Same pools as the reference: proportional scaling leaves the conditional split as is.
    assert [p.instances for p in by["conditional-split-kimi-k2"][0].pools] == [2, 1]
    gpu = by["gpu-only-kimi-k2"][0]
    assert provisioned(gpu)["peak_w"] == pytest.approx(provisioned(by[ref][0])["peak_w"], rel=8 * 2300 / 680800)
    with pytest.raises(CompareError, match="--iso"):
        prepare(scs, "watts")
    with pytest.raises(CompareError, match="--reference"):
        prepare(scs, "count", reference="nope")


def test_model_that_does_not_fit_is_a_clear_error():
    sc = load_scenario("wafer-only-kimi-k2")
    data = sc.model_dump()
    data["pools"][0]["pp"] = 12
    small = type(sc).model_validate(data)
    with pytest.raises(CompareError) as e:
        check_scenario(small)
    msg = str(e.value)
    assert "wafer-only-kimi-k2" in msg and "pp=12" in msg and "at least" in msg


def test_unpriced_device_under_iso_cost():
    sc = load_scenario("gpu-only-kimi-k2")
    dev = sc.model_dump()
    dev["cost"] = {"basis": "rental"}
    dev["name"] = "gpu-rental"
    # MI455X has neither a rental price nor (after this override) a capex figure.
    dev["cost"]["capex_usd"] = {}
    import rack.measure.energy as energy

    saved = energy.DEFAULT_CAPEX_USD.pop("mi455x")
    try:
        with pytest.raises(CompareError, match=r"\[cost\]\.capex_usd\.mi455x"):
            prepare([load_scenario("helios-cs3-kimi-k2"), type(sc).model_validate(dev)], "cost")
    finally:
        energy.DEFAULT_CAPEX_USD["mi455x"] = saved


def test_compare_cli_json_and_folder(cli, tmp_path):
    out = tmp_path / "cmp"
    r = cli(["compare", "--window", "0:8", "--out", str(out), "--json", "--stage", "gateway=2"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    names = [s["name"] for s in doc["scenarios"]]
    assert names == list(DEFAULT_SCENARIOS)
    run_keys = {"requests", "latency", "throughput", "goodput", "kv_transfer", "memory", "utilization",
                "emulation", "provenance"}
    for s in doc["scenarios"]:
        assert run_keys <= set(s)
        assert s["energy"]["joules"] > 0 and s["energy"]["tokens_per_joule"] > 0
        assert s["cost"]["usd_per_mtok"] > 0
        assert s["requests"]["submitted"] == doc["scenarios"][0]["requests"]["submitted"]
        assert s["breakdown"]["stages"][0]["stage"] == "gateway"
    vc = doc["vendor_claim"]
    assert vc["split"] == "helios-cs3-kimi-k2" and vc["wafer_only"] == "wafer-only-kimi-k2"
    tpj = {s["name"]: s["energy"]["tokens_per_joule"] for s in doc["scenarios"]}
    assert vc["ratio"] == pytest.approx(tpj["helios-cs3-kimi-k2"] / tpj["wafer-only-kimi-k2"])
    report = (out / "report.md").read_text()
    assert f"{vc['ratio']:.2f}x" in report and "Assumptions behind the measured ratio" in report
    for png in ("latency_cdf", "stage_breakdown", "memory", "link_utilisation"):
        assert (out / "plots" / f"{png}.png").stat().st_size > 1000
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    trace = json.loads((out / "timelines.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2, 3, 4}    # request tracks
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    # engine and link counter tracks: gpu-only 4 instances, wafer-only 1, split 2 + 1 + a link, conditional same
    assert {"helios-cs3-kimi-k2: prefill-0", "helios-cs3-kimi-k2: decode-0",
            "helios-cs3-kimi-k2: gpu-to-wafer"} <= procs and len(procs) == 4 + 4 + 1 + 4 + 4
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {"waiting", "running", "KV occupancy (%)", "prefix-cache hits (blocks)", "utilisation (%)"} <= counters
    for name in names:
        assert (out / name / "timeseries.csv").stat().st_size > 100
        assert (out / "plots" / f"timeseries-{name}.png").stat().st_size > 1000
    assert json.loads((out / "compare.json").read_text())["scenarios"][0]["name"] == names[0]
    assert (out / "helios-cs3-kimi-k2" / "results.json").exists()


def test_compare_cli_table_and_errors(cli, tmp_path):
    r = cli(["compare", "helios-cs3-kimi-k2", "wafer-only-kimi-k2", "--window", "0:4", "--iso", "count",
             "--no-plots", "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "tokens / J" in r.output and "iso-count scaling" in r.output and "wafer 1->2" in r.output
    assert "tokens/J, helios-cs3-kimi-k2 vs wafer-only-kimi-k2" in r.output
    r = cli(["compare", "no-such-scenario", "--window", "0:4", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "unknown scenario" in r.output
    assert "arrivals:" not in r.output          # refused before the trace is read
    r = cli(["compare", "--iso", "watts", "--window", "0:4", "--out", str(tmp_path / "e")])
    assert r.exit_code == 2 and "--iso" in r.output
    assert "arrivals:" not in r.output and not (tmp_path / "e").exists()    # nothing read, nothing made


def test_compare_warns_when_deployments_serve_different_models():
    from rack.experiments.compare import model_warning

    kimi = [load_scenario("helios-cs3-kimi-k2"), load_scenario("gpu-only-kimi-k2")]
    assert model_warning(kimi) is None
    w = model_warning(kimi + [load_scenario("a100-llama2-70b")])
    assert w is not None and "a100-llama2-70b: Llama-2-70B (bf16 weights)" in w and "different models" in w


def test_a_deployment_keeps_its_colour_in_every_plot():
    from rack.measure.plots import palette

    p = palette(["a", "b", "c"])
    assert len(set(p.values())) == 3 and p == palette(["a", "b", "c", "a"])
