"""From a scenario to components: which cores a run needs, their constructor
arguments, and which peers each one talks to.

The result is driver-neutral: a list of `ComponentSpec`, whose keyword arguments
refer to peers through `Ref(name)` placeholders; a driver builds each core with its
peers' names (cores talk by messages, `workloads.core`), and the Ray driver also
connects each actor to the actors it sends to. Everything that can
be checked before a component starts is checked here (the model fits every pool,
every route exists), so a bad scenario fails before any actor is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from devices.catalog import resolve_device, resolve_model
from devices.costmodel import CostModel, Parallelism, SpeculativeConfig
from devices.planner import ModelDoesNotFit, plan_memory
from interconnect.link import LinkSpec

from .admission import kv_fit_of
from .faults import apply_faults
from .scenario import DEFAULT_MAX_NUM_SEQS, PoolConfig, Scenario, ScenarioError


@dataclass(frozen=True)
class Ref:
    """A placeholder for the peer component called `name`."""

    name: str


@dataclass
class ComponentSpec:
    """One core to place: `factory` is "module:Class" (a `workloads.core.Core`);
    `kwargs` may hold Refs to peers (also inside dicts and lists; a driver passes their
    names); `resources` are Ray custom resources for its actor; `weight_load_s`: a
    crash target (`rack.faults`), rebuilt after a crash and reloading its weights for
    that long (None: not restartable)."""

    name: str
    factory: str
    kwargs: dict[str, Any]
    kind: str                      # collector | router | interconnect | prefill | decode | both | faults
    pool: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    weight_load_s: float | None = None

    def refs(self) -> set[str]:
        """Names of the peers this component needs."""
        out: set[str] = set()

        def walk(v: Any) -> None:
            if isinstance(v, Ref):
                out.add(v.name)
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    walk(x)

        walk(self.kwargs)
        return out


def instance_names(pool: PoolConfig) -> list[str]:
    """Names of a pool's instances: `<pool>-<i>`."""
    return [f"{pool.name}-{i}" for i in range(pool.instances)]


def cost_model(scenario: Scenario, pool: PoolConfig) -> CostModel:
    """The cost model of one instance of `pool` (model, device, TP/PP/EP, dtypes,
    speculative decoding). Raises ScenarioError naming the pool on a bad device/model."""
    spec = None
    if pool.speculative is not None:
        s = pool.speculative
        spec = SpeculativeConfig(draft_tokens=s.draft_tokens, acceptance_rate=s.acceptance_rate,
                                 method=s.method, draft_model=s.draft_model)
    try:
        return CostModel(resolve_model(scenario.model), resolve_device(pool.device, pool.stack),
                         Parallelism(tp=pool.tp, pp=pool.pp, ep=pool.ep, dp_attention=pool.dp_attention),
                         weight_dtype=scenario.weight_dtype, kv_dtype=scenario.kv_dtype,
                         speculative=spec)
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


def context_limit(scenario: Scenario) -> int | None:
    """The run's context limit in tokens: the scenario's `max_model_len`, else the
    model's `max_context_tokens` (None if neither is known)."""
    if scenario.max_model_len is not None:
        return scenario.max_model_len
    return resolve_model(scenario.model).max_context_tokens


def build_topology(scenario: Scenario, request_ids: Sequence[int]) -> list[ComponentSpec]:
    """The components of `scenario`, in an order where each one's peers come first.

    Raises ScenarioError (pool, field and what is needed) before anything starts.
    """
    specs: list[ComponentSpec] = [ComponentSpec(
        "collector", "rack.collector:Collector", {"request_ids": list(request_ids), "notify": [Ref("router")]},
        "collector", resources=dict(scenario.placement.collector))]
    decoders = [p for p in scenario.pools if p.role == "decode"]
    prefillers = [p for p in scenario.pools if p.role == "prefill"]
    colocated = [p for p in scenario.pools if p.role == "both"]
    # Conditional disaggregation without a decode-only pool: the prefill pool ships its
    # KV to the colocated ("both") instances, which also prefill short prompts locally.
    kv_receivers = decoders if decoders else (colocated if prefillers else [])
    costs = {p.name: cost_model(scenario, p) for p in scenario.pools}
    for p in scenario.pools:
        check_fit(scenario, p, costs[p.name])

    decode_names: list[str] = []
    for p in decoders:
        for name in instance_names(p):
            decode_names.append(name)
            specs.append(ComponentSpec(name, "devices.engines.decode:DecodeEngine", {
                "name": name, "cost": costs[p.name], "collector": Ref("collector"),
                "max_batch": max_num_seqs(p, costs[p.name]), "kv_block_tokens": p.kv_block_tokens,
                "admission_policy": p.admission_policy,
                "memory_reserve_fraction": p.memory_reserve_fraction,
                "max_reserve_queue": p.max_reserve_queue, "first_token": scenario.first_token,
            }, "decode", p.name, dict(p.resources)))

    local_names: list[str] = []
    for p in colocated:
        for name in instance_names(p):
            local_names.append(name)
            if p in kv_receivers:
                decode_names.append(name)
            specs.append(ComponentSpec(name, "devices.engines.colocated:ColocatedEngine", {
                "name": name, "cost": costs[p.name], "collector": Ref("collector"),
                "chunk_tokens": p.chunk_tokens, "max_queue": p.max_queue,
                "max_batch": max_num_seqs(p, costs[p.name]), "kv_block_tokens": p.kv_block_tokens,
                "prefix_cache": p.prefix_cache, "admission_policy": p.admission_policy,
                "memory_reserve_fraction": p.memory_reserve_fraction,
                "max_reserve_queue": p.max_reserve_queue, "first_token": scenario.first_token,
            }, "both", p.name, dict(p.resources)))

    if prefillers:
        links = [LinkSpec(name=l.name, bandwidth_GBps=l.bandwidth_GBps, latency_us=l.latency_us,
                          per_message_us=l.per_message_us) for l in scenario.links]
        routes: dict[tuple[str, str], list[str]] = {}
        for l in scenario.links:
            src_pool, dst_pool = scenario.pool(l.src), scenario.pool(l.dst)
            for s in instance_names(src_pool):
                for d in instance_names(dst_pool):
                    routes.setdefault((s, d), []).append(l.name)
        for key, path in routes.items():
            if len(path) > 1:
                raise ScenarioError(f"links: more than one link from {key[0]} to {key[1]}: {path}")
        specs.append(ComponentSpec("interconnect", "interconnect.component:Interconnect", {
            "links": links, "routes": routes,
            "receivers": [Ref(d) for d in decode_names],
            "payload_scale": scenario.payload_scale,
        }, "interconnect", resources=dict(scenario.placement.interconnect)))

    prefill_names: list[str] = []
    for p in prefillers:
        for name in instance_names(p):
            prefill_names.append(name)
            specs.append(ComponentSpec(name, "devices.engines.prefill:PrefillEngine", {
                "name": name, "cost": costs[p.name], "collector": Ref("collector"),
                "interconnect": Ref("interconnect"), "decode": [Ref(d) for d in decode_names],
                "router": Ref("router"),
                "chunk_tokens": p.chunk_tokens, "max_queue": p.max_queue,
                "kv_block_tokens": p.kv_block_tokens, "prefix_cache": p.prefix_cache,
                "payload_scale": scenario.payload_scale, "layer_group": scenario.layer_group,
                "memory_reserve_fraction": p.memory_reserve_fraction, "kv_seed": scenario.seed,
                "first_token": scenario.first_token,
            }, "prefill", p.name, dict(p.resources)))

    kv_fit = {}
    for p in scenario.pools:
        # a token's KV in memory with all its copies, as the engines' block pools hold it
        fit = kv_fit_of(check_fit(scenario, p, costs[p.name]), costs[p.name].kv_held_bytes_per_token,
                        p.kv_block_tokens)
        kv_fit.update({n: fit for n in instance_names(p)})
    r = scenario.router
    specs.append(ComponentSpec("router", "rack.router:Router", {
        "collector": Ref("collector"),
        "prefill": [Ref(n) for n in prefill_names],
        "decode_targets": decode_names,
        "local": [Ref(n) for n in local_names],
        "policy": r.policy,
        "max_outstanding_tokens": r.max_outstanding_tokens,
        "local_prefill_threshold_tokens": r.local_prefill_threshold_tokens,
        "decoders": [Ref(d) for d in decode_names],
        "max_context_tokens": context_limit(scenario), "context_overflow": scenario.context_overflow,
        "kv_fit": kv_fit,
    }, "router", resources=dict(scenario.placement.router)))
    # injected faults: crash targets made restartable, plus the injector (rack.faults)
    return apply_faults(scenario, specs)
