"""Hardware and model specifications (pydantic) and the quantities derived from them.

Units are SI throughout: bytes, bytes/s, FLOP, FLOP/s, seconds, watts. Field names say
the unit where it is not obvious (`memory_bandwidth_Bps`, `layer_latency_s`).

`HardwareSpec` describes one device (a GPU, or one wafer-scale system); `ModelSpec`
describes a transformer's shape, from which parameter counts, weight bytes, KV bytes
per token and FLOPs per token are derived. Catalog entries live in TOML files under
`devices/catalog/` (see `devices.catalog`), each number with its source.

Derived-value conventions (documented once, used everywhere):
- parameter counts cover every weight matrix and norm vector; biases, attention
  sinks and router biases (< 0.01 % of any catalog model) are left out;
- *active* parameters are those a token multiplies by: all attention and dense
  weights, the shared experts, the router, `n_active_experts` routed experts per MoE
  layer and the output projection (LM head). The input embedding is a table lookup
  (one row read per token), so it is not active. This is the convention of the
  gpt-oss model card (5.1 B active) and of DeepSeek-V3 (37 B); Qwen3 counts the
  input embedding as well (22.1 B quoted vs 21.6 B here);
- FLOPs per token = 2 x active parameters + attention (QK^T and AV):
  2 x n_heads x (d_qk + d_v) per layer per attended position;
- KV bytes per token: GQA 2 x layers x kv_heads x head_dim x bytes; MLA
  layers x (kv_lora_rank + qk_rope_head_dim) x bytes (the compressed latent and the
  shared RoPE key, as DeepSeek-V3 caches them). Sliding-window layers store at most
  `sliding_window` tokens; `kv_bytes_per_token` counts every layer (an upper bound,
  exact up to the window), `kv_bytes_for_context` is exact.
"""

from __future__ import annotations

import math
import re
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Dtype = Literal["bf16", "fp8", "fp4"]
#: Dtype names in decreasing precision.
DTYPES: tuple[str, ...] = ("bf16", "fp8", "fp4")
#: Bytes per element. FP4 block scales (MXFP4: one byte per 32 values, +3 %) are not
#: counted: the catalog's weight sizes are element counts x these widths.
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
#: Activations travel between devices in 16-bit (TP all-reduce, EP all-to-all, PP hops).
ACTIVATION_BYTES = 2.0


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype` ("bf16" 2, "fp8" 1, "fp4" 0.5).

    Raises:
        ValueError: unknown dtype name.
    """
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}") from None


class _Spec(BaseModel):
    # no NaN or infinite figure (a device file may say `memory_bandwidth_Bps = inf`)
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


class Efficiency(_Spec):
    """Fraction of a device's peak that real kernels sustain, per phase.

    Defaults are sourced (see `reference/hardware.md`): sustained FP8 GEMM on GB200
    reaches ~55 % of peak [M]; decode memory-bandwidth utilisation in tuned stacks is
    60-85 % [E] (HBM achieved 92 % of peak in a microbenchmark [M]); collectives reach
    ~80 % of link bandwidth [E]. Catalog entries tune only these factors, per device,
    and say why in a comment.
    """

    prefill_compute: float = Field(0.55, gt=0, le=1, description="prefill FLOP/s / peak")
    prefill_memory: float = Field(0.80, gt=0, le=1, description="prefill bytes/s / peak bandwidth")
    decode_compute: float = Field(0.55, gt=0, le=1, description="decode FLOP/s / peak")
    decode_memory: float = Field(0.75, gt=0, le=1, description="decode bytes/s / peak bandwidth")
    communication: float = Field(0.80, gt=0, le=1, description="collective bytes/s / link bandwidth")
    fp4_compute: Optional[float] = Field(
        None, gt=0, le=1, description="prefill and decode FLOP/s / the FP4 peak when the weights are FP4, for a "
        "stack whose FP4 GEMMs run another kernel family than its FP8 ones (B300 SGLang as InferenceX launches "
        "it: FP8 without JIT DeepGEMM, FP4 through flashinfer's TRT-LLM kernels); None: prefill_compute and "
        "decode_compute for every dtype")

    prefill_attention_compute: Optional[float] = Field(
        None, gt=0, le=1, description="prompt-pass attention FLOP/s / the attention dtype's peak, for a stack "
        "whose prefill attention kernel (FlashInfer, FlashAttention, TRT-LLM MLA) sustains another fraction than "
        "its GEMMs: the term 8k prompts tell from 1k ones (attention grows with the prompt squared); None: "
        "prefill_compute")

    def for_weights(self, weight_dtype: str) -> "Efficiency":
        """The efficiencies of the kernel path that serves `weight_dtype` weights: with
        FP4 weights and `fp4_compute` set, prefill and decode compute take it; else
        these efficiencies unchanged (self)."""
        if weight_dtype == "fp4" and self.fp4_compute is not None:
            return self.model_copy(update={"prefill_compute": self.fp4_compute, "decode_compute": self.fp4_compute})
        return self


#: Collectives a `CollectiveTable` can describe, with the nccl-tests bus-bandwidth
#: factor f(n): busbw = algbw x f(n) (nccl-tests doc/PERFORMANCE.md), so the time of
#: a collective over S bytes (the nccl-tests "size") is latency + S x f(n) / busbw.
COLLECTIVE_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def _interp_log2(table: dict[int, float], n: int) -> float:
    """table[n], linearly interpolated in log2(n) between measured group sizes and held
    flat beyond the largest and below the smallest."""
    if n in table:
        return table[n]
    keys = sorted(table)
    if n <= keys[0]:
        return table[keys[0]]
    if n >= keys[-1]:
        return table[keys[-1]]
    hi = next(k for k in keys if k > n)
    lo = max(k for k in keys if k < n)
    w = (math.log2(n) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return table[lo] + w * (table[hi] - table[lo])


class CollectiveTable(_Spec):
    """Measured time of one collective on a fabric, per group size n (GPUs).

    `latency_us[n]`: time of a small message (the flat part of an nccl-tests /
    rccl-tests curve, us); `busbw_GBps[n]`: the bus bandwidth large messages reach
    (GB/s, nccl-tests' "busbw"). Time of a collective over S bytes:
        t(S, n) = latency_us[n] x 1e-6 + S x f(n) / (busbw_GBps[n] x 1e9)
    with f(n) from `COLLECTIVE_FACTORS` (2 (n-1)/n for all-reduce, (n-1)/n otherwise).
    Group sizes between two measured ones are interpolated in log2(n); beyond the
    table the nearest measured size is used. Each catalog table names its source.

    Raises:
        pydantic.ValidationError: an empty table, a group size below 2, a
            non-positive latency or bandwidth, or different group sizes in the two.
    """

    latency_us: dict[int, float]
    busbw_GBps: dict[int, float]

    @model_validator(mode="after")
    def _check(self) -> "CollectiveTable":
        if not self.latency_us or set(self.latency_us) != set(self.busbw_GBps):
            raise ValueError("latency_us and busbw_GBps must give the same, non-empty, group sizes")
        for name in ("latency_us", "busbw_GBps"):
            for n, v in getattr(self, name).items():
                if n < 2 or not (v > 0 and math.isfinite(v)):
                    raise ValueError(f"{name}[{n}] must be a positive figure for a group of >= 2, got {v!r}")
        return self

    def parts(self, kind: str, nbytes, n: int) -> tuple:
        """(transfer s, latency s) of collective `kind` over `nbytes` (the nccl-tests
        size; array ok) among `n` devices; both 0 for n = 1."""
        if n <= 1:
            return 0.0 * nbytes, 0.0 * nbytes
        f = COLLECTIVE_FACTORS[kind](n)
        return (nbytes * f / (_interp_log2(self.busbw_GBps, n) * 1e9),
                _interp_log2(self.latency_us, n) * 1e-6 + 0.0 * nbytes)


class StackInfo(_Spec):
    """Which serving software a catalog entry's latencies, efficiencies and scheduler
    defaults describe: `key` (what a scenario pool's `stack` names), the framework, its
    version and other names it is known by."""

    key: str = Field("", description="short name a pool's `stack` field uses, e.g. 'sglang'")
    framework: str = ""
    version: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """"SGLang 0.5.9", or the key, or "" when unnamed."""
        return " ".join(x for x in (self.framework or self.key, self.version) if x)


class HardwareSpec(_Spec):
    """One device: a GPU, or one wafer-scale system (kind "wafer").

    Capacities and rates are per device; an instance of N devices multiplies them.
    Peak FLOP/s are dense figures per dtype; `dense_fraction` scales a quoted peak whose
    dense/sparse status is uncertain (CS-3's "125 PFLOP/s peak AI"). A dtype the device
    lacks (FP4 on H100, FP8 on A100) computes at the next wider one it has, while its
    bytes stay narrow (weight-only quantisation).

    A catalog entry is hardware *running a software stack* (`stack`, the
    `software_stack` description): the efficiencies, the fixed latencies and the
    scheduler defaults below belong to the stack, so a stack variant is an entry that
    `extends` the hardware and overrides them (cs3 / cs3-2024q4, h200 / h200-sglang).
    A hardware entry names its `default_stack` (the variant a bare device name means).

    Latency terms model what a roofline misses (each paid in full, not overlapped):
    `layer_latency_s` per layer per pass of a micro-batch (GPUs: the chain of kernel
    launches, norms and small kernels of a CUDA-graph decode pass; the wafer: moving
    activations across the wafer and synchronising); `moe_layer_latency_s` per MoE
    layer per pass on top (router GEMM, top-k, token permute/unpermute, grouped-GEMM
    launches); `prefill_layer_latency_s` per layer of a pass that computes prompt
    tokens (eager launches, no CUDA graph: vLLM and SGLang capture decode only);
    `iteration_overhead_s` per iteration (scheduling, sampling, detokenising: CPU time
    the GPU waits for); `pipeline_hop_latency_s` per hop between pipeline stages;
    `prompt_token_layer_s` (wafer only; 0 elsewhere): a wafer keeps every layer's weights
    in its own region of PEs, so a prompt's tokens stream through the layers one after
    another, each occupying a layer's region for this long (its activations broadcast
    over the region's fabric and its partial sums reduced, as a decode token's are): a
    prompt of n tokens takes the first token's latency through every layer plus (n - 1)
    x this, plus its FLOPs at the prefill efficiency (`CostModel.prefill`). That is
    one request's stream; the prompts of several requests stream through the same
    regions at once, each region interleaving up to `prompt_streams` of them (None: as
    many as the scheduler sends, bounded by the regions' arithmetic at the prefill
    efficiency; 1: one stream at a time, the prompts' tokens queue behind one another);
    `request_latency_s` per request, outside the GPUs: the serving front end's HTTP,
    tokenisation and streaming of the first token, which a client's TTFT holds (a
    fixed stage, `rack.measure.breakdown`, in the replays of measured rows);
    `disagg_request_latency_s` per request of a disaggregated deployment on top of it:
    the disaggregated front end (Dynamo's, MoRI's) routes the request to a prefill
    worker and hands it to a decode worker (KV-transfer setup, the decode side's
    admission and first step's dispatch) beyond the KV bytes the link model moves;
    fitted on the disaggregated rows of a stack (0 where a stack has none: unmeasured).
    Collectives come from `collectives` (measured tables, per fabric and group size)
    within the scale-up domain, else from the alpha-beta link figures.

    Scheduler defaults of the stack: `max_num_seqs` (requests an instance runs at
    once: vLLM's max_num_seqs, SGLang's max_running_requests, TensorRT-LLM's
    max_batch_size); `mixed_prefill` (True: prompt chunks are fused with the decode
    step in one iteration, as vLLM and TensorRT-LLM do; False: prefill batches run as
    passes of their own between decode steps, SGLang's default).

    Kernel terms: `attention_dtype` (the dtype attention computes in; None: the
    weights' compute dtype, but never narrower than fp8: no serving stack runs
    attention in FP4); `moe_tile_tokens` (a grouped GEMM pads each touched expert's
    rows to its M tile: the efficiency of expert GEMMs against tokens per expert);
    `attention_context_half_tokens` (decode attention runs at ctx / (ctx + this) of
    the memory roofline: split-KV kernels pay a fixed cost per request and layer).

    Capacities may be given in the datasheet's unit: `memory_gib` (HBM capacities are
    binary: an "80 GB" H100 holds 80 GiB) or `memory_bytes`.

    Raises:
        pydantic.ValidationError: a field is missing, of the wrong type, or out of
            range (e.g. a zero or negative capacity), naming the field.
    """

    key: str = Field(min_length=1, description="catalog key, lower case")
    name: str = Field(min_length=1, description="display name")
    kind: Literal["gpu", "wafer"] = "gpu"
    vendor: str = ""
    description: str = ""
    software_stack: str = Field("", description="the software stack, in words")
    stack: StackInfo = StackInfo()
    default_stack: str = Field("", description="hardware entries: the stack a bare device name means")
    borrowed_from: str = Field("", description="the catalog entry whose software terms this entry runs "
                               "(its `stack_from`, or the stack `devices.borrow` lent); '' : its own")
    aliases: tuple[str, ...] = ()

    memory_bytes: float = Field(gt=0, description="memory capacity per device (bytes)")
    memory_bandwidth_Bps: float = Field(gt=0, description="memory bandwidth per device (bytes/s)")
    peak_flops: dict[Dtype, float] = Field(description="dense peak FLOP/s per dtype; bf16 required")
    dense_fraction: float = Field(1.0, gt=0, le=1, description="dense share of the quoted peak")
    efficiency: Efficiency = Efficiency()

    scale_up_bandwidth_Bps: float = Field(0.0, ge=0, description="scale-up fabric, per device, per direction (bytes/s)")
    scale_up_latency_s: float = Field(0.0, ge=0, description="latency of one scale-up collective step (s)")
    scale_up_domain: int = Field(1, ge=1, description="devices sharing the scale-up fabric")
    scale_out_bandwidth_Bps: float = Field(gt=0, description="scale-out NIC bandwidth per device (bytes/s)")
    scale_out_latency_s: float = Field(5e-6, ge=0, description="latency of one scale-out message (s)")

    collectives: dict[Collective, CollectiveTable] = Field(
        default_factory=dict, description="measured collective times within the scale-up domain")

    weight_load_Bps: float = Field(
        25e9, gt=0, description="rate at which a (re)started device loads its weights (bytes/s); default: "
        "host memory over PCIe Gen4 x16, ~25 GB/s measured host-to-device")
    layer_latency_s: float = Field(0.0, ge=0, description="latency per layer per micro-batch pass (s)")
    moe_layer_latency_s: float = Field(0.0, ge=0, description="extra latency per MoE layer per pass (s)")
    prefill_layer_latency_s: float = Field(0.0, ge=0, description="extra latency per layer of a pass with prompt tokens (s)")
    prompt_token_layer_s: float = Field(
        0.0, ge=0, description="wafer: time a prompt token occupies one layer's PE region as prompt tokens "
        "stream through the layers (s); 0: prompts run as micro-batched passes (GPUs)")
    prompt_streams: Optional[int] = Field(
        None, ge=1, description="wafer: prompt streams (requests) a layer region interleaves; None: no cap "
        "but the regions' arithmetic; 1: prompts stream one after another")
    pipeline_hop_latency_s: float = Field(0.0, ge=0, description="latency per pipeline hop between devices (s)")
    iteration_overhead_s: float = Field(0.0, ge=0, description="fixed cost per iteration (s)")
    request_latency_s: float = Field(0.0, ge=0, description="API server time in every request's TTFT (s)")
    disagg_request_latency_s: float = Field(
        0.0, ge=0, description="extra time in every request's TTFT when prefill and decode run on separate "
        "instances: the disaggregated front end's routing and the prefill-to-decode handoff (s)")
    max_num_seqs: Optional[int] = Field(None, ge=1, description="stack's default cap on requests per instance")
    mixed_prefill: bool = Field(True, description="prompt chunks fused with the decode step in one iteration")
    attention_dtype: Optional[Dtype] = Field(None, description="dtype attention computes in (None: weights', >= fp8)")
    moe_tile_tokens: int = Field(1, ge=1, description="grouped-GEMM M tile: rows per touched expert are padded to it")
    attention_context_half_tokens: float = Field(
        0.0, ge=0, description="decode attention efficiency ctx / (ctx + this)")
    activation_reserve_fraction: float = Field(
        0.10, ge=0, lt=1, description="share of memory kept for activations/workspace")
    kv_profile_overhead_gb: Optional[float] = Field(
        None, ge=0, description="per GPU, the memory beyond the weight bytes a stack that sizes its KV cache "
        "as a fraction of the memory left after a profiling forward (TensorRT-LLM's free_gpu_memory_fraction) "
        "finds in use: the forward's activation peak, workspaces, CUDA-graph pools, communication buffers, the "
        "CUDA context (GB; None: the activation reserve alone sizes the KV cache)")

    idle_w: float = Field(ge=0, description="power when idle (W)")
    peak_w: float = Field(gt=0, description="power at full load (W)")
    price_per_hour_usd: Optional[float] = Field(None, ge=0, description="rental price per device-hour")

    @model_validator(mode="before")
    @classmethod
    def _memory_in_datasheet_unit(cls, data):
        if isinstance(data, dict) and "memory_gib" in data:
            data = dict(data)
            gib = data.pop("memory_gib")
            if "memory_bytes" in data:
                raise ValueError("give memory_gib or memory_bytes, not both")
            if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0:
                raise ValueError(f"memory_gib must be a positive number of GiB, got {gib!r}")
            data["memory_bytes"] = float(gib) * 2.0 ** 30
        return data

    @field_validator("peak_flops")
    @classmethod
    def _check_peaks(cls, v: dict) -> dict:
        if "bf16" not in v:
            raise ValueError("peak_flops must give a 'bf16' figure (the fallback for missing dtypes)")
        for dt, f in v.items():
            if not (f > 0 and math.isfinite(f)):
                raise ValueError(f"peak_flops.{dt} must be a positive FLOP/s figure, got {f!r}")
        return v

    @model_validator(mode="after")
    def _check_consistency(self) -> "HardwareSpec":
        if self.idle_w > self.peak_w:
            raise ValueError(f"idle_w ({self.idle_w} W) exceeds peak_w ({self.peak_w} W)")
        if self.scale_up_domain > 1 and self.scale_up_bandwidth_Bps <= 0:
            raise ValueError(
                f"scale_up_domain is {self.scale_up_domain} but scale_up_bandwidth_Bps is 0: "
                "give the fabric's bandwidth or set scale_up_domain = 1")
        return self

    @property
    def stack_label(self) -> str:
        """The stack in a few words for summaries: "SGLang 0.5.9" or the description,
        with "(terms of <entry>)" when its software terms are borrowed."""
        label = self.stack.label or self.software_stack
        return f"{label} (terms of {self.borrowed_from})" if self.borrowed_from else label

    def software_stack_for(self, model: "ModelSpec") -> str:
        """`software_stack` with only the kernels `model` runs: the items after the
        colon (split at ", ", " and ", "/") naming MLA are dropped for a model without
        MLA, those naming MoE or expert parallelism (MoE, DeepEP, expert) for a dense
        model. "SGLang 0.5.9: CUDA-graph decode, FlashInfer MLA, fused-MoE Triton
        kernels, custom all-reduce" for Llama is "SGLang 0.5.9: CUDA-graph decode,
        custom all-reduce"."""
        head, sep, tail = self.software_stack.partition(": ")
        if not sep:
            return self.software_stack
        unused = []
        if model.mla is None:
            unused.append(re.compile(r"\bMLA\b"))
        if model.moe is None:
            unused.append(re.compile(r"MoE|DeepEP|expert", re.IGNORECASE))

        def keep(part: str) -> bool:
            return not any(p.search(part) for p in unused)

        items = []
        for item in tail.split(", "):
            parts = [q for q in re.split(r" and |/", item) if keep(q)]
            if len(parts) == len(re.split(r" and |/", item)):
                items.append(item)
            elif parts:
                items.append(" and ".join(parts))
        return head + sep + ", ".join(items) if items else head

    def for_weights(self, weight_dtype: str) -> "HardwareSpec":
        """This entry as it serves `weight_dtype` weights: its efficiencies those of the
        stack's kernel path for that dtype (`Efficiency.for_weights`); self when the
        stack runs one path for every dtype."""
        eff = self.efficiency.for_weights(weight_dtype)
        return self if eff is self.efficiency else self.model_copy(update={"efficiency": eff})

    def attention_compute_dtype(self, weight_dtype: str) -> str:
        """The dtype attention computes in for `weight_dtype` weights: the stack's
        `attention_dtype`, else the weights' compute dtype widened to at least fp8."""
        dt = self.attention_dtype or weight_dtype
        if dt == "fp4":
            dt = "fp8"
        return self.compute_dtype(dt)

    def collective_parts(self, kind: str, nbytes, n: int, efficiency: float = 1.0) -> tuple:
        """(transfer s, latency s) of collective `kind` over `nbytes` (the nccl-tests
        size; array ok) among n devices: the measured table for n within the scale-up
        domain; otherwise an alpha-beta estimate on the link (`link(n)`): ceil(log2 n)
        steps of its latency (twice for an all-reduce: a tree up and down) and the
        bytes at its bandwidth x `efficiency`. Both 0 for n = 1."""
        if n <= 1:
            return 0.0 * nbytes, 0.0 * nbytes
        table = self.collectives.get(kind)
        if table is not None and n <= self.scale_up_domain:
            return table.parts(kind, nbytes, n)
        bw, lat = self.link(n)
        steps = 2 if kind == "all_reduce" else 1
        return (nbytes * COLLECTIVE_FACTORS[kind](n) / (bw * efficiency),
                steps * math.ceil(math.log2(n)) * lat + 0.0 * nbytes)

    @property
    def unit_name(self) -> str:
        """What one device is called in messages: "GPUs" or "systems"."""
        return "systems" if self.kind == "wafer" else "GPUs"

    def compute_dtype(self, dtype: str) -> str:
        """The dtype the device computes in for `dtype` operands: `dtype` itself if it
        has a peak for it, else the next wider one (fp4 -> fp8 -> bf16)."""
        i = DTYPES.index(dtype) if dtype in DTYPES else -1
        if i < 0:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        for dt in reversed(DTYPES[: i + 1]):
            if dt in self.peak_flops:
                return dt
        return "bf16"

    def dense_peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of one device computing with `dtype` operands."""
        return self.peak_flops[self.compute_dtype(dtype)] * self.dense_fraction

    def link(self, group: int) -> tuple[float, float]:
        """(bandwidth bytes/s per direction, latency s) for traffic within a group of
        `group` devices: the scale-up fabric if the group fits in one scale-up domain,
        else the scale-out NIC."""
        if group <= self.scale_up_domain and self.scale_up_bandwidth_Bps > 0:
            return self.scale_up_bandwidth_Bps, self.scale_up_latency_s
        return self.scale_out_bandwidth_Bps, self.scale_out_latency_s


class MoESpec(_Spec):
    """Mixture-of-experts layout. Dense layers come first (DeepSeek's
    `first_k_dense_replace`) and use the model's `ffn_size`; the others are MoE."""

    n_routed_experts: int = Field(gt=0)
    n_active_experts: int = Field(gt=0, description="routed experts per token (top-k)")
    n_shared_experts: int = Field(0, ge=0)
    expert_ffn_size: int = Field(gt=0, description="intermediate size of one expert")
    n_dense_layers: int = Field(0, ge=0)
    topk_group: Optional[int] = Field(None, gt=0, description="node-limited routing (DeepSeek-V3 config.json "
                                      "`topk_group`): a token's experts lie in at most this many of the "
                                      "`n_group` expert groups; None: no limit")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.n_active_experts > self.n_routed_experts:
            raise ValueError(f"n_active_experts ({self.n_active_experts}) exceeds "
                             f"n_routed_experts ({self.n_routed_experts})")
        return self


class MLASpec(_Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""

    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    q_lora_rank: Optional[int] = Field(None, gt=0, description="None: direct query projection")


class ModelSpec(_Spec):
    """A decoder-only transformer's shape (from its config.json).

    Raises:
        pydantic.ValidationError: missing/invalid field, naming it.
    """

    key: str = Field(min_length=1)
    name: str = Field(min_length=1)
    description: str = ""
    aliases: tuple[str, ...] = ()

    n_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn_size: int = Field(ge=0, description="dense FFN intermediate size (0 if every layer is MoE)")
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    ffn_matrices: int = Field(3, ge=2, le=3, description="3 for gated (SwiGLU) FFNs, 2 otherwise")
    moe: Optional[MoESpec] = None
    mla: Optional[MLASpec] = None
    sliding_window: Optional[int] = Field(None, gt=0, description="window of the sliding-window layers (tokens)")
    n_sliding_layers: int = Field(0, ge=0)
    native_dtype: Optional[Dtype] = Field(
        None, description="dtype the weights ship in (config.json torch_dtype / quantization_config): what "
        "`rack estimate` assumes by default; None: unknown (bf16)")
    max_context_tokens: Optional[int] = Field(
        None, gt=0, description="longest context (prompt + output tokens) the model serves: config.json "
        "max_position_embeddings, or the model card; None: unknown (no limit is enforced)")
    published_params_total: Optional[float] = Field(None, gt=0, description="vendor's total parameter count")
    published_params_active: Optional[float] = Field(None, gt=0, description="vendor's active parameter count")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.n_kv_heads > self.n_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) exceeds n_heads ({self.n_heads})")
        if self.n_sliding_layers > self.n_layers:
            raise ValueError(f"n_sliding_layers ({self.n_sliding_layers}) exceeds n_layers ({self.n_layers})")
        if self.n_sliding_layers and self.sliding_window is None:
            raise ValueError("n_sliding_layers > 0 needs sliding_window")
        if self.moe is not None and self.moe.n_dense_layers > self.n_layers:
            raise ValueError(f"moe.n_dense_layers ({self.moe.n_dense_layers}) exceeds n_layers")
        if self.n_dense_layers > 0 and self.ffn_size == 0:
            raise ValueError(f"{self.n_dense_layers} dense layers need ffn_size > 0")
        return self

    # ---- layer structure -------------------------------------------------------
    @property
    def n_moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts."""
        return 0 if self.moe is None else self.n_layers - self.moe.n_dense_layers

    @property
    def n_dense_layers(self) -> int:
        """Layers with a dense FFN of `ffn_size`."""
        return self.n_layers - self.n_moe_layers

    @property
    def n_full_attention_layers(self) -> int:
        return self.n_layers - self.n_sliding_layers

    # ---- parameter counts --------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        """Projection weights of one attention block (plus MLA's latent norms)."""
        h, H = self.hidden_size, self.n_heads
        if self.mla is None:
            d = self.head_dim
            return h * H * d + 2 * h * self.n_kv_heads * d + H * d * h
        m = self.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            q = h * H * qk
        else:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
            + m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim)
        o = H * m.v_head_dim * h
        return q + kv + o

    @property
    def dense_ffn_params(self) -> int:
        return self.ffn_matrices * self.hidden_size * self.ffn_size

    @property
    def expert_params(self) -> int:
        """One routed expert (0 without MoE)."""
        return 0 if self.moe is None else self.ffn_matrices * self.hidden_size * self.moe.expert_ffn_size

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer."""
        return 0 if self.moe is None else self.moe.n_shared_experts * self.expert_params

    @property
    def router_params(self) -> int:
        return 0 if self.moe is None else self.hidden_size * self.moe.n_routed_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Weights of the output projection as a matmul (vocab x hidden), tied or not."""
        return self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        return (2 * self.n_layers + 1) * self.hidden_size

    @property
    def params_total(self) -> int:
        """All parameters (tied embeddings counted once)."""
        moe = 0
        if self.moe is not None:
            moe = self.n_moe_layers * (self.moe.n_routed_experts * self.expert_params
                                       + self.shared_expert_params + self.router_params)
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return (self.n_layers * self.attention_params_per_layer + self.n_dense_layers * self.dense_ffn_params
                + moe + self.embedding_params + head + self.norm_params)

    @property
    def params_active(self) -> int:
        """Parameters one token multiplies by (see the module docstring)."""
        return self.active_linear_params + self.lm_head_params + self.norm_params

    @property
    def active_linear_params(self) -> int:
        """Per-token matmul weights of the layers (no LM head, no norms)."""
        moe = 0
        if self.moe is not None:
            moe = self.n_moe_layers * (self.moe.n_active_experts * self.expert_params
                                       + self.shared_expert_params + self.router_params)
        return self.n_layers * self.attention_params_per_layer + self.n_dense_layers * self.dense_ffn_params + moe

    @property
    def pass_resident_params(self) -> int:
        """Weights every forward pass reads whatever its tokens: attention, dense FFNs,
        shared experts, routers, norms and the LM head (routed experts are extra,
        see `expected_distinct_experts`)."""
        moe = 0 if self.moe is None else self.n_moe_layers * (self.shared_expert_params + self.router_params)
        return (self.n_layers * self.attention_params_per_layer + self.n_dense_layers * self.dense_ffn_params
                + moe + self.lm_head_params + self.norm_params)

    def expected_distinct_experts(self, tokens) -> np.ndarray:
        """Expected routed experts touched per MoE layer by `tokens` tokens (array ok).

        With top-k routing spread uniformly over E experts, an expert is missed by one
        token with probability 1 - k/E, so E x (1 - (1 - k/E)^T) experts are touched by T
        tokens: k for one token, approaching E for large batches. Real routers are
        skewed, which touches fewer; uniform is the upper bound for a given T.
        """
        t = np.asarray(tokens, dtype=float)
        if self.moe is None:
            return np.zeros_like(t)
        E, k = self.moe.n_routed_experts, self.moe.n_active_experts
        return E * -np.expm1(t * math.log1p(-k / E)) if k < E else np.where(t > 0, float(E), 0.0)

    def weight_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all weights stored at `dtype`."""
        return int(round(self.params_total * dtype_bytes(dtype)))

    # ---- KV cache ----------------------------------------------------------------------
    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token per layer: 2 x kv_heads x head_dim (K and V), or
        kv_lora_rank + qk_rope_head_dim for MLA."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """KV bytes per token over all layers at `dtype` (16-bit values match
        `reference/hardware.md`). Sliding-window layers are counted in full: exact for
        contexts up to the window, an upper bound beyond."""
        return int(round(self.n_layers * self.kv_elements_per_token_per_layer * dtype_bytes(dtype)))

    def kv_bytes_for_context(self, context, dtype: str = "bf16") -> np.ndarray:
        """KV bytes held for one request of `context` tokens (array ok): full-attention
        layers keep every token, sliding-window layers at most `sliding_window`."""
        c = np.asarray(context, dtype=float)
        per = self.kv_elements_per_token_per_layer * dtype_bytes(dtype)
        held = self.n_full_attention_layers * c
        if self.n_sliding_layers:
            held = held + self.n_sliding_layers * np.minimum(c, self.sliding_window)
        return held * per

    # ---- FLOPs ------------------------------------------------------------------------------
    @property
    def attention_flops_per_position(self) -> int:
        """FLOPs of QK^T and AV for one query token attending one position in one layer:
        2 x n_heads x (d_qk + d_v). MLA uses its uncompressed head dims."""
        if self.mla is None:
            return 2 * self.n_heads * 2 * self.head_dim
        m = self.mla
        return 2 * self.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)

    @property
    def decode_attention_flops_per_position(self) -> int:
        """FLOPs per attended position per layer of a decode step. MLA decodes in the
        absorbed form (DeepSeek-V2 report, section 2.1.3; FlashMLA): the query is
        projected into the latent space, so QK^T runs over kv_lora_rank +
        qk_rope_head_dim and AV over kv_lora_rank: 2 x heads x (2 kv_lora_rank + rope).
        GQA: as `attention_flops_per_position`."""
        if self.mla is None:
            return self.attention_flops_per_position
        m = self.mla
        return 2 * self.n_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)

    def kv_replication(self, tp: int) -> int:
        """Copies of each token's KV across a tensor-parallel group of `tp` devices.

        GQA shards KV heads over the group; with more devices than KV heads each head
        is held by tp / n_kv_heads of them (vLLM replicates KV heads so). MLA's cached
        latent has no head dimension, so every device of the group keeps all of it
        (the reason SGLang and TensorRT-LLM serve DeepSeek with data-parallel attention)."""
        if tp <= 1:
            return 1
        if self.mla is not None:
            return int(tp)
        return max(1, int(tp) // self.n_kv_heads)

    @property
    def attention_weight_params(self) -> int:
        """Weights of every attention block (what data-parallel attention replicates)."""
        return self.n_layers * self.attention_params_per_layer

    def flops_per_token(self, context) -> np.ndarray:
        """Forward FLOPs for one new token whose query attends `context` positions
        (itself included; array ok): 2 x active params + attention, with sliding-window
        layers capped at their window."""
        c = np.asarray(context, dtype=float)
        pos = self.n_full_attention_layers * c
        if self.n_sliding_layers:
            pos = pos + self.n_sliding_layers * np.minimum(c, self.sliding_window)
        return 2.0 * self.params_active + self.attention_flops_per_position * pos

    def summary(self) -> dict:
        """Derived figures as a plain dict (parameters, bytes at each dtype)."""
        return {
            "params_total": self.params_total,
            "params_active": self.params_active,
            "weight_bytes": {dt: self.weight_bytes(dt) for dt in DTYPES},
            "kv_bytes_per_token": {dt: self.kv_bytes_per_token(dt) for dt in DTYPES},
        }


__all__ = [
    "ACTIVATION_BYTES", "COLLECTIVE_FACTORS", "CollectiveTable", "DTYPES", "DTYPE_BYTES", "Dtype",
    "Efficiency", "HardwareSpec", "MLASpec", "StackInfo",
    "MoESpec", "ModelSpec", "dtype_bytes",
]
