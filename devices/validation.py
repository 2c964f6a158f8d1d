"""The validation table: the cost model's predictions against published figures.

Rows live in `devices/catalog/calibration.toml` (one per row of
`shared/reference/calibration.md`, with the scenario that reproduces it). Three kinds:

- single_stream: one request decoding alone; tokens/s per user =
  tokens_per_step / step time (the wafer rows);
- offline: steady-state continuous batching with as many sequences as the KV cache
  holds (MLPerf Offline);
- server: the same, with the batch capped so that the steady-state TPOT and TTFT meet
  the limits (MLPerf Server);
- prefill_time / prefill_rate / ttft (`PROMPT_KINDS`, the wafer prompt rows): one prompt
  of `prompt_tokens` alone, nothing cached: its time (ms), its rate (tokens/s), or the
  client's TTFT (ms: the stack's front-end `request_latency_s` + the prompt's time).

Steady state (`steady_state`): B sequences, spread evenly over their output, hold
prompt + output/2 tokens of KV on average (contexts prompt + (i + 1/2) output / B).
Each iteration every sequence gains tokens_per_step (tps) tokens, so B x tps / output
sequences finish per iteration and as many new prompts are prefilled in the same
iteration (chunked prefill fused with the decode step, as vLLM and TensorRT-LLM run):
    iteration = cost.mixed(prompts of B x tps / output x prompt tokens, decode of B)
    throughput = B x tps / iteration      TPOT = iteration / tps
    TTFT ~ 2 x iteration (wait for the running iteration, then the prompt's own).
An instance of tp x pp devices is replicated count / (tp x pp) times.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import CATALOG_DIR, CatalogError, resolve_device
from .costmodel import CostModel, Parallelism, SpeculativeConfig
from .planner import plan_memory

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CALIBRATION_FILE = CATALOG_DIR / "calibration.toml"
#: Row kinds: decode per user, steady-state batching, and the wafer prompt rows (one
#: prompt alone: its server-side time in ms, its rate in tokens/s, its client TTFT in ms).
PROMPT_KINDS = ("prefill_time", "prefill_rate", "ttft")
KINDS = ("single_stream", "offline", "server") + PROMPT_KINDS
#: Largest |relative error| of a wafer prompt row (issue 22): their TTFTs hold a front
#: end fitted on two rows of the public service, their lengths are partly assumed.
PROMPT_TOLERANCE = 0.35


@dataclass(frozen=True)
class CalibrationRow:
    """One published figure and the scenario that should reproduce it."""

    name: str
    kind: str                     # single_stream | offline | server
    model: str
    device: str
    count: int
    published: float
    unit: str
    source: str = ""
    tp: int | None = None
    pp: int | None = None
    ep: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    context: int = 1024
    prompt_tokens: float = 1000.0
    output_tokens: float = 300.0
    tpot_limit_s: float | None = None
    ttft_limit_s: float | None = None
    speculative: dict | None = None


@dataclass(frozen=True)
class ValidationRow:
    """A row of the validation table. relative_error = predicted / published - 1."""

    name: str
    predicted: float
    published: float
    unit: str
    relative_error: float
    source: str = ""
    details: dict = field(default_factory=dict)
    kind: str = ""

    @property
    def tolerance(self) -> float | None:
        """This row's own criterion on |relative error| (None: the caller's): the wafer
        prompt rows' is `PROMPT_TOLERANCE`."""
        return PROMPT_TOLERANCE if self.kind in PROMPT_KINDS else None

    def to_dict(self) -> dict:
        return asdict(self)


def load_rows(path: str | Path = CALIBRATION_FILE) -> list[CalibrationRow]:
    """Calibration rows from a TOML file of `[[row]]` tables.

    Raises:
        CatalogError: unreadable file or a row with a missing/unknown field (named).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: cannot read calibration rows: {e}") from None
    rows = []
    known = {f.name for f in fields(CalibrationRow)}
    required = {f.name for f in fields(CalibrationRow) if f.default is MISSING}
    for i, raw in enumerate(data.get("row", []), 1):
        where = f"{path}: row {i} ({raw.get('name', '?')})"
        unknown = sorted(set(raw) - known)
        if unknown:
            raise CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                               f"a row has {', '.join(f.name for f in fields(CalibrationRow))}")
        missing = sorted(required - set(raw))
        if missing:
            raise CatalogError(f"{where}: missing field(s) {', '.join(missing)}")
        rows.append(CalibrationRow(**raw))
        if raw.get("kind") not in KINDS:
            raise CatalogError(f"{path}: row {i}: kind must be one of {', '.join(KINDS)}, "
                               f"got {raw.get('kind')!r}")
    return rows


def default_parallelism(device, count: int, tp: int | None = None, pp: int | None = None,
                        ep: int = 1) -> Parallelism:
    """The parallelism of an instance of `count` devices (tp x pp = count).

    Neither tp nor pp given: GPUs are tensor parallel (tp = count), wafer-scale systems
    pipelined (pp = count). One given: the other is count divided by it.

    Raises:
        ValueError: count < 1, or tp x pp != count.
    """
    dev = resolve_device(device)
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if tp is None and pp is None:
        tp, pp = (1, count) if dev.kind == "wafer" else (count, 1)
    elif tp is None:
        tp = count // pp
    elif pp is None:
        pp = count // tp
    if tp * pp != count:
        raise ValueError(f"tp ({tp}) x pp ({pp}) must equal the device count ({count})")
    return Parallelism(tp=tp, pp=pp, ep=ep)


def cost_for(row: CalibrationRow, device=None) -> CostModel:
    """The cost model of one instance of the row's deployment (rows giving tp/pp run
    count / (tp x pp) replicas of that instance); `device`: a spec to use instead of
    the row's catalog device (fitting)."""
    spec = SpeculativeConfig(**row.speculative) if row.speculative else None
    if row.tp is None and row.pp is None:
        par = default_parallelism(row.device, row.count, ep=row.ep)
    else:
        par = Parallelism(tp=row.tp or 1, pp=row.pp or 1, ep=row.ep)
    return CostModel(row.model, device if device is not None else row.device, par,
                     weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype, speculative=spec)


def single_stream_tokens_per_s(cost: CostModel, context: int) -> float:
    """Decode tokens/s of one request alone at `context` tokens."""
    return cost.tokens_per_step / float(cost.decode_steps(np.array([context]), 1).time_s[0])


def steady_state(cost: CostModel, prompt_tokens: float, output_tokens: float, *,
                 tpot_limit_s: float | None = None, ttft_limit_s: float | None = None,
                 max_batch: int | None = None) -> dict:
    """Steady-state continuous batching of one instance (see the module docstring).

    Returns a dict with batch, throughput_tps (output tokens/s of the instance),
    tpot_s, ttft_s, iteration_s, bound, prompts_per_iteration and kv_batch_limit.
    Raises ModelDoesNotFit when the weights do not fit.
    """
    plan = plan_memory(cost)
    P, O, tps = float(prompt_tokens), float(output_tokens), cost.tokens_per_step
    b_kv = int(plan.kv_tokens // (P + O / 2))
    if max_batch is not None:
        b_kv = min(b_kv, int(max_batch))
    if b_kv < 1:
        raise ValueError(f"{cost!r}: the KV cache holds no sequence of {P + O / 2:.0f} tokens")
    def at(b: int) -> dict:
        ctx = P + (np.arange(b) + 0.5) * O / b
        n_new = b * tps / O                          # prompts admitted per iteration
        whole = int(n_new)
        chunks = np.array([P] * whole + ([P * (n_new - whole)] if n_new > whole else []))
        it = cost.mixed(chunks, np.zeros_like(chunks), ctx)
        return {"batch": b, "throughput_tps": b * tps / it.time_s, "tpot_s": it.time_s / tps,
                "ttft_s": 2 * it.time_s, "iteration_s": it.time_s, "bound": it.bound,
                "prompts_per_iteration": n_new}

    def ok(r: dict) -> bool:
        return ((tpot_limit_s is None or r["tpot_s"] <= tpot_limit_s)
                and (ttft_limit_s is None or r["ttft_s"] <= ttft_limit_s))

    best = at(b_kv)
    if not ok(best):
        lo, hi = 0, b_kv                  # TPOT and TTFT grow with the batch: bisect
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(at(mid)):
                lo = mid
            else:
                hi = mid
        if lo == 0:
            raise ValueError(f"{cost!r}: no batch meets TPOT <= {tpot_limit_s} s and TTFT <= {ttft_limit_s} s")
        best = at(lo)
    best.update(kv_batch_limit=b_kv)
    return best


#: Prompts in flight for a wafer prompt row's pipeline rate when its stack sets no
#: request cap (rack's default max_num_seqs, rack.wiring.sizing).
PIPELINE_PROMPTS = 256


def predict(row: CalibrationRow, device=None) -> tuple[float, dict]:
    """(predicted value, details) for one calibration row (`device`: see `cost_for`)."""
    cost = cost_for(row, device)
    details: dict[str, Any] = {"instance": cost.describe()}
    if row.kind in PROMPT_KINDS:
        n = int(round(row.prompt_tokens))
        one = cost.prefill([n], [0])
        front = cost.device.request_latency_s if row.kind == "ttft" else 0.0
        value = n / one.time_s if row.kind == "prefill_rate" else (front + one.time_s) * 1e3
        details.update(prompt_tokens=n, prefill_s=one.time_s, front_end_s=front, bound=one.bound)
        if cost.device.prompt_token_layer_s > 0:
            # the row measures one request's stream; the pipeline's rate with many
            # prompts in flight (the stack's request cap) is what serving sees
            details["pipeline"] = cost.prompt_throughput(n, cost.max_num_seqs or PIPELINE_PROMPTS)
        return value, details
    if row.kind == "single_stream":
        value = single_stream_tokens_per_s(cost, row.context)
        step = cost.decode_steps(np.array([row.context]), 1)
        details.update(step_s=float(step.time_s[0]), bound=step.bound, context=row.context)
        return value, details
    replicas = row.count // cost.parallelism.n_devices
    if replicas < 1:
        raise CatalogError(f"row {row.name!r}: count {row.count} is smaller than one instance "
                           f"({cost.parallelism.n_devices} devices)")
    limits = {} if row.kind == "offline" else {"tpot_limit_s": row.tpot_limit_s, "ttft_limit_s": row.ttft_limit_s}
    # the stack's scheduler cap bounds the batch as well as the KV cache does
    st = steady_state(cost, row.prompt_tokens, row.output_tokens, max_batch=cost.max_num_seqs, **limits)
    details.update(replicas=replicas, **st)
    return replicas * st["throughput_tps"], details


def validate(rows: list[CalibrationRow] | None = None) -> list[ValidationRow]:
    """The validation table: every calibration row, predicted vs published."""
    out = []
    for row in rows if rows is not None else load_rows():
        value, details = predict(row)
        out.append(ValidationRow(name=row.name, predicted=value, published=row.published, unit=row.unit,
                                 relative_error=value / row.published - 1.0, source=row.source,
                                 details=details, kind=row.kind))
    return out


def solve_wafer_latency(rows: list[CalibrationRow] | None = None) -> dict:
    """Per-layer and per-hop latency of each wafer software stack that reproduce the
    single-stream rows exactly (how the catalog's values were obtained).

    For each stack (device key) the per-token step time is linear in the two terms:
    step = step0 + a x layer_latency + b x hop_latency, with a = target layers (+ k x
    draft layers when speculating) and b = pipeline hops; step0 (roofline, links) is
    measured with both terms at zero. One row fixes layer_latency given hop latency;
    two rows (different hop counts) fix both. Returns {device: {"layer_latency_s",
    "pipeline_hop_latency_s", "rows"}}.
    """
    rows = [r for r in (rows if rows is not None else load_rows()) if r.kind == "single_stream"]
    by_dev: dict[str, list[CalibrationRow]] = {}
    for r in rows:
        by_dev.setdefault(r.device, []).append(r)
    out = {}
    for dev_name, rs in by_dev.items():
        dev = resolve_device(dev_name)
        eqs = []
        for r in rs:
            cost = cost_for(r)
            target = cost.tokens_per_step / r.published         # required step time
            zero = dev.model_copy(update={"layer_latency_s": 0.0, "pipeline_hop_latency_s": 0.0})
            c0 = CostModel(cost.model, zero, cost.parallelism, cost.weight_dtype, cost.kv_dtype, cost.speculative)
            step0 = float(c0.decode_steps(np.array([r.context]), 1).time_s[0])
            k = cost.speculative.draft_tokens if cost.speculative else 0
            a = cost.model.n_layers + (k * cost.draft.n_layers if cost.draft is not None else 0)
            b = cost.parallelism.pp - 1
            eqs.append((a, b, target - step0, r.name))
        if len({e[1] for e in eqs}) >= 2:
            A = np.array([[e[0], e[1]] for e in eqs], float)
            y = np.array([e[2] for e in eqs])
            (lat, hop), *_ = np.linalg.lstsq(A, y, rcond=None)
        else:
            hop = dev.pipeline_hop_latency_s
            lat = float(np.mean([(e[2] - e[1] * hop) / e[0] for e in eqs]))
        out[dev_name] = {"layer_latency_s": float(lat), "pipeline_hop_latency_s": float(hop),
                         "rows": [e[3] for e in eqs]}
    return out


__all__ = [
    "CALIBRATION_FILE", "CalibrationRow", "KINDS", "PROMPT_KINDS", "PROMPT_TOLERANCE", "ValidationRow", "cost_for",
    "default_parallelism", "load_rows", "predict", "single_stream_tokens_per_s", "solve_wafer_latency",
    "steady_state", "validate",
]
