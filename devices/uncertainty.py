"""Uncertain terms: the cost and energy model's figures nobody has measured well, each a
documented range with its sources, and a scenario setting (`[terms]`) a study can sweep.

A term's key is "<device-or-component>.<parameter>": "cs3.prefill_efficiency" sets the
prefill efficiency of every CS-3 entry (the hardware `cs3` and its stack variants,
whose keys start with "cs3-"), "mi455x.tdp_w" the MI455X's busy power, and
"link.bandwidth_GBps" the bandwidth of every KV link of a scenario. `nominal` is the
value the shipped catalog and scenarios use (read from them, so the two never
disagree); `low`..`high` is the plausible range the sources allow.

How a term reaches the runs: the scenario's `terms` are applied to each pool's device
spec where the pool's cost model is built (`pool_cost_model`, which every runtime and
the energy model use) and to its links; `rack estimate --term KEY=VALUE` applies them
to the device it prices (`apply_terms`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .specs import HardwareSpec


@dataclass(frozen=True)
class UncertainTerm:
    """One uncertain figure of the model.

    key: "<device-or-component>.<parameter>", e.g. "cs3.prefill_efficiency";
    label: for tables and plots; unit: "" for a fraction;
    low / nominal / high: the documented range and the value the shipped catalog and
        scenarios use (low <= nominal <= high);
    sources: where the range comes from; scale: "linear" or "log" (how a sweep spaces
        its values); doc: one line, what it means physically and why the range.
    """

    key: str
    label: str
    unit: str
    low: float
    nominal: float
    high: float
    sources: tuple[str, ...]
    scale: str = "linear"
    doc: str = ""

    @property
    def target(self) -> str:
        """What the term applies to: a device's catalog key prefix, or "link"."""
        return self.key.split(".", 1)[0]


@dataclass(frozen=True)
class _Rule:
    """How a term reads its nominal value and sets it: `get(spec)` and `put(spec, value)
    -> {field: new value}` on a device spec; `valid(value)` the physical limits (None:
    valid) beyond which a value is refused, wider than the documented range."""

    get: Callable[[HardwareSpec], float]
    put: Callable[[HardwareSpec, float], dict]
    valid: Callable[[float], str | None]


def _fraction(v: float) -> str | None:
    return None if 0.0 < v <= 1.0 else "a fraction in (0, 1]"


def _positive(v: float) -> str | None:
    return None if v > 0.0 else "a positive number"


def _dense_bf16(spec: HardwareSpec) -> float:
    return spec.dense_peak_flops("bf16")


def _set_dense_peak(spec: HardwareSpec, pflops: float) -> dict:
    # every dtype's peak scales with the 16-bit one (the same PEs, wider SIMD)
    scale = pflops * 1e15 / _dense_bf16(spec)
    return {"peak_flops": {dt: f * scale for dt, f in spec.peak_flops.items()}}


def _set_efficiency(field: str) -> Callable[[HardwareSpec, float], dict]:
    return lambda spec, v: {"efficiency": {**spec.efficiency.model_dump(), field: v}}


def _set_busy_power(spec: HardwareSpec, watts: float) -> dict:
    # the idle share is what was measured (xPU-athalon: ~80 % of TDP): keep it
    return {"peak_w": watts, "idle_w": watts * spec.idle_w / spec.peak_w}


#: Software terms a borrowed stack carries (scaled together by a `stack_time_factor`).
_LATENCY_FIELDS = ("layer_latency_s", "moe_layer_latency_s", "prefill_layer_latency_s",
                   "iteration_overhead_s", "request_latency_s", "disagg_request_latency_s")
_EFFICIENCY_FIELDS = ("prefill_compute", "prefill_memory", "decode_compute", "decode_memory")


def _set_stack_factor(spec: HardwareSpec, f: float) -> dict:
    # time x f: fixed latencies x f, roofline efficiencies / f (at most 1: a factor
    # below an efficiency's headroom no longer speeds that term up)
    eff = spec.efficiency.model_dump()
    for k in _EFFICIENCY_FIELDS:
        eff[k] = min(1.0, eff[k] / f)
    return {"efficiency": eff, **{k: getattr(spec, k) * f for k in _LATENCY_FIELDS}}


_RULES: dict[str, _Rule] = {
    "dense_peak_pflops": _Rule(lambda s: _dense_bf16(s) / 1e15, _set_dense_peak, _positive),
    "prefill_efficiency": _Rule(lambda s: s.efficiency.prefill_compute, _set_efficiency("prefill_compute"),
                                _fraction),
    "prompt_token_layer_us": _Rule(lambda s: s.prompt_token_layer_s * 1e6,
                                   lambda s, v: {"prompt_token_layer_s": v * 1e-6}, _positive),
    "prompt_streams": _Rule(lambda s: float(s.prompt_streams) if s.prompt_streams else math.inf,
                            lambda s, v: {"prompt_streams": max(1, int(round(v)))},
                            lambda v: None if v >= 1.0 else "a number of streams >= 1"),
    "idle_power_fraction": _Rule(lambda s: s.idle_w / s.peak_w, lambda s, v: {"idle_w": v * s.peak_w},
                                 lambda v: None if 0.0 <= v <= 1.0 else "a fraction in [0, 1]"),
    "busy_power_w": _Rule(lambda s: s.peak_w, _set_busy_power, _positive),
    "tdp_w": _Rule(lambda s: s.peak_w, _set_busy_power, _positive),
    "memory_bandwidth_TBps": _Rule(lambda s: s.memory_bandwidth_Bps / 1e12,
                                   lambda s, v: {"memory_bandwidth_Bps": v * 1e12}, _positive),
    "stack_time_factor": _Rule(lambda s: 1.0, _set_stack_factor, _positive),
}

#: Documented ranges. Each: (key, label, unit, low, high, sources, scale, doc); the
#: nominal is read from the catalog device `<target>` (or the default scenario's link).
_RANGES: tuple[tuple, ...] = (
    ("cs3.dense_peak_pflops", "CS-3 dense 16-bit peak", "PFLOP/s", 15.6, 62.5,
     ("cerebras.ai/chip: '125 petaflops of peak AI performance'; listed as sparse FP16 (yobitel knowledge base)",
      "Tom's Hardware WSE-3 launch: unstructured-sparsity acceleration up to 8x (125 / 8 = 15.6)",
      "Hot Chips 2024 WSE-3 slides: FP16 SIMD 8-wide per PE; 900,000 PEs x 8 x 2 FLOP x ~1.1 GHz = 15.8 PFLOP/s",
      "high end: the earlier reading, dense = half of 125 (2:1 sparse)"),
     "log", "dense FP16 FLOP/s of one wafer at prompt GEMMs: the vendor's 125 PFLOP/s is a sparse figure"),
    ("cs3.prefill_efficiency", "CS-3 prefill efficiency", "", 0.2, 0.8,
     ("no public wafer GEMM-efficiency figure; sustained FP8 GEMM on GB200 ~55 % of peak (hardware.md)",
      "one request's prompt is bound by its stream through the layers (~0.4 % MFU for Kimi-K2 on 28 CS-3); "
      "many prompts in flight at once are bound by this share of the dense peak (`rack estimate` on a wafer "
      "prints both rates and their MFU)"),
     "linear", "share of the dense peak the wafer's prompt arithmetic sustains with many prompts in flight"),
    ("cs3.prompt_streams", "CS-3 prompt streams per layer region", "", 1.0, 512.0,
     ("no public figure: the wafer prompt rows measure one request at a time (devices/wafer_prompt.py)",
      "low end: one stream, the prompts of several requests queue behind one another (a pipeline's prompt "
      "rate is one request's, ~24k tokens/s)",
      "high end and nominal: as many as the requests an instance runs (the scenarios' max_num_seqs 512): "
      "the regions' arithmetic at the prefill efficiency binds, as for decode micro-batches (DESIGN.md: a "
      "pipeline of W stages keeps W micro-batches in flight)"),
     "log", "prompts of different requests a layer region interleaves: with the prefill efficiency, the "
     "range from one request's stream to the compute roofline"),
    ("cs3.prompt_token_layer_us", "CS-3 prompt token time per layer region", "us", 23.0, 150.0,
     ("fitted (41 us) on the wafer prompt rows of `rack validate`: Cerebras API example, 12 prompt tokens of "
      "Llama-3.1-8B in 1.07 ms (Aug 2024); WaferEngine on a real CS-3, 768 tokens of Qwen3-1.7B at 24.7k tok/s",
      "low end: the late-2024 kernels cut decode's per-layer latency 17.3 -> 9.8 us (x0.57); the same cut here",
      "high end: SemiAnalysis's Cerebras calculator assumes context processing 5-20x faster than decode "
      "(tokenomics.info/cerebras); 5x for Kimi-K2 on 28 CS-3 at an 8k prompt"),
     "log", "time a prompt token holds one layer's PE region as a prompt streams through the wafer's layers: "
     "sets the per-request prefill rate (~1 / this)"),
    ("cs3.idle_power_fraction", "CS-3 idle power / TDP", "", 0.65, 0.9,
     ("xPU-athalon (arXiv 2604.10852): a CS-3 idles at ~80 % of TDP",
      "low end: 15 of 23 kW, the lower end of the per-system power quoted (hardware.md)"),
     "linear", "power an idle CS-3 draws as a share of its busy draw"),
    ("cs3.busy_power_w", "CS-3 busy power", "W", 20000.0, 25000.0,
     ("~23 kW per CS-3 system (Hot Chips 2024 summary; TEAS, Edinburgh, rates the system at 23 kW)",
      "xPU-athalon (arXiv 2604.10852): ~100 % of TDP in both prefill and decode"),
     "linear", "power a CS-3 draws when serving (prefill or decode)"),
    ("mi455x.memory_bandwidth_TBps", "MI455X HBM4 bandwidth", "TB/s", 19.6, 23.3,
     ("AMD MI450 announcement: 19.6 TB/s (2025)", "AMD slide in a sell-side note: 'up to 23.3 TB/s' (2026)"),
     "linear", "HBM bandwidth of one MI455X: the 2025 and 2026 announcements differ"),
    ("link.bandwidth_GBps", "KV link bandwidth", "GB/s", 190.0, 4200.0,
     ("Mooncake transfer engine: 8 x 400 Gb/s RoCE reaches ~190 GB/s",
      "28 CS-3 x 12 x 100 GbE = 28 x 150 GB/s = 4.2 TB/s of wafer-side I/O (hardware.md)",
      "nominal: the shipped split scenarios' 400 GB/s link"),
     "log", "capacity of the GPU-to-wafer KV link (every link of the scenario)"),
)


def _rule(key: str) -> _Rule:
    return _RULES[key.split(".", 1)[1]]


def term_value(key: str, device: HardwareSpec) -> float | None:
    """The value term `key` ("<target>.<name>") has on `device` as catalogued (what the
    term replaces when a study varies it); None where the spec does not set it."""
    return _rule(key).get(device)


def _nominal(key: str) -> float:
    target = key.split(".", 1)[0]
    if target == "link":
        return 400.0          # the shipped split scenarios' KV link (rack/scenarios/helios-cs3-kimi-k2.toml)
    from .catalog import get_device

    return float(_rule(key).get(get_device(target)))


@functools.lru_cache(maxsize=1)
def uncertain_terms() -> tuple[UncertainTerm, ...]:
    """Every documented uncertain term, nominal values read from the catalog."""
    return tuple(UncertainTerm(key=k, label=lab, unit=u, low=lo, nominal=_nominal(k), high=hi, sources=src,
                               scale=sc, doc=doc)
                 for k, lab, u, lo, hi, src, sc, doc in (*_RANGES, *_measured_ranges()))


#: The MI455X's documented TDP range (W): not published; 2,000-2,500 W estimated for
#: MI450-class boards (hardware.md); MI355X: 1,400 W.
MI455X_TDP_RANGE_W = (2000.0, 2500.0)


def _measured_ranges() -> tuple[tuple, ...]:
    """The MI455X's terms whose ranges come from measurement (devices.lodo): its busy
    and idle board power from the fractions of TDP fitted for SGLang on MI355X (rows
    with measured board power) over its documented TDP range, the idle fraction's range
    from leave-one-row-out refits; its borrowed stack's time factor from the
    leave-one-device-out table of the measured rows."""
    from .lodo import borrowed_stack_uncertainty, power_fractions, power_fraction_range

    pf = power_fractions("mi355x-sglang")
    lo_i, hi_i = power_fraction_range("mi355x-sglang")
    lodo = borrowed_stack_uncertainty("mi455x")
    f = lodo["factor"]
    lo_w, hi_w = MI455X_TDP_RANGE_W
    return (
        ("mi455x.tdp_w", "MI455X busy power", "W", pf["busy"] * lo_w, pf["busy"] * hi_w,
         (f"SGLang on MI355X draws {pf['busy']:.0%} of its {pf['tdp_w']:.0f} W TDP at full load (fitted on the "
          "InferenceX rows with measured board power: scripts/fit_gpu_stacks.py)",
          f"MI455X TDP not published; {lo_w:.0f}-{hi_w:.0f} W estimated for MI450-class boards (hardware.md)"),
         "linear", "board power of one MI455X at full load (the fitted MI355X fraction x its TDP range)"),
        ("mi455x.idle_power_fraction", "MI455X idle power / busy power", "", lo_i, hi_i,
         (f"SGLang on MI355X: idle {pf['idle']:.0%} and busy {pf['busy']:.0%} of TDP, fitted on the rows with "
          "measured board power; range: the fits leaving out one row at a time (devices.lodo)",),
         "linear", "power an idle MI455X draws as a share of its busy draw"),
        ("mi455x.stack_time_factor", "MI455X borrowed-stack time factor", "x", 1 / f, f,
         ("MI455X runs SGLang's terms fitted on MI355X (mi455x-sglang.toml): no measured row",
          f"leave-one-device-out validation of borrowed stacks on the measured rows (devices/lodo.py, "
          f"{lodo['source']}): median |error| {lodo['median_abs_error']['tpot_s']:.1%} on TPOT, "
          f"{lodo['median_abs_error']['throughput_per_gpu']:.1%} on throughput per GPU over {lodo['devices']} "
          f"devices and {lodo['rows']} rows: / {f:.3g} to x {f:.3g}"),
         "log", "step time of the borrowed software stack relative to the terms it borrows"),
    )


def uncertain_term(key: str) -> UncertainTerm:
    """The term called `key`.

    Raises:
        ValueError: unknown key, naming the known keys.
    """
    for t in uncertain_terms():
        if t.key == key:
            return t
    raise ValueError(f"unknown uncertain term {key!r} (known: {', '.join(t.key for t in uncertain_terms())})")


def check_terms(terms: Mapping[str, Any]) -> dict[str, float]:
    """`terms` ({key: value}) checked: known keys, finite values within each term's
    physical limits. Returns them as floats.

    Raises:
        ValueError: an unknown key (naming the known ones) or a bad value (naming the
            key and what is expected).
    """
    out = {}
    for key, value in terms.items():
        uncertain_term(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"term {key!r}: expected a finite number, got {value!r}")
        why = _RULES[key.split(".", 1)[1]].valid(float(value)) if not key.startswith("link.") else \
            (None if value > 0 else "a positive number")
        if why is not None:
            raise ValueError(f"term {key!r}: expected {why}, got {value!r}")
        out[key] = float(value)
    return out


def parse_term(text: str) -> tuple[str, float]:
    """"KEY=VALUE" (the `--term` option) as (key, value), checked as `check_terms` does.

    Raises:
        ValueError: no "=", a value that is not a number, or as `check_terms`.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--term {text!r}: expected KEY=VALUE, e.g. cs3.prefill_efficiency=0.3")
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"--term {text!r}: {value.strip()!r} is not a number") from None
    return key, check_terms({key: v})[key]


def applies_to(target: str, device: HardwareSpec) -> bool:
    """Whether a term whose target is `target` (e.g. "cs3") sets `device`: its catalog
    key is the target or starts with "<target>-"."""
    key = device.key.lower()
    return key == target or key.startswith(target + "-")


def apply_terms(device: HardwareSpec, terms: Mapping[str, float]) -> HardwareSpec:
    """`device` with the terms that name it (its key is the term's target or starts with
    "<target>-") set; the same spec when none applies. Power terms are applied after the
    others so an idle fraction is taken of the busy power given beside it.

    Raises:
        ValueError: as `check_terms`; pydantic.ValidationError: a value the spec refuses.
    """
    mine = [(k, v) for k, v in check_terms(terms).items() if not k.startswith("link.")
            and applies_to(k.split(".", 1)[0], device)]
    if not mine:
        return device
    mine.sort(key=lambda kv: kv[0].endswith("idle_power_fraction"))
    spec = device
    for key, value in mine:
        data = spec.model_dump()
        data.update(_rule(key).put(spec, value))
        spec = HardwareSpec.model_validate(data)
    return spec


def link_bandwidth_GBps(terms: Mapping[str, float], bandwidth_GBps: float) -> float:
    """A KV link's bandwidth under `terms`: "link.bandwidth_GBps" if set, else its own."""
    return float(terms.get("link.bandwidth_GBps", bandwidth_GBps))


def pool_cost_model(scenario, pool):
    """The `CostModel` of one instance of `pool` of `scenario` (its model, device and
    stack with the scenario's `terms` applied, TP/PP/EP, dtypes, speculative decoding).

    Raises:
        ValueError / KeyError / devices.CatalogError: a bad device, model or split.
    """
    from .borrow import resolve_stack
    from .catalog import resolve_model
    from .costmodel import CostModel, Parallelism, SpeculativeConfig

    spec = None
    if pool.speculative is not None:
        s = pool.speculative
        spec = SpeculativeConfig(draft_tokens=s.draft_tokens, acceptance_rate=s.acceptance_rate,
                                 method=s.method, draft_model=s.draft_model)
    device = apply_terms(resolve_stack(pool.device, pool.stack), getattr(scenario, "terms", {}) or {})
    return CostModel(resolve_model(scenario.model), device,
                     Parallelism(tp=pool.tp, pp=pool.pp, ep=pool.ep, dp_attention=pool.dp_attention,
                                 two_batch_overlap=getattr(pool, "two_batch_overlap", False)),
                     weight_dtype=scenario.weight_dtype, kv_dtype=scenario.kv_dtype, speculative=spec)


def wafer_prefill_rate(scenario, prompt_tokens: int) -> float:
    """Per-request prefill rate (prompt tokens/s) of one `prompt_tokens`-token prompt,
    nothing cached, alone on one instance of the scenario's wafer pool (the first pool
    whose device is a wafer, decode side first), with the scenario's terms: the figure
    `rack estimate` prints as "prefill 1 x N".

    Raises:
        ValueError: prompt_tokens < 1, or the scenario has no wafer pool.
    """
    from .borrow import resolve_stack

    if int(prompt_tokens) < 1:
        raise ValueError(f"wafer_prefill_rate: prompt_tokens must be >= 1, got {prompt_tokens!r}")
    pools = sorted(scenario.pools, key=lambda p: p.role == "prefill")
    for pool in pools:
        if resolve_stack(pool.device, pool.stack).kind == "wafer":
            cost = pool_cost_model(scenario, pool)
            return int(prompt_tokens) / cost.prefill([int(prompt_tokens)], [0]).time_s
    raise ValueError(f"scenario {scenario.name!r} has no wafer pool (pools: "
                     f"{', '.join(f'{p.name} ({p.device})' for p in scenario.pools)})")


__all__ = ["UncertainTerm", "apply_terms", "check_terms", "link_bandwidth_GBps", "parse_term",
           "pool_cost_model", "uncertain_term", "uncertain_terms", "wafer_prefill_rate"]
