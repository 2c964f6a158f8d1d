"""Sizing a scenario's pools: each instance's cost model, its memory plan (do the
weights fit?), its batch cap, how long a restart reloads its weights, and the run's
context limit. Used by the topology (to build the cores) and by the scenario's own
checks (`rack.wiring.load.check_hardware`); it imports the scenario schema only for
type annotations, and nothing imports it back from the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devices.catalog import resolve_model
from devices.costmodel import CostModel
from devices.planner import ModelDoesNotFit, plan_memory
from devices.uncertainty import pool_cost_model

from .settings import ScenarioError

if TYPE_CHECKING:  # pragma: no cover
    from .scenario import PoolConfig, Scenario

#: Requests an instance runs at once when neither the pool nor its stack says
#: (vLLM's max_num_seqs default on smaller GPUs, and rack's default before stacks).
DEFAULT_MAX_NUM_SEQS = 256


def instance_names(pool: PoolConfig) -> list[str]:
    """Names of a pool's instances: `<pool>-<i>`."""
    return [f"{pool.name}-{i}" for i in range(pool.instances)]


def cost_model(scenario: Scenario, pool: PoolConfig) -> CostModel:
    """The cost model of one instance of `pool` (model, device with the scenario's
    uncertain `terms` applied, TP/PP/EP, dtypes, speculative decoding:
    `devices.uncertainty.pool_cost_model`). Raises ScenarioError naming the pool on a
    bad device/model."""
    try:
        return pool_cost_model(scenario, pool)
    except (ValueError, KeyError) as exc:
        raise ScenarioError(f"pool {pool.name!r}: {exc}") from None


def max_num_seqs(pool: PoolConfig, cost: CostModel) -> int:
    """Requests one instance of `pool` runs at once: the pool's `max_num_seqs`, else
    its stack's default, else `DEFAULT_MAX_NUM_SEQS`."""
    return pool.max_num_seqs or cost.max_num_seqs or DEFAULT_MAX_NUM_SEQS


def check_fit(scenario: Scenario, pool: PoolConfig, cost: CostModel):
    """The pool's memory plan; raises ScenarioError if the weights do not fit one instance."""
    try:
        if pool.memory_reserve_fraction is None:
            return plan_memory(cost, block_size=pool.kv_block_tokens)
        return plan_memory(cost, reserve_fraction=pool.memory_reserve_fraction,
                           block_size=pool.kv_block_tokens)
    except ModelDoesNotFit as exc:
        raise ScenarioError(f"pool {pool.name!r} ({pool.device}, tp={pool.tp}, pp={pool.pp}): {exc}") from None


def weight_load_s(scenario: Scenario, pool: PoolConfig, cost: CostModel) -> float:
    """Seconds a (re)started instance of `pool` spends loading its weights before it
    serves: each device's share of the weights over its load bandwidth (the pool's
    `weight_load_GBps`, else the device's catalog `weight_load_Bps`)."""
    plan = check_fit(scenario, pool, cost)
    rate = pool.weight_load_GBps * 1e9 if pool.weight_load_GBps is not None else cost.device.weight_load_Bps
    return plan.per_device_weight_bytes / rate


def chunk_tpot_ms(scenario: Scenario, pool: PoolConfig) -> float:
    """The TPOT target (ms) `pool`'s "tpot" chunk sizes keep to: its `chunk_tpot_ms`,
    else the scenario's SLO."""
    return pool.chunk_tpot_ms if pool.chunk_tpot_ms is not None else scenario.slo.tpot_ms


def chunk_sizes(scenario: Scenario, pool: PoolConfig, cost: CostModel) -> tuple[int, int | None]:
    """(chunk_tokens, prompt_chunk_tokens) of `pool`'s engines: the pool's numbers, or
    for "tpot" the sizes whose iterations keep within its TPOT target (`chunk_tpot_ms`)
    (`devices.chunking.tpot_chunks`, at most the pool's max_num_seqs prompts at once).
    prompt_chunk_tokens None: a prompt may take the whole budget."""
    from devices.chunking import tpot_chunks

    rule = None
    if "tpot" in (pool.chunk_tokens, pool.prompt_chunk_tokens):
        rule = tpot_chunks(cost, chunk_tpot_ms(scenario, pool) * 1e-3, max_num_seqs(pool, cost))
    budget = rule["chunk_tokens"] if pool.chunk_tokens == "tpot" else pool.instance_chunk_tokens
    per = pool.prompt_chunk_tokens
    if per == "tpot" or (per is None and pool.chunk_tokens == "tpot"):
        per = rule["prompt_chunk_tokens"]
    return int(budget), (None if per is None else int(per))


def prefill_scheduling(scenario: Scenario) -> str:
    """How `scenario`'s colocated pools (role "both") schedule prompts, as a clause for
    a report, from the chunk sizes their engines get (`chunk_sizes`): what a page says
    about a deployment's scheduling is what the code does. "" when no pool prefills
    and decodes. Raises ScenarioError as `cost_model`."""
    parts = []
    for p in scenario.pools:
        if p.role != "both":
            continue
        budget, per = chunk_sizes(scenario, p, cost_model(scenario, p))
        rule = (f", sizes from a {chunk_tpot_ms(scenario, p):g} ms TPOT target"
                if "tpot" in (p.chunk_tokens, p.prompt_chunk_tokens) else "")
        if per is None or per >= budget:
            parts.append(f"piggybacks prompt chunks of up to {budget:,} tokens on its decode steps (chunked "
                         f"prefill{rule}), so a chunk holds every decoding user for its time")
        else:
            parts.append(f"piggybacks prompt chunks on its decode steps (chunked prefill{rule}): up to {per:,} "
                         f"token{'s' if per != 1 else ''} of each prompt in progress and {budget:,} tokens in all per step, every prompt "
                         "a stream of its own" + (" through the layer regions beside the decode micro-batches"
                                                   if cost_model(scenario, p).device.kind == "wafer" else ""))
    return "; ".join(parts)


def context_limit(scenario: Scenario) -> int | None:
    """The run's context limit in tokens: the scenario's `max_model_len`, else the
    model's `max_context_tokens` (None if neither is known)."""
    if scenario.max_model_len is not None:
        return scenario.max_model_len
    return resolve_model(scenario.model).max_context_tokens




__all__ = ["DEFAULT_MAX_NUM_SEQS", "check_fit", "chunk_sizes", "chunk_tpot_ms", "prefill_scheduling", "context_limit", "cost_model", "instance_names", "max_num_seqs",
           "weight_load_s"]
