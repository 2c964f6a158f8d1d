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

The energy boundary (`EnergySettings.boundary`, the scenario's `[energy].boundary`):
every deployment counts the same things, so ratios between deployments compare like
with like.
- "system" (default): the accelerators plus, per accelerator, its share of the hosts
  (CPUs, memory, boards, fans, power conversion: `host_w`), of the scale-out NICs and
  their optics (`nic_w`) and of the switches (scale-up and scale-out ports:
  `switch_w`), drawn at a constant power over the whole window (hosts and switches are
  powered whether the accelerator computes or not; how much they vary with load lies
  inside each figure's range). The figures and their sources are `BOUNDARY_W`; a
  CS-3's ~23 kW system rating already includes its own host processors, power
  supplies, cooling and 12 x 100 GbE ports, so only the external switch ports its
  links land on are added. Every figure is an estimate [E] with a documented range:
  `boundary_terms()` lists them as uncertain terms the study sweeps
  (`rack.experiments.study.terms`), and a scenario sets its own with `[energy].host_w`
  etc. by device key.
- "devices": the accelerators' board (GPU) or system (CS-3) power alone, as the
  vendors' per-device figures count it.
results.json's `energy.boundary` says which one `joules` is; `energy.boundaries` gives
both, and `energy.overhead` the hosts', NICs' and switches' parts. Cooling and the
facility (PUE) enter the electricity cost only.

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
#: Parts of the "system" energy boundary, per accelerator (`BOUNDARY_W`).
BOUNDARY_PARTS = ("host", "nic", "switch")


@dataclass(frozen=True)
class BoundaryFigure:
    """Watts one accelerator adds to the "system" boundary for one part (host, nic or
    switch): `nominal` (the default), the documented range `low`..`high`, and sources."""

    low: float
    nominal: float
    high: float
    sources: tuple[str, ...]


#: Per-accelerator watts outside the accelerator, by device catalog key, or for a device
#: without an entry its kind's (`_KIND_FIGURES`); every figure an estimate [E] with its range.
BOUNDARY_W: dict[str, dict[str, BoundaryFigure]] = {
    "gpu": {   # an 8-GPU HGX/OAM-class server and its fabric
        "host": BoundaryFigure(100.0, 175.0, 300.0, (
            "NVIDIA DGX H100 datasheet: 2 x Xeon Platinum 8480C (350 W TDP each) and 2 TB DDR5 for 8 GPUs "
            "(~90 W of CPU TDP and ~40 W of memory per GPU), plus fans and power-supply losses [E]",
            "high end: the DGX H100's 10.2 kW maximum system power less 8 x 700 W GPUs leaves 575 W per GPU "
            "for everything else, NICs and NVSwitches included (datasheet maxima, not a typical draw)")),
        "nic": BoundaryFigure(20.0, 35.0, 60.0, (
            "one 400 Gb/s scale-out NIC per GPU (DGX H100: 8 x ConnectX-7), ~15-25 W per adapter, plus "
            "~8-16 W of optics per port where the links are optical [E]",)),
        "switch": BoundaryFigure(20.0, 50.0, 100.0, (
            "the GPU's share of the scale-up switches on the baseboard (DGX H100: 4 NVSwitch chips per 8 GPUs) "
            "and of a leaf/spine scale-out fabric (a 51.2 Tb/s, 64 x 800 GbE switch draws ~1-2 kW: ~15-30 W per "
            "400 GbE port, two switch tiers) [E]",)),
    },
    "mi455x": {   # AMD Helios: 18 trays of 4 MI455X and one EPYC host CPU each (hardware.md)
        "host": BoundaryFigure(100.0, 150.0, 250.0, (
            "Helios: one EPYC 'Venice' host CPU per 4 GPUs (hardware.md); EPYC 9005 parts run up to 500 W TDP, "
            "plus DDR5 (~10 W per DIMM), the tray's board, pumps and power conversion: ~400-1,000 W per tray of "
            "4 GPUs [E]",
            "cross-check: a GB200/GB300 NVL72 rack draws ~120-140 kW (hardware.md); less 72 GPUs' board power "
            "and 36 Grace CPUs it leaves ~150-400 W per GPU for switches, NICs, fans and conversion [E]")),
        "nic": BoundaryFigure(45.0, 75.0, 150.0, (
            "Helios scale-out: 300 GB/s per GPU = 3 x 800 GbE Pensando Vulcano NICs (hardware.md); ~15-30 W per "
            "800 G NIC plus 0-16 W of optics per port (copper or linear-drive to retimed optics) [E]",)),
        "switch": BoundaryFigure(60.0, 150.0, 300.0, (
            "Helios scale-up: 3.6 TB/s per GPU (260 TB/s per rack) through UALink-over-Ethernet switch trays: "
            "~20 x 102.4 Tb/s switch ASICs per 72 GPUs at ~0.5-1 kW each, ~140-280 W per GPU, plus the GPU's "
            "share of the scale-out leaf (3 x 800 GbE ports at ~15-30 W) [E]",
            "cross-check: the NVL72 residual above (~150-400 W per GPU for switches, NICs, fans)")),
    },
    "cs3": {   # a CS-3: host processors, power, cooling and its 12 x 100 GbE inside its rating
        "host": BoundaryFigure(0.0, 0.0, 0.0, (
            "included in the ~23 kW CS-3 system rating (hardware.md; the catalog's cs3 peak_w is the system's)",)),
        "nic": BoundaryFigure(0.0, 0.0, 0.0, (
            "the CS-3's 12 x 100 GbE I/O is part of the system and its rating (hardware.md)",)),
        "switch": BoundaryFigure(60.0, 120.0, 180.0, (
            "the external switch ports the CS-3's 12 x 100 GbE land on (hardware.md): a 32 x 100 GbE switch "
            "draws ~250-450 W (~8-14 W per port) plus ~3.5 W per QSFP28 optic: 5-15 W per port x 12 [E]",)),
    },
}


#: The entry of `BOUNDARY_W` a device without its own takes, by kind.
_KIND_FIGURES = {"gpu": "gpu", "wafer": "cs3"}


def boundary_watts(device: Any, settings: Any) -> dict[str, float]:
    """{part: watts per accelerator} the "system" boundary adds for `device` (a
    `HardwareSpec`): the scenario's `[energy].<part>_w` entry for the device (or the
    hardware a stack variant runs on), else `BOUNDARY_W` by device key, then by device
    kind (`_KIND_FIGURES`; a kind with no entry adds nothing). Under the "devices" boundary every part
    is 0. settings: `EnergySettings`."""
    if settings.boundary == "devices":
        return {part: 0.0 for part in BOUNDARY_PARTS}
    table = (for_device(BOUNDARY_W, device.key)
             or BOUNDARY_W.get(_KIND_FIGURES.get(getattr(device, "kind", ""), ""), {}))
    out = {}
    for part in BOUNDARY_PARTS:
        own = for_device(getattr(settings, f"{part}_w"), device.key)
        out[part] = float(own) if own is not None else (table[part].nominal if part in table else 0.0)
    return out


def boundary_terms() -> list[dict]:
    """The "system" boundary's figures that have a range, as uncertain terms: [{"key"
    ("<device>.<part>_w", e.g. "mi455x.host_w"), "label", "unit" ("W"), "low",
    "nominal", "high", "sources", "scale", "doc"}], for the study's tornado
    (`rack.experiments.study.terms`). The generic GPU fallback ("gpu") has no term: a
    scenario sets another device's own figure by key."""
    return [_term(key, part, f) for key, parts in BOUNDARY_W.items() if key != "gpu"
            for part, f in parts.items() if f.low < f.high]


_PART_LABEL = {"host": "host share (CPU, memory, board, fans)", "nic": "NICs and optics",
               "switch": "switch ports"}


def _term(device: str, part: str, f: BoundaryFigure) -> dict:
    return {"key": f"{device}.{part}_w", "label": f"{device.upper()} {_PART_LABEL[part]} per device", "unit": "W",
            "low": f.low, "nominal": f.nominal, "high": f.high, "sources": list(f.sources), "scale": "linear",
            "doc": f"power outside the {device.upper()} the 'system' energy boundary counts per device ({part})"}


def boundary_term(key: str) -> Optional[dict]:
    """The boundary term `key` ("<device>.<part>_w"), or None when `key` is not one."""
    return next((t for t in boundary_terms() if t["key"] == key), None)


def with_boundary_term(energy: Any, key: str, value: float) -> dict:
    """The `[energy]` table (as a dict) of `energy` (`EnergySettings`) with boundary
    term `key` = `value` watts per device. Raises ValueError for a key that is not
    "<device>.<part>_w" with part one of host, nic, switch, or a negative value."""
    device, _, field = key.partition(".")
    part = field.removesuffix("_w")
    if not device or part not in BOUNDARY_PARTS or not field.endswith("_w"):
        raise ValueError(f"energy boundary term {key!r}: expected <device>.<part>_w, part one of "
                         f"{', '.join(BOUNDARY_PARTS)}")
    if not value >= 0:
        raise ValueError(f"energy boundary term {key!r}: expected watts >= 0, got {value!r}")
    data = energy.model_dump()
    data[f"{part}_w"] = {**data[f"{part}_w"], device: float(value)}
    return data


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


def for_device(mapping: Mapping[str, Any], key: str):
    """A per-device setting of `mapping` for device `key`: mapping[key], else the entry
    of the hardware a stack variant runs on ("h100" for "h100-sglang": prices and
    power outside the device belong to the hardware), else None."""
    if key in mapping:
        return mapping[key]
    for k in sorted(mapping, key=len, reverse=True):
        if key.startswith(k + "-"):
            return mapping[k]
    return None


def _capex_for(key: str, settings: CostSettings) -> tuple[Optional[float], str]:
    usd = for_device(settings.capex_usd, key)
    if usd is not None:
        return usd, "scenario [cost].capex_usd"
    return for_device(DEFAULT_CAPEX_USD, key) or (None, "")


def device_price(device: Any, settings: CostSettings) -> DevicePrice:
    """The price of one device (`HardwareSpec`) under `settings`.

    basis "tco": capex / (amortisation_years x 8760 x utilisation) per hour, energy added
    separately; without a capex figure, the rental price if known. basis "rental": the
    scenario's or the catalog's price_per_hour_usd; without one, the TCO rate if a capex
    is known. Neither: usd_per_hour None, with the source saying what to set.
    """
    key = device.key
    rental = for_device(settings.price_per_hour_usd, key)
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

    Watts within the scenario's energy boundary (`boundary_watts`: under "system" each
    device's hosts, NICs and switch ports are added). $/h at peak = devices x (device
    $/h + those peak watts x PUE x electricity price, the latter only for TCO-priced
    devices). Raises ScenarioError for an unknown device.
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
        extra = sum(boundary_watts(dev, scenario.energy).values())
        price = device_price(dev, settings)
        usd = None
        if price.usd_per_hour is not None:
            energy_h = ((dev.peak_w + extra) / 1000.0 * settings.pue * settings.electricity_usd_per_kwh
                        if price.plus_energy else 0.0)
            usd = n * (price.usd_per_hour + energy_h)
        out.append(PoolRates(p.name, dev.key, n, p.instances, n * (dev.peak_w + extra), n * (dev.idle_w + extra),
                             usd))
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
    # the "system" boundary's parts at the scenario's figures, whichever boundary it reports
    system = scenario.energy.model_copy(update={"boundary": "system"})
    parts_w = {part: 0.0 for part in BOUNDARY_PARTS}
    per_device_w: dict[str, dict] = {}
    for spec, dev, n in engine_instances(specs):
        st = stats.get(spec.name, {})
        act = _activity(st, dev, spec.kind, window_s)
        joules = {k: n * (dev.idle_w * window_s + (dev.peak_w - dev.idle_w) * a) for k, a in act.items()}
        for k in totals:
            totals[k] += joules[k]
        extra = boundary_watts(dev, system)
        for part, w in extra.items():
            parts_w[part] += n * w
        d = per_device_w.setdefault(dev.key, {"devices": 0, **{f"{p}_w": extra[p] for p in BOUNDARY_PARTS}})
        d["devices"] += n
        instances[spec.name] = {
            "pool": spec.pool, "device": dev.key, "devices": n, "idle_w": dev.idle_w,
            "peak_w": dev.peak_w, "activity_s": act[mode], "busy_s": act["busy"],
            "joules": joules[mode], "joules_per_device": joules[mode] / n,
            "idle_joules": n * dev.idle_w * window_s,
            "overhead_w": n * sum(extra.values()),
        }
        p = pools.setdefault(spec.pool, {"device": dev.key, "devices": 0, "instances": 0, "joules": 0.0,
                                         "idle_joules": 0.0, "dynamic_joules": 0.0,
                                         "idle_power_w": 0.0, "peak_power_w": 0.0, "overhead_w": 0.0})
        p["devices"] += n
        p["instances"] += 1
        p["joules"] += joules[mode]
        p["idle_joules"] += n * dev.idle_w * window_s
        p["dynamic_joules"] += joules[mode] - n * dev.idle_w * window_s
        p["idle_power_w"] += n * dev.idle_w
        p["peak_power_w"] += n * dev.peak_w
        p["overhead_w"] += n * sum(extra.values())
    # loads from a host-memory KV tier (devices.memory.HostKVTier): each byte's DRAM
    # read, host link and device write, on top of the devices' own power
    host_kv = sum(float((stats.get(spec.name, {}).get("host_kv") or {}).get("joules", 0.0))
                  for spec, _, _ in engine_instances(specs))
    for k in totals:
        totals[k] += host_kv
    for p in pools.values():
        p["mean_power_w"] = p["joules"] / window_s if window_s > 0 else p["idle_power_w"]
    devices_j = totals[mode]
    overhead_w = sum(parts_w.values())
    system_j = devices_j + overhead_w * window_s
    boundary = scenario.energy.boundary
    total = system_j if boundary == "system" else devices_j
    counted_w = overhead_w if boundary == "system" else 0.0

    def per_j(tokens: float, j: float) -> Optional[float]:
        return tokens / j if j > 0 else None

    idle_w = sum(p["idle_power_w"] for p in pools.values()) + counted_w
    return {
        "joules": total,
        "host_kv_joules": host_kv,
        "boundary": boundary,
        "devices_joules": devices_j,
        "tokens_per_joule": per_j(output_tokens, total),
        "joules_per_output_token": total / output_tokens if output_tokens else None,
        "total_tokens_per_joule": per_j(output_tokens + input_tokens, total),
        "window_s": window_s,
        "mean_power_w": total / window_s if window_s > 0 else idle_w,
        "idle_power_w": idle_w,
        "peak_power_w": sum(p["peak_power_w"] for p in pools.values()) + counted_w,
        "activity": mode,
        "pools": pools,
        "instances": instances,
        "overhead": {"counted": boundary == "system", "power_w": overhead_w,
                     "joules": overhead_w * window_s,
                     **{f"{part}_joules": w * window_s for part, w in parts_w.items()},
                     "per_device_w": per_device_w},
        "boundaries": {"devices": {"joules": devices_j, "tokens_per_joule": per_j(output_tokens, devices_j)},
                       "system": {"joules": system_j, "tokens_per_joule": per_j(output_tokens, system_j)}},
        "sensitivity": {k: {"joules": v + counted_w * window_s,
                            "tokens_per_joule": per_j(output_tokens, v + counted_w * window_s)}
                        for k, v in totals.items()},
        "assumptions": [
            "P = idle_w + (peak_w - idle_w) x u per device (linear model, Fan et al. 2007); "
            f"u = {'busy fraction' if mode == 'busy' else 'share of the achievable roofline'} of the instance",
            f"integrated over [0, {window_s:.1f} s] (to the run's last request event) for every provisioned device, idle or not",
            ("boundary 'system': devices plus hosts, NICs and switch ports per device at constant power "
             f"({overhead_w:,.0f} W in all; rack.measure.energy.BOUNDARY_W, with sources and ranges); "
             "cooling excluded (PUE enters the electricity cost only)") if boundary == "system" else
            ("boundary 'devices': accelerators only; hosts, NICs, switches and cooling excluded "
             "(PUE enters the electricity cost only)"),
            "loads from a host-memory KV tier counted on top, at either boundary (host_kv_joules, "
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
        inst = energy["instances"][spec.name]
        inst_j = float(inst["joules"])
        if (energy.get("overhead") or {}).get("counted"):     # the system boundary's hosts, NICs, switches
            inst_j += float(inst.get("overhead_w", 0.0)) * window
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
            f"{settings.utilisation:.0%} utilisation, plus the run's energy ({energy.get('boundary', 'devices')} "
            f"boundary) x PUE {settings.pue:g} x "
            f"${settings.electricity_usd_per_kwh:g}/kWh" if settings.basis == "tco" else
            "basis rental: hourly device prices (power included)",
            f"the run's cost over [0, {window:.1f} s] divided by its completed output tokens",
        ],
    }


__all__ = ["BOUNDARY_PARTS", "BOUNDARY_W", "BoundaryFigure", "DEFAULT_CAPEX_USD", "DevicePrice", "PoolRates",
           "boundary_term", "boundary_terms", "boundary_watts", "cost_section", "device_price", "for_device", "energy_section", "pool_rates", "with_boundary_term"]
