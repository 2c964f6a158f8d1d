"""Uncertain terms (devices.uncertainty): documented ranges, the scenario's `[terms]`,
and `--term` reaching the cost model, the links, the energy model and `rack estimate`."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from devices.catalog import get_device
from devices.uncertainty import (apply_terms, check_terms, parse_term, uncertain_term, uncertain_terms,
                                 wafer_prefill_rate)
import rack.cli
from rack.cli.app import app
from rack.wiring.scenario import ScenarioError, parse_scenario
from rack.wiring.load import load_scenario
from rack.wiring.sizing import cost_model

rack.cli._register_commands()
runner = CliRunner()


def test_every_term_is_documented_with_its_nominal_inside_its_range():
    keys = [t.key for t in uncertain_terms()]
    assert len(keys) == len(set(keys)) >= 8
    for t in uncertain_terms():
        target, _, param = t.key.partition(".")
        assert target and param and t.label and t.doc
        assert t.low <= t.nominal <= t.high, t.key
        assert t.sources and all(isinstance(s, str) and s for s in t.sources)
        assert t.scale in ("linear", "log")
        if t.scale == "log":
            assert t.low > 0


def test_nominal_is_what_the_catalog_runs():
    cs3 = get_device("cs3")
    assert uncertain_term("cs3.prefill_efficiency").nominal == cs3.efficiency.prefill_compute
    assert uncertain_term("cs3.idle_power_fraction").nominal == pytest.approx(cs3.idle_w / cs3.peak_w)
    assert uncertain_term("mi455x.tdp_w").nominal == get_device("mi455x").peak_w
    assert uncertain_term("link.bandwidth_GBps").nominal == load_scenario("helios-cs3-kimi-k2").links[0].bandwidth_GBps


def test_unknown_key_names_the_known_ones():
    with pytest.raises(ValueError, match="known: .*cs3.prefill_efficiency"):
        uncertain_term("cs3.prefil_efficiency")
    with pytest.raises(ValueError, match="fraction"):
        check_terms({"cs3.prefill_efficiency": 1.5})
    with pytest.raises(ValueError, match="finite"):
        check_terms({"cs3.prefill_efficiency": math.nan})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_term("cs3.prefill_efficiency")
    with pytest.raises(ValueError, match="not a number"):
        parse_term("cs3.prefill_efficiency=abc")
    assert parse_term(" cs3.prefill_efficiency = 0.3") == ("cs3.prefill_efficiency", 0.3)


def test_terms_apply_to_their_device_and_its_stacks_only():
    terms = {"cs3.prefill_efficiency": 0.3, "mi455x.tdp_w": 2000.0}
    wafer = apply_terms(get_device("cs3", "2024q4"), terms)
    assert wafer.efficiency.prefill_compute == 0.3
    assert wafer.layer_latency_s == get_device("cs3", "2024q4").layer_latency_s      # the rest kept
    gpu = apply_terms(get_device("mi455x"), terms)
    assert gpu.peak_w == 2000.0 and gpu.efficiency == get_device("mi455x").efficiency
    h100 = get_device("h100")
    assert apply_terms(h100, terms) is h100


def test_power_terms_keep_the_idle_share_or_take_it_of_the_busy_power_given():
    base = get_device("cs3")
    one = apply_terms(base, {"cs3.busy_power_w": 20000.0})
    assert one.idle_w / one.peak_w == pytest.approx(base.idle_w / base.peak_w)
    both = apply_terms(base, {"cs3.idle_power_fraction": 0.8, "cs3.busy_power_w": 20000.0})
    assert (both.peak_w, both.idle_w) == (20000.0, pytest.approx(16000.0))


def test_dense_peak_scales_every_dtype():
    dev = apply_terms(get_device("cs3"), {"cs3.dense_peak_pflops": 20.0})
    assert dev.dense_peak_flops("bf16") == pytest.approx(20e15)


def test_scenario_terms_reach_the_pools_cost_model_and_links():
    from rack.wiring.topology import build_topology

    sc = load_scenario("helios-cs3-kimi-k2")
    slow = sc.with_overrides(terms={"cs3.prefill_efficiency": 0.2, "cs3.prompt_token_layer_us": 100.0,
                                    "link.bandwidth_GBps": 1000.0})
    assert cost_model(slow, slow.pool("decode")).device.efficiency.prefill_compute == 0.2
    assert cost_model(slow, slow.pool("prefill")).device == cost_model(sc, sc.pool("prefill")).device
    specs = build_topology(slow, [0])
    links = [l for s in specs for l in s.kwargs.get("links", [])]
    assert links and all(l.bandwidth_GBps == 1000.0 for l in links)
    assert wafer_prefill_rate(slow, 8192) < wafer_prefill_rate(sc, 8192)


def test_scenario_terms_errors_name_the_field():
    data = load_scenario("helios-cs3-kimi-k2").model_dump()
    with pytest.raises(ScenarioError, match=r"terms.*known: "):
        parse_scenario({**data, "terms": {"cs3.nope": 1.0}}, "x.toml")
    with pytest.raises(ScenarioError, match=r"x.toml: field terms.*link bounds"):
        parse_scenario({**data, "terms": {"link.bandwidth_GBps": 1e9}}, "x.toml")


def test_scenario_toml_terms_table(tmp_path):
    from rack.scenarios import __file__ as _  # noqa: F401  (the package exists)
    from rack.wiring.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "helios-cs3-kimi-k2.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(text + '\n[terms]\n"cs3.prefill_efficiency" = 0.3\n')
    assert load_scenario(str(path)).terms == {"cs3.prefill_efficiency": 0.3}


def test_wafer_prefill_rate_is_what_estimate_prints():
    from rack.cli.estimate import build_estimate

    sc = load_scenario("helios-cs3-kimi-k2")
    dec = sc.pool("decode")
    est = build_estimate(sc.model, dec.device, dec.pp, None, None, 1, sc.weight_dtype, sc.kv_dtype, 1, 4096,
                         8192, stack=dec.stack)
    assert wafer_prefill_rate(sc, 8192) == pytest.approx(est["prefill"]["single"]["tokens_per_s"])
    with pytest.raises(ValueError, match="no wafer pool"):
        wafer_prefill_rate(load_scenario("gpu-only-kimi-k2"), 1024)


def test_energy_rates_take_the_power_terms():
    from rack.measure.energy import BOUNDARY_W, pool_rates

    sc = load_scenario("helios-cs3-kimi-k2")
    hot = sc.with_overrides(terms={"cs3.busy_power_w": 25000.0})
    dec = {r.pool: r for r in pool_rates(hot)}["decode"]
    assert dec.peak_w == 28 * 25000.0 + 28 * BOUNDARY_W["cs3"]["switch"].nominal   # + its switch ports
    dev = {r.pool: r for r in pool_rates(hot.with_overrides(energy={"boundary": "devices"}))}["decode"]
    assert dev.peak_w == 28 * 25000.0


def test_estimate_term_option():
    args = ["estimate", "-m", "kimi-k2", "-d", "cs3", "-n", "28", "-p", "8192", "--json"]
    base = json.loads(runner.invoke(app, args).stdout)
    r = runner.invoke(app, args + ["--term", "cs3.prompt_token_layer_us=100"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["prefill"]["single"]["time_s"] > base["prefill"]["single"]["time_s"]
    bad = runner.invoke(app, args + ["--term", "cs3.nope=1"])
    assert bad.exit_code == 2 and "unknown uncertain term" in bad.output


@pytest.mark.parametrize("command", ["run", "compare"])
def test_run_and_compare_refuse_a_bad_term_in_one_line(command):
    r = runner.invoke(app, [command, "--runtime", "virtual", "--term", "cs3.prefill_efficiency=0"])
    assert r.exit_code == 2 and "fraction" in r.output
