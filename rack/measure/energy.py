"""Energy and cost of a run: per-device power integrated over the run, tokens per joule,
joules per output token, and dollars per million tokens.

Power model (per device; every device of a pool counts, busy or not, because a
provisioned rack burns idle power):

    P(t) = idle_w + (peak_w - idle_w) * u(t),      u(t) in [0, 1]

the linear utilisation-to-power model of Fan, Weber and Barroso ("Power provisioning
for a warehouse-sized computer", ISCA 2007), used for accelerators by the ML.ENERGY
and Splitwise power studies. Integrated over the run's window [0, T] an instance of
n devices uses

    E = n * (idle_w * T + (peak_w - idle_w) * A),   A = integral of u(t) dt (s)

where A, the *activity* of one device (the mean over the instance's devices), comes
from the engine's own counters (`devices.engines.common.Utilisation`: device_busy_s,
flops, bytes):

- "busy" (default): u(t) = 1 while the device works, 0 otherwise, so A =
  device_busy_s: the occupancy of the device's pipeline stage
  (`IterationCost.device_busy_s`). On one stage it is the time the instance runs
  iterations less the per-iteration CPU overhead; on a pipeline of pp stages carrying
  m micro-batches each stage works m x (stage time) per step of about
  pp x (stage time) + hops, so with fewer requests than stages most stages idle (a
  wafer pipeline of 28 systems decoding 12 requests keeps each system ~43 % busy).
  This is the meaning of nvidia-smi's "GPU utilisation" (the share of time a kernel
  runs) and an upper estimate: Splitwise (Patel et al., ISCA 2024, Fig. 9) measured
  prompt phases near TDP but token phases below it.
- "roofline": u(t) = achieved share of the *achievable* roofline during busy time,
  A = min(device_busy_s, max(flops / (peak_flops * eff_c), bytes / (bandwidth * eff_m))),
  with the device's sourced efficiency factors (`HardwareSpec.efficiency`; prefill
  factors for the compute side of prefill/both pools, decode factors for the memory
  side of decode/both pools). A lower estimate: a latency-bound wafer moves few bytes
  per second, so it sits near idle power.
Both are computed; `energy.activity` picks the reported one and `energy.sensitivity`
gives the other, so a reader sees the range.

Devices of one instance are charged its mean device activity (the devices of a
tensor-parallel group work in lock step; pipeline stages take turns).
Hosts, NICs, switches and cooling are not counted in joules (vendors' per-device
figures exclude them); the facility overhead (PUE) enters the electricity cost only.

Cost model (`CostSettings`, the scenario's `[cost]` table):
- basis "tco" (default, as operators compute it): per device-hour, capex / (amortisation
  years x 8760 h x utilisation), plus the measured energy x PUE x electricity price;
- basis "rental": the device's hourly price (catalog `price_per_hour_usd`, or the
  scenario's override), which includes power.
Dollars per million output tokens = the run's cost over [0, T] / output tokens x 1e6.
Every default below names its source; a device with no price and no capex gives a
null cost and says which field to set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Optional, Sequence


from rack.wiring.settings import CostSettings, ScenarioError

if TYPE_CHECKING:  # pragma: no cover
    from rack.wiring.scenario import Scenario
    from rack.wiring.topology import ComponentSpec

SECONDS_PER_HOUR = 3600.0
HOURS_PER_YEAR = 8760.0
JOULES_PER_KWH = 3.6e6

#: Purchase price per device, USD, all-in share of the system it sits in
#: (catalog key -> (usd, source)). Estimates [E]: no vendor publishes these.
DEFAULT_CAPEX_USD: dict[str, tuple[float, str]] = {
    "cs3": (2.5e6, "[E] ~$2.5M 'retail' per CS-3 system (Cerebras S-1 era reports; the S-1 implies "
                   "~$1.4M average to its largest customer); a CS-1 was 'a couple million dollars' "
                   "(AnandTech, 2020)"),
    "mi455x": (45e3, "[E] Helios pricing is not published; a GB200 NVL72 rack is reported at ~$3M "
                     "(~$42k per GPU slot incl. CPUs, switches, rack), rounded up for HBM4"),
    "gb200": (45e3, "[E] a GB200 NVL72 rack is reported at ~$3M: ~$42k per GPU slot incl. Grace CPUs, "
                    "switches and rack, rounded up"),
    "gb300": (50e3, "[E] above GB200 (press estimates of ~$3.5-4M per GB300 NVL72 rack)"),
    "mi325x": (20e3, "[E] between MI300X (~$15k) and MI355X (~$30k) (press estimates)"),
    "mi355x": (30e3, "[E] no list price; ~2x an MI300X (~$15k) for 1.5x HBM and ~2x FP8 (press estimates)"),
    "mi300x": (15e3, "[E] ~$10-15k per MI300X reported by analysts (2024)"),
    "h100": (30e3, "[E] $25-40k per H100 (NVIDIA CEO, 2024, CNBC)"),
    "h200": (35e3, "[E] ~$30-40k per H200 (press estimates, 2024)"),
    "b200": (40e3, "[E] $30-40k per Blackwell GPU (NVIDIA CEO, March 2024, CNBC)"),
    "b300": (45e3, "[E] Blackwell Ultra, above B200 (press estimates)"),
    "a100": (10e3, "[E] ~$10k per A100 80GB (secondary market, 2024)"),
}
@dataclass(frozen=True)
class DevicePrice:
    """How one device is priced: `usd_per_hour` of ownership or rental (None when
    unknown), whether electricity is added on top (`plus_energy`), and the source."""

    key: str
    usd_per_hour: Optional[float]
    plus_energy: bool
    basis: str
    source: str


@dataclass(frozen=True)
class PoolRates:
    """Provisioned figures of one instance of a pool (for iso-cost/power/count scaling):
    devices, peak and idle watts, and dollars per hour at peak power (None if unpriced)."""

    pool: str
    device: str
    devices_per_instance: int
    instances: int
    peak_w: float
    idle_w: float
    usd_per_hour_at_peak: Optional[float]


def engine_instances(specs):
    """(spec, device spec, devices per instance) for every engine instance of a topology."""
    for spec in specs:
        if spec.kind in ("prefill", "decode", "both"):
            cost = spec.kwargs["cost"]
            yield spec, cost.device, int(cost.parallelism.n_devices)


def _for_device(mapping: Mapping[str, Any], key: str):
    """mapping[key], else the entry of the hardware a stack variant runs on ("h100" for
    "h100-sglang": prices belong to the hardware), else None."""
    if key in mapping:
        return mapping[key]
    for k in sorted(mapping, key=len, reverse=True):
        if key.startswith(k + "-"):
            return mapping[k]
    return None


def _capex_for(key: str, settings: CostSettings) -> tuple[Optional[float], str]:
    usd = _for_device(settings.capex_usd, key)
    if usd is not None:
        return usd, "scenario [cost].capex_usd"
    return _for_device(DEFAULT_CAPEX_USD, key) or (None, "")


def device_price(device: Any, settings: CostSettings) -> DevicePrice:
    """The price of one device (`HardwareSpec`) under `settings`.

    basis "tco": capex / (amortisation_years x 8760 x utilisation) per hour, energy added
    separately; without a capex figure, the rental price if known. basis "rental": the
    scenario's or the catalog's price_per_hour_usd; without one, the TCO rate if a capex
    is known. Neither: usd_per_hour None, with the source saying what to set.
    """
    key = device.key
    rental = _for_device(settings.price_per_hour_usd, key)
    rental_src = "scenario [cost].price_per_hour_usd"
    if rental is None and device.price_per_hour_usd is not None:
        rental, rental_src = float(device.price_per_hour_usd), "device catalog price_per_hour_usd"
    capex, capex_src = _capex_for(key, settings)
    hours = settings.amortisation_years * HOURS_PER_YEAR * settings.utilisation
    if settings.basis == "rental" and rental is not None:
        return DevicePrice(key, rental, False, "rental", rental_src)
    if capex is not None:
        note = "" if settings.basis == "tco" else " (no rental price known: TCO instead)"
        return DevicePrice(key, capex / hours, True, "tco",
                           f"capex ${capex:,.0f} / ({settings.amortisation_years:g} y x 8760 h x "
                           f"{settings.utilisation:g}); {capex_src}{note}")
    if rental is not None:
        return DevicePrice(key, rental, False, "rental", f"{rental_src} (no capex known: rental instead)")
    return DevicePrice(key, None, False, "none",
                       f"no price for {key!r}: set [cost].capex_usd.{key} or "
                       f"[cost].price_per_hour_usd.{key} in the scenario")


def pool_rates(scenario: "Scenario") -> list[PoolRates]:
    """Per-instance devices, peak/idle watts and $/h at peak power for every pool.

    $/h at peak = devices x (device $/h + peak_w x PUE x electricity price, the latter
    only for TCO-priced devices). Raises ScenarioError for an unknown device.
    """
    from devices.borrow import resolve_stack
    from devices.uncertainty import apply_terms

    settings = scenario.cost
    out = []
    for p in scenario.pools:
        try:
            dev = apply_terms(resolve_stack(p.device, p.stack), scenario.terms)
        except (ValueError, KeyError) as exc:
            raise ScenarioError(f"pool {p.name!r}: {exc}") from None
        n = p.devices_per_instance
        price = device_price(dev, settings)
        usd = None
        if price.usd_per_hour is not None:
            energy_h = (dev.peak_w / 1000.0 * settings.pue * settings.electricity_usd_per_kwh
                        if price.plus_energy else 0.0)
            usd = n * (price.usd_per_hour + energy_h)
        out.append(PoolRates(p.name, dev.key, n, p.instances, n * dev.peak_w, n * dev.idle_w, usd))
    return out


def _activity(st: Mapping[str, Any], device: Any, role: str, window_s: float) -> dict:
    """Both activity measures (s) of one device of an instance from its stats (the
    device's own busy time: `device_busy_s`), clipped to [0, window]."""
    busy = min(max(float(st.get("device_busy_s", st.get("busy_s", 0.0))), 0.0), window_s)
    eff = device.efficiency
    eff_c = eff.decode_compute if role == "decode" else eff.prefill_compute
    eff_m = eff.prefill_memory if role == "prefill" else eff.decode_memory
    pf, bw = float(st.get("peak_flops", 0.0)), float(st.get("memory_bandwidth", 0.0))
    c = float(st.get("flops", 0.0)) / (pf * eff_c) if pf > 0 else 0.0
    m = float(st.get("bytes", 0.0)) / (bw * eff_m) if bw > 0 else 0.0
    return {"busy": busy, "roofline": min(busy, max(c, m))}


def energy_section(scenario: "Scenario", specs: Sequence["ComponentSpec"], stats: Mapping[str, dict],
                   window_s: float, output_tokens: int, input_tokens: int = 0) -> dict:
    """The `energy` section of results.json.

    specs/stats: the run's topology and component stats (engines: busy_s, flops, bytes,
    peak_flops, memory_bandwidth; an engine missing from `stats` counts as idle).
    window_s: the integration window [0, window_s] (s, >= 0): the run's end, its last request event.
    output_tokens / input_tokens: completed requests' tokens.

    Returns {"joules", "host_kv_joules" (loads from host-memory KV tiers, in "joules"),
    "tokens_per_joule" (output tokens / J), "joules_per_output_token",
    "total_tokens_per_joule" ((input + output) / J), "window_s", "mean_power_w",
    "idle_power_w", "peak_power_w", "activity", "pools": {pool: {...}}, "instances":
    {name: {"pool", "device", "devices", "idle_w", "peak_w" (per device), "activity_s",
    "joules", "joules_per_device"}}, "sensitivity": {"busy"|"roofline": {"joules",
    "tokens_per_joule"}}, "assumptions": [str]}. Sums: instances -> pools -> total.
    Raises ValueError for a negative window.
    """
    if not (window_s >= 0 and math.isfinite(window_s)):
        raise ValueError(f"energy window must be a finite number of seconds >= 0, got {window_s!r}")
    mode = scenario.energy.activity
    pools: dict[str, dict] = {}
    instances: dict[str, dict] = {}
    totals = {"busy": 0.0, "roofline": 0.0}
    for spec, dev, n in engine_instances(specs):
        st = stats.get(spec.name, {})
        act = _activity(st, dev, spec.kind, window_s)
        joules = {k: n * (dev.idle_w * window_s + (dev.peak_w - dev.idle_w) * a) for k, a in act.items()}
        for k in totals:
            totals[k] += joules[k]
        instances[spec.name] = {
            "pool": spec.pool, "device": dev.key, "devices": n, "idle_w": dev.idle_w,
            "peak_w": dev.peak_w, "activity_s": act[mode], "busy_s": act["busy"],
            "joules": joules[mode], "joules_per_device": joules[mode] / n,
            "idle_joules": n * dev.idle_w * window_s,
        }
        p = pools.setdefault(spec.pool, {"device": dev.key, "devices": 0, "instances": 0, "joules": 0.0,
                                         "idle_joules": 0.0, "dynamic_joules": 0.0,
                                         "idle_power_w": 0.0, "peak_power_w": 0.0})
        p["devices"] += n
        p["instances"] += 1
        p["joules"] += joules[mode]
        p["idle_joules"] += n * dev.idle_w * window_s
        p["dynamic_joules"] += joules[mode] - n * dev.idle_w * window_s
        p["idle_power_w"] += n * dev.idle_w
        p["peak_power_w"] += n * dev.peak_w
    # loads from a host-memory KV tier (devices.memory.HostKVTier): each byte's DRAM
    # read, host link and device write, on top of the devices' own power
    host_kv = sum(float((stats.get(spec.name, {}).get("host_kv") or {}).get("joules", 0.0))
                  for spec, _, _ in engine_instances(specs))
    for k in totals:
        totals[k] += host_kv
    for p in pools.values():
        p["mean_power_w"] = p["joules"] / window_s if window_s > 0 else p["idle_power_w"]
    total = totals[mode]

    def per_j(tokens: float, j: float) -> Optional[float]:
        return tokens / j if j > 0 else None

    idle_w = sum(p["idle_power_w"] for p in pools.values())
    return {
        "joules": total,
        "host_kv_joules": host_kv,
        "tokens_per_joule": per_j(output_tokens, total),
        "joules_per_output_token": total / output_tokens if output_tokens else None,
        "total_tokens_per_joule": per_j(output_tokens + input_tokens, total),
        "window_s": window_s,
        "mean_power_w": total / window_s if window_s > 0 else idle_w,
        "idle_power_w": idle_w,
        "peak_power_w": sum(p["peak_power_w"] for p in pools.values()),
        "activity": mode,
        "pools": pools,
        "instances": instances,
        "sensitivity": {k: {"joules": v, "tokens_per_joule": per_j(output_tokens, v)} for k, v in totals.items()},
        "assumptions": [
            "P = idle_w + (peak_w - idle_w) x u per device (linear model, Fan et al. 2007); "
            f"u = {'busy fraction' if mode == 'busy' else 'share of the achievable roofline'} of the instance",
            f"integrated over [0, {window_s:.1f} s] (to the run's last request event) for every provisioned device, idle or not",
            "devices only: hosts, NICs, switches and cooling excluded (PUE enters the electricity cost only), "
            "except the energy of loads from a host-memory KV tier (host_kv_joules, "
            "devices.engines.common.HOST_KV_JOULES_PER_BYTE)",
            "idle_w/peak_w from the device catalog (devices/catalog/devices/*.toml, with sources)",
        ],
    }


def cost_section(scenario: "Scenario", specs: Sequence["ComponentSpec"], energy: Mapping[str, Any],
                 output_tokens: int, input_tokens: int = 0) -> dict:
    """The `cost` section of results.json, from the `energy` section of the same run.

    Returns {"usd" (the run's cost over the energy window), "usd_per_mtok" (per million
    output tokens), "usd_per_mtok_total" (per million input + output tokens),
    "usd_per_hour" (provisioned devices + electricity at the run's mean power),
    "capex_usd_per_hour", "electricity_usd", "basis", "pools": {pool: {"device",
    "devices", "usd_per_device_hour", "price_source", "usd"}}, "assumptions": [str]};
    usd figures are None when a device has no price (the pool's price_source says what
    to set).
    """
    settings = scenario.cost
    window = float(energy["window_s"])
    pools: dict[str, dict] = {}
    priced = True
    device_usd_h = 0.0
    electricity_j = 0.0
    for spec, dev, n in engine_instances(specs):
        price = device_price(dev, settings)
        p = pools.setdefault(spec.pool, {"device": dev.key, "devices": 0,
                                         "usd_per_device_hour": price.usd_per_hour,
                                         "basis": price.basis, "price_source": price.source, "usd": 0.0})
        p["devices"] += n
        inst_j = float(energy["instances"][spec.name]["joules"])
        if price.usd_per_hour is None:
            priced = False
            p["usd"] = None
            continue
        device_usd_h += n * price.usd_per_hour
        inst_usd = n * price.usd_per_hour * window / SECONDS_PER_HOUR
        if price.plus_energy:
            electricity_j += inst_j
            inst_usd += inst_j / JOULES_PER_KWH * settings.pue * settings.electricity_usd_per_kwh
        if p["usd"] is not None:
            p["usd"] += inst_usd
    electricity_usd = electricity_j / JOULES_PER_KWH * settings.pue * settings.electricity_usd_per_kwh
    usd = device_usd_h * window / SECONDS_PER_HOUR + electricity_usd if priced else None
    mean_elec_h = electricity_usd / window * SECONDS_PER_HOUR if window > 0 else 0.0

    def per_mtok(tokens: int) -> Optional[float]:
        return usd / tokens * 1e6 if usd is not None and tokens > 0 else None

    return {
        "usd": usd,
        "usd_per_mtok": per_mtok(output_tokens),
        "usd_per_mtok_total": per_mtok(output_tokens + input_tokens),
        "usd_per_hour": device_usd_h + mean_elec_h if priced else None,
        "capex_usd_per_hour": device_usd_h if priced else None,
        "electricity_usd": electricity_usd if priced else None,
        "basis": settings.basis,
        "pools": pools,
        "assumptions": [
            f"basis {settings.basis}: capex amortised over {settings.amortisation_years:g} years at "
            f"{settings.utilisation:.0%} utilisation, plus measured device energy x PUE {settings.pue:g} x "
            f"${settings.electricity_usd_per_kwh:g}/kWh" if settings.basis == "tco" else
            "basis rental: hourly device prices (power included)",
            f"the run's cost over [0, {window:.1f} s] divided by its completed output tokens",
        ],
    }


__all__ = ["DEFAULT_CAPEX_USD", "DevicePrice", "PoolRates",
           "cost_section", "device_price", "energy_section", "pool_rates"]
