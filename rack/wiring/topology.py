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

import dataclasses

from interconnect.link import LinkSpec
from rack.serving.admission import kv_fit_of

from .faults import CRASH_KINDS, resolve_target
from .scenario import Scenario, ScenarioError
from .sizing import check_fit, chunk_sizes, context_limit, cost_model, instance_names, max_num_seqs, weight_load_s


@dataclass(frozen=True)
class Ref:
    """A placeholder for the peer component called `name`."""

    name: str


@dataclass
class ComponentSpec:
    """One core to place: `factory` is "module:Class" (a `workloads.core.Core`);
    `kwargs` may hold Refs to peers (also inside dicts and lists; a driver passes their
    names); `resources` are Ray custom resources for its actor; `weight_load_s`: a
    crash target (`rack.wiring.faults`), rebuilt after a crash and reloading its weights for
    that long (None: not restartable); `host`: "module:Class" of the Ray actor that hosts
    it (None: `rack.runtime.ray_host.CoreHost`; a live front's adds its HTTP server);
    `crashes`: injected crashes aimed at it; `restarts`: real deaths of its Ray actor it
    survives (`Scenario.max_restarts`; its actor's Ray max_restarts is the sum)."""

    name: str
    factory: str
    kwargs: dict[str, Any]
    kind: str                      # collector | router | interconnect | prefill | decode | both | faults | front
    pool: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    weight_load_s: float | None = None
    host: str | None = None
    crashes: int = 0
    restarts: int = 0

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


def _host_tier(pool) -> dict:
    """A prefilling engine's host-memory KV tier arguments from its pool's settings."""
    return {"host_kv_bytes": int(pool.host_kv_gb * 1e9),
            "host_kv_Bps": None if pool.host_kv_GBps is None else pool.host_kv_GBps * 1e9}


def build_topology(scenario: Scenario, request_ids: Sequence[int]) -> list[ComponentSpec]:
    """The components of `scenario`, in an order where each one's peers come first.

    Raises ScenarioError (pool, field and what is needed) before anything starts.
    """
    specs: list[ComponentSpec] = [ComponentSpec(
        "collector", "rack.serving.collector:Collector", {"request_ids": request_ids if hasattr(request_ids, "dtype") else list(request_ids), "notify": [Ref("router")]},
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
        budget, per_prompt = chunk_sizes(scenario, p, costs[p.name])
        for name in instance_names(p):
            local_names.append(name)
            if p in kv_receivers:
                decode_names.append(name)
            specs.append(ComponentSpec(name, "devices.engines.colocated:ColocatedEngine", {
                "name": name, "cost": costs[p.name], "collector": Ref("collector"),
                "chunk_tokens": budget, "prompt_chunk_tokens": per_prompt, "max_queue": p.max_queue,
                **_host_tier(p),
                "max_batch": max_num_seqs(p, costs[p.name]), "kv_block_tokens": p.kv_block_tokens,
                "prefix_cache": p.prefix_cache, "admission_policy": p.admission_policy,
                "memory_reserve_fraction": p.memory_reserve_fraction,
                "max_reserve_queue": p.max_reserve_queue, "first_token": scenario.first_token,
                "recv_interval": p.scheduler_recv_interval,
                # SGLang's chunked-prefill budget leaves the running decodes out (ColocatedEngine)
                "decode_in_budget": costs[p.name].device.stack.key != "sglang",
            }, "both", p.name, dict(p.resources)))

    if prefillers:
        from devices.uncertainty import link_bandwidth_GBps

        # the scenario's "link.bandwidth_GBps" term, if set, sets every KV link
        links = [LinkSpec(name=l.name, bandwidth_GBps=link_bandwidth_GBps(scenario.terms, l.bandwidth_GBps),
                          latency_us=l.latency_us,
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
                "chunk_tokens": p.instance_chunk_tokens, "max_queue": p.max_queue, **_host_tier(p),
                "kv_block_tokens": p.kv_block_tokens, "prefix_cache": p.prefix_cache,
                "payload_scale": scenario.payload_scale, "layer_group": scenario.layer_group,
                "memory_reserve_fraction": p.memory_reserve_fraction, "kv_seed": scenario.seed,
                "first_token": scenario.first_token,
                # the KV-aware router learns what each instance caches from its KV events
                "kv_events": scenario.router.policy == "prefix_aware",
            }, "prefill", p.name, dict(p.resources)))

    kv_fit = {}
    for p in scenario.pools:
        # a token's KV in memory with all its copies, as the engines' block pools hold it
        fit = kv_fit_of(check_fit(scenario, p, costs[p.name]), costs[p.name].kv_held_bytes_per_token,
                        p.kv_block_tokens)
        kv_fit.update({n: fit for n in instance_names(p)})
    r = scenario.router
    specs.append(ComponentSpec("router", "rack.serving.router:Router", {
        "collector": Ref("collector"),
        "prefill": [Ref(n) for n in prefill_names],
        "decode_targets": decode_names,
        "local": [Ref(n) for n in local_names],
        "policy": r.policy,
        "prefix_weight": r.prefix_weight,
        "max_outstanding_tokens": r.max_outstanding_tokens,
        "local_prefill_threshold_tokens": r.local_prefill_threshold_tokens,
        "decoders": [Ref(d) for d in decode_names],
        "max_context_tokens": context_limit(scenario), "context_overflow": scenario.context_overflow,
        "kv_fit": kv_fit,
    }, "router", resources=dict(scenario.placement.router)))
    # injected faults: crash targets made restartable, plus the injector (rack.wiring.faults)
    return apply_faults(scenario, specs)


def apply_faults(scenario, specs: list) -> list:
    """The topology with the scenario's faults and restarts wired in: crash targets
    and, with `max_restarts`, every prefill and decode instance marked restartable
    (`ComponentSpec.weight_load_s`: a driver rebuilds them, reloading their weights for
    that long; `crashes`, `restarts`), and a `FaultInjector` core (kind "faults") after
    the router, which also recovers real deaths (`FaultInjector.instance_died`).
    Returns `specs` unchanged when there is neither."""
    restarts = scenario.max_restarts
    if not scenario.faults and not restarts:
        return specs
    faults = []
    for i, f in enumerate(scenario.faults):
        d = f.model_dump()
        d.update(index=i, instance=resolve_target(scenario, f))
        faults.append(d)
    crashes: dict[str, int] = {}
    for d in faults:
        if d["kind"] in CRASH_KINDS:
            crashes[d["instance"]] = crashes.get(d["instance"], 0) + 1
    survivors = {s.name for s in specs if s.kind in _RESTART_KIND} if restarts else set()
    load_s = {s.name: weight_load_s(scenario, scenario.pool(s.pool), s.kwargs["cost"])
              for s in specs if s.name in crashes or s.name in survivors}
    for d in faults:
        d["weight_load_s"] = load_s.get(d["instance"])
    out = []
    for s in specs:
        if s.name in load_s:
            s = dataclasses.replace(s, weight_load_s=load_s[s.name], crashes=crashes.get(s.name, 0),
                                    restarts=restarts if s.name in survivors else 0)
        out.append(s)
    names = {s.name for s in out}
    out.append(ComponentSpec("faults", "rack.serving.fault_injector:FaultInjector", {
        "faults": faults, "collector": "collector", "router": "router",
        "interconnect": "interconnect" if "interconnect" in names else None,
        "restartable": {s.name: {"kind": _RESTART_KIND[s.kind], "weight_load_s": s.weight_load_s}
                        for s in out if s.name in survivors},
    }, "faults"))
    return out


#: Components whose real deaths `max_restarts` covers, and the crash kind that records one.
_RESTART_KIND = {"decode": "decode_crash", "prefill": "prefill_crash"}
