"""Roofline cost model: how long a prefill iteration or a decode step takes.

Pure functions of (model, device, parallelism, dtypes, speculative decoding) and the
batch; vectorised with numpy so an engine can price 10^4 decode steps of a batch of
10^3 requests in one call.

Formulas (SI units: FLOP, bytes, seconds). An instance is N = tp x pp devices;
a pipeline stage is tp devices holding n_layers / pp layers.

Work of one forward pass over T tokens (summed over requests):
    FLOPs  = 2 T A + 2 G V h + f_att x (positions attended)         [FLOP]
        A = active linear params per token (attention + dense FFN + shared experts +
            router + k routed experts, see `ModelSpec`), G = tokens that need logits
            (prefill: one per request; decode: every token), V h = LM-head weights,
        f_att = 2 x heads x (d_qk + d_v) per layer per attended position; a prefill
            chunk of n tokens over c cached attends sum_{p=c+1}^{c+n} p positions,
            capped at the window on sliding-window layers.
    weight bytes per pass = (R + L_moe x D(T) x P_e) x b_w                    [bytes]
        R = weights every pass reads (attention, dense FFN, shared experts, router,
            norms, LM head), P_e = one routed expert, b_w = bytes per weight,
        D(T) = E (1 - (1 - k/E)^T) distinct experts touched per MoE layer by T tokens
            (uniform top-k routing; k for one token, -> E for large batches).
    KV bytes = (cached tokens read + new tokens written) x KV bytes per token-layer.

Time of one pass, with m micro-batches: m = min(pp, decode requests) for decode (each
request's next token depends on its last, so a pipeline keeps at most pp micro-batches
in flight), for a prompt chunk the m <= min(pp, prompt tokens) that finishes first
(its tokens stream through the stages; each micro-batch pays the per-layer latencies
and a weight read), m = min(pp, prompt tokens + decode requests) for a mixed pass:
    per stage, per micro-batch:
        t_compute = (F_prefill / e_pc + F_decode / e_dc) / (m pp tp P)
        t_memory  = (W(T/m) / e_m / pp + KV / e_kv / (m pp)) / (tp B)
        t_stage   = max(t_compute, t_memory) + t_comm + (n_layers / pp) x L
            P = dense peak FLOP/s of one device at the compute dtype, B = its memory
            bandwidth, e_* = the device's efficiency factors for the phase,
            t_comm = TP all-reduces (2 per layer: 2 (tp-1)/tp x S / link bandwidth +
            2 ceil(log2 tp) x link latency, S = T/m x hidden x 2 bytes) or, with ep > 1, an
            attention all-reduce plus an expert all-to-all (dispatch + combine) per
            MoE layer; L = device.layer_latency_s (wafer only).
        hop = link latency + pipeline_hop_latency_s + (T/m) x hidden x 2 / link bandwidth
    decode / mixed (steady state, micro-batches interleave across steps):
        time = max(pp x t_stage + (pp - 1) x hop, m x t_stage)
        i.e. a token's latency is the sum of the stage times plus the hops, while the
        slowest stage, busy with all m micro-batches, bounds throughput;
    prefill (one iteration, pipeline filled then drained):
        time = (m + pp - 1) x t_stage + (pp - 1) x hop
    plus device.iteration_overhead_s. Communication is not overlapped with compute.

Speculative decoding (k draft tokens, acceptance rate a): a step drafts k tokens
(k passes of the draft: a draft model on one stage's devices, or an MTP head = one
extra layer + LM head of the target) and verifies k + 1 tokens per request in one
target pass; it yields (1 - a^(k+1)) / (1 - a) tokens per request on average.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from .specs import ACTIVATION_BYTES, DTYPES, HardwareSpec, ModelSpec, dtype_bytes

BOUNDS = ("compute", "memory", "communication", "latency")


@dataclass(frozen=True)
class Parallelism:
    """How an instance's devices share the model.

    tp: tensor-parallel degree (devices splitting each layer, one pipeline stage);
    pp: pipeline stages (on the wafer engine: systems the layers are pipelined over);
    ep: expert-parallel degree: the MoE layers' experts are sharded over ep of a
        stage's tp devices (ep must divide tp); attention stays tensor parallel.
    dp_attention: data-parallel attention (SGLang --enable-dp-attention, TensorRT-LLM
        attention DP): each of the tp devices holds the whole attention block and runs
        it for its own share of the requests (their KV lives on it alone); the FFN/MoE
        layers stay sharded over the tp devices (experts over ep of them).

    Raises:
        ValueError: a degree below 1, not an integer, or ep not dividing tp.
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp_attention: bool = False
    #: two-batch overlap (SGLang --enable-two-batch-overlap; DeepSeek's "dual
    #: micro-batch overlap"): the batch is split in two and one half's expert-parallel
    #: all-to-all runs while the other half computes, so a pass takes max(roofline,
    #: collectives) instead of their sum
    two_batch_overlap: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"Parallelism.{name} must be an integer >= 1, got {v!r}")
        if self.tp % self.ep:
            raise ValueError(f"Parallelism.ep ({self.ep}) must divide tp ({self.tp}): experts are "
                             "sharded within a pipeline stage's tensor-parallel group")

    @property
    def n_devices(self) -> int:
        return self.tp * self.pp

    @classmethod
    def deployed(cls, tp: int = 1, ep: int = 1, dp_attention: bool = False, pp: int = 1,
                 two_batch_overlap: bool = False) -> "Parallelism":
        """The parallelism a serving framework's flags deploy. With data-parallel
        attention the attention block is replicated on every rank of the expert-parallel
        group and the experts are sharded over it (SGLang --tp N --dp N
        --enable-dp-attention --ep N; InferenceX reports such an instance as TP 1, EP N,
        DP attention): a stage spans max(tp, ep) devices. Without it, ep must divide tp.
        The all-to-all runs on the scale-up fabric when the group fits one scale-up
        domain, else on the scale-out network (`HardwareSpec.collective_parts`)."""
        if dp_attention and ep > tp:
            tp = ep
        return cls(tp=tp, pp=pp, ep=ep, dp_attention=bool(dp_attention) and tp > 1,
                   two_batch_overlap=two_batch_overlap)


def _check_split(model: ModelSpec, par: Parallelism) -> None:
    """The model must split as the parallelism says. Every pipeline stage holds at
    least one layer (pp <= layers). Tensor parallelism must split the attention heads
    evenly, as vLLM checks at start (`ModelConfig.verify_with_parallel_config`: heads %
    tp == 0; GQA: KV heads % tp == 0, or tp % KV heads == 0 when the heads are
    replicated); data-parallel attention does not split them. Raises ValueError naming
    the counts."""
    if par.pp > model.n_layers:
        raise ValueError(f"{par.pp} pipeline stages for {model.key}'s {model.n_layers} layers: a stage "
                         "holds at least one layer (use pp <= layers, or fewer systems)")
    tp = par.tp
    if tp <= 1 or par.dp_attention:
        return
    if model.n_heads % tp:
        raise ValueError(f"tensor parallelism {tp} does not divide {model.key}'s {model.n_heads} "
                         "attention heads (vLLM and SGLang refuse it): use a divisor of the heads")
    kv = model.n_kv_heads
    if model.mla is None and (kv % tp if kv >= tp else tp % kv):
        raise ValueError(f"tensor parallelism {tp} cannot split {model.key}'s {kv} KV heads "
                         "(KV heads % tp or tp % KV heads must be 0)")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: `draft_tokens` (k) drafted per step, each accepted with
    probability `acceptance_rate` (a) until the first rejection.

    method "mtp": multi-token-prediction head(s) of the target (one extra layer + the
    LM head per drafted token); "draft_model": a separate small model, `draft_model`
    (catalog name or ModelSpec), run on one pipeline stage's devices.

    Raises:
        ValueError: k < 1, a outside [0, 1), unknown method, or a draft_model method
            without a draft model.
    """

    draft_tokens: int
    acceptance_rate: float
    method: Literal["mtp", "draft_model"] = "mtp"
    draft_model: Optional[object] = None

    def __post_init__(self) -> None:
        k, a = self.draft_tokens, self.acceptance_rate
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"SpeculativeConfig.draft_tokens must be an integer >= 1, got {k!r}")
        if not (0.0 <= float(a) < 1.0):
            raise ValueError(f"SpeculativeConfig.acceptance_rate must be in [0, 1), got {a!r}")
        if self.method not in ("mtp", "draft_model"):
            raise ValueError(f"SpeculativeConfig.method must be 'mtp' or 'draft_model', got {self.method!r}")
        if self.method == "draft_model" and self.draft_model is None:
            raise ValueError("SpeculativeConfig: method 'draft_model' needs draft_model (a catalog name)")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens emitted per verification step: (1 - a^(k+1)) / (1 - a)."""
        a, k = float(self.acceptance_rate), int(self.draft_tokens)
        return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class IterationCost:
    """Cost of one iteration on the whole instance.

    time_s: duration (s); flops: FLOPs done; bytes: bytes moved to/from device memory
    (weights read once per micro-batch pass, KV read and written); comm_s: time spent
    in communication (collectives and pipeline hops, transfer and latency) within
    time_s; bound: the largest term of the critical path: "compute" or "memory" (the
    roofline), "communication" (bytes over links) or "latency" (fixed latencies: per
    layer, per collective step, per pipeline hop, per iteration). compute_s, memory_s,
    comm_bw_s, latency_s: those terms along the critical path (s); busy_s: see
    `device_busy_s`. A step's time splits as roofline_s (max of compute and memory) +
    comm_s (collectives and pipeline hops) + fixed_s (the stack's per-layer, per-MoE-
    layer, per-prompt-layer and per-iteration latencies), exactly for one stage or a
    steady pipeline with m <= pp micro-batches.
    """

    time_s: float
    flops: float
    bytes: float
    comm_s: float
    bound: str
    compute_s: float = 0.0
    memory_s: float = 0.0
    latency_s: float = 0.0
    comm_bw_s: float = 0.0
    tokens: float = 0.0
    busy_s: float | None = None
    fixed_s: float = 0.0

    @property
    def roofline_s(self) -> float:
        """max(compute_s, memory_s): the roofline's share of the critical path."""
        return max(self.compute_s, self.memory_s)

    @property
    def device_busy_s(self) -> float:
        """Seconds each device of the instance works in the iteration: its pipeline
        stage's time for each micro-batch it carries (the whole iteration minus the
        per-iteration CPU overhead on one stage; on pp stages a stage idles while the
        others hold the micro-batches)."""
        return self.time_s if self.busy_s is None else self.busy_s


def _iteration_cost(time_s: float, flops: float, bytes: float, comm_s: float, bound: str, compute_s: float,
                    memory_s: float, latency_s: float, comm_bw_s: float, tokens: float, busy_s: float | None,
                    fixed_s: float) -> IterationCost:
    """`IterationCost(...)` with every field given, without the frozen dataclass's
    `object.__setattr__` per field (~0.5 us a build instead of ~1.6; `CostModel._cost`
    builds one per priced iteration): the same instance dict, fields in the same order,
    so the same object content (equal, hashed and printed alike)."""
    c = object.__new__(IterationCost)
    c.__dict__.update(time_s=time_s, flops=flops, bytes=bytes, comm_s=comm_s, bound=bound, compute_s=compute_s,
                      memory_s=memory_s, latency_s=latency_s, comm_bw_s=comm_bw_s, tokens=tokens,
                      busy_s=busy_s, fixed_s=fixed_s)
    return c


class StepCosts:
    """The next n_steps decode steps of a fixed batch: arrays of shape (n_steps,).

    time_s: duration of each step (s); flops, bytes: work of each step; comm_s:
    communication time within each step; bound: what binds the first step (given as
    a name, or as the four terms of `CostModel._bound_of`, named on first read: an
    engine pricing a run never reads it); tokens_per_step: expected tokens each
    request gains per step.

    `CostModel.decode_steps` may give flops, bytes and comm_s as lines over the steps
    (value at step j = a + b j) instead of arrays: the arrays are then built on first
    access, and `work(n)` sums the first n steps in closed form (an engine reads only
    those sums, for utilisation). `busy(n)`: seconds each device of the instance is
    busy in the first n steps (its pipeline stage working; see `IterationCost.busy_s`),
    from a `busy_s` array or from busy = a x time + b per step (`busy_line`).
    """

    __slots__ = ("time_s", "_bound", "tokens_per_step", "_flops", "_bytes", "_comm", "_lines",
                 "_busy", "_busy_line")

    def __init__(self, time_s: np.ndarray, flops: np.ndarray | None, bytes: np.ndarray | None,
                 comm_s: np.ndarray | None, bound: str | tuple, tokens_per_step: float = 1.0,
                 lines: tuple[float, float, float, float, float] | None = None,
                 busy_s: np.ndarray | None = None, busy_line: tuple[float, float] | None = None) -> None:
        self.time_s = time_s
        self._bound = bound
        self.tokens_per_step = tokens_per_step
        self._flops, self._bytes, self._comm = flops, bytes, comm_s
        self._lines = lines          # (flops a, flops b, bytes a, bytes b, comm) or None
        self._busy, self._busy_line = busy_s, busy_line

    @property
    def bound(self) -> str:
        """What binds the first step: "compute", "memory", "communication" or "latency"."""
        b = self._bound
        if type(b) is tuple:
            b = self._bound = CostModel._bound_of(*b)
        return b

    def busy(self, n: int) -> float:
        """Seconds one device of the instance works during the first n steps (<= their
        duration: a pipeline stage idles while the other stages hold the micro-batches)."""
        # np.add.reduce: the reduction ndarray.sum calls, without its Python wrapper
        # (once per run of steps)
        if self._busy is not None:
            return float(np.add.reduce(self._busy[:n]))
        total = float(np.add.reduce(self.time_s[:n]))
        if self._busy_line is None:
            return total
        a, b = self._busy_line
        return a * total + b * n

    def _line(self, a: float, b: float) -> np.ndarray:
        return a + b * np.arange(self.time_s.shape[0], dtype=float)

    @property
    def flops(self) -> np.ndarray:
        if self._flops is None:
            self._flops = self._line(self._lines[0], self._lines[1])
        return self._flops

    @property
    def bytes(self) -> np.ndarray:
        if self._bytes is None:
            self._bytes = self._line(self._lines[2], self._lines[3])
        return self._bytes

    @property
    def comm_s(self) -> np.ndarray:
        if self._comm is None:
            self._comm = np.full(self.time_s.shape[0], self._lines[4])
        return self._comm

    def work(self, n: int) -> tuple[float, float]:
        """(FLOPs, bytes) of the first n steps (0 <= n <= n_steps)."""
        if self._lines is not None:
            fa, fb, ba, bb, _ = self._lines
            tri = n * (n - 1) / 2
            return n * fa + fb * tri, n * ba + bb * tri
        return float(self.flops[:n].sum()), float(self.bytes[:n].sum())

    @property
    def end_times(self) -> np.ndarray:
        """Cumulative end time of each step from the start of the first (s)."""
        return np.cumsum(self.time_s)

    def __repr__(self) -> str:
        return f"StepCosts(n_steps={self.time_s.shape[0]}, bound={self.bound!r}, tokens_per_step={self.tokens_per_step})"


@dataclass(frozen=True)
class _Terms:
    """A model's coefficients at given dtypes (plain floats for the hot path)."""

    wb: float
    kv_token_layer_bytes: float
    resident_params: float
    expert_params: float
    n_moe: int
    n_experts: int
    top_k: int
    topk_group: int
    active_linear: float
    lm_head: float
    attn_coef: float
    dec_attn_coef: float
    attn_weight_bytes: float
    n_layers: int
    n_full: int
    n_slide: int
    window: float
    hidden: int
    # set by CostModel for its instance (see `CostModel.__init__`)
    kv_rep: int = 1                        # copies of each token's KV across the tp group
    replicated_weight_bytes: float = 0.0   # extra weights read per pass (DP attention)
    ctx_pad: float = 0.0                   # decode attention's fixed cost, in tokens of context

    @classmethod
    def of(cls, model: ModelSpec, weight_dtype: str, kv_dtype: str) -> "_Terms":
        moe = model.moe
        return cls(
            wb=dtype_bytes(weight_dtype),
            kv_token_layer_bytes=model.kv_elements_per_token_per_layer * dtype_bytes(kv_dtype),
            resident_params=float(model.pass_resident_params),
            expert_params=float(model.expert_params),
            n_moe=model.n_moe_layers,
            n_experts=moe.n_routed_experts if moe else 0,
            top_k=moe.n_active_experts if moe else 0,
            topk_group=(moe.topk_group or 0) if moe else 0,
            active_linear=float(model.active_linear_params),
            lm_head=float(model.lm_head_params),
            attn_coef=float(model.attention_flops_per_position),
            dec_attn_coef=float(model.decode_attention_flops_per_position),
            attn_weight_bytes=float(model.attention_weight_params) * dtype_bytes(weight_dtype),
            n_layers=model.n_layers,
            n_full=model.n_full_attention_layers,
            n_slide=model.n_sliding_layers,
            window=float(model.sliding_window or 0),
            hidden=model.hidden_size,
        )

    def distinct_experts(self, tokens: np.ndarray) -> np.ndarray:
        if not self.n_moe:
            return np.zeros_like(tokens)
        E, k = self.n_experts, self.top_k
        if k >= E:
            return np.where(tokens > 0, float(E), 0.0)
        return E * -np.expm1(tokens * math.log1p(-k / E))

    def weight_bytes_per_pass(self, tokens: np.ndarray) -> np.ndarray:
        if isinstance(tokens, float):
            # scalar fast path (one pass of a prefill, a mixed or a decode iteration):
            # the same arithmetic as the array path, with math.expm1 for np.expm1
            if tokens <= 0:
                return 0.0
            E, k = self.n_experts, self.top_k
            if not self.n_moe:
                distinct = 0.0
            elif k >= E:
                distinct = float(E)
            else:
                distinct = E * -math.expm1(tokens * math.log1p(-k / E))
            return (self.resident_params + self.n_moe * distinct * self.expert_params) * self.wb
        experts = self.n_moe * self.distinct_experts(tokens) * self.expert_params
        return np.where(tokens > 0, (self.resident_params + experts) * self.wb, 0.0)


def _maximum(a, b):
    """np.maximum, without the ufunc call when both are scalars (the hot path)."""
    if isinstance(a, float) and isinstance(b, float):
        return a if a >= b else b
    return np.maximum(a, b)


def _at(x, i: int = 0):
    """Element i of a scalar or (flattened) array."""
    return x if isinstance(x, float) else np.ravel(x)[i]


def _larger_line(a0: float, a1: float, b0: float, b1: float, n: int) -> np.ndarray:
    """max(a0 + a1 j, b0 + b1 j) for j = 0 .. n-1, shape (n,).

    When one line is at least the other at j = 0 and grows at least as fast, it is the
    larger at every j (rounding is monotonic, so also in floating point): it alone is
    evaluated (one multiply into a new array, one add in place), which is what a decode
    step's time usually is (memory-bound on GPUs, compute- or latency-bound on the
    wafer)."""
    j = _STEP_INDEX[:n] if n <= _STEP_INDEX.shape[0] else np.arange(n, dtype=float)
    if b0 >= a0 and b1 >= a1:
        a0, a1 = b0, b1
    elif not (a0 >= b0 and a1 >= b1):
        return np.maximum(a0 + a1 * j, b0 + b1 * j)     # the lines cross
    j = j * a1
    j += a0
    return j


#: j = 0, 1, ... as floats, for `_larger_line` (a slice of it instead of an arange per
#: run of steps; 4096 is a decode engine's default longest run). Read-only: shared.
_STEP_INDEX = np.arange(4096, dtype=float)
_STEP_INDEX.flags.writeable = False


def _counts_key(*counts) -> tuple | None:
    """A hashable key of token-count lists or 1-D arrays (their values as tuples), None
    for anything else (scalars, other shapes)."""
    key = []
    for x in counts:
        if type(x) is list:
            key.append(tuple(x))
        elif type(x) is np.ndarray and x.ndim == 1:
            key.append(tuple(x.tolist()))
        else:
            return None
    return tuple(key)


def _as_counts(x, name: str) -> np.ndarray:
    if type(x) is list:
        # an engine's counts (a few ints): floats at once, checked by the short arrays'
        # path below; a long list as ints (their one check for negatives)
        x = np.array(x, dtype=float) if len(x) <= 64 else np.array(x)
    if type(x) is np.ndarray and x.ndim == 1 and x.size <= 64 and x.dtype.kind in "iuf":
        # the engines' short token-count arrays: Python's min and sum are cheaper than
        # ufunc reductions (a nan or inf makes the sum fail `< inf`)
        v = x.tolist()
        if v and (min(v) < 0 or (x.dtype.kind == "f" and not sum(v) < math.inf)):
            raise ValueError(f"{name} must be finite token counts >= 0")
        return x.astype(float)
    if type(x) is np.ndarray and x.ndim == 1 and x.dtype.kind in "iu":
        if x.size and x.min() < 0:          # ints are finite: one check for negatives
            raise ValueError(f"{name} must be finite token counts >= 0")
        return x.astype(float)
    a = np.asarray(x, dtype=float)
    if a.ndim > 1:
        a = a.ravel()
    if a.size and (not np.all(np.isfinite(a)) or np.any(a < 0)):
        raise ValueError(f"{name} must be finite token counts >= 0")
    return np.atleast_1d(a)


def _range_min_sum(c: np.ndarray, n: np.ndarray, w: float) -> np.ndarray:
    """sum_{p=c+1}^{c+n} min(p, w), elementwise (w > 0)."""
    top = np.minimum(c + n, w)
    below = np.maximum(top - c, 0.0)            # positions c+1..top that are <= w
    s_below = below * (c + 1 + top) / 2.0
    return s_below + (n - below) * w


def _shift_min_sum(c_sorted: np.ndarray, prefix: np.ndarray, shift: np.ndarray, w: float) -> np.ndarray:
    """sum_i min(c_i + s, w) for every s in `shift` (c sorted ascending, prefix its
    cumulative sum with a leading 0): O(len(shift) log len(c))."""
    idx = np.searchsorted(c_sorted, w - shift, side="left")   # c_i + s < w for i < idx
    return prefix[idx] + shift * idx + w * (c_sorted.size - idx)


class CostModel:
    """Iteration times of one instance: a model served on `parallelism` devices.

    Args:
        model, device: specs, or catalog names / file paths (see `devices.catalog`).
        parallelism: tp x pp devices (ep within tp).
        weight_dtype, kv_dtype: "bf16" | "fp8" | "fp4": bytes stored and moved; the
            weight dtype also sets the compute dtype (see HardwareSpec.compute_dtype).
        speculative: optional SpeculativeConfig.

    Attributes:
        kv_bytes_per_token: KV bytes per token of context, all layers, at kv_dtype
            (plus the draft's KV when speculating with a draft model or MTP head).
        weight_bytes: bytes of weights at weight_dtype (plus draft / MTP weights).
        tokens_per_step: 1.0, or expected tokens per verification step.
        peak_flops: dense FLOP/s of the whole instance at the compute dtype.
        memory_bandwidth: bytes/s of the whole instance.

    Raises:
        ValueError: unknown dtype; CatalogError: unknown model/device name.
    """

    def __init__(self, model, device, parallelism: Parallelism | None = None,
                 weight_dtype: str = "fp8", kv_dtype: str = "fp8",
                 speculative: SpeculativeConfig | None = None):
        from .catalog import resolve_device, resolve_model

        for name, dt in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)):
            if dt not in DTYPES:
                raise ValueError(f"CostModel {name} must be one of {', '.join(DTYPES)}, got {dt!r}")
        self.model: ModelSpec = resolve_model(model)
        # the stack's kernel path for these weights (B300 SGLang: FP4 and FP8 GEMMs differ)
        self.device: HardwareSpec = resolve_device(device).for_weights(weight_dtype)
        self.parallelism: Parallelism = parallelism or Parallelism()
        _check_split(self.model, self.parallelism)
        self.weight_dtype = weight_dtype
        self.kv_dtype = kv_dtype
        self.speculative = speculative
        self.compute_dtype = self.device.compute_dtype(weight_dtype)
        par, dev = self.parallelism, self.device
        self._peak_dev = dev.dense_peak_flops(weight_dtype)
        self.attention_dtype = dev.attention_compute_dtype(weight_dtype)
        self._peak_att = dev.dense_peak_flops(self.attention_dtype)
        self.peak_flops: float = par.n_devices * self._peak_dev
        self.memory_bandwidth: float = par.n_devices * dev.memory_bandwidth_Bps
        self._t = self._instance_terms(self.model)
        self._lines: dict[int, tuple] = {}     # batch size -> `_decode_line`
        self._token_terms: dict[tuple, tuple] = {}   # see `_terms_of_tokens`
        self._mixed_slopes: dict[tuple[int, int], tuple] = {}   # see `mixed_steps`
        self._prefill_costs: dict[tuple, IterationCost] = {}   # see `prefill`
        self._prefill_parts: dict[tuple, dict] = {}   # see `_prefill_part`

        self.draft: ModelSpec | None = None
        extra_w = extra_kv = 0
        if speculative is not None:
            if speculative.method == "draft_model":
                self.draft = resolve_model(speculative.draft_model)
                extra_w = self.draft.weight_bytes(weight_dtype)
            else:
                self.draft = self._mtp_module(self.model)
                extra_w = int(round((self.draft.params_total - self.draft.embedding_params
                                     - (0 if self.draft.tie_word_embeddings else self.draft.lm_head_params))
                                    * dtype_bytes(weight_dtype)))
            extra_kv = self.draft.kv_bytes_per_token(kv_dtype)
            self._td = self._instance_terms(self.draft)
        self.kv_bytes_per_token: int = self.model.kv_bytes_per_token(kv_dtype) + extra_kv
        self.weight_bytes: int = self.model.weight_bytes(weight_dtype) + extra_w
        #: Copies of each token's KV across a stage's tp devices (`ModelSpec.kv_replication`;
        #: 1 with data-parallel attention): the KV cache holds kv_bytes / kv_replication tokens.
        self.kv_replication: int = self._t.kv_rep
        #: Weight bytes held more than once: data-parallel attention keeps the attention
        #: blocks on each of the tp devices ((tp - 1) extra copies).
        self.replicated_weight_bytes: int = int(round(self._t.replicated_weight_bytes
                                                      + (self._td.replicated_weight_bytes if speculative else 0)))
        #: Bytes one token of context occupies in the instance's memory (all its copies).
        self.kv_held_bytes_per_token: int = self.kv_bytes_per_token * self.kv_replication
        #: Prompt chunks fused with the decode step in one pass: the stack's `mixed_prefill`,
        #: never on a wafer streaming prompts (its layer regions take prompt and decode
        #: tokens in turn: the prompt's stream, then the decode step).
        self._fused: bool = dev.mixed_prefill and dev.prompt_token_layer_s == 0
        #: The stack's cap on requests an instance runs at once (None: not given): per
        #: attention rank with data-parallel attention (each rank runs its own batch and
        #: captures its own CUDA / HIP graphs up to the stack's size).
        ranks = par.tp if par.dp_attention and par.tp > 1 else 1
        self.max_num_seqs: int | None = None if dev.max_num_seqs is None else dev.max_num_seqs * ranks
        self.tokens_per_step: float = 1.0 if speculative is None else speculative.tokens_per_step

    def _instance_terms(self, model: ModelSpec) -> _Terms:
        """`_Terms` of `model` on this instance: KV copies and replicated attention
        weights of the parallelism, the stack's decode-attention padding."""
        par = self.parallelism
        t = _Terms.of(model, self.weight_dtype, self.kv_dtype)
        dp = par.dp_attention and par.tp > 1
        return dataclasses.replace(
            t, kv_rep=1 if dp else model.kv_replication(par.tp),
            replicated_weight_bytes=(par.tp - 1) * t.attn_weight_bytes if dp else 0.0,
            ctx_pad=float(self.device.attention_context_half_tokens))

    @staticmethod
    def _mtp_module(model: ModelSpec) -> ModelSpec:
        """The target's MTP head as a one-layer model (MoE layer if the model has MoE;
        embeddings and LM head shared with the target)."""
        upd: dict = {"key": f"{model.key}-mtp", "name": f"{model.name} MTP head", "n_layers": 1,
                     "n_sliding_layers": 0, "sliding_window": None}
        if model.moe is not None:
            upd["moe"] = model.moe.model_copy(update={"n_dense_layers": 0})
        return model.model_copy(update=upd)

    # ---- core -------------------------------------------------------------------
    def _moe_padding_flops(self, t: _Terms, tok_mb):
        """Extra FLOPs of one micro-batch's grouped GEMMs from padding each touched
        expert's rows to the stack's M tile: 2 P_e L_moe max(0, D(T) tile - T k)."""
        tile = self.device.moe_tile_tokens
        if tile <= 1 or not t.n_moe:
            return 0.0 * tok_mb
        if isinstance(tok_mb, float):
            # (numpy's expm1 on the scalar: the value it gives a one-element array,
            # which math.expm1 does not always give)
            distinct = t.distinct_experts(tok_mb)
            return 2.0 * t.expert_params * t.n_moe * max(0.0, float(distinct) * tile - tok_mb * t.top_k)
        return 2.0 * t.expert_params * t.n_moe * np.maximum(0.0, t.distinct_experts(tok_mb) * tile - tok_mb * t.top_k)

    def _pass(self, t: _Terms, *, tokens, flops_p, flops_d, att_p, att_d, kv_p, kv_d, m: int, pp: int,
              steady: bool, lean: bool = False, skew_p: tuple[float, float] = (0.0, 0.0)) -> dict:
        """Time one forward pass (arrays broadcast over steps); see the module docstring.

        flops_*: all FLOPs of the prefill (p) and decode (d) parts; att_*: their
        attention share (QK^T and AV), computed at the attention dtype.
        skew_p: (linear, attention) FLOPs the prompt part's busiest data-parallel
        attention rank does beyond an even share, in instance FLOPs (`_dp_skew`): the
        other ranks wait for it, so they add to the compute time, not to the work.
        lean: for `decode_steps` (one pass, no parts to combine): "time", "flops",
        "bytes", "comm", "busy" as computed here, and "compute", "memory", "comm_bw",
        "latency" only at the first step (what `_bound` reads), as scalars.
        """
        dev, eff, par = self.device, self.device.efficiency, self.parallelism
        tp = par.tp
        # Scalars stay Python floats (a pass's token count is one number even when
        # its FLOPs vary over decode steps): same arithmetic, far fewer ufunc calls.
        if not isinstance(tokens, float):
            tokens = np.asarray(tokens, dtype=float)
        tok_mb = tokens / m
        decode_part = flops_d > 0 if isinstance(flops_d, float) else np.any(np.asarray(flops_d) > 0)
        prefill_part = flops_p > 0 if isinstance(flops_p, float) else np.any(np.asarray(flops_p) > 0)
        if isinstance(tok_mb, float):
            key = (id(t), tok_mb, m, pp, bool(prefill_part))
            terms = self._token_terms.get(key)
            if terms is None:
                if len(self._token_terms) >= self._TOKEN_TERMS_MAX:
                    self._token_terms.clear()
                terms = self._token_terms[key] = self._terms_of_tokens(t, tok_mb, m, pp, bool(prefill_part))
        else:
            terms = self._terms_of_tokens(t, tok_mb, m, pp, bool(prefill_part))
        w_mb, pad, comm_bw, comm_lat, hop_xfer, hop_lat = terms
        # Weights are read once per micro-batch pass for both parts; a fused pass reads
        # them no faster than either phase alone would (taking the decode figure made a
        # memory-bound prompt chunk faster when a decode request joined it).
        e_w = (min(eff.decode_memory, eff.prefill_memory) if decode_part and prefill_part
               else eff.decode_memory if decode_part else eff.prefill_memory)
        peak, bw = tp * self._peak_dev, tp * dev.memory_bandwidth_Bps
        lin_p, lin_d = flops_p - att_p, flops_d - att_d
        if prefill_part:
            lin_p = lin_p + pad
        else:
            lin_d = lin_d + pad
        e_att = eff.prefill_attention_compute or eff.prefill_compute
        compute_s = (((lin_p + skew_p[0]) / eff.prefill_compute + lin_d / eff.decode_compute) / peak
                     + ((att_p + skew_p[1]) / e_att + att_d / eff.decode_compute) / (tp * self._peak_att)) / (m * pp)
        memory_s = (w_mb / e_w / pp
                    + t.kv_rep * (kv_p / eff.prefill_memory + kv_d / eff.decode_memory) / (m * pp)) / bw
        comm_s = comm_bw + comm_lat
        lat_s = (t.n_layers * (dev.layer_latency_s + (dev.prefill_layer_latency_s if prefill_part else 0.0))
                 + t.n_moe * dev.moe_layer_latency_s) / pp
        if par.two_batch_overlap:
            stage = _maximum(_maximum(compute_s, memory_s), comm_s) + lat_s
        else:
            stage = _maximum(compute_s, memory_s) + comm_s + lat_s
        hop = hop_xfer + hop_lat
        if steady:
            time = _maximum(pp * stage + (pp - 1) * hop, m * stage)
            passes = pp
        else:
            time = (m + pp - 1) * stage + (pp - 1) * hop
            passes = m + pp - 1
        time = time + dev.iteration_overhead_s
        busy = m * stage        # each device works on its stage for each of the m micro-batches
        if lean:
            # the same values without the broadcasting "+ 0" of the full dict
            return {
                "time": time,
                "flops": flops_p + flops_d,
                "bytes": m * w_mb + t.kv_rep * (kv_p + kv_d),
                "comm": np.full(np.shape(time), passes * comm_s + (pp - 1) * hop),
                "busy": busy,
                "compute": passes * _at(compute_s),
                "memory": passes * _at(memory_s),
                "comm_bw": passes * comm_bw + (pp - 1) * hop_xfer,
                "latency": passes * (lat_s + comm_lat) + (pp - 1) * hop_lat + dev.iteration_overhead_s,
                "fixed": passes * lat_s + dev.iteration_overhead_s,
            }
        flops = flops_p + flops_d
        d = {
            "time": time,
            "flops": flops if isinstance(flops, float) else np.asarray(flops, dtype=float),
            "bytes": m * w_mb + t.kv_rep * (kv_p + kv_d),
            # all time spent communicating (collectives and pipeline hops, both terms)
            "comm": passes * comm_s + (pp - 1) * hop,
            "busy": busy,
            "compute": passes * compute_s,
            "memory": passes * memory_s,
            # alpha-beta split of the critical path: bandwidth-driven transfer time vs
            # fixed latencies (per layer, per collective step, per hop, per iteration)
            "comm_bw": passes * comm_bw + (pp - 1) * hop_xfer,
            "latency": passes * (lat_s + comm_lat) + (pp - 1) * hop_lat + dev.iteration_overhead_s,
            # the stack's fixed latencies alone (per layer, per MoE layer, per iteration)
            "fixed": passes * lat_s + dev.iteration_overhead_s,
        }
        if type(time) is not float:
            # steps as arrays: every term broadcast to the time's shape. A scalar pass
            # (every prefill and mixed iteration) keeps its floats as they are (adding
            # a float 0.0 changes no value: its terms are sums and products of
            # non-negative ones, so none is a -0.0 the addition would turn into 0.0)
            z = 0 * time
            for k in d:
                d[k] = d[k] + z
        return d

    _TOKEN_TERMS_MAX = 4096
    # Entries of `_token_terms` (a pass's terms by token count), of `_prefill_costs`
    # (a prefill iteration's cost by its counts) and of `_prefill_parts` (its pass): a
    # prefill engine's iterations mostly carry the full chunk budget, so a few hundred
    # keys cover most of a trace (Azure conversation: 2,361 distinct of 19,341); cleared
    # when full.

    def _terms_of_tokens(self, t: _Terms, tok_mb, m: int, pp: int, prompt: bool = False) -> tuple:
        """The terms of `_pass` that depend only on the micro-batch's token count (and
        the model, m and pp): (weight bytes read per micro-batch, MoE padding FLOPs of
        the m micro-batches, collective transfer s, collective latency s, pipeline hop
        transfer s, hop latency s). `_pass` memoizes them for scalar token counts."""
        dev, eff = self.device, self.device.efficiency
        w_mb = t.weight_bytes_per_pass(tok_mb) + t.replicated_weight_bytes
        pad = m * self._moe_padding_flops(t, tok_mb)
        comm_bw, comm_lat = self._stage_comm(t, tok_mb, pp, prompt)
        if pp > 1:
            link_bw, link_lat = dev.link(self.parallelism.n_devices)
            hop_xfer = tok_mb * t.hidden * ACTIVATION_BYTES / (link_bw * eff.communication)
            hop_lat = link_lat + dev.pipeline_hop_latency_s
        else:
            hop_xfer = hop_lat = 0.0
        return w_mb, pad, comm_bw, comm_lat, hop_xfer, hop_lat

    def _stage_comm(self, t: _Terms, tok_mb, pp: int, prompt: bool = False) -> tuple:
        """(transfer time, latency time) of one stage's collectives for one micro-batch
        of tok_mb tokens (s), from the device's measured collective tables
        (`HardwareSpec.collective_parts`).

        Tensor-parallel attention: an all-reduce of the micro-batch's hidden states
        after attention and after each dense FFN; an MoE layer with ep > 1 dispatches
        and combines its tokens' top-k copies with two all-to-alls among ep devices
        (ep = 1: an all-reduce, the experts being tensor parallel). Data-parallel
        attention: no collective after attention; a dense FFN (or an MoE without EP)
        gathers the group's tokens and reduce-scatters its outputs (an all-reduce's
        bytes and steps); an MoE with EP dispatches each device's own tokens.
        """
        par = self.parallelism
        tp, ep = par.tp, par.ep
        if tp == 1:
            return 0.0 * tok_mb, 0.0 * tok_mb
        dev, e = self.device, self.device.efficiency.communication
        size = tok_mb * t.hidden * ACTIVATION_BYTES
        ar = dev.collective_parts("all_reduce", size, tp, e)
        if ep > 1 and t.n_moe:
            own = tok_mb / (tp if par.dp_attention else ep)
            copies = t.top_k
            if prompt and ep > dev.scale_up_domain and t.topk_group:
                # a pass with prompt tokens over the scale-out network (DeepEP's normal
                # kernels): node-limited routing puts a token's experts in at most
                # topk_group nodes, one copy crosses to each remote node and is
                # forwarded to its experts over the scale-up fabric. Decode steps use the
                # low-latency kernels, which send each top-k copy over RDMA directly
                # (deepseek-ai/DeepEP README). nbytes follow nccl-tests' all-to-all
                # convention (x (n - 1) / n inside collective_parts): copies scaled back
                nodes = math.ceil(ep / dev.scale_up_domain)
                reach = min(t.top_k, t.topk_group, nodes)
                copies = reach * (nodes - 1) / nodes * ep / (ep - 1)
            a2a = dev.collective_parts("all_to_all", own * copies * t.hidden * ACTIVATION_BYTES, ep, e)
            moe = (2 * a2a[0], 2 * a2a[1])
        else:
            moe = ar
        attn = (0.0 * tok_mb, 0.0 * tok_mb) if par.dp_attention else ar
        layers, moe_layers = t.n_layers / pp, t.n_moe / pp
        dense = layers - moe_layers
        return tuple(layers * attn[i] + dense * ar[i] + moe_layers * moe[i] for i in (0, 1))

    @staticmethod
    def _combine(parts: list[dict]) -> dict:
        out = dict(parts[0])
        for p in parts[1:]:
            for k in out:
                out[k] = out[k] + p[k]
        return out

    @staticmethod
    def _bound_of(compute: float, memory: float, comm_bw: float, latency: float) -> str:
        """The largest term of the critical path (`IterationCost.bound`); ties go to the
        roofline, then to communication."""
        roof, top = ("compute", compute) if compute >= memory else ("memory", memory)
        if top >= comm_bw and top >= latency:
            return roof
        return "communication" if comm_bw >= latency else "latency"

    @staticmethod
    def _bound(d: dict, i: int = 0) -> str:
        return CostModel._bound_of(_at(d["compute"], i), _at(d["memory"], i), _at(d["comm_bw"], i),
                                   _at(d["latency"], i))

    def _cost(self, d: dict, tokens: float) -> IterationCost:
        if type(d["time"]) is float and type(d["compute"]) is float:
            # a scalar pass (every prefill and mixed iteration): no per-field unwrapping
            compute, memory, comm_bw, latency = d["compute"], float(d["memory"]), float(d["comm_bw"]), \
                float(d["latency"])
            return _iteration_cost(d["time"], float(d["flops"]), float(d["bytes"]), float(d["comm"]),
                                   self._bound_of(compute, memory, comm_bw, latency), compute, memory, latency,
                                   comm_bw, float(tokens), float(d["busy"]), float(d["fixed"]))
        f = lambda k: float(_at(d[k]))  # noqa: E731
        return _iteration_cost(time_s=f("time"), flops=f("flops"), bytes=f("bytes"), comm_s=f("comm"),
                               bound=self._bound(d), compute_s=f("compute"), memory_s=f("memory"),
                               latency_s=f("latency"), comm_bw_s=f("comm_bw"), tokens=float(tokens),
                               busy_s=f("busy"), fixed_s=f("fixed"))

    # ---- work of a phase ---------------------------------------------------------------
    @staticmethod
    def _prefill_work(t: _Terms, n: np.ndarray, c: np.ndarray) -> tuple[float, float, float, float]:
        """(tokens, FLOPs, attention FLOPs, KV bytes) of prefill chunks n over cached c."""
        if n.size < 8 and not t.n_slide:
            # An iteration's few requests: Python floats, the same operations, one
            # pass, no ufunc calls (token counts are whole numbers: their sums are
            # exact in any order).
            tokens = pos = cached = 0.0
            live = 0
            for x, y in zip(n.tolist(), c.tolist()):
                if x > 0:
                    tokens += x
                    pos += x * y + x * (x + 1) / 2
                    cached += y
                    live += 1
            pos = t.n_full * pos
            kv_read = t.n_full * cached
            att = t.attn_coef * pos
            flops = 2 * tokens * t.active_linear + 2 * live * t.lm_head + att
            kv = t.kv_token_layer_bytes * (kv_read + t.n_layers * tokens)
            return tokens, flops, att, kv
        live = n > 0
        n, c = n[live], c[live]
        tokens = float(n.sum())
        pos = t.n_full * float(np.sum(n * c + n * (n + 1) / 2))
        kv_read = t.n_full * float(c.sum())
        if t.n_slide:
            pos += t.n_slide * float(_range_min_sum(c, n, t.window).sum())
            kv_read += t.n_slide * float(np.minimum(c, t.window).sum())
        att = t.attn_coef * pos
        flops = 2 * tokens * t.active_linear + 2 * live.sum() * t.lm_head + att
        kv = t.kv_token_layer_bytes * (kv_read + t.n_layers * tokens)
        return tokens, flops, att, kv

    @staticmethod
    def _decode_work(t: _Terms, c: np.ndarray, shift: np.ndarray | float, q: int) -> tuple:
        """(tokens, FLOPs, attention FLOPs, KV bytes) per step of a decode batch with
        contexts c + shift (shift: array over steps; a scalar for one step, which keeps
        the work and its pass in Python floats: the same values without a ufunc call
        per term), q query tokens per request (k + 1
        when verifying). Each request's attention is charged `t.ctx_pad` more tokens of
        context (the fixed cost of a split-KV decode kernel, `HardwareSpec.
        attention_context_half_tokens`) on its full-attention layers."""
        B = c.size
        csum = float(np.add.reduce(c))         # (ndarray.sum's reduction without its Python wrapper)
        ctx_sum = csum + B * (shift + t.ctx_pad)                    # sum_i (c_i + s + pad)
        pos = t.n_full * (q * ctx_sum + B * q * (q + 1) / 2)
        kv_read = t.n_full * ctx_sum
        if t.n_slide:
            cs = np.sort(c)
            prefix = np.concatenate(([0.0], np.cumsum(cs)))
            pos = pos + t.n_slide * sum(_shift_min_sum(cs, prefix, shift + r, t.window) for r in range(1, q + 1))
            kv_read = kv_read + t.n_slide * _shift_min_sum(cs, prefix, shift, t.window)
        tokens = float(B * q)
        att = t.dec_attn_coef * pos
        flops = 2 * tokens * (t.active_linear + t.lm_head) + att
        kv = t.kv_token_layer_bytes * (kv_read + t.n_layers * tokens)
        return tokens, flops, att, kv

    def _draft_passes(self, c: np.ndarray, shift: np.ndarray) -> dict | None:
        """k sequential draft passes (one token per request each) on one stage's devices."""
        if self.speculative is None:
            return None
        parts = []
        for r in range(int(self.speculative.draft_tokens)):
            tok, fl, att, kv = self._decode_work(self._td, c, shift + r, 1)
            parts.append(self._pass(self._td, tokens=tok, flops_p=0.0, flops_d=fl, att_p=0.0, att_d=att,
                                    kv_p=0.0, kv_d=kv,
                                    m=1, pp=1, steady=True))
        return self._combine(parts)

    # ---- public API -------------------------------------------------------------------------
    def prefill(self, new_tokens, cached_tokens=0) -> IterationCost:
        """One chunked-prefill iteration: request i computes new_tokens[i] tokens on top
        of cached_tokens[i] already in its KV (prefix cache or earlier chunks).

        Args: arrays (or scalars) of token counts, broadcast together.
        Raises: ValueError on negative counts or an iteration with no new tokens.
        """
        # A prefill engine's iterations repeat the same few (chunk, cached) shapes (the
        # full chunk budget over 0, 1, 2... chunks of a prompt): the cost of the same
        # counts (lists, or 1-D arrays) is looked up, not computed again (the same
        # object, bit for bit).
        key = _counts_key(new_tokens, cached_tokens)
        if key is not None:
            hit = self._prefill_costs.get(key)
            if hit is not None:
                return hit
        cost = self._prefill_cost(new_tokens, cached_tokens)
        if key is not None:
            if len(self._prefill_costs) >= self._TOKEN_TERMS_MAX:
                self._prefill_costs.clear()
            self._prefill_costs[key] = cost
        return cost

    def _prefill_cost(self, new_tokens, cached_tokens) -> IterationCost:
        n = _as_counts(new_tokens, "new_tokens")
        c = _as_counts(cached_tokens, "cached_tokens")
        if n.shape != c.shape:
            n, c = np.broadcast_arrays(n, c)
        tokens = self._prefill_tokens(n)
        if tokens <= 0:
            raise ValueError("prefill: no new tokens in the iteration")
        return self._cost(self._prefill_dict(n, c), tokens)

    @staticmethod
    def _prefill_tokens(n: np.ndarray) -> float:
        return float(sum(x for x in n.tolist() if x > 0)) if n.size < 8 else float(n[n > 0].sum())

    def _prefill_part(self, n: np.ndarray, c: np.ndarray) -> dict:
        """`_prefill_dict(n, c)`, looked up by the counts when seen before: an unfused
        mixed iteration's prompt pass is a pure function of them and repeats as often
        as `prefill`'s shapes do (the full chunk budget over 0, 1, 2... chunks of a
        prompt), while its decode part changes every step. Callers only read the dict
        (`_combine` copies it)."""
        key = (tuple(n.tolist()), tuple(c.tolist()))
        d = self._prefill_parts.get(key)
        if d is None:
            if len(self._prefill_parts) >= self._TOKEN_TERMS_MAX:
                self._prefill_parts.clear()
            d = self._prefill_parts[key] = self._prefill_dict(n, c)
        return d

    def _prefill_dict(self, n: np.ndarray, c: np.ndarray) -> dict:
        """A prefill-only pass (pipeline filled then drained), with the draft's or MTP
        head's own prefill of the prompt when speculating."""
        tokens, flops, att, kv = self._prefill_work(self._t, n, c)
        if self.device.prompt_token_layer_s > 0:
            d = self._stream_prefill(self._t, n, flops, att, kv)
            if self.speculative is not None:
                d = self._combine([d, self._draft_prefill(n, c, tokens)])
            return d
        pp = self.parallelism.pp
        # The prompt's tokens stream through the stages in m micro-batches; each one
        # pays the per-layer latencies and reads the weights again, so the stack picks
        # the m that finishes first (m = min(pp, tokens) made 28 tokens on the 28-stage
        # wafer cost 1.8x one token, and 2 tokens on two GPU stages 1.5x one).
        d = None
        skew = self._dp_skew(self._t, n, c, tokens, att)
        for m in range(1, max(1, int(min(pp, tokens))) + 1):      # no prompt token: m = 1
            dm = self._pass(self._t, tokens=tokens, flops_p=flops, flops_d=0.0, att_p=att, att_d=0.0, kv_p=kv,
                            kv_d=0.0, m=m, pp=pp, steady=False, skew_p=skew)
            if d is None or dm["time"] < d["time"]:
                d = dm
        if self.speculative is not None:  # the draft (or MTP head) builds its KV of the prompt too
            d = self._combine([d, self._draft_prefill(n, c, tokens)])
        return d

    def _stream_prefill(self, t: _Terms, n: np.ndarray, flops: float, att: float, kv: float,
                        overhead: bool = True) -> dict:
        """Prompt chunks streamed through a wafer's layers (`HardwareSpec.prompt_token_layer_s`).

        n: (R,) new tokens of each request's chunk; flops, att, kv: their work
        (`_prefill_work`). Every layer's weights sit in their own region of PEs (on pp
        systems, layers / pp regions each), so one request's prompt tokens follow one
        another through the layers: its first token takes the decode path's latency
        through every layer and hop,
            fill = layers x (layer_latency + prefill_layer_latency) + moe_layers x
                   moe_layer_latency + (pp - 1) x (link latency + hop latency + one
                   token's activations over the link),
        and each later token holds a layer region for tau = max(prompt_token_layer_s, one
        token's activations over the system link): a stream of n tokens takes
        fill + (n - 1) tau. The chunks of several requests are separate streams, in
        flight in the same regions at once (as a decode step's micro-batches are in
        different regions at once): a region interleaves up to S = `prompt_streams`
        of them (None: no cap), so its busiest stream slot carries
            n_slot = max(max_i n_i, sum_i n_i / S)
        tokens one after another. The chunks' arithmetic spreads over the regions, which
        together hold every PE of the N = pp systems; it adds to the streams' time:
            time = fill + (n_slot - 1) x tau + max(FLOPs / (e_pc x P x N), KV bytes / (e_pm x B x N))
        with P, B one system's dense peak and SRAM bandwidth. One request (R = 1) is the
        stream the wafer prompt rows measure (devices/wafer_prompt.py); many requests
        reach the regions' arithmetic at the prefill efficiency (`rack estimate` prints
        both rates and the MFU). Adding the arithmetic to the stream instead of
        overlapping them is conservative by at most 2x at the crossover. Activations in
        flight are one hidden vector per stream per layer region (bytes, against GBs of
        SRAM), so no memory bound applies to them; the prompt's KV is written into SRAM
        as on GPUs (the KV cache's capacity is the planner's). `overhead`: add the
        per-iteration overhead (a mixed step adds it once, `_wafer_mixed`).
        """
        dev, eff, par = self.device, self.device.efficiency, self.parallelism
        N, pp = par.n_devices, par.pp
        live = [x for x in n.tolist() if x > 0]
        n_slot = max(live) if live else 0.0
        if dev.prompt_streams is not None:
            n_slot = max(n_slot, sum(live) / dev.prompt_streams)
        compute_s = ((flops - att) / self._peak_dev + att / self._peak_att) / (N * eff.prefill_compute)
        memory_s = t.kv_rep * kv / (N * dev.memory_bandwidth_Bps * eff.prefill_memory)
        tok_x = hop_lat = 0.0
        if pp > 1:
            link_bw, link_lat = dev.link(N)
            tok_x = t.hidden * ACTIVATION_BYTES / (link_bw * eff.communication)
            hop_lat = link_lat + dev.pipeline_hop_latency_s
        lat_layers = (t.n_layers * (dev.layer_latency_s + dev.prefill_layer_latency_s)
                      + t.n_moe * dev.moe_layer_latency_s)
        hops = (pp - 1) * (hop_lat + tok_x)
        occupancy = max(0.0, n_slot - 1.0) * max(dev.prompt_token_layer_s, tok_x)
        roof = max(compute_s, memory_s)
        time = lat_layers + hops + occupancy + roof + (dev.iteration_overhead_s if overhead else 0.0)
        link_bound = tok_x > dev.prompt_token_layer_s
        comm_bw = (pp - 1) * tok_x + (occupancy if link_bound else 0.0)
        fixed = time - roof - hops - (occupancy if link_bound else 0.0)
        return {"time": time, "flops": flops, "bytes": t.kv_rep * kv, "comm": time - roof - fixed,
                # a system works from the first token's arrival at its layers to the last's departure
                "busy": occupancy + roof + lat_layers / pp, "compute": compute_s, "memory": memory_s,
                "comm_bw": comm_bw, "latency": time - roof - comm_bw, "fixed": fixed}

    def _wafer_mixed(self, n: np.ndarray, c: np.ndarray, ctx: np.ndarray, tok_p: float) -> dict:
        """A wafer's mixed step: prompt chunks n over cached c and one decode step of the
        requests with contexts ctx, in flight in the layer regions at once (tok_p: the
        chunks' tokens, `_prefill_tokens(n)`).

        The decode micro-batches and the prompt streams share the regions as the decode
        micro-batches share them among themselves: each region works on whichever
        arrives. The step ends when its longest path ends and its busiest system has
        done all its work:
            time = overhead + max(decode step's latency path (`decode_step` less its
                   overhead), the longest prompt stream (`_stream_prefill`),
                   busiest system: m x decode stage + the prompt chunks' arithmetic share)
        so a decode token waits for no prompt token (a step is as long as its slowest
        member, which sets TPOT: the chunk rule, `devices.chunking`, bounds it) and a
        prompt token never costs more pipeline time than a decode token at the same
        batch and context (tests/test_wafer_pipeline.py). The cost terms (compute,
        memory, latency...) are the longer path's, the extra time of a busier system
        counted as compute.
        """
        ovh = self.device.iteration_overhead_s
        parts = []
        if tok_p:
            _, fl, att, kv = self._prefill_work(self._t, n, c)
            parts.append(self._stream_prefill(self._t, n, fl, att, kv, overhead=False))
        if ctx.size:
            dd = self._decode_point(ctx)
            dd["time"] -= ovh
            dd["latency"] -= ovh
            dd["fixed"] -= ovh
            parts.append(dd)
        if len(parts) == 1:
            d = dict(parts[0])
        else:
            p, dd = parts
            d = dict(p if p["time"] >= dd["time"] else dd)
            busiest = dd["busy"] + max(p["compute"], p["memory"])
            if busiest > d["time"]:
                extra = busiest - d["time"]
                d["compute"] = max(d["compute"], d["memory"]) + extra
                d["time"] = busiest
            d["flops"], d["bytes"] = p["flops"] + dd["flops"], p["bytes"] + dd["bytes"]
            d["busy"] = min(d["time"], dd["busy"] + p["busy"])
        for k in ("time", "latency", "fixed"):
            d[k] += ovh
        return d

    def _draft_prefill(self, n: np.ndarray, c: np.ndarray, tokens: float) -> dict:
        _, fl, att, kv = self._prefill_work(self._td, n, c)
        return self._pass(self._td, tokens=tokens, flops_p=fl, flops_d=0.0, att_p=att, att_d=0.0, kv_p=kv,
                          kv_d=0.0, m=1, pp=1, steady=False, skew_p=self._dp_skew(self._td, n, c, tokens, att))

    def _dp_skew(self, t: _Terms, n: np.ndarray, c: np.ndarray, tokens: float, att: float) -> tuple[float, float]:
        """(linear, attention) FLOPs by which a prompt pass's busiest attention rank
        exceeds an even share, with data-parallel attention ((0, 0) without it).

        Each of the R = tp ranks runs the attention block (its projections, in
        `ModelSpec.attention_weight_params`, and QK^T / AV) for its own requests alone
        (SGLang --enable-dp-attention: the scheduler of each DP rank batches its own
        requests; TensorRT-LLM attention DP likewise), and every rank waits for the
        busiest one at the next MoE all-to-all. A request's chunk is not split over
        ranks, so the busiest rank carries at least the largest chunk and at least an
        even share:
            busiest tokens = max(max_i n_i, sum_i n_i / R)
        (attention positions likewise), and the pass takes as long as if every rank
        carried that much. One prompt on R ranks costs its attention block R times an
        even share; R or more equal prompts, none extra. The expert and dense-FFN
        GEMMs are unaffected: the MoE layers gather every rank's tokens.
        n, c: chunk and cached tokens per request (`_prefill_work`'s); tokens: their
        sum; att: their attention FLOPs.
        """
        par = self.parallelism
        if not par.dp_attention or par.tp < 2 or tokens <= 0:
            return (0.0, 0.0)
        ranks = par.tp
        live = n > 0
        n_l, c_l = n[live], c[live]
        busiest = max(float(n_l.max()), tokens / ranks)
        lin = 2.0 * t.attn_weight_bytes / t.wb * (ranks * busiest - tokens)
        pos = n_l * c_l + n_l * (n_l + 1) / 2          # full-attention positions per request
        total = float(pos.sum())
        att_extra = att * (ranks * max(float(pos.max()), total / ranks) / total - 1.0) if total > 0 else 0.0
        return (lin, att_extra)

    def decode_steps(self, context_lens, n_steps: int) -> StepCosts:
        """The next n_steps decode steps of a fixed batch.

        Args:
            context_lens: (B,) tokens of context of each request at the first step; in
                step j request i has context_lens[i] + j x tokens_per_step.
            n_steps: number of steps (>= 0).
        Returns: StepCosts with arrays of shape (n_steps,).
        Raises: ValueError on an empty batch, negative contexts or n_steps < 0.
        """
        c = _as_counts(context_lens, "context_lens")
        if c.size == 0:
            raise ValueError("decode_steps: empty batch (no context_lens)")
        n_steps = int(n_steps)
        if n_steps < 0:
            raise ValueError(f"decode_steps: n_steps must be >= 0, got {n_steps}")
        if n_steps == 0:
            z = np.zeros(0)
            return StepCosts(z, z, z, z, "memory", self.tokens_per_step)
        if self.speculative is None and not self._t.n_slide:
            # contexts are whole token counts (no speculative decoding on this path), so
            # every order of summation gives the same, exact sum; Python's sum is cheaper
            # than numpy's for a few items
            return self.decode_steps_of_sum(c.size, sum(c.tolist()) if c.size < 8 else c.sum(), n_steps)
        shift = np.arange(n_steps, dtype=float) * self.tokens_per_step
        d = self._decode_dict(c, shift, lean=True)
        return StepCosts(time_s=d["time"], flops=d["flops"], bytes=d["bytes"], comm_s=d["comm"],
                         bound=self._bound(d), tokens_per_step=self.tokens_per_step,
                         busy_s=np.broadcast_to(d["busy"], np.shape(d["time"])))

    _LINE_X = float(2 ** 24)
    # Second point of `_decode_line`: a power of two (exact division), far enough from 0
    # that the slopes keep ~14 significant digits over the context sums a batch reaches.

    def _decode_line(self, B: int) -> tuple:
        """A decode step of B requests as affine functions of x, the batch's context sum.

        Without speculative decoding or sliding-window layers, a step's FLOPs and KV
        bytes are affine in x (`_decode_work`), hence so are its compute and memory
        times; everything else in `_pass` depends on B only, and the step time is
        max(compute, memory) + a constant (steady pipeline, m <= pp). The lines come
        from two scalar evaluations of the general `_pass` (x = 0 and x = `_LINE_X`), so
        there is one formula; values agree with it to ~1e-14 relative.
        Returns (compute0, compute1, memory0, memory1, rest, flops0, flops1, bytes0,
        bytes1, comm, comm_bw, latency, busy_a, busy_b, fixed): v(x) = v0 + v1 x; time =
        max(compute, memory) + rest; a device's busy time = busy_a x time + busy_b (the
        stage time is (time - overhead - hops) / pp, busy for m micro-batches).
        """
        line = self._lines.get(B)
        if line is not None:
            return line
        t, pp, X = self._t, self.parallelism.pp, self._LINE_X
        m = int(min(pp, B))
        d0, d1 = (self._pass(t, tokens=float(B), flops_p=0.0, flops_d=fl, att_p=0.0, att_d=att, kv_p=0.0,
                             kv_d=kv, m=m, pp=pp, steady=True, lean=True)
                  for _, fl, att, kv in (self._decode_work(t, np.zeros(B), x, 1) for x in (0.0, X / B)))
        f = lambda k: (float(_at(d0[k])), (float(_at(d1[k])) - float(_at(d0[k]))) / X)  # noqa: E731
        (c0, c1), (m0, m1), (fl0, fl1), (b0, b1) = f("compute"), f("memory"), f("flops"), f("bytes")
        time0 = float(_at(d0["time"]))
        rest = time0 - max(c0, m0)
        busy_a = m / pp
        busy_b = float(_at(d0["busy"])) - busy_a * time0
        line = (c0, c1, m0, m1, rest, fl0, fl1, b0, b1, float(_at(d0["comm"])),
                float(_at(d0["comm_bw"])), float(_at(d0["latency"])), busy_a, busy_b, float(_at(d0["fixed"])))
        self._lines[B] = line
        return line

    def decode_steps_of_sum(self, batch_size: int, context_sum: int, n_steps: int) -> StepCosts | None:
        """`decode_steps` of a batch of `batch_size` requests (>= 1) whose contexts sum
        to `context_sum` tokens at the first step, n_steps >= 1; None when a step's cost
        depends on more than that sum (speculative decoding, sliding-window layers): ask
        `decode_steps` with the contexts then. The same StepCosts, bit for bit, as
        `decode_steps` on contexts with that sum (a decode engine keeps the sum as it
        admits and completes requests instead of building the contexts per run).

        From the batch size's `_decode_line` (the hot path of every decode engine):
        step j has context sum x_j = x_0 + B tps j, so each quantity is v0 + v1 x_0 +
        (v1 B tps) j: one multiply-add over j per array."""
        if self.speculative is not None or self._t.n_slide:
            return None
        B, x0, n_steps = int(batch_size), float(context_sum), int(n_steps)
        c0, c1, m0, m1, rest, fl0, fl1, b0, b1, comm, comm_bw, lat, busy_a, busy_b, _ = self._decode_line(B)
        dx = B * self.tokens_per_step
        cx, mx = c0 + c1 * x0, m0 + m1 * x0
        time = _larger_line(cx + rest, c1 * dx, mx + rest, m1 * dx, n_steps)
        return StepCosts(time, None, None, None, (cx, mx, comm_bw, lat), self.tokens_per_step,
                         lines=(fl0 + fl1 * x0, fl1 * dx, b0 + b1 * x0, b1 * dx, comm),
                         busy_line=(busy_a, busy_b))

    def _decode_dict(self, c: np.ndarray, shift: np.ndarray | float, lean: bool = False) -> dict:
        q = 1 if self.speculative is None else int(self.speculative.draft_tokens) + 1
        tok, fl, att, kv = self._decode_work(self._t, c, shift, q)
        pp = self.parallelism.pp
        # tokens is the same at every step: a scalar (the pass broadcasts it)
        d = self._pass(self._t, tokens=float(tok), flops_p=0.0, flops_d=fl, att_p=0.0, att_d=att, kv_p=0.0,
                       kv_d=kv,
                       m=int(min(pp, c.size)), pp=pp, steady=True,
                       lean=lean and self.speculative is None)
        draft = self._draft_passes(c, shift)
        return d if draft is None else self._combine([d, draft])

    def _decode_point(self, c: np.ndarray) -> dict:
        """One decode step of the batch with contexts c as a dict of floats (`_pass`'s
        keys): from the batch size's `_decode_line` when it applies (no speculative
        decoding, no sliding-window layers), else `_decode_dict`."""
        if self.speculative is not None or self._t.n_slide:
            return {k: float(_at(v)) for k, v in self._decode_dict(c, 0.0).items()}
        c0, c1, m0, m1, rest, fl0, fl1, b0, b1, comm, comm_bw, lat, busy_a, busy_b, fixed = self._decode_line(c.size)
        x = float(sum(c.tolist())) if c.size < 8 else float(c.sum())
        compute, memory = c0 + c1 * x, m0 + m1 * x
        time = max(compute, memory) + rest
        return {"time": time, "flops": fl0 + fl1 * x, "bytes": b0 + b1 * x, "comm": comm,
                "busy": busy_a * time + busy_b, "compute": compute, "memory": memory, "comm_bw": comm_bw,
                "latency": lat, "fixed": fixed}

    def mixed(self, new_tokens, cached_tokens, context_lens) -> IterationCost:
        """One colocated iteration: a prefill chunk (new_tokens over cached_tokens, as in
        `prefill`) and one decode step of the requests with `context_lens`.

        With the stack's `mixed_prefill` (vLLM, TensorRT-LLM) both run in one fused
        pass (weights read once per micro-batch pass for both parts); without it
        (SGLang's default) the prompt chunk is a prefill pass of its own followed by
        the decode step, each an iteration with its own overhead.

        Raises: ValueError if both parts are empty or counts are negative.
        """
        n = _as_counts(new_tokens, "new_tokens")
        c = _as_counts(cached_tokens, "cached_tokens")
        if n.shape != c.shape:
            n, c = np.broadcast_arrays(n, c)
        ctx = _as_counts(context_lens, "context_lens") if np.size(context_lens) else np.zeros(0)
        return self._cost(*self._mixed_dict(n, c, ctx))

    def _mixed_dict(self, n: np.ndarray, c: np.ndarray, ctx: np.ndarray) -> tuple[dict, float]:
        """`mixed`'s pass (`_pass`'s keys) and its tokens, from checked float counts
        (`_as_counts`: n and c of one shape, ctx (B,)). Raises ValueError if both
        parts are empty."""
        tok_p = self._prefill_tokens(n)
        q = 1 if self.speculative is None else int(self.speculative.draft_tokens) + 1
        if tok_p + ctx.size <= 0:
            raise ValueError("mixed: no prefill tokens and no decode requests")
        if self.device.prompt_token_layer_s > 0 and tok_p:
            # (no prompt tokens: the decode step below, bit for bit `decode_step`'s)
            d = self._wafer_mixed(n, c, ctx, tok_p)       # the decode part carries its draft passes
            if self.speculative is not None and tok_p:
                d = self._combine([d, self._draft_prefill(n, c, tok_p)])
            return d, tok_p + ctx.size * q
        if not self._fused:
            parts = ([self._prefill_part(n, c)] if tok_p else []) + \
                ([self._decode_dict(ctx, 0.0)] if ctx.size else [])
            return self._combine(parts), tok_p + ctx.size * q
        tok_p, fl_p, att_p, kv_p = self._prefill_work(self._t, n, c)
        if ctx.size:
            # one step: shift 0 as a scalar, so the work and the pass stay scalars
            tok_d, fl_d, att_d, kv_d = self._decode_work(self._t, ctx, 0.0, q)
            fl_d, att_d, kv_d = float(fl_d), float(att_d), float(kv_d)
        else:
            tok_d, fl_d, att_d, kv_d = 0.0, 0.0, 0.0, 0.0
        pp = self.parallelism.pp
        # Micro-batches as in the passes of each part alone: the prompt chunk's tokens
        # split as in `_prefill_dict`, one per decode request as in `decode_steps`.
        # Counting the chunk as one micro-batch made its pass faster the more decode
        # requests shared it (the tokens are spread over m micro-batches).
        m = int(min(pp, tok_p + ctx.size))
        d = self._pass(self._t, tokens=tok_p + tok_d, flops_p=fl_p, flops_d=fl_d, att_p=att_p, att_d=att_d,
                       kv_p=kv_p, kv_d=kv_d, m=max(m, 1), pp=pp, steady=True,
                       skew_p=self._dp_skew(self._t, n, c, tok_p, att_p))
        if self.speculative is not None:
            if ctx.size:
                d = self._combine([d, self._draft_passes(ctx, 0.0)])
            if tok_p:
                d = self._combine([d, self._draft_prefill(n, c, tok_p)])
        return d, tok_p + tok_d

    _MIXED_LINE_I = float(2 ** 20)
    # Second point of `mixed_steps`' lines, in iterations: a power of two (exact
    # division), far enough that the slopes keep ~14 significant digits.

    def mixed_steps(self, new_tokens: int, cached_tokens: int, context_lens, n_steps: int) -> StepCosts:
        """The next n_steps colocated iterations in which one prompt computes
        `new_tokens` per iteration (iteration j on top of cached_tokens + j x new_tokens)
        fused with a decode step of a fixed batch (request i has context_lens[i] + j x
        tokens_per_step at iteration j; the batch may be empty). Each iteration is
        `mixed([new], [cached + j new], contexts + j tps)`.

        Args: new_tokens >= 1, cached_tokens >= 0 (ints); context_lens: (B,) token
            counts, B >= 0; n_steps >= 1.
        Returns: StepCosts with arrays of shape (n_steps,); `bound` is the first
            iteration's.
        Raises: ValueError on counts out of range.

        Without speculative decoding or sliding-window layers an iteration's compute
        and memory times, FLOPs and bytes are affine in j (the prompt's cached tokens
        and the batch's context sum both grow linearly; token counts and micro-batches
        are fixed) and the time is max(compute, memory) + a constant (see
        `_decode_line`): the lines come from `mixed` at j = 0 and j = `_MIXED_LINE_I`.
        Otherwise each iteration is priced by `mixed`.
        """
        new_tokens, cached_tokens, n_steps = int(new_tokens), int(cached_tokens), int(n_steps)
        if new_tokens < 1 or cached_tokens < 0 or n_steps < 1:
            raise ValueError(f"mixed_steps: need new_tokens >= 1, cached_tokens >= 0, n_steps >= 1; got "
                             f"{new_tokens}, {cached_tokens}, {n_steps}")
        ctx = context_lens if type(context_lens) is np.ndarray else np.asarray(context_lens)
        tps = self.tokens_per_step
        new = np.array([new_tokens])

        def at(cached: int, contexts: np.ndarray) -> IterationCost:
            return self.mixed(new, np.array([cached]), contexts)

        first = at(cached_tokens, ctx)      # (checks the counts)
        if self.speculative is not None or self._t.n_slide or not self._fused:
            # the later iterations from the float counts `mixed` would make of them
            # (`_as_counts`), without checking them again
            n = np.array([float(new_tokens)])
            cf = _as_counts(ctx, "context_lens") if ctx.size else np.zeros(0)
            costs = [first] + [self._cost(*self._mixed_dict(n, np.array([float(cached_tokens + j * new_tokens)]),
                                                             cf + j * tps))
                               for j in range(1, n_steps)]
            arr = lambda k: np.array([getattr(c, k) for c in costs])  # noqa: E731
            return StepCosts(arr("time_s"), arr("flops"), arr("bytes"), arr("comm_s"), first.bound, tps,
                             busy_s=arr("device_busy_s"))
        # Slopes per iteration do not depend on where the lines start: from two
        # canonical points (nothing cached, empty contexts; then J iterations on), once
        # per (chunk, batch size), so they do not depend on which call came first.
        key = (new_tokens, ctx.size)
        slopes = self._mixed_slopes.get(key)
        if slopes is None:
            J = self._MIXED_LINE_I
            zero = np.zeros(ctx.size)
            a, b = at(0, zero), at(int(J) * new_tokens, zero + J * tps)
            slopes = self._mixed_slopes[key] = tuple((getattr(b, k) - getattr(a, k)) / J
                                                     for k in ("compute_s", "memory_s", "flops", "bytes"))
        s_compute, s_memory, s_flops, s_bytes = slopes
        rest = first.time_s - max(first.compute_s, first.memory_s)
        time = _larger_line(first.compute_s + rest, s_compute, first.memory_s + rest, s_memory, n_steps)
        busy_a = min(self.parallelism.pp, new_tokens + ctx.size) / self.parallelism.pp   # m / pp, see `mixed`
        return StepCosts(time, None, None, None, first.bound, tps,
                         lines=(first.flops, s_flops, first.bytes, s_bytes, first.comm_s),
                         busy_line=(busy_a, first.device_busy_s - busy_a * first.time_s))

    # ---- conveniences -------------------------------------------------------------------------
    def prompt_throughput(self, prompt_tokens: int, requests: int) -> dict:
        """One prompt of `prompt_tokens` alone against `requests` of them prefilled at once
        (one `prefill` iteration; on a wafer, `requests` streams through the layer regions).

        Returns {"requests", "single_tokens_per_s", "single_mfu", "aggregate_tokens_per_s",
        "aggregate_mfu", "aggregate_time_s", "gain" (aggregate over single)}; MFU is the
        pass's FLOPs over the instance's dense peak for its time.
        Raises: ValueError on prompt_tokens or requests below 1.
        """
        if int(prompt_tokens) < 1 or int(requests) < 1:
            raise ValueError(f"prompt_throughput: prompt_tokens and requests must be >= 1, got "
                             f"{prompt_tokens}, {requests}")
        n, k = int(prompt_tokens), int(requests)
        one = self.prefill([n], [0])
        many = self.prefill(np.full(k, n), 0)
        rate = k * n / many.time_s
        return {"requests": k, "single_tokens_per_s": n / one.time_s,
                "single_mfu": one.flops / (one.time_s * self.peak_flops),
                "aggregate_tokens_per_s": rate, "aggregate_mfu": many.flops / (many.time_s * self.peak_flops),
                "aggregate_time_s": many.time_s, "gain": rate * one.time_s / n}

    def decode_step(self, context_lens) -> IterationCost:
        """One decode step of the batch as an IterationCost (see `decode_steps`).

        Raises: ValueError on an empty batch or negative contexts.
        """
        c = _as_counts(context_lens, "context_lens")
        if c.size == 0:
            raise ValueError("decode_step: empty batch (no context_lens)")
        q = 1 if self.speculative is None else int(self.speculative.draft_tokens) + 1
        return self._cost(self._decode_dict(c, 0.0), c.size * q)

    def describe(self) -> dict:
        """The instance's configuration and derived rates as a plain dict."""
        par = self.parallelism
        out = {
            "model": self.model.key, "device": self.device.key, "n_devices": par.n_devices,
            "tp": par.tp, "pp": par.pp, "ep": par.ep, "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype, "compute_dtype": self.compute_dtype,
            "attention_dtype": self.attention_dtype, "dp_attention": par.dp_attention,
            "stack": self.device.stack_label, "kv_replication": self.kv_replication,
            "max_num_seqs": self.max_num_seqs,
            "peak_flops": self.peak_flops, "memory_bandwidth_Bps": self.memory_bandwidth,
            "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
            "tokens_per_step": self.tokens_per_step,
            "prompt_token_layer_s": self.device.prompt_token_layer_s,
        }
        if self.speculative is not None:
            s = self.speculative
            out["speculative"] = {"method": s.method, "draft_tokens": s.draft_tokens,
                                  "acceptance_rate": s.acceptance_rate,
                                  "draft_model": self.draft.key if self.draft is not None else None}
        return out

    def __repr__(self) -> str:
        p = self.parallelism
        return (f"CostModel({self.model.key} on {p.n_devices} x {self.device.key}, tp={p.tp} pp={p.pp} "
                f"ep={p.ep}, weights {self.weight_dtype}, KV {self.kv_dtype})")


__all__ = ["BOUNDS", "CostModel", "IterationCost", "Parallelism", "SpeculativeConfig", "StepCosts"]
