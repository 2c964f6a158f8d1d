"""The study as data: a study spec file (TOML) declaring each section of the page as a
grid (deployments x workloads x parameter values x metric, its SLO and its reading).

`rack study --spec FILE` runs the sections a file declares and writes their page; the
shipped spec (`rack/experiments/study/findings.toml`) is the study behind docs/findings.md.
A section:

    [[section]]
    key = "load"                      # the results key (an identifier, unique)
    kind = "capacity"                 # what runs: see KINDS
    title = "Load"                    # the page's heading (default: per kind)
    deployments = ["wafer-only-kimi-k2", "helios72-cs3-kimi-k2"]   # scenario names or paths
    workloads = [{trace = "mooncake_conv", window = [0, 600]}]
    parameter = {name = "prompt_tokens", values = [1024, 4096]}    # optional
    rates = {ladder = [0.25, 256, 2]}                               # or {values = [...]}
    metric = "tokens_per_joule"
    reading = "at_capacity"
    slo = {tpot_ms = 80}              # optional: the deployments' SLO replaced
    quick = {rates = {values = [1, 8]}}   # `--quick`: these fields replaced (tiny inputs)

Kinds (`KINDS`; the fields each needs in `REQUIRED`):
- "compare": `rack compare` of the deployments on one trace at its own rate;
- "capacity": a rate sweep per parameter value, read at each deployment's capacity
  (parameter: none, "prompt_tokens"/"output_tokens" of a synthetic workload, or
  "slo.tpot_ms"); a workload file (agentic) also runs once at the file's own rate;
- "bandwidth": the KV link bandwidth swept (`parameter.name = "link.bandwidth_GBps"`)
  for each case in `cases` at a fixed rate or at another section's capacity;
- "gpu_pd": colocated against prefill/decode pools at equal GPU count, per case;
- "interactivity": closed-loop concurrency ladders (`rack sweep interactivity`) per
  workload, and each pair's ratio at equal interactivity; with `until_turned = true`
  the concurrencies are the rungs each curve climbs until it turns
  (`rack.experiments.interactivity.curve_state`; `patience` points after its best
  must be lower), and `knobs` = {deployment =
  {"pools.<pool>.<field>" = [values]}} adds one ladder per value of a knob that trades
  per-user speed for throughput (chunk size, batch cap), the deployment's curve being
  the best of them (`rack.experiments.equal_interactivity`);
- readings at equal interactivity: `reading = "equal_interactivity"` reads both curves
  at the same tokens/s per user, with intervals from the points' bootstrap
  replicates widened by the ladder's bracket; `at` picks the headline: "a_knee" (at the first deployment's knee),
  "up_to" (the highest ratio over the overlap) or a number (tokens/s per user);
  "a_best" is the older "at least" reading at the first deployment's best point;
- "tornado": a pair's ratio at equal interactivity with each uncertain term at the ends
  of its documented range (`devices.uncertainty`, or a range given inline);
- "breakeven_map": a pair's ratio over one uncertain term (x) x the input/output ratio
  (y) of a synthetic workload;
- "view": no runs; a part of the page drawn from other sections (`view` names it).

Errors name the file and the field: `StudySpecError("spec.toml: section[2] ('load')
.rates.values: ...")`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: The spec behind docs/findings.md.
SHIPPED_SPEC = Path(__file__).with_name("findings.toml")

KINDS = ("compare", "capacity", "bandwidth", "gpu_pd", "interactivity", "tornado", "breakeven_map", "view")
#: Fields a section of each kind must give.
REQUIRED = {"compare": ("deployments", "workloads"), "capacity": ("deployments", "workloads", "rates"),
            "bandwidth": ("workloads", "parameter", "cases"), "gpu_pd": ("cases",),
            "interactivity": ("deployments", "workloads", "concurrencies"),
            "tornado": ("pairs", "workloads", "terms"),
            "breakeven_map": ("pairs", "concurrencies", "terms", "parameter"), "view": ("view",)}
#: Parameters a capacity section can sweep.
CAPACITY_PARAMETERS = ("prompt_tokens", "output_tokens", "slo.tpot_ms")
#: What a view section draws (rack.experiments.study.findings).
VIEWS = ("header", "summary", "helios72", "vendor", "kv_reuse", "five_x", "verdicts", "settle", "caveats")
READINGS = ("at_capacity", "equal_load", "equal_interactivity", "at_least_interactivity")


class StudySpecError(ValueError):
    """A study spec file that cannot be used; the message names the file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Synthetic(_Strict):
    """Poisson traffic of fixed lengths: `n` requests or `duration_s` seconds of
    arrivals, whichever is more (`rack.experiments.sweep.Workload`)."""

    prompt_tokens: Optional[int] = Field(default=None, ge=1)
    output_tokens: Optional[int] = Field(default=None, ge=1)
    n: int = Field(default=400, ge=1)
    duration_s: float = Field(default=12.0, gt=0, allow_inf_nan=False)


class WorkloadRef(_Strict):
    """One workload: a trace (`trace`, optional `window` [start, end] s and
    `max_requests`), a workload file (`workload`, optional `duration_s`), a synthetic
    grid workload (`synthetic`) or vLLM's random dataset (`random`: input/output lengths,
    for the break-even map, which sets the lengths itself)."""

    trace: Optional[str] = Field(default=None, min_length=1)
    window: Optional[tuple[float, float]] = None
    max_requests: Optional[int] = Field(default=None, ge=1)
    workload: Optional[str] = Field(default=None, min_length=1)
    duration_s: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    synthetic: Optional[Synthetic] = None
    random: Optional[dict[str, int]] = None
    router_policy: Optional[Literal["round_robin", "least_outstanding_work", "prefix_aware"]] = None
    label: Optional[str] = None

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadRef":
        given = [k for k in ("trace", "workload", "synthetic", "random") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of trace, workload, synthetic, random; got {given or 'none'}")
        if self.window is not None and not (0 <= self.window[0] < self.window[1] and math.isfinite(self.window[1])):
            raise ValueError(f"window: expected [start, end] seconds with 0 <= start < end, got {list(self.window)}")
        return self

    def name(self) -> str:
        """A short label (the trace's or file's name, or "synthetic"/"random")."""
        return self.label or self.trace or self.workload or ("synthetic" if self.synthetic else "random")

    def plan(self, **controls):
        """The `workloads.LoadPlan` of a trace, workload file or random dataset."""
        from workloads.load import LoadControls, LoadPlan

        c = LoadControls(**{**({"duration_s": self.duration_s} if self.duration_s else {}), **controls})
        if self.trace is not None:
            return LoadPlan("trace", self.trace, window=self.window, max_requests=self.max_requests, controls=c)
        if self.workload is not None:
            return LoadPlan("workload", self.workload, controls=c)
        if self.random is not None:
            return LoadPlan("random", **self.random, controls=c)
        raise ValueError("a synthetic workload has no load plan; it is a capacity section's grid")


class Rates(_Strict):
    """Rates tried: `values`, or `ladder` = [lo, hi, points per doubling]
    (`rack.experiments.study.config.ladder`). Multiples of a trace's own rate; req/s of a
    synthetic workload."""

    values: Optional[list[float]] = None
    ladder: Optional[tuple[float, float, int]] = None

    @model_validator(mode="after")
    def _one(self) -> "Rates":
        if (self.values is None) == (self.ladder is None):
            raise ValueError("expected exactly one of values, ladder")
        v = self.values if self.values is not None else self.ladder[:2]
        if not v or any(not (x > 0 and math.isfinite(x)) for x in v):
            raise ValueError(f"expected finite rates > 0, got {list(v)}")
        if self.ladder is not None and (self.ladder[1] < self.ladder[0] or self.ladder[2] < 1):
            raise ValueError(f"ladder: expected [lo, hi >= lo, points per doubling >= 1], got {list(self.ladder)}")
        return self

    def as_tuple(self) -> tuple:
        from rack.experiments.study.config import ladder

        return tuple(float(x) for x in self.values) if self.values is not None else ladder(*self.ladder)


class Parameter(_Strict):
    """The parameter a grid sweeps: its name and values."""

    name: str = Field(min_length=1)
    values: list[Union[float, list[int]]] = Field(min_length=1)


class SLO(_Strict):
    """The SLO of a section: the attainment target that defines capacity, and TTFT/TPOT
    targets replacing the deployments' own (None: kept)."""

    target: Optional[float] = Field(default=None, gt=0, le=1)
    ttft_ms: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    tpot_ms: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)


class TermRef(_Strict):
    """An uncertain term: its key in `devices.uncertainty`, and optionally a range given
    here instead of (or narrower than) the documented one."""

    key: str = Field(min_length=1)
    low: Optional[float] = Field(default=None, allow_inf_nan=False)
    nominal: Optional[float] = Field(default=None, allow_inf_nan=False)
    high: Optional[float] = Field(default=None, allow_inf_nan=False)
    label: Optional[str] = None
    unit: Optional[str] = None
    scale: Optional[Literal["linear", "log"]] = None
    points: int = Field(default=3, ge=2, le=12)       # breakeven_map: values across the range


class Case(_Strict):
    """A sub-grid of a bandwidth or gpu_pd section. bandwidth: `split` against
    `against` at `rate_scale` x the trace rate, or at `capacity_of` (a deployment) in
    section `capacity_from`. gpu_pd: `colocated` against `pd` at each (prefill, decode)
    instance split of `ratios` and each TPOT target of `tpot_ms`, on `workload`."""

    split: Optional[str] = None
    against: list[str] = Field(default_factory=list)
    rate_scale: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    capacity_from: Optional[str] = None
    capacity_of: Optional[str] = None
    colocated: Optional[str] = None
    pd: Optional[str] = None
    ratios: list[tuple[int, int]] = Field(default_factory=list)
    tpot_ms: list[float] = Field(default_factory=list)
    workload: Optional[WorkloadRef] = None
    rates: Optional[Rates] = None


class Section(_Strict):
    """One section of the study (see the module docstring)."""

    key: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: Literal[KINDS]
    title: Optional[str] = None
    deployments: list[str] = Field(default_factory=list)
    workloads: list[WorkloadRef] = Field(default_factory=list)
    parameter: Optional[Parameter] = None
    rates: Optional[Rates] = None
    concurrencies: list[int] = Field(default_factory=list)
    per_slot: int = Field(default=4, ge=1)
    pairs: list[tuple[str, str]] = Field(default_factory=list)
    metric: str = ""
    reading: Optional[Literal[READINGS]] = None
    tolerance: float = Field(default=0.01, ge=0, lt=1)
    at: Union[Literal["a_best", "a_knee", "up_to"], float] = "a_best"
    until_turned: bool = False
    patience: int = Field(default=1, ge=1, le=4)
    knobs: dict[str, dict[str, list[Union[int, float]]]] = Field(default_factory=dict)
    slo: SLO = SLO()
    terms: Union[Literal["all"], list[TermRef]] = Field(default_factory=list)
    cases: list[Case] = Field(default_factory=list)
    source: Optional[str] = None
    view: Optional[Literal[VIEWS]] = None
    options: dict[str, Any] = Field(default_factory=dict)
    quick: dict[str, Any] = Field(default_factory=dict)

    @field_validator("concurrencies")
    @classmethod
    def _ladder(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError(f"expected integers >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> "Section":
        missing = [f for f in REQUIRED[self.kind] if not getattr(self, f)]
        if missing:
            raise ValueError(f"a {self.kind!r} section needs {', '.join(missing)}")
        if self.kind == "capacity":
            p = self.parameter
            if p is not None and p.name not in CAPACITY_PARAMETERS:
                raise ValueError(f"parameter.name: a capacity section sweeps one of "
                                 f"{', '.join(CAPACITY_PARAMETERS)}, got {p.name!r}")
            if len(self.workloads) != 1:
                raise ValueError("workloads: a capacity section runs one workload")
            w = self.workloads[0]
            if p is not None and p.name != "slo.tpot_ms" and w.synthetic is None:
                raise ValueError(f"parameter {p.name!r} needs a synthetic workload")
        if self.kind == "tornado":
            need = "rates" if self.reading == "at_capacity" else "concurrencies"
            if not getattr(self, need):
                raise ValueError(f"a tornado read {'at capacity' if need == 'rates' else 'at equal interactivity'} "
                                 f"needs {need}")
            if self.reading == "at_capacity" and self.workloads[0].trace is None:
                raise ValueError("workloads[0]: a tornado read at capacity runs a trace")
        for name, knobs in self.knobs.items():
            if name not in self.scenario_names():
                raise ValueError(f"knobs.{name}: not a deployment of this section")
            for path, values in knobs.items():
                parts = path.split(".")
                if len(parts) != 3 or parts[0] != "pools" or not values:
                    raise ValueError(f"knobs.{name}.{path}: expected 'pools.<pool>.<field>' = [values, ...]")
        if self.at in ("a_knee", "up_to") and self.reading != "equal_interactivity":
            raise ValueError(f"at = {self.at!r} is a reading at equal interactivity: set reading = "
                             "'equal_interactivity'")
        if self.kind == "bandwidth" and self.parameter.name != "link.bandwidth_GBps":
            raise ValueError(f"parameter.name: a bandwidth section sweeps 'link.bandwidth_GBps', got "
                             f"{self.parameter.name!r}")
        if self.kind == "breakeven_map":
            if self.parameter.name != "io_ratio":
                raise ValueError(f"parameter.name: a breakeven_map's y axis is 'io_ratio', got {self.parameter.name!r}")
            if self.terms == "all" or len(self.terms) != 1:
                raise ValueError("terms: a breakeven_map sweeps exactly one uncertain term (its x axis)")
        return self

    def scenario_names(self) -> list[str]:
        """Every deployment the section names (deployments, pairs, cases)."""
        out = list(self.deployments) + [n for p in self.pairs for n in p]
        for c in self.cases:
            out += [n for n in (c.split, c.colocated, c.pd, c.capacity_of) if n] + list(c.against)
        return list(dict.fromkeys(out))


class StudySpec(_Strict):
    """A whole spec: a title, the attainment target (capacity), and the sections in
    page order."""

    title: str = "Findings"
    target: float = Field(default=0.9, gt=0, le=1)
    section: list[Section] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> "StudySpec":
        keys = [s.key for s in self.section]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ValueError(f"section keys must be unique, repeated: {', '.join(dup)}")
        for s in self.section:
            refs = [s.source] + [c.capacity_from for c in s.cases]
            for r in refs:
                if r is not None and r not in keys:
                    raise ValueError(f"section {s.key!r} refers to section {r!r}, which the spec does not declare "
                                     f"(sections: {', '.join(keys)})")
        return self

    def quick(self) -> "StudySpec":
        """The spec with every section's `quick` fields applied (`--quick`)."""
        secs = []
        for s in self.section:
            data = s.model_dump(exclude_none=True)
            data.update(s.quick)
            secs.append(data)
        return StudySpec.model_validate({**self.model_dump(exclude_none=True), "section": secs})


def _loc(data: Any, loc: tuple) -> str:
    """A pydantic error location as "section[2] ('load').rates.values"."""
    out, node = "", data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            if isinstance(node, list) and 0 <= part < len(node):
                node = node[part]
                if isinstance(node, dict) and "key" in node:
                    out += f" ({node['key']!r})"
            else:
                node = None
        else:
            out += ("." if out else "") + str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def parse_spec(data: dict, source: str = "<spec>") -> StudySpec:
    """A `StudySpec` from parsed TOML; raises StudySpecError naming `source` and the
    field (one line per problem)."""
    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {_loc(data, e['loc'])}: {msg}")
        raise StudySpecError("\n".join(lines)) from None


def load_spec(path: Optional[Path | str] = None, *, check_deployments: bool = True) -> StudySpec:
    """Read and validate a study spec file (default: the shipped one). With
    `check_deployments`, every deployment named must load (`rack.wiring.load.load_scenario`).
    Raises StudySpecError naming the file (and line, for TOML syntax) and field."""
    import tomllib

    path = Path(path) if path is not None else SHIPPED_SPEC
    if not path.is_file():
        raise StudySpecError(f"{path}: study spec file not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise StudySpecError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudySpecError(f"{path}: not valid TOML: {exc}") from None
    spec = parse_spec(data, str(path))
    if check_deployments:
        check_names(spec, str(path))
    return spec


def check_names(spec: StudySpec, source: str) -> None:
    """Every deployment a section names loads; raises StudySpecError naming the section."""
    from rack.wiring.load import load_scenario

    for i, s in enumerate(spec.section):
        for n in s.scenario_names():
            try:
                load_scenario(n)
            except Exception as exc:      # ScenarioError, OSError: the scenario's own message
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise StudySpecError(f"{source}: section[{i}] ({s.key!r}): deployment {n!r}: {first}") from None


__all__ = ["CAPACITY_PARAMETERS", "Case", "KINDS", "Parameter", "REQUIRED", "Rates", "SHIPPED_SPEC", "SLO",
           "Section", "StudySpec", "StudySpecError", "Synthetic", "TermRef", "VIEWS", "WorkloadRef", "check_names",
           "load_spec", "parse_spec"]
