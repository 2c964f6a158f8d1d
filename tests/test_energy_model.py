"""Energy and cost: integrated power adds up, an idle rack draws idle power only, and
the dollar figures follow from the stated prices."""

from __future__ import annotations

import math

import pytest

from devices.catalog import resolve_device
from rack.wiring.settings import ENERGY_BOUNDARIES, CostSettings, EnergySettings
from rack.measure.energy import (BOUNDARY_PARTS, BOUNDARY_W, DEFAULT_CAPEX_USD, boundary_terms, boundary_watts,
                                 cost_section, device_price, energy_section, pool_rates, with_boundary_term)
from rack.run.runner import run_scenario
from rack.wiring.scenario import Scenario
from rack.wiring.load import load_scenario
from workloads import FixedLengths, PoissonArrivals, Request, synthesize


def toy_split(**extra) -> Scenario:
    """Llama-3.1-8B on H100s: one prefill GPU, one decode GPU, a 50 GB/s KV link."""
    return Scenario.model_validate(dict(
        name="toy-split", model="llama-3.1-8b", weight_dtype="bf16", kv_dtype="bf16",
        pools=[dict(name="prefill", device="h100", role="prefill", instances=1),
               dict(name="decode", device="h100", role="decode", instances=2)],
        links=[dict(name="kv", src="prefill", dst="decode", bandwidth_GBps=50, latency_us=5, per_message_us=10)],
        slo=dict(ttft_ms=1000, tpot_ms=50), **extra))


@pytest.fixture(scope="module")
def split_run():
    reqs = synthesize(PoissonArrivals(4.0), FixedLengths(2048, 64), n=60, seed=3)
    return run_scenario(toy_split(), reqs, runtime="virtual")


def test_energy_adds_up_over_devices(split_run):
    e = split_run.results["energy"]
    T = e["window_s"]
    assert T > 0
    h100 = resolve_device("h100")
    total = 0.0
    for spec in split_run.specs:
        if spec.kind not in ("prefill", "decode"):
            continue
        st = split_run.stats[spec.name]
        n = spec.kwargs["cost"].parallelism.n_devices
        # Integral of P(t) = idle + (peak - idle) * busy(t) over [0, T], device by device.
        # busy: the device's own busy time (its stage's work, without the per-iteration CPU time)
        assert 0 < st["device_busy_s"] <= st["busy_s"]
        per_device = h100.idle_w * T + (h100.peak_w - h100.idle_w) * st["device_busy_s"]
        inst = e["instances"][spec.name]
        assert inst["joules_per_device"] == pytest.approx(per_device, rel=1e-12)
        assert inst["joules"] == pytest.approx(n * per_device, rel=1e-12)
        total += n * per_device
    assert e["devices_joules"] == pytest.approx(total, rel=1e-12)
    assert e["joules"] == pytest.approx(total + e["overhead"]["joules"], rel=1e-12)
    assert sum(p["joules"] for p in e["pools"].values()) == pytest.approx(e["devices_joules"], rel=1e-12)
    assert sum(p["idle_joules"] + p["dynamic_joules"] for p in e["pools"].values()) == \
        pytest.approx(e["devices_joules"])
    # Three instances of one GPU each: idle floor and ceiling, the hosts, NICs and switches on top.
    extra = 3 * sum(boundary_watts(h100, EnergySettings()).values())
    assert extra > 0
    assert e["idle_power_w"] == pytest.approx(3 * h100.idle_w + extra)
    assert e["peak_power_w"] == pytest.approx(3 * h100.peak_w + extra)
    assert e["idle_power_w"] < e["mean_power_w"] < e["peak_power_w"]
    out_tokens = split_run.results["throughput"]["output_tokens"]
    assert e["tokens_per_joule"] == pytest.approx(out_tokens / e["joules"])
    assert e["joules_per_output_token"] == pytest.approx(e["joules"] / out_tokens)
    # The roofline activity never exceeds busy time, so it never costs more energy.
    assert e["idle_power_w"] * T <= e["sensitivity"]["roofline"]["joules"] <= e["sensitivity"]["busy"]["joules"]


def test_boundaries_differ_by_the_hosts_nics_and_switches_exactly():
    """The same run under the devices-only and the system boundary: the joules differ by
    the hosts', NICs' and switch ports' power x the window, per device, and nothing else."""
    reqs = synthesize(PoissonArrivals(4.0), FixedLengths(1024, 32), n=20, seed=1)
    sc = load_scenario("helios-cs3-kimi-k2")
    out = run_scenario(sc, reqs, runtime="virtual")
    T = out.results["energy"]["window_s"]
    out_tok = out.results["throughput"]["output_tokens"]
    full = energy_section(sc, out.specs, out.stats, T, out_tok)
    dev_sc = sc.with_overrides(energy={"boundary": "devices"})
    dev = energy_section(dev_sc, out.specs, out.stats, T, out_tok)
    assert full["boundary"] == "system" and dev["boundary"] == "devices"
    mi, cs3 = resolve_device("mi455x"), resolve_device("cs3")
    # 16 MI455X (2 x TP8) and 28 CS-3, at the documented figures
    gpu_w = sum(BOUNDARY_W["mi455x"][p].nominal for p in BOUNDARY_PARTS)
    wafer_w = sum(BOUNDARY_W["cs3"][p].nominal for p in BOUNDARY_PARTS)
    assert BOUNDARY_W["cs3"]["host"].nominal == 0 and BOUNDARY_W["cs3"]["nic"].nominal == 0   # in its rating
    parts = 16 * gpu_w + 28 * wafer_w
    assert full["joules"] - dev["joules"] == pytest.approx(parts * T, rel=1e-12)
    assert full["overhead"]["joules"] == pytest.approx(parts * T, rel=1e-12)
    assert sum(full["overhead"][f"{p}_joules"] for p in BOUNDARY_PARTS) == pytest.approx(parts * T, rel=1e-12)
    assert dev["joules"] == full["devices_joules"] == dev["devices_joules"]
    assert dev["idle_power_w"] == 16 * mi.idle_w + 28 * cs3.idle_w
    assert full["idle_power_w"] == pytest.approx(dev["idle_power_w"] + parts)
    assert full["boundaries"] == dev["boundaries"]          # both reported whichever is chosen
    assert out.results["energy"]["joules"] == pytest.approx(full["joules"], rel=1e-12)
    # a scenario's own figure for a device replaces the default, part by part
    own = sc.with_overrides(energy={"host_w": {"mi455x": 400.0}})
    e = energy_section(own, out.specs, out.stats, T, out_tok)
    assert e["joules"] - full["joules"] == pytest.approx(16 * (400.0 - BOUNDARY_W["mi455x"]["host"].nominal) * T)


def test_every_shipped_scenario_states_its_energy_boundary():
    import tomllib

    from rack.wiring.scenario import SCENARIO_DIR

    files = sorted(SCENARIO_DIR.glob("*.toml"))
    assert files
    for f in files:
        data = tomllib.loads(f.read_text())
        assert data.get("energy", {}).get("boundary") in ENERGY_BOUNDARIES, f.name


def test_boundary_terms_have_ranges_and_sources():
    terms = {t["key"]: t for t in boundary_terms()}
    assert {"mi455x.host_w", "mi455x.nic_w", "mi455x.switch_w", "cs3.switch_w"} <= set(terms)
    for t in terms.values():
        assert t["low"] <= t["nominal"] <= t["high"] and t["low"] < t["high"] and t["sources"]
    data = with_boundary_term(EnergySettings(), "mi455x.nic_w", 100.0)
    assert EnergySettings.model_validate(data).nic_w == {"mi455x": 100.0}
    with pytest.raises(ValueError, match="part"):
        with_boundary_term(EnergySettings(), "mi455x.fans_w", 1.0)


def test_idle_run_reports_idle_power_only():
    sc = load_scenario("helios-cs3-kimi-k2")
    out = run_scenario(sc, [], runtime="virtual")
    assert out.results["energy"]["joules"] == 0.0          # a run of zero length
    e = energy_section(sc.with_overrides(energy={"boundary": "devices"}), out.specs, out.stats, 100.0,
                       output_tokens=0)
    idle_w = 16 * resolve_device("mi455x").idle_w + 28 * resolve_device("cs3").idle_w
    assert e["idle_power_w"] == idle_w
    assert e["mean_power_w"] == pytest.approx(idle_w, rel=1e-12)
    assert e["joules"] == pytest.approx(idle_w * 100.0, rel=1e-12)
    assert all(p["dynamic_joules"] == pytest.approx(0.0, abs=1e-6) for p in e["pools"].values())
    assert e["tokens_per_joule"] == 0.0 and e["joules_per_output_token"] is None


def test_late_request_leaves_the_rack_idle_until_it_arrives():
    sc = toy_split()
    out = run_scenario(sc, [Request(0, 20.0, 512, 8)], runtime="virtual")
    e = out.results["energy"]
    assert e["window_s"] > 20.0
    busy = sum(i["busy_s"] for i in e["instances"].values())
    h100 = resolve_device("h100")
    # idle_power_w: the devices' idle draw and the hosts, NICs and switches (constant)
    assert e["joules"] == pytest.approx(e["idle_power_w"] * e["window_s"] + (h100.peak_w - h100.idle_w) * busy)
    # one short request (its prefill and 8 decode steps, ~0.1 s with the stack's latencies) in 20 s
    assert busy < 0.2 and e["mean_power_w"] < e["idle_power_w"] * 1.02


def test_negative_window_is_refused(split_run):
    with pytest.raises(ValueError, match="window"):
        energy_section(toy_split(), split_run.specs, split_run.stats, -1.0, 0)


def test_tco_cost_by_hand(split_run):
    sc = toy_split()
    e = split_run.results["energy"]
    c = split_run.results["cost"]
    capex = DEFAULT_CAPEX_USD["h100"][0]
    s = CostSettings()
    per_h = capex / (s.amortisation_years * 8760 * s.utilisation)
    T = e["window_s"]
    usd = 3 * per_h * T / 3600 + e["joules"] / 3.6e6 * s.pue * s.electricity_usd_per_kwh
    assert c["basis"] == "tco"
    assert c["usd"] == pytest.approx(usd, rel=1e-12)
    out_tokens = split_run.results["throughput"]["output_tokens"]
    in_tokens = sum(split_run.columns["prompt_tokens"][split_run.columns["outcome"] == "completed"])
    assert c["usd_per_mtok"] == pytest.approx(usd / out_tokens * 1e6, rel=1e-12)
    assert c["usd_per_mtok_total"] == pytest.approx(usd / (out_tokens + in_tokens) * 1e6, rel=1e-12)
    assert sum(p["usd"] for p in c["pools"].values()) == pytest.approx(usd, rel=1e-12)
    # The same split, rented at $2.50 per H100-hour: power is in the price.
    rented = toy_split(cost=dict(basis="rental", price_per_hour_usd={"h100": 2.5}))
    c2 = cost_section(rented, split_run.specs, e, out_tokens)
    assert c2["usd"] == pytest.approx(3 * 2.5 * T / 3600, rel=1e-12)
    assert c2["electricity_usd"] == 0.0


def test_device_price_sources_and_missing_price():
    s = CostSettings()
    cs3 = device_price(resolve_device("cs3"), s)
    assert cs3.usd_per_hour == pytest.approx(2.5e6 / (5 * 8760)) and "capex" in cs3.source
    # MI300X has a catalog rental price: used under basis "rental".
    mi = device_price(resolve_device("mi300x"), CostSettings(basis="rental"))
    assert mi.basis == "rental" and mi.usd_per_hour == resolve_device("mi300x").price_per_hour_usd
    # A device with neither capex nor rental price: no number, and the fix is named.
    unknown = resolve_device("h100").model_copy(update={"key": "mystery-gpu"})
    p = device_price(unknown, s)
    assert p.usd_per_hour is None and "[cost].capex_usd.mystery-gpu" in p.source


def test_pool_rates_at_peak_power():
    sc = load_scenario("helios-cs3-kimi-k2")
    rates = {r.pool: r for r in pool_rates(sc)}
    cs3 = resolve_device("cs3")
    extra = sum(boundary_watts(cs3, sc.energy).values())
    assert rates["decode"].devices_per_instance == 28 and rates["decode"].peak_w == 28 * (cs3.peak_w + extra)
    s = sc.cost
    per_h = (2.5e6 / (s.amortisation_years * 8760 * s.utilisation)
             + (cs3.peak_w + extra) / 1e3 * s.pue * s.electricity_usd_per_kwh)
    assert rates["decode"].usd_per_hour_at_peak == pytest.approx(28 * per_h)
    assert math.isfinite(rates["prefill"].usd_per_hour_at_peak)


def test_energy_boundary_option_of_rack_run(tmp_path):
    import json

    from typer.testing import CliRunner

    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    args = ["run", "-s", "helios-cs3-kimi-k2", "--runtime", "virtual", "--dataset", "random",
            "--random-input-len", "256", "--random-output-len", "8", "--num-prompts", "4", "--json", "--no-plots"]
    got = {}
    for b in ("devices", "system"):
        res = CliRunner().invoke(app, args + ["--energy-boundary", b, "--out", str(tmp_path / b)])
        assert res.exit_code == 0, res.output
        got[b] = json.loads(res.stdout)["energy"]
        assert got[b]["boundary"] == b
    assert got["system"]["joules"] - got["devices"]["joules"] == pytest.approx(got["system"]["overhead"]["joules"])
    bad = CliRunner().invoke(app, args + ["--energy-boundary", "rack", "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "--energy-boundary" in bad.output
