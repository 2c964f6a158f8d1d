"""Memory planner: where the weights go and what is left for the KV cache.

For an instance of N = tp x pp devices the weights are split evenly (tensor parallel
within a stage, layers across stages; a stage may hold a fraction of a layer when the
layer count does not divide); data-parallel attention adds (tp - 1) copies of the
attention blocks (`CostModel.replicated_weight_bytes`). A token of context occupies
`kv_bytes_per_token x kv_replication` bytes (MLA's latent is held by every device of a
tensor-parallel group: `CostModel.kv_replication`). Each device keeps `reserve_fraction` of its memory for
activations and workspace (default: the device's `activation_reserve_fraction`,
10 % on GPUs as vLLM's gpu_memory_utilization=0.9 leaves, 2 % on the wafer whose
decode activations are a few hidden vectors per layer). The rest holds KV blocks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .costmodel import CostModel


class ModelDoesNotFit(ValueError):
    """The weights (plus the reserve) exceed the instance's memory, or leave no room
    for any KV cache. The message says what is needed and how many devices would do."""


def format_bytes(n: float) -> str:
    """Decimal units with 3 significant figures: 1.03 TB, 176 GB, 44 GB, 512 MB."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class MemoryPlan:
    """Byte budget of one instance (all its devices).

    capacity_bytes = weight_bytes + reserve_bytes + kv_bytes (+ < n bytes of rounding
    from the per-device split); weight_bytes includes replicated copies;
    kv_tokens = kv_bytes // (kv_bytes_per_token x kv_replication); kv_blocks =
    kv_tokens // block_size. per_device_* are the same
    for the most loaded device (all devices are equal under the even split).
    """

    n_devices: int
    capacity_bytes: int
    weight_bytes: int
    reserve_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int
    block_size: int
    kv_blocks: int
    reserve_fraction: float
    kv_replication: int
    per_device_capacity_bytes: int
    per_device_weight_bytes: int
    per_device_kv_bytes: int

    def max_batch(self, context_tokens: int) -> int:
        """Requests of `context_tokens` tokens whose KV fits at once (block-rounded)."""
        if context_tokens <= 0:
            raise ValueError(f"context_tokens must be > 0, got {context_tokens}")
        return self.kv_blocks // math.ceil(context_tokens / self.block_size)

    def to_dict(self) -> dict:
        return asdict(self)


def plan_memory(cost: CostModel, *, reserve_fraction: float | None = None, block_size: int = 16,
                free_fraction: float | None = None) -> MemoryPlan:
    """Split an instance's memory into weights, reserve and KV cache.

    Args:
        cost: the instance (model, device, parallelism, dtypes; its weight_bytes and
            kv_bytes_per_token include any draft model).
        reserve_fraction: share of each device's memory kept for activations and
            workspace; None: the device's `activation_reserve_fraction`.
        block_size: tokens per KV block (vLLM's default is 16).
        free_fraction: size the KV cache as TensorRT-LLM does instead (its
            `kv_cache_config.free_gpu_memory_fraction`): this share of the memory left on
            each device after the weights and the profiling forward's other memory, the
            device's `kv_profile_overhead_gb` (tensorrt_llm/_torch/pyexecutor/_util.py
            `_cal_max_tokens`: (total - peak) x fraction); the rest is the reserve. None:
            `reserve_fraction` sizes it. Ignored when the device has no
            `kv_profile_overhead_gb`.

    Raises:
        ModelDoesNotFit: e.g. "Kimi-K2 (fp8) needs 1.03 TB of weights; 4 CS-3 hold
            176 GB: use at least 24 systems".
        ValueError: reserve_fraction outside [0, 1), free_fraction outside (0, 1] or
            block_size < 1.
    """
    dev = cost.device
    rf = dev.activation_reserve_fraction if reserve_fraction is None else float(reserve_fraction)
    if not 0.0 <= rf < 1.0:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
    if free_fraction is not None and not 0.0 < float(free_fraction) <= 1.0:
        raise ValueError(f"free_fraction must be in (0, 1], got {free_fraction!r}")
    if int(block_size) < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size!r}")
    n = cost.parallelism.n_devices
    per_dev_cap = int(dev.memory_bytes)
    capacity = n * per_dev_cap
    weights = int(cost.weight_bytes) + int(getattr(cost, "replicated_weight_bytes", 0))
    rep = int(getattr(cost, "kv_replication", 1))
    per_dev_weights = math.ceil(weights / n)
    per_dev_reserve = int(per_dev_cap * rf)
    if free_fraction is not None and dev.kv_profile_overhead_gb is not None:
        # TensorRT-LLM: KV = fraction x (memory - the profiling peak); the reserve is the rest
        left = per_dev_cap - per_dev_weights - dev.kv_profile_overhead_gb * 1e9
        per_dev_reserve = int(per_dev_cap - per_dev_weights - max(0.0, float(free_fraction) * left))
        rf = per_dev_reserve / per_dev_cap
    reserve = n * per_dev_reserve
    usable_per_dev = per_dev_cap - per_dev_reserve
    need = max(1, math.ceil(weights / usable_per_dev))
    label = f"{cost.model.name} ({cost.weight_dtype})"
    if per_dev_weights > usable_per_dev:
        raise ModelDoesNotFit(
            f"{label} needs {format_bytes(weights)} of weights; {n} {dev.name} hold {format_bytes(capacity)}"
            f" ({format_bytes(n * usable_per_dev)} after the {rf:.0%} activation reserve): "
            f"use at least {need} {dev.unit_name}")
    kv_per_dev = usable_per_dev - per_dev_weights
    kv_bytes = n * kv_per_dev
    kvpt = int(cost.kv_bytes_per_token)
    kv_tokens = kv_bytes // (kvpt * rep) if kvpt else 0
    kv_blocks = kv_tokens // int(block_size)
    if kv_blocks < 1:
        raise ModelDoesNotFit(
            f"{label} fits its {format_bytes(weights)} of weights in {n} {dev.name} but leaves "
            f"{format_bytes(kv_bytes)} for the KV cache, less than one block of {block_size} tokens "
            f"({format_bytes(block_size * kvpt * rep)}): use at least {need + 1} {dev.unit_name}")
    return MemoryPlan(
        n_devices=n, capacity_bytes=capacity, weight_bytes=weights, reserve_bytes=reserve,
        kv_bytes=kv_bytes, kv_bytes_per_token=kvpt, kv_tokens=int(kv_tokens), block_size=int(block_size),
        kv_blocks=int(kv_blocks), reserve_fraction=rf, kv_replication=rep, per_device_capacity_bytes=per_dev_cap,
        per_device_weight_bytes=per_dev_weights, per_device_kv_bytes=kv_per_dev)


def devices_for_workload(cost_of, requests: int, context_tokens: int, *, reserve_fraction: float | None = None,
                         block_size: int = 16, max_devices: int = 4096) -> dict:
    """The fewest devices of an instance that hold the weights plus the KV a workload
    keeps at once: `requests` requests of `context_tokens` tokens of context each (a
    decode tier's max_num_seqs at the workload's context, or its concurrency).

    The rule: the smallest N with plan_memory(cost_of(N)).max_batch(context_tokens) >=
    requests, i.e. N x (device memory x (1 - reserve)) >= weights + requests x
    ceil(context / block) x block x KV bytes per token (x the KV's copies across TP),
    every device holding its even share of the weights. On the wafer N is the number of
    systems the layers are pipelined over (Kimi-K2.6's 513 GB of 4-bit weights need 12
    CS-3; 512 requests of 8,192 tokens of fp8 KV need more).

    Args:
        cost_of: N -> the instance's `CostModel` on N devices (raises ValueError for an
            N the model cannot be split over, which is skipped).
        requests, context_tokens: the workload (>= 1 each).
        reserve_fraction, block_size: as `plan_memory`.
        max_devices: the largest N tried.
    Returns: {"devices": N, "weight_bytes", "kv_bytes_needed", "kv_bytes" (the KV
        capacity at N), "per_device_bytes", "requests", "context_tokens",
        "weights_only_devices": the fewest N that hold the weights with at least one KV
        block}.
    Raises: ValueError on requests or context below 1, or no N up to max_devices that holds it.
    """
    if int(requests) < 1 or int(context_tokens) < 1:
        raise ValueError(f"devices_for_workload: requests and context_tokens must be >= 1, got "
                         f"{requests}, {context_tokens}")
    weights_only = None
    for n in range(1, int(max_devices) + 1):
        try:
            cost = cost_of(n)
            plan = plan_memory(cost, reserve_fraction=reserve_fraction, block_size=block_size)
        except ValueError:          # ModelDoesNotFit, or a split the model refuses
            continue
        if weights_only is None:
            weights_only = n
        if plan.max_batch(context_tokens) >= requests:
            blocks = math.ceil(context_tokens / plan.block_size)
            return {"devices": n, "weights_only_devices": weights_only, "weight_bytes": plan.weight_bytes,
                    "kv_bytes_needed": int(requests) * blocks * plan.block_size * plan.kv_bytes_per_token
                    * plan.kv_replication,
                    "kv_bytes": plan.kv_bytes, "per_device_bytes": plan.per_device_capacity_bytes,
                    "requests": int(requests), "context_tokens": int(context_tokens)}
    raise ValueError(f"devices_for_workload: {requests} requests of {context_tokens:,} tokens do not fit "
                     f"{max_devices} devices")


__all__ = ["MemoryPlan", "ModelDoesNotFit", "devices_for_workload", "format_bytes", "plan_memory"]
