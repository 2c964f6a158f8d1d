"""Scenario configuration: what rack to emulate (pydantic, from TOML or a catalog name).

A scenario names the model and dtypes, the device pools (device, instance count,
parallelism, role), the links between pools, the router policy, the SLO targets,
the KV `payload_scale` and the Ray runtime's clock dilation. Shipped scenarios live in
`rack/scenarios/*.toml`; `load_scenario(name_or_path)` reads either.

Every error names the file and the field and says what was expected.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Literal, Optional, Union

from interconnect.link import LinkSpec
from rack.wiring.faults import FaultConfig, check_faults
from rack.wiring.settings import CostSettings, EnergySettings, FixedStage, ScenarioError
from workloads.errors import field_path, refuse_non_finite
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SCENARIO_DIR = Path(__file__).parent.parent / "scenarios"
DEFAULT_SCENARIO = "helios-cs3-kimi-k2"

#: Most instances in one pool: each instance is a core (a Ray actor on the Ray runtime),
#: built before the run; 4,096 instances of 8 GPUs are 32,768 GPUs, beyond the largest
#: inference deployments published. 10**18 used to run into a MemoryError after 20 s.
MAX_INSTANCES = 4096
#: Seeds are numpy seeds: >= 0 (SeedSequence takes no negative one) and 64-bit (one
#: of 10**21 failed inside a component, "argument out of range").
MAX_SEED = 2**63 - 1
#: KV link bounds: a latency or per-message cost above a second is a unit mistake (the
#: slowest WAN round trips are ~0.3 s; 1e300 us ran and reported a TTFT of 1e294 s as
#: "complete"); a bandwidth from 1 MB/s (a multi-GB KV payload then takes an hour) to
#: 1 PB/s (200x a CS-3 system's 28 x 150 GB/s of I/O).
MAX_LINK_LATENCY_US = 1e6
LINK_BANDWIDTH_GBPS = (1e-3, 1e6)


class _Strict(BaseModel):
    # strict: a count written "8" or 8.0 is an error, not silently an int (an int is
    # still a valid float, and tables are read into their models)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _positive_resources(v: dict[str, float]) -> dict[str, float]:
    """Ray custom resources {name: amount}: named, each amount positive and finite."""
    bad = {k: x for k, x in v.items() if not k or not (x > 0) or x == float("inf")}
    if bad:
        raise ValueError(f"Ray resource amounts must be positive and finite, got {bad}")
    return v


class SpeculativeSettings(_Strict):
    """Speculative decoding on a decode pool: k draft tokens, acceptance rate a."""

    draft_tokens: int = Field(ge=1)
    acceptance_rate: float = Field(ge=0.0, lt=1.0)
    method: Literal["mtp", "draft_model"] = "mtp"
    draft_model: Optional[str] = None


class PoolConfig(_Strict):
    """A pool of identical engine instances.

    `tp * pp` devices form one instance (on the wafer engine `pp` is the number of
    systems its layers are pipelined over). `role` is what the pool's instances do.
    `stack` names the serving software the device runs (a catalog stack of that
    device: "sglang", "trtllm", "vllm", "2024q4", ...; None: the device's default
    stack); every run summary prints it. `max_num_seqs` caps the requests an instance
    runs at once (vLLM's max_num_seqs, SGLang's max_running_requests); None: the
    stack's default, else DEFAULT_MAX_NUM_SEQS. Older files' `max_batch` is read as
    `max_num_seqs`.
    """

    name: str = Field(min_length=1)
    device: str = Field(min_length=1, description="catalog name or path to a device TOML")
    stack: Optional[str] = Field(default=None, min_length=1, description="software stack (catalog) of the device")
    role: Literal["prefill", "decode", "both"]
    instances: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    dp_attention: bool = Field(default=False, description="data-parallel attention over the tp devices (with ep "
                               "above tp: over the ep devices, attention replicated on each)")
    two_batch_overlap: bool = Field(default=False, description="overlap the expert-parallel all-to-all with "
                                    "compute (SGLang --enable-two-batch-overlap)")
    # prefill side (role prefill or both)
    chunk_tokens: Union[int, Literal["tpot"]] = Field(
        default=8192, description="chunked-prefill token budget per iteration (prefill + decode tokens); "
        "\"tpot\": the largest whose iterations keep within the SLO's TPOT target (devices.chunking; role both)")
    chunk_tpot_ms: Optional[float] = Field(
        default=None, gt=0, description="the TPOT target (ms) the \"tpot\" chunk sizes keep to; None: the "
        "SLO's tpot_ms (a knob that trades per-user speed for prompt throughput, the SLO unchanged)")
    prompt_chunk_tokens: Optional[Union[int, Literal["tpot"]]] = Field(
        default=None, description="role both: tokens one prompt takes of an iteration at most (vLLM's "
        "long_prefill_token_threshold); \"tpot\": from the SLO's TPOT target (devices.chunking); None: the "
        "whole budget, or the TPOT rule's when chunk_tokens is \"tpot\"")
    prefix_cache: bool = True
    host_kv_gb: float = Field(default=0.0, ge=0, description="host memory per instance (GB) keeping the prefixes "
                              "its prefix cache evicts, loaded back instead of recomputed (0: none)")
    host_kv_GBps: Optional[float] = Field(default=None, gt=0, description="the host tier's link per instance "
                                          "(GB/s); None: each device's weight_load_Bps (catalog) x its devices")
    max_queue: int = Field(default=1024, ge=1, description="requests waiting per instance before rejection")
    scheduler_recv_interval: int = Field(default=1, ge=1, description="role both: decode steps between the "
                                         "scheduler's receives of new requests (SGLang "
                                         "--scheduler-recv-interval; 1: every iteration)")
    # decode side (role decode or both)
    max_num_seqs: Optional[int] = Field(default=None, ge=1, description="requests an instance runs at once "
                                        "(None: the stack's default)")
    admission_policy: Literal["reserve", "preempt"] = "reserve"
    speculative: Optional[SpeculativeSettings] = None
    kv_block_tokens: int = Field(default=16, ge=1, description="tokens per paged KV block")
    max_reserve_queue: int = Field(default=4096, ge=1, description="decode side: KV reservations waiting "
                                   "for memory per instance before rejection (decode_queue_full)")
    memory_reserve_fraction: Optional[float] = Field(default=None, ge=0.0, lt=1.0)
    weight_load_GBps: Optional[float] = Field(default=None, gt=0, description="rate at which a restarted "
                                              "instance reloads its weights, GB/s per device; default: the "
                                              "device's weight_load_Bps (catalog)")
    resources: dict[str, float] = Field(default_factory=dict, description="Ray custom resources per instance actor")

    @model_validator(mode="before")
    @classmethod
    def _max_batch_alias(cls, data):
        # scenario files written before stacks called the cap `max_batch`
        if isinstance(data, dict) and "max_batch" in data:
            data = dict(data)
            if "max_num_seqs" in data:
                raise ValueError("give max_num_seqs or its old name max_batch, not both")
            data["max_num_seqs"] = data.pop("max_batch")
        return data

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return _positive_resources(v)

    @field_validator("chunk_tokens", "prompt_chunk_tokens")
    @classmethod
    def _chunk(cls, v, info):
        if isinstance(v, int) and v < 1:
            raise ValueError(f"{info.field_name} must be >= 1 tokens or \"tpot\", got {v}")
        return v

    @model_validator(mode="after")
    def _tpot_rule_decodes(self) -> "PoolConfig":
        if self.role != "both" and "tpot" in (self.chunk_tokens, self.prompt_chunk_tokens):
            raise ValueError(f"pool {self.name!r}: chunk sizes from the TPOT target (\"tpot\") apply to a pool "
                             f"that decodes what it prefills (role \"both\"), not role {self.role!r}")
        if self.role != "both" and self.prompt_chunk_tokens is not None:
            raise ValueError(f"pool {self.name!r}: prompt_chunk_tokens applies to role \"both\" pools")
        return self

    @model_validator(mode="after")
    def _dp_attention_ranks(self):
        # as deployed (devices.costmodel.Parallelism.deployed): with data-parallel
        # attention over an EP group larger than tp ("tp 1, ep 8, DP attention"), the
        # instance spans the ep devices, attention replicated on each
        if self.dp_attention and self.ep > self.tp:
            object.__setattr__(self, "tp", self.ep)
        return self

    @property
    def devices_per_instance(self) -> int:
        return self.tp * self.pp

    @property
    def instance_chunk_tokens(self) -> int:
        """Prompt tokens one iteration of an instance may carry: `chunk_tokens`, per
        attention rank with data-parallel attention (each rank schedules its own chunk;
        SGLang's --chunked-prefill-size is the instance's, divided over the DP ranks, so
        a pool takes the rank's share: devices.serving_rows.pass_budget), as the
        closed-loop estimate packs it. For chunk sizes from the TPOT target ("tpot")
        the instance's budget is `rack.wiring.sizing.chunk_sizes`'; raises ValueError."""
        if not isinstance(self.chunk_tokens, int):
            raise ValueError(f"pool {self.name!r}: chunk_tokens {self.chunk_tokens!r} is sized per instance by "
                             "rack.wiring.sizing.chunk_sizes")
        return self.chunk_tokens * (self.tp if self.dp_attention and self.tp > 1 else 1)


class LinkConfig(LinkSpec):
    """A KV link from pool `src` to pool `dst` (bandwidth, latency and per-message
    overhead as in `interconnect.link.LinkSpec`, within MAX_LINK_LATENCY_US and
    LINK_BANDWIDTH_GBPS), shared max-min fairly by its transfers."""

    bandwidth_GBps: float = Field(ge=LINK_BANDWIDTH_GBPS[0], le=LINK_BANDWIDTH_GBPS[1],
                                  description="capacity, GB/s (1e9 bytes/s)")
    latency_us: float = Field(default=LinkSpec.model_fields["latency_us"].default, ge=0, le=MAX_LINK_LATENCY_US,
                              description="propagation latency, us")
    per_message_us: float = Field(default=LinkSpec.model_fields["per_message_us"].default, ge=0,
                                  le=MAX_LINK_LATENCY_US, description="fixed cost per message, us")
    src: str
    dst: str


class RouterConfig(_Strict):
    """Admission and dispatch.

    `policy`: "round_robin", "least_outstanding_work" (fewest queued prompt tokens) or
    "prefix_aware" (fewest queued prompt tokens plus the prompt's tokens the instance
    does not cache, learnt from its KV events: `rack.serving.prefix_routing`).
    `max_outstanding_tokens`: prompt tokens waiting for prefill per instance above
    which, when every instance is above it, an arrival is rejected ("router_queue_full").
    `local_prefill_threshold_tokens`: conditional disaggregation; prompts up to this
    length are prefilled on the decode side (needs a pool with role "both").
    `prefix_weight`: "prefix_aware" only: weight w of a prompt's uncached tokens
    against an instance's backlog, cost = backlog + w x uncached (1: the tokens the
    instance must compute before this prompt is done; more keeps conversations on the
    instance that caches them at the price of balance).
    """

    policy: Literal["round_robin", "least_outstanding_work", "prefix_aware"] = "least_outstanding_work"
    max_outstanding_tokens: int = Field(default=4_000_000, ge=1)
    local_prefill_threshold_tokens: int = Field(default=0, ge=0)
    prefix_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)


class SLOConfig(_Strict):
    """Per-request latency targets (DistServe goodput counts requests meeting both)."""

    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)

    @field_validator("ttft_ms", "tpot_ms")
    @classmethod
    def _plausible_ms(cls, v: float, info) -> float:
        # A value outside these bounds is almost surely in another unit. Floors: the
        # fastest published per-user decode is ~1,800-2,300 tokens/s (~0.45 ms/token,
        # reference/calibration.md), so 0.1 ms per output token (10,000 tokens/s) is
        # out of reach; no TTFT (a forward pass over every layer, plus the network)
        # is below 1 ms. Ceilings: one hour to the first token, one minute per token.
        lo, hi = {"ttft_ms": (1.0, 3.6e6), "tpot_ms": (0.1, 6e4)}[info.field_name]
        if v < lo:
            raise ValueError(f"{info.field_name} is in milliseconds: {v:g} ms is implausibly small "
                             f"(expected >= {lo:g} ms; if you meant {v:g} s, write {info.field_name} = {v * 1e3:g})")
        if v > hi:
            raise ValueError(f"{info.field_name} is in milliseconds: {v:g} ms is implausibly large "
                             f"(expected <= {hi:g} ms; if you meant {v:g} us, write {info.field_name} = {v / 1e3:g})")
        return v


class PlacementConfig(_Strict):
    """Ray placement of the components that are not pools (TOML table `[placement]`).

    Each field is the Ray custom resources its actor asks for, e.g. `router = {head = 1}`
    pins the router to a node started with `--resources='{"head": 64}'` (pool instances
    use their pool's `resources`). Empty (the default): Ray picks the node. Ignored by the
    virtual runtime; the Ray runtime refuses, before creating any actor, a resource no
    node offers (docs/multinode.md).
    """

    router: dict[str, float] = Field(default_factory=dict, description="Ray resources of the router actor")
    collector: dict[str, float] = Field(default_factory=dict, description="Ray resources of the collector actor")
    interconnect: dict[str, float] = Field(default_factory=dict, description="Ray resources of the interconnect actor")
    front: dict[str, float] = Field(default_factory=dict, description="Ray resources of the live HTTP front (rack serve)")

    @field_validator("router", "collector", "interconnect", "front")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        return _positive_resources(v)


class Scenario(_Strict):
    """A whole emulated rack. See `rack/scenarios/*.toml` for annotated examples."""

    name: str
    description: str = ""
    model: str = Field(description="catalog name or path to a config.json / model TOML")
    weight_dtype: Literal["bf16", "fp8", "fp4"] = "fp8"
    kv_dtype: Literal["bf16", "fp8", "fp4"] = "fp8"
    pools: list[PoolConfig] = Field(min_length=1)
    links: list[LinkConfig] = Field(default_factory=list)
    router: RouterConfig = RouterConfig()
    slo: SLOConfig
    placement: PlacementConfig = PlacementConfig()   # Ray nodes of router/collector/interconnect
    payload_scale: float = Field(default=1e-3, gt=0, le=1.0, description="shipped bytes / logical KV bytes")
    layer_group: int = Field(default=8, ge=1, description="layers per KV frame")
    dilation: float = Field(default=20.0, gt=0, description="Ray runtime: wall seconds per emulated second")
    # Who sends the client a split request's first token: "decode" (the decode
    # engine's first step after the KV has landed, as vLLM's and Dynamo's disaggregated
    # serving do; TTFT includes the KV transfer) or "prefill" (the prefill instance
    # streams it at the end of the prompt). Colocated requests are unaffected.
    first_token: Literal["decode", "prefill"] = "decode"
    # Context limit (prompt + output tokens), as vLLM's --max-model-len: at most the
    # model's own (catalog `max_context_tokens`); None: the model's. A request beyond it
    # is rejected at admission, or its output truncated (`context_overflow`, see
    # rack.serving.admission).
    max_model_len: Optional[int] = Field(default=None, ge=2)
    context_overflow: Literal["reject", "truncate"] = "reject"
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="seeds every random choice (numpy needs >= 0)")
    # Energy, cost and fixed latency stages (rack.measure.energy, rack.measure.breakdown document them).
    energy: EnergySettings = EnergySettings()
    cost: CostSettings = CostSettings()
    fixed_stages: list[FixedStage] = Field(default_factory=list)
    # Injected faults (rack.wiring.faults; docs/robustness.md).
    faults: list[FaultConfig] = Field(default_factory=list)
    # Ray runtime: real deaths (not injected faults) each prefill/decode instance's actor
    # survives: Ray restarts it and its requests are recovered as after an injected crash
    # (docs/robustness.md); 0: a death ends the run, status aborted.
    max_restarts: int = Field(default=0, ge=0, le=1000, description="Ray runtime: real deaths each engine "
                              "instance's actor survives (restarted, its requests recovered)")
    # Uncertain terms of the cost and energy model set for this scenario (TOML table
    # `[terms]`, e.g. "cs3.prefill_efficiency" = 0.3): keys and ranges in
    # devices.uncertainty; applied to each pool's device spec and to the KV links.
    terms: dict[str, float] = Field(default_factory=dict, description="uncertain terms set "
                                    "(devices.uncertainty.uncertain_terms)")

    # once for every table, also those defined in other modules (energy, cost, fixed
    # stages, links, faults)
    _finite_numbers = model_validator(mode="before")(refuse_non_finite)

    @field_validator("dilation")
    @classmethod
    def _sane_dilation(cls, v: float) -> float:
        # the Ray runtime's limits, with their reasons (rack.wiring.pace)
        from rack.wiring.pace import dilation_error

        why = dilation_error(v)
        if why is not None:
            raise ValueError(why)
        return v

    @field_validator("terms")
    @classmethod
    def _known_terms(cls, v: dict[str, float]) -> dict[str, float]:
        from devices.uncertainty import check_terms

        out = check_terms(v)
        bw = out.get("link.bandwidth_GBps")
        if bw is not None and not LINK_BANDWIDTH_GBPS[0] <= bw <= LINK_BANDWIDTH_GBPS[1]:
            raise ValueError(f"term 'link.bandwidth_GBps': {bw:g} GB/s is outside the KV link bounds "
                             f"{LINK_BANDWIDTH_GBPS[0]:g}-{LINK_BANDWIDTH_GBPS[1]:g} GB/s")
        return out

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [p.name for p in pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique; repeated: {sorted(dup)}")
        return pools

    @model_validator(mode="after")
    def _check_topology(self) -> "Scenario":
        pools = {p.name: p for p in self.pools}
        roles = {p.role for p in self.pools}
        for i, link in enumerate(self.links):
            for end in ("src", "dst"):
                pool = getattr(link, end)
                if pool not in pools:
                    close = difflib.get_close_matches(pool, list(pools), n=3)
                    hint = f"; did you mean {close}?" if close else ""
                    raise ValueError(
                        f"links[{i}].{end}: no pool named {pool!r} (pools: {sorted(pools)}){hint}")
        has_prefill = bool(roles & {"prefill", "both"})
        has_decode = bool(roles & {"decode", "both"})
        if not (has_prefill and has_decode):
            raise ValueError("pools: need at least one pool that prefills (role prefill/both) "
                             "and one that decodes (role decode/both)")
        if "prefill" in roles:
            # KV goes to the decode pools; with none, to the colocated ("both") pools
            # (conditional disaggregation: they also prefill short prompts locally).
            decoders = [p.name for p in self.pools if p.role == "decode"] or \
                [p.name for p in self.pools if p.role == "both"]
            if not decoders:
                raise ValueError("pools: a prefill-only pool needs a decode pool to ship its KV to")
            for p in self.pools:
                if p.role != "prefill":
                    continue
                for d in decoders:
                    if not any(l.src == p.name and l.dst == d for l in self.links):
                        raise ValueError(f"links: no link from prefill pool {p.name!r} to decode pool {d!r}")
        for i, p in enumerate(self.pools):
            if p.scheduler_recv_interval != 1 and p.role != "both":
                raise ValueError(f"pools[{i}].scheduler_recv_interval (pool {p.name!r}): only modelled on "
                                 f"role 'both' pools, not {p.role!r}")
        if self.router.local_prefill_threshold_tokens and "both" not in roles:
            raise ValueError("router.local_prefill_threshold_tokens: needs a pool with role 'both'")
        check_faults(self)
        return self

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def with_router(self, **changes) -> "Scenario":
        """A copy with `[router]` fields replaced (None: kept), validated again; e.g.
        `with_router(policy="prefix_aware")`. Raises ScenarioError for a bad value."""
        given = {k: v for k, v in changes.items() if v is not None}
        if not given:
            return self
        return self.with_overrides(router={**self.router.model_dump(), **given})

    def with_overrides(self, **changes) -> "Scenario":
        """A copy with top-level fields replaced (validated again)."""
        data = self.model_dump()
        given = {k: v for k, v in changes.items() if v is not None}     # None: not overridden
        data.update(given)
        return parse_scenario(data, f"scenario {self.name!r} with overrides {sorted(given)}")

    def with_pool(self, name: str, **changes) -> "Scenario":
        """A copy with fields of pool `name` replaced (validated again), e.g. a wafer
        tier's size (`pp`) or its chunk sizes. Raises KeyError for an unknown pool and
        ScenarioError for a bad value."""
        self.pool(name)
        data = self.model_dump()
        for p in data["pools"]:
            if p["name"] == name:
                p.update(changes)
        return parse_scenario(data, f"scenario {self.name!r} with pool {name!r} {sorted(changes)}")


def scenario_names() -> list[str]:
    """Names of the scenarios shipped in `rack/scenarios/`."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def _fields_at(loc: tuple) -> list[str]:
    """Field names of the model found at `loc` inside Scenario ([] if not a model)."""
    import typing

    model: object = Scenario
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann, model = field.annotation, None
        for cand in (ann, *typing.get_args(ann), *(a for x in typing.get_args(ann) for a in typing.get_args(x))):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


#: Why a bound is where it is, added to pydantic's "Input should be less than ..." for
#: the fields whose ceiling is not obvious (the constants above give the sources).
_BOUND_REASONS = {
    "instances": f"each instance is a core (a Ray actor on the Ray runtime); at most {MAX_INSTANCES:,} per pool",
    "latency_us": "a KV link latency above a second is a unit mistake (the slowest WAN round trips are ~0.3 s)",
    "per_message_us": "a per-message cost above a second is a unit mistake",
    "bandwidth_GBps": "KV link bandwidths from 1 MB/s to 1 PB/s (GB/s here)",
    "seed": "numpy seeds are 64-bit",
}

_UNIT_WORDS = {"ms": "milliseconds", "s": "seconds", "us": "microseconds", "gb": "GB", "gbps": "GB/s",
               "bps": "bytes/s"}


def _format_validation(path: str, exc: ValidationError) -> str:
    """One line per error, each naming the file, the field and what was expected."""
    lines = []
    errors = exc.errors()
    # a required field reported missing because it was misspelled: the "unknown field"
    # line (with its "did you mean") says it all
    typos = set()
    for err in errors:
        if err["type"] == "extra_forbidden":
            loc = tuple(err["loc"])
            for c in difflib.get_close_matches(str(loc[-1]), _fields_at(loc), n=1, cutoff=0.5):
                typos.add(loc[:-1] + (c,))
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and loc in typos:
            continue
        field = field_path(loc)
        msg = err["msg"]
        got = err.get("input")
        got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        if err["type"] == "extra_forbidden":
            known = _fields_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.5)
            hint = ""
            if close:
                unit = _UNIT_WORDS.get(close[0].rsplit("_", 1)[-1].lower())
                hint = f"; did you mean {close[0]!r}" + (f" (in {unit})" if unit else "") + "?"
            lines.append(f"{path}: unknown field {field!r}{hint}"
                         + (f" (expected one of: {', '.join(known)})" if known else ""))
        elif err["type"] == "missing":
            lines.append(f"{path}: field {field!r} is required but missing")
        elif not loc:
            # model-level checks name their own field first ("links[0].dst: ...")
            lines.append(f"{path}: field {msg.removeprefix('Value error, ')}")
        else:
            why = _BOUND_REASONS.get(str(loc[-1])) if err["type"] in ("less_than_equal", "greater_than_equal") else None
            lines.append(f"{path}: field {field}: {msg.removeprefix('Value error, ')}{got_s}"
                         + (f": {why}" if why else ""))
    return "\n".join(lines)


def parse_scenario(data: dict, source: str = "<scenario>") -> Scenario:
    """Validate a scenario dict; raises ScenarioError naming `source` and the field."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(source, exc)) from None
