"""Fit each GPU software stack's parameters on the measured serving rows it ran.

One parameter set per (device, stack) catalog entry, no per-model or per-row factor:
the per-MoE-layer latency, the per-iteration overhead, the per-layer latency of prompt
passes, the front end's per-request latency, the decode memory efficiency and the prefill compute efficiency (`HardwareSpec`
documents each; the decode-attention padding was fitted too and went to 0 on every
stack: these 1k-8k-token contexts show no attention cost beyond their KV bytes). The objective is the sum of
robust (soft-L1) log errors of the closed-loop estimate (devices.serving_rows, each row
deployed with how its benchmark launched it: devices.harness) against median
TPOT, median TTFT (weight 1/2: `WEIGHTS`) and
total tokens/s per GPU, on gpu-calibration.csv, the saturated-prefill rows and the
InferenceX DeepSeek-R1 rows (devices/catalog/inferencex/measured_rows.csv). Then the
board power of each stack with rows that measured it (`fit_power`) and the
leave-one-device-out table (devices/lodo.py, written to devices/catalog/lodo.toml). Stacks with fewer than MIN_ROWS rows fit only the two
latency terms and take the rest from a sibling stack (`SIBLINGS`).

The MLPerf entries (mi300x-vllm, b300-trtllm) fit one compute efficiency on their
throughput rows (devices/catalog/calibration.toml, steady-state batching).

    python scripts/fit_gpu_stacks.py            # print fitted values and errors
    python scripts/fit_gpu_stacks.py --write    # also write them into the catalog files
    python scripts/fit_gpu_stacks.py --only h200-sglang --start decode_memory=0.8
                                                # start the search inside the bounds
    python scripts/fit_gpu_stacks.py --only h200-sglang --probe decode_memory=0.8,0.92
                                                # which rows hold a term where it is

Nelder-Mead in the log of each parameter (numpy only), bounded by clipping.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devices.borrow import FIT_SIBLINGS, forget_cached, resolve_stack  # noqa: E402
from devices.catalog import CATALOG_DIR, _raw_entries, get_device  # noqa: E402
from devices.serving_rows import closed_loop_estimate, deployment, load_serving_rows, measured  # noqa: E402
from devices.inferencex import load_inferencex_rows  # noqa: E402
from devices.lodo import hardware_tdp_w, leave_one_device_out, write_lodo  # noqa: E402
from devices.validation import load_rows, predict  # noqa: E402

ROWS = CATALOG_DIR / "gpu-calibration.csv"
#: Saturated-prefill rows (disaggregated, high concurrency; InferenceX, sources per row):
#: they measure the prefill pool's pass time under load, which low-concurrency TTFTs,
#: mostly fixed overhead, cannot separate from the front end's per-request latency.
SATURATED = CATALOG_DIR / "saturated-prefill.csv"
#: (parameter, lower, upper): latencies in s, efficiencies as fractions, padding in tokens.
#: decode_memory at most 0.92: HBM reached 92 % of peak in a microbenchmark (hardware.md);
#: at least 0.45: the weight reads of decode-shaped FP8 GEMMs (M = 64-128 tokens) reach
#: 45-80 % of HBM peak in DeepGEMM's published kernel table (H800, 3.35 TB/s: 1.51 TB/s
#: for M 128 x N 2112 x K 7168, DeepSeek's fused q/kv down-projection, up to 2.67 TB/s;
#: deepseek-ai/DeepGEMM README, Performance), the best open kernels of these models.
#: Bounds keep each term physical: a CUDA/HIP-graph MoE layer's extra kernels take 5-300 us,
#: a scheduler iteration 0.1-5 ms of CPU, an eager prompt layer at most 1 ms, the front
#: end (HTTP, tokenising, streaming) 1-300 ms of a request's TTFT, a disaggregated
#: deployment's routing and prefill-to-decode handoff 1 ms-0.5 s more (a router hop and a
#: KV-transfer handshake at least; at most the 0.3-0.5 s its one-user TTFTs measure: a
#: lone request's whole TTFT bounds any fixed cost of it. With the saturated TTFTs in
#: the fit a 1 s bound let b200-trtllm reach 0.65 s and miss its one-user row, 0238,
#: by +149 %: the rows between low load and saturation wait in bursts the closed form's
#: open queue does not hold, and a fixed latency is not that wait); kernels
#: reach 45-92 % of HBM bandwidth and 1-80 % of dense peak (the low end: B300 SGLang
#: 0.5.10 as InferenceX launches it, JIT DeepGEMM off, measures ~1.6 %: see b300-sglang.toml).
#: The per-MoE-layer latency is not fitted: on rows of one model (DeepSeek, 58 MoE
#: layers) it adds to every step exactly as the per-iteration overhead does, so the
#: rows cannot tell them apart; the fit sets it to 0 (`HELD`) and the overhead carries
#: the sum.
HELD = {"moe_layer_latency_s": 0.0}
PARAMS = (("iteration_overhead_s", 1e-4, 5e-3),
          ("prefill_layer_latency_s", 1e-5, 1e-3), ("request_latency_s", 1e-3, 0.3),
          ("disagg_request_latency_s", 1e-3, 0.5),
          ("decode_memory", 0.45, 0.92), ("prefill_compute", 0.01, 0.8), ("decode_compute", 0.01, 0.8),
          ("fp4_compute", 0.01, 0.8), ("prefill_attention_compute", 0.01, 0.8),
          ("kv_profile_overhead_gb", 1.0, 30.0))
#: Fitted only where the entry declares it (a stack whose FP4 weights run another kernel
#: path than its FP8 ones: `Efficiency.fp4_compute`; a TensorRT-LLM stack whose KV cache
#: is sized after a profiling forward: `kv_profile_overhead_gb`, which its rows measure
#: where the cache caps the running requests); elsewhere FP4 rows take the entry's
#: prefill/decode compute efficiencies and the activation reserve sizes the cache.
#: kv_profile_overhead_gb in GB per GPU: at least the CUDA context and communication
#: buffers (~1 GB), at most a sixth of a 180 GB B200 (the profiling forward of an 8.5k-token
#: batch, its workspaces and CUDA-graph pools).
PER_ENTRY = ("fp4_compute", "prefill_attention_compute", "kv_profile_overhead_gb")
LATENCY_ONLY = ("iteration_overhead_s", "prefill_layer_latency_s", "request_latency_s", "disagg_request_latency_s")
MIN_ROWS = 5
#: Models whose InferenceX rows the stacks are fitted on (the catalog has their
#: architecture; the others are named by `rack validate --rows`).
FIT_MODELS = ("DeepSeek-R1-0528",)
#: Rows whose measured power the source itself flags as implausible (README, notes):
#: MI355X ATOM FP8 1k/1k at 512 users reports 257 W per GPU, under the other rows' idle.
POWER_EXCLUDED = ("ixapp-fix-0077",)
#: A board's mean draw over a run stays within its power limit (TDP); the fit may reach
#: it, not pass it by more than the sampling noise of nvidia-smi / amd-smi (~5 %).
POWER_CEILING = 1.05
#: Why a fitted term at a bound is not a result (printed beside it).
BOUND_NOTES = {   # (parameter, "low" | "high") -> why the fit sits there
    ("prefill_layer_latency_s", "high"): "the rows' prompt passes take longer than their FLOPs at the fitted "
                                         "efficiency and a 1 ms eager layer allow: a cost per prompt the model "
                                         "lacks, not a longer layer, and not the prefill worker's KV send (~6 ms "
                                         "an 8k prompt at link rate) (b200-sglang: its disaggregated prefill "
                                         "workers' rows 0194, 0225-0227, 0430, 0432 and FP4 row 0023; "
                                         "gb200-trtllm: its one-worker TP4 8k rows 0347, 0351, 0352; "
                                         "gb200-sglang: its P48/D24 rows of another build; --probe names them; "
                                         "docs/devices.md, terms at a bound)",
    ("prefill_layer_latency_s", "low"): "no fixed latency per prompt layer is left beyond the roofline",
    ("decode_memory", "high"): "HBM reached 92 % of peak in a microbenchmark (hardware.md): decode at the ceiling, "
                               "held there by small-batch steps (gb200-sglang: C40, 0041, 0050, against its "
                               "P48/D24 rows; b300-sglang: FP4 rows 0444, 0445) that may read fewer experts than "
                               "uniform top-k routing's upper bound; no public per-expert load of DeepSeek-R1 "
                               "prices that (docs/devices.md, terms at a bound)",
    ("decode_memory", "low"): "the rows' decode steps take longer than the slowest published decode-shaped "
                              "GEMM (45 % of HBM) allows: costs the roofline does not hold (or rows of one "
                              "stack that disagree)",
    ("request_latency_s", "high"): "the front end's share of TTFT is at the end of its plausible range: waits "
                                   "the closed form does not hold (h200-trtllm: 0098, 0019, 0090, S02, 0407 "
                                   "ask for more, 0100, S03, S04, 0089 for less)",
}
#: stack entry -> the entry whose other parameters it takes when it has few rows
SIBLINGS = FIT_SIBLINGS   # the same SGLang 0.5.x kernels (devices.borrow: LODO keeps them apart)
#: TTFT weighs 1/2: at saturation it holds queueing beyond what the closed loop models
#: (admission and prefill capacity, Little's law), which would otherwise pull the front
#: end's latency up and spoil the low-load rows (weight 1 did: gpu-calibration's TTFT
#: median went from 14 % to 34 %). The saturated rows' TTFTs (8k prompts, >= 64 users: the
#: wait for prefill capacity) are fitted with the rest since the closed loop prices the
#: run the benchmark measures (`devices.serving_rows.benchmark_run`, as the engine replay
#: of its client does); before, a steady state matched to the run's diluted throughput put
#: that wait where the rows do not, and they were left out.
WEIGHTS = {"tpot_s": 1.0, "ttft_s": 0.5, "throughput_per_gpu": 1.0, "input_per_prefill_gpu": 1.0}


EFFICIENCIES = ("decode_memory", "prefill_compute", "decode_compute", "fp4_compute", "prefill_attention_compute")


def with_params(dev, values: dict):
    """`dev` with the fitted values (prefill and decode compute efficiencies apart: a
    prompt pass's GEMMs are large, a decode step's are a batch of rows; MLPerf fits set
    both from one value, `fit_mlperf`)."""
    eff = {k: v for k, v in values.items() if k in EFFICIENCIES}
    if "prefill_compute" in eff and "decode_compute" not in values:
        eff["decode_compute"] = eff["prefill_compute"]
    top = {k: v for k, v in values.items() if k not in EFFICIENCIES}
    return dev.model_copy(update={**top, "efficiency": dev.efficiency.model_copy(update=eff)})


def _term(dev, p: str):
    """The entry's value of parameter `p` (a HardwareSpec field or an efficiency)."""
    return getattr(dev, p) if hasattr(dev, p) else getattr(dev.efficiency, p)


def loss(dev, deps_rows) -> float:
    """The fit's objective: the sum of the rows' `row_loss`."""
    return sum(row_loss(dev, dep, row)[0] for dep, row in deps_rows)


def _robust(e: float, scale: float = 0.2) -> float:
    """Soft-L1 (pseudo-Huber) of a log error: quadratic within ~20 %, linear beyond, so
    a few rows the formula cannot reach (queueing the benchmark saw) do not pull the
    parameters away from the rest."""
    return 2 * scale ** 2 * (math.sqrt(1 + (e / scale) ** 2) - 1)


def nelder_mead(f, x0: np.ndarray, steps: int = 150, scale: float = 0.5) -> np.ndarray:
    n = x0.size
    pts = [x0] + [x0 + scale * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(steps):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = np.mean(pts[:-1], axis=0)
        refl = centre + (centre - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centre + 2 * (centre - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centre + 0.5 * (pts[-1] - centre)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def fit_stack(key: str, deps_rows, names: tuple[str, ...], base, start_at: dict | None = None) -> dict:
    """The values of parameters `names` that minimise `loss` on the entry's rows, from
    the catalog's values (`base`) or `start_at`'s (Nelder-Mead in the logs, each clipped
    to its PARAMS bounds: a search that starts on a bound tends to stay there, so a
    refit of a term at its bound starts it inside)."""
    bounds = {p: (lo, hi) for p, lo, hi in PARAMS}

    def values(x):
        return {p: float(np.clip(math.exp(v), *bounds[p])) for p, v in zip(names, x)}

    def start(p):
        v = (start_at or {}).get(p, _term(base, p))
        return math.log(min(max(v, bounds[p][0]), bounds[p][1]))

    x = nelder_mead(lambda x: loss(with_params(base, values(x)), deps_rows), np.array([start(p) for p in names]))
    return values(x)


def row_loss(dev, dep, row) -> tuple[float, dict]:
    """One row's share of `loss` and its signed relative errors by metric."""
    est, meas = closed_loop_estimate(dep, device=dev, iterations=30), measured(row)
    errors = {k: est[k] / meas[k] - 1 for k in WEIGHTS if k in meas}
    return sum(WEIGHTS[k] * _robust(math.log1p(e)) for k, e in errors.items()), errors


def probe(key: str, deps_rows, param: str, probed: list[float], min_change: float = 0.002) -> list[dict]:
    """What holds a term where it is: the entry's loss with `param` at each value of
    `probed`, every other term as the catalog has it, and the rows whose share of the
    loss moves by more than `min_change` from the catalog's value (largest first).

    Returns one dict per probed value: {"value", "loss", "catalog_loss", "rows": [{"id",
    "change", "errors_at_catalog", "errors_at_value"}]} (errors signed, est / meas - 1).
    Raises SystemExit naming the parameter when the entry has no such term."""
    base = get_device(key)
    try:
        _term(base, param)
    except AttributeError:
        raise SystemExit(f"--probe: {key} has no parameter {param!r}") from None
    at_catalog = [row_loss(base, dep, row) for dep, row in deps_rows]
    out = []
    for v in probed:
        dev = with_params(base, {param: v})
        moved, total = [], 0.0
        for (dep, row), (l0, e0) in zip(deps_rows, at_catalog):
            l1, e1 = row_loss(dev, dep, row)
            total += l1               # (the objective, `loss`, without pricing every row again)
            if abs(l1 - l0) > min_change:
                moved.append({"id": row.id, "change": l1 - l0, "errors_at_catalog": e0, "errors_at_value": e1})
        moved.sort(key=lambda r: -abs(r["change"]))
        out.append({"value": v, "loss": total, "catalog_loss": sum(l for l, _ in at_catalog), "rows": moved})
    return out


def _assignments(text: str, flag: str) -> dict[str, float]:
    """{"name": value} from "name=value,name=value" (the --start flag)."""
    out = {}
    for part in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = part.partition("=")
        if name not in {p for p, _, _ in PARAMS} or not value:
            raise SystemExit(f"{flag}: expected name=value with a name of {[p for p, _, _ in PARAMS]}, got {part!r}")
        out[name] = float(value)
    return out


def reload_catalog() -> None:
    """Forget the catalog files read so far (a sibling fitted later reads the values
    just written)."""
    _raw_entries.cache_clear()
    get_device.cache_clear()
    forget_cached()       # the resolved stacks too (the power fit's loads read them)


def write_values(key: str, values: dict) -> None:
    path = CATALOG_DIR / "devices" / f"{key}.toml"
    text = path.read_text()
    for p, v in values.items():
        name = "decode_memory" if p == "decode_memory" else p
        fmt = f"{v:.3g}" if "latency" in p or "overhead" in p else (f"{v:.0f}.0" if p.endswith("tokens") else f"{v:.3f}")
        text, n = re.subn(rf"^({name}\s*=\s*)\S+(\s*#)", rf"\g<1>{fmt}\2", text, flags=re.M)
        if p == "prefill_compute" and "decode_compute" not in values:
            text = re.sub(r"^(decode_compute\s*=\s*)\S+(\s*#)", rf"\g<1>{fmt}\2", text, flags=re.M)
        if n != 1:
            raise SystemExit(f"{path}: no single '{name} = ... #' line to write")
    path.write_text(text)


def fit_power(rows, only: str | None, write: bool) -> None:
    """Idle and busy board power per (device, stack) entry from the rows that measured
    mean GPU-board power: P = idle_w + (peak_w - idle_w) x u, u the closed loop's load
    (`devices.serving_rows._power`), by least squares (linear in idle_w, peak_w).
    Bounds: idle_w >= 0 and peak_w <= POWER_CEILING x the hardware's TDP (`peak_w` of
    its hardware entry: a board does not draw more than its power limit for long)."""
    groups: dict[str, list] = {}
    fitted: dict[str, dict] = {}
    for m in rows:
        dep = deployment(m.row)
        spec = resolve_stack(dep.device, dep.stack)
        if not spec.borrowed_from:
            groups.setdefault(spec.key, []).append((m, dep, spec))
    for key, items in groups.items():
        if only and key not in only.split(","):
            continue
        if len(items) < 3:
            print(f"{key}: {len(items)} rows with power: too few to fit idle and busy power")
            continue
        u = np.array([closed_loop_estimate(dep)["load"] for _, dep, _ in items])
        w = np.array([m.power_w_per_gpu for m, _, _ in items])
        tdp = hardware_tdp_w(key)

        def fit(sel):
            a = np.vstack([1 - u[sel], u[sel]]).T           # P = idle (1 - u) + peak u
            i, p = np.linalg.lstsq(a, w[sel], rcond=None)[0]
            return max(0.0, float(i)), min(float(p), POWER_CEILING * tdp)

        idle, peak = fit(np.ones(len(u), bool))
        # the idle share's spread over the fits leaving out one row at a time
        ratios = [i / p for i, p in (fit(np.arange(len(u)) != j) for j in range(len(u)))]
        fitted[key] = {"idle_fraction_low": min(ratios), "idle_fraction_high": max(ratios), "rows": len(u)}
        print(f"{key}: power fitted on {len(items)} rows: idle_w = {idle:.0f} W, peak_w = {peak:.0f} W "
              f"(TDP {tdp:.0f} W; load u {u.min():.2f}-{u.max():.2f})")
        for (m, _, _), ui in zip(items, u):
            pred = idle + (peak - idle) * ui
            print(f"   {m.id}  power {pred:.0f} / {m.power_w_per_gpu:.0f} W {pred / m.power_w_per_gpu - 1:+.0%}")
        if write:
            write_power(key, idle, peak, len(items))
            reload_catalog()
    return fitted


def write_power(key: str, idle: float, peak: float, n: int) -> None:
    """Write idle_w / peak_w into the stack entry (replacing or adding the lines)."""
    path = CATALOG_DIR / "devices" / f"{key}.toml"
    text = path.read_text()
    note = f"# fitted on {n} rows with measured board power (scripts/fit_gpu_stacks.py)"
    for name, v in (("idle_w", idle), ("peak_w", peak)):
        line = f"{name} = {v:.0f}"
        text, k = re.subn(rf"^{name}\s*=.*$", f"{line}   {note}", text, flags=re.M)
        if k == 0:
            text = re.sub(r"\n*^(\[stack\])", f"\n{line}   {note}\n\n\\1", text, count=1, flags=re.M)
    path.write_text(text)


def write_mi455x_power() -> None:
    """The MI455X's idle and busy board power (mi455x.toml): SGLang on MI355X's fitted
    fractions of its TDP times the middle of the MI455X's documented TDP range
    (devices.uncertainty.MI455X_TDP_RANGE_W; the range itself is the study's term)."""
    from devices.lodo import power_fractions
    from devices.uncertainty import MI455X_TDP_RANGE_W

    pf = power_fractions("mi355x-sglang")
    mid = sum(MI455X_TDP_RANGE_W) / 2
    path = CATALOG_DIR / "devices" / "mi455x.toml"
    text = path.read_text()
    for name, frac in (("idle_w", pf["idle"]), ("peak_w", pf["busy"])):
        text, n = re.subn(rf"^{name}\s*=.*$", f"{name} = {frac * mid:.0f}   # [C] SGLang on MI355X's fitted "
                          f"{frac:.1%} of TDP x {mid:.0f} W (middle of the documented {MI455X_TDP_RANGE_W[0]:.0f}-"
                          f"{MI455X_TDP_RANGE_W[1]:.0f} W; scripts/fit_gpu_stacks.py)", text, flags=re.M)
        if n != 1:
            raise SystemExit(f"{path}: no single '{name} = ...' line to write")
    path.write_text(text)
    reload_catalog()


def mlperf_terms(key: str) -> tuple[str, ...]:
    """The efficiency an MLPerf entry's one fitted value sets: its FP4 kernel path's
    where the entry has one (its own or the stack it takes its terms from: b300-trtllm's
    NVFP4 MLPerf rows run that path and measure nothing else), else its prefill and
    decode compute."""
    return ("fp4_compute",) if get_device(key).efficiency.fp4_compute is not None else ("prefill_compute",)


def fit_mlperf(key: str, rows) -> float:
    """The compute efficiency that centres the entry's MLPerf throughput rows (their
    error is linear in 1 / efficiency: compute-bound), by bisection on the log mean."""
    lo, hi = 0.1, 0.95
    for _ in range(40):
        mid = (lo + hi) / 2
        dev = with_params(get_device(key), {p: mid for p in mlperf_terms(key)})
        err = np.mean([math.log(predict(r, device=dev)[0] / r.published) for r in rows])
        lo, hi = (lo, mid) if err > 0 else (mid, hi)
    return (lo + hi) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the fitted values into the catalog files")
    ap.add_argument("--only", help="fit only these catalog entries (comma-separated, e.g. h200-sglang)")
    ap.add_argument("--power-only", action="store_true", help="fit only the board power and the leave-one-device-"
                    "out table (the stacks' terms and the MLPerf efficiencies as the catalog has them)")
    ap.add_argument("--params", help="fit only these parameters (comma-separated, e.g. fp4_compute), the "
                    "others as the catalog has them")
    ap.add_argument("--rows", help="InferenceX measured rows (measured_rows.csv layout; default: the packaged copy)")
    ap.add_argument("--start", help="start the search from these values instead of the catalog's (e.g. "
                    "decode_memory=0.8,prefill_layer_latency_s=5e-4): a term the catalog has at a bound")
    ap.add_argument("--probe", help="fit nothing: the loss of the --only entries with one term at each of these "
                    "values, the others as the catalog has them, and the rows that move (e.g. "
                    "decode_memory=0.8,0.92)")
    args = ap.parse_args()
    start_at = _assignments(args.start, "--start") if args.start else {}
    if args.probe:
        name, _, values = args.probe.partition("=")
        if not args.only or not values:
            raise SystemExit("--probe needs --only ENTRY and PARAM=V1,V2,...")
        probed = [float(v) for v in values.split(",") if v.strip()]
    groups: dict[str, list] = {}
    held_out = []
    measured_rows = [m for m in load_inferencex_rows(args.rows) if m.row is not None and m.model in FIT_MODELS]
    power_rows = [m for m in measured_rows if m.power_w_per_gpu and m.id not in POWER_EXCLUDED]
    for row in [*load_serving_rows(ROWS), *load_serving_rows(SATURATED), *(m.row for m in measured_rows)]:
        dep = deployment(row)
        spec = resolve_stack(dep.device, dep.stack)
        if spec.borrowed_from:          # a pair running another entry's terms: a check, not a fit
            held_out.append((spec, dep, row))
            continue
        groups.setdefault(spec.key, []).append((dep, row))
    if args.probe:
        for key in args.only.split(","):
            for r in probe(key, groups[key], name, probed):
                print(f"{key}: {name} = {r['value']:g}: loss {r['loss']:.3f} (catalog's value: {r['catalog_loss']:.3f})")
                for m in r["rows"]:
                    print(f"   {m['id']:16s} {m['change']:+.3f}  " + "  ".join(
                        f"{k.split('_')[0]} {m['errors_at_catalog'][k]:+.0%} -> {m['errors_at_value'][k]:+.0%}"
                        for k in m["errors_at_catalog"]))
        return
    order = sorted(groups, key=lambda k: k in SIBLINGS)          # siblings' sources first
    for key in ([] if args.power_only else order):
        if args.only and key not in args.only.split(","):
            continue
        base = get_device(key)
        if key in SIBLINGS:
            sib = get_device(SIBLINGS[key])
            names = LATENCY_ONLY
            copied = {p: _term(sib, p) for p, _, _ in PARAMS if p not in names and p not in PER_ENTRY}
            base = with_params(base, copied)
        else:
            names, copied = tuple(p for p, _, _ in PARAMS), {}
        names = tuple(p for p in names if p not in PER_ENTRY or _term(base, p) is not None)
        if args.params:
            names = tuple(p for p in names if p in args.params.split(","))
        deps_rows = groups[key]
        if not any(row.disaggregated for _, row in deps_rows):     # unmeasured: left at 0
            names = tuple(p for p in names if p != "disagg_request_latency_s")
        held = {} if args.params else HELD       # --params: every other term as the catalog has it
        base = with_params(base, held)
        vals = {**fit_stack(key, deps_rows, names, base, start_at), **held}
        dev = with_params(base, vals)
        print(f"{key}: fitted on {', '.join(r.id for _, r in deps_rows)}")
        for p, v in {**copied, **vals}.items():
            print(f"  {p} = {v:.4g}" + ("  (from " + SIBLINGS[key] + ")" if p in copied else ""))
        for dep, row in deps_rows:
            est, meas = closed_loop_estimate(dep, device=dev), measured(row)
            print("   " + row.id + "  " + "  ".join(f"{k.split('_')[0]} {est[k] / meas[k] - 1:+.0%}"
                                                   for k in WEIGHTS if k in meas))
        for p, lo, hi in PARAMS:
            v = {**copied, **vals}.get(p)
            if p in vals and v is not None and not lo * 1.01 < v < hi / 1.01:
                print(f"  note: {p} = {v:.4g} sits at its bound [{lo:g}, {hi:g}]: "
                      + BOUND_NOTES.get((p, "low" if v <= lo * 1.01 else "high"),
                                        "the rows ask for more than the bound allows"))
        if args.write:
            write_values(key, {**copied, **vals})
            reload_catalog()
    power = fit_power(power_rows, args.only, args.write)
    if args.write and "mi355x-sglang" in power:
        write_mi455x_power()
    lodo = leave_one_device_out([*load_serving_rows(ROWS), *(m.row for m in measured_rows)])
    print(f"leave-one-device-out over {lodo['rows']} rows: median |error| "
          + ", ".join(f"{m} {v:.1%}" for m, v in lodo["median_abs_error"].items()))
    for d in lodo["devices"]:
        print(f"  {d['device']} {d['stack']} borrows {d['borrowed_from']}: {len(d['rows'])} rows, "
              + ", ".join(f"{m} {v:.1%}" for m, v in d["median_abs_error"].items()))
    if args.write and not args.only:
        write_lodo(lodo, "gpu-calibration.csv and the InferenceX DeepSeek-R1 rows (devices/catalog/inferencex)",
                   power)
    mlperf: dict[str, list] = {}
    for r in load_rows():
        if r.kind in ("offline", "server"):
            mlperf.setdefault(get_device(r.device).key, []).append(r)
    for key, rows in mlperf.items():
        if args.power_only or args.params or (args.only and key not in args.only.split(",")):
            continue
        e = fit_mlperf(key, rows)
        print(f"{key}: prefill/decode compute efficiency {e:.3f}, fitted on {len(rows)} MLPerf rows")
        if args.write:
            write_values(key, {p: e for p in mlperf_terms(key)})
            reload_catalog()


if __name__ == "__main__":
    main()
