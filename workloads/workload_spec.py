"""Workload files: a mixture of clients, each with its own arrival process, rate
schedule, length distributions, reasoning share and multi-turn sessions (TOML,
validated with pydantic). The schema is documented in docs/workloads.md.

`load_workload(path_or_name)` reads and validates a file (or a shipped example by
name, see `workload_names`); `workloads.mixture.generate_workload` turns the
`WorkloadSpec` into requests. Every error names the file and the field, e.g.
``mix.toml: field clients[2].input_tokens.mean: Input should be greater than or
equal to 1 (got 0)``.
"""

from __future__ import annotations

import difflib
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import field_path, refuse_non_finite
from .bounds import MAX_LOGNORMAL_CV, MAX_SYSTEM_PROMPTS
from .request import MAX_TOKENS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parent / "data"


class WorkloadSpecError(ValueError):
    """A workload file is invalid; the message names the file and the field."""


class _Model(BaseModel):
    # strict: a count written 8.5 or "8" is an error, not silently converted
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---------------------------------------------------------------- token distributions
class FixedDist(_Model):
    """Always `tokens` tokens."""
    dist: Literal["fixed"]
    tokens: int = Field(ge=1, le=MAX_TOKENS)


class _Range(_Model):
    """A model with `min` and `max` fields: max must not be below min."""

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class UniformDist(_Range):
    """Uniform on the integers [min, max]."""
    dist: Literal["uniform"]
    min: int = Field(ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)


class LogNormalDist(_Model):
    """Log-normal with this mean (tokens) and CV, clipped to [1, max]."""
    dist: Literal["lognormal"]
    mean: float = Field(ge=1, le=MAX_TOKENS)
    cv: float = Field(ge=0, le=MAX_LOGNORMAL_CV)
    max: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _cap(self):
        token_distribution(self)        # the law's own checks (a cap below the mean)
        return self


class _Pmf(_Model):
    """{value: probability}; TOML keys are strings ("512" = 0.25). Subclasses say
    which keys are valid (`_value`)."""
    dist: Literal["pmf"]
    pmf: dict[str, float] = Field(min_length=1)

    @staticmethod
    def _value(key: str) -> None:  # pragma: no cover
        raise NotImplementedError

    @field_validator("pmf")
    @classmethod
    def _check(cls, v: dict[str, float]) -> dict[str, float]:
        from .lengths import normalised_probs
        for key in v:
            cls._value(key)
        normalised_probs(list(v.values()))
        return v


class PmfDist(_Pmf):
    """An empirical PMF {tokens: probability}."""

    @staticmethod
    def _value(key: str) -> None:
        try:
            ok = 1 <= int(key) <= MAX_TOKENS
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"key {key[:40]!r} is not a token count in [1, {MAX_TOKENS:,}]")


TokenDist = Annotated[Union[FixedDist, UniformDist, LogNormalDist, PmfDist], Field(discriminator="dist")]


def token_distribution(d: TokenDist):
    """The `workloads.lengths` token distribution of a validated spec entry."""
    from .lengths import FixedTokens, LogNormalTokens, PmfTokens, UniformTokens
    if isinstance(d, FixedDist):
        return FixedTokens(d.tokens)
    if isinstance(d, UniformDist):
        return UniformTokens(d.min, d.max)
    if isinstance(d, LogNormalDist):
        return LogNormalTokens(d.mean, d.cv, d.max)
    return PmfTokens.from_mapping(d.pmf)


# ---------------------------------------------------------------- reasoning share
class ShareFixed(_Model):
    dist: Literal["fixed"]
    value: float = Field(ge=0, le=1)


class ShareUniform(_Range):
    dist: Literal["uniform"]
    min: float = Field(ge=0, le=1)
    max: float = Field(ge=0, le=1)


class SharePmf(_Pmf):
    """{share: probability}, shares in [0, 1] (ServeGen's reason_ratio)."""

    @staticmethod
    def _value(key: str) -> None:
        try:
            ok = 0 <= float(key) <= 1
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"key {key!r} is not a share between 0 and 1")


ShareDist = Annotated[Union[ShareFixed, ShareUniform, SharePmf], Field(discriminator="dist")]


def _share_number(v: Any) -> Any:
    # `reasoning_share = 0.6` is short for a fixed share
    return {"dist": "fixed", "value": v} if isinstance(v, (int, float)) and not isinstance(v, bool) else v


# ---------------------------------------------------------------- arrivals and schedule
ArrivalKind = Literal["poisson", "gamma", "weibull", "constant"]


class _ArrivalFields(_Model):
    arrival: Optional[ArrivalKind] = None
    cv: Optional[float] = Field(default=None, gt=0)
    shape: Optional[float] = Field(default=None, gt=0)

    def _check_process(self, kind: str, cv: Optional[float], shape: Optional[float], at: str) -> None:
        """The arrival law's own checks (Gamma's CV ceiling, Weibull's solvable CVs),
        before anything is drawn."""
        from .arrivals import GammaArrivals, WeibullArrivals

        try:
            if kind == "gamma":
                GammaArrivals(1.0, cv)
            elif kind == "weibull":
                WeibullArrivals(1.0, shape=shape) if shape is not None else WeibullArrivals(1.0, cv=cv)
        except ValueError as exc:
            raise ValueError(f"{at}: {exc}") from None


class Window(_ArrivalFields):
    """One window of a client's rate schedule: from `start_s` to the next window's
    start (the last one lasts `window_s`). Arrival and length fields override the
    client's for this window."""
    start_s: float = Field(ge=0)
    rate_per_s: float = Field(ge=0)
    input_tokens: Optional[TokenDist] = None
    output_tokens: Optional[TokenDist] = None
    reasoning_share: Optional[ShareDist] = None

    _share = field_validator("reasoning_share", mode="before")(_share_number)


class Session(_Model):
    """Multi-turn sessions: the schedule's rate is the rate of new sessions; each has
    1 + geometric turns (mean `turns_mean`, at most `max_turns`); a think time (mean
    `think_time_s`: exponential, or log-normal with CV `think_time_cv`) separates turn j
    and turn j+1: counted from turn j's arrival (`think_after = "arrival"`, open loop)
    or from its answer (`"answer"`: the requests carry `Request.turn` and the runtime
    sends each turn when the previous one has ended plus the think time); every prompt
    starts with one of `system_prompts` system prompts (Zipf popularity), then
    `initial_context_tokens` of the session's own earlier context (none by default),
    then the history."""
    turns_mean: float = Field(default=1.0, ge=1)
    max_turns: int = Field(default=32, ge=1)
    think_time_s: float = Field(default=30.0, ge=0)
    think_time_cv: Optional[float] = Field(default=None, gt=0)
    think_after: Literal["arrival", "answer"] = "arrival"
    system_prompt_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    # the Zipf weights are one array of this length
    system_prompts: int = Field(default=1, ge=1, le=MAX_SYSTEM_PROMPTS)
    system_prompt_zipf: float = Field(default=1.0, ge=0)
    initial_context_tokens: Optional[TokenDist] = None
    max_prompt_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)


class Client(_ArrivalFields):
    """One client (tenant) of the mixture. Give exactly one rate form: `rate_per_s`
    (constant), `rates` (one per `window_s` window) or `windows` (explicit)."""
    name: str = Field(min_length=1)
    rate_per_s: Optional[float] = Field(default=None, ge=0)
    rates: Optional[list[float]] = Field(default=None, min_length=1)
    windows: Optional[list[Window]] = Field(default=None, min_length=1)
    input_tokens: Optional[TokenDist] = None
    output_tokens: Optional[TokenDist] = None
    reasoning_share: Optional[ShareDist] = None
    session: Optional[Session] = None
    slo_class: Optional[str] = None

    _share = field_validator("reasoning_share", mode="before")(_share_number)

    @field_validator("rates")
    @classmethod
    def _rates(cls, v):
        if v is not None and any(not (math.isfinite(r) and r >= 0) for r in v):
            raise ValueError("every rate must be a finite number of requests/s >= 0")
        return v

    @model_validator(mode="after")
    def _check(self):
        given = [k for k in ("rate_per_s", "rates", "windows") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"client {self.name!r}: give exactly one of rate_per_s, rates or "
                             f"windows (got {', '.join(given) or 'none'})")
        if self.windows is not None:
            starts = [w.start_s for w in self.windows]
            if any(b <= a for a, b in zip(starts, starts[1:])):
                raise ValueError(f"client {self.name!r}: windows must have increasing start_s, "
                                 f"got {starts}")
        for side in ("input_tokens", "output_tokens"):
            if getattr(self, side) is None and (
                    self.windows is None or any(getattr(w, side) is None for w in self.windows)):
                raise ValueError(f"client {self.name!r}: {side} is required (on the client, "
                                 "or on every window)")
        for where, fields in [("client", self), *((f"windows[{i}]", w) for i, w in
                                                  enumerate(self.windows or ()))]:
            kind = fields.arrival or self.arrival or "poisson"
            cv = fields.cv if fields.cv is not None else (None if fields.arrival else self.cv)
            shape = fields.shape if fields.shape is not None else (None if fields.arrival else self.shape)
            at = f"client {self.name!r}" + ("" if where == "client" else f" {where}")
            if kind == "gamma" and cv is None:
                raise ValueError(f"{at}: gamma arrivals need cv")
            if kind == "weibull" and (cv is None) == (shape is None):
                raise ValueError(f"{at}: weibull arrivals need cv or shape (one of them)")
            self._check_process(kind, cv, shape, at)
        return self


class WorkloadSpec(_Model):
    """A workload file (see docs/workloads.md)."""
    name: Optional[str] = None
    description: Optional[str] = None
    seed: int = Field(default=0, ge=0, le=2**63 - 1,
                      description="seeds every draw (numpy's SeedSequence: >= 0; 64-bit)")
    duration_s: Optional[float] = Field(default=None, gt=0)
    window_s: float = Field(default=600.0, gt=0)
    exact_counts: bool = True
    block_size: int = Field(default=512, ge=1, le=MAX_TOKENS)
    clients: list[Client] = Field(min_length=1)

    _finite_numbers = model_validator(mode="before")(refuse_non_finite)     # every table at once

    @model_validator(mode="after")
    def _check(self):
        names = [c.name for c in self.clients]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"clients: names must be unique, repeated: {dup}")
        if self.duration_s is None and self.schedule_end() is None:
            raise ValueError("duration_s is required when no client has a rate schedule "
                             "(rates or windows)")
        return self

    def schedule_end(self) -> Optional[float]:
        """End of the longest schedule (s): a `rates` list ends after len x window_s, an
        explicit schedule one window_s after its last start; None without schedules."""
        ends = []
        for c in self.clients:
            if c.rates is not None:
                ends.append(len(c.rates) * self.window_s)
            elif c.windows is not None:
                ends.append(c.windows[-1].start_s + self.window_s)
        return max(ends) if ends else None

    @property
    def end_s(self) -> float:
        """The workload's length (s): `duration_s`, or the end of the longest schedule."""
        return self.duration_s if self.duration_s is not None else float(self.schedule_end())


def workload_names() -> dict[str, Path]:
    """Shipped example workloads: name -> file (``workloads/data/*.toml``)."""
    return {p.stem.replace("_", "-"): p for p in sorted(DATA_DIR.glob("*.toml"))}


def resolve_workload(path_or_name: str | Path) -> Path:
    """An existing file path, or a shipped example's name. Raises WorkloadSpecError
    (also for an empty name, a directory, a FIFO or a broken symbolic link)."""
    from .paths import file_problem, name_problem, shown

    bad = name_problem(path_or_name)
    if bad is not None:
        raise WorkloadSpecError(f"workload {shown(path_or_name)!r}: {bad}; expected a workload file or one of "
                                f"{', '.join(workload_names())}")
    path = Path(path_or_name).expanduser()
    if path.is_file():
        return path
    named = workload_names().get(str(path_or_name).strip().lower().replace("_", "-"))
    if named is not None:
        return named
    bad = file_problem(path)
    if bad is not None:
        raise WorkloadSpecError(f"{shown(path)}: {bad}; expected a workload TOML file")
    raise WorkloadSpecError(f"{path_or_name}: no such workload file, and not a shipped "
                            f"workload name (known: {', '.join(workload_names()) or 'none'})")


_TAGS = ("fixed", "uniform", "lognormal", "pmf")
_UNION_FIELDS = ("input_tokens", "output_tokens", "reasoning_share", "initial_context_tokens")


def _loc(loc: tuple) -> str:
    # the union's tag is left out: the `dist` value already says which one
    return field_path([x for i, x in enumerate(loc)
                       if not (x in _TAGS and i and loc[i - 1] in _UNION_FIELDS)])


def _known_fields(loc: tuple) -> list[str]:
    model: Any = WorkloadSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if part in _TAGS:
            return []
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        nxt = None
        import typing
        for cand in (field.annotation, *typing.get_args(field.annotation),
                     *(a for x in typing.get_args(field.annotation) for a in typing.get_args(x))):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                nxt = cand
                break
        if nxt is None:
            return []
        model = nxt
    return list(getattr(model, "model_fields", {}))


def format_errors(source: str, exc: ValidationError) -> str:
    """One line per error: ``FILE: field LOCATION: what was expected (got VALUE)``."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = _loc(loc)
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = err.get("input")
        got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        if err["type"] == "extra_forbidden":
            known = _known_fields(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.5)
            lines.append(f"{source}: unknown field {field!r}"
                         + (f"; did you mean {close[0]!r}?" if close else "")
                         + (f" (expected one of: {', '.join(known)})" if known else ""))
        elif err["type"] == "missing":
            lines.append(f"{source}: field {field!r} is required but missing")
        elif err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            lines.append(f"{source}: field {field}.dist: expected one of {ctx.get('expected_tags')} "
                         f"(got {ctx.get('tag')!r})")
        elif not loc:
            # model-level checks name their own field first ("window_s: expected ...")
            lines.append(f"{source}: field {msg}")
        else:
            lines.append(f"{source}: field {field}: {msg}{got_s}")
    return "\n".join(lines)


def parse_workload(data: dict, source: str = "<workload>") -> WorkloadSpec:
    """Validate a workload dict; raises WorkloadSpecError naming `source` and the field."""
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkloadSpecError(format_errors(source, exc)) from None


def load_workload(path_or_name: str | Path) -> WorkloadSpec:
    """Read and validate a workload TOML file (or a shipped example by name).
    Raises WorkloadSpecError for a missing file, bad TOML (with its line) or a bad field."""
    path = resolve_workload(path_or_name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadSpecError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadSpecError(f"{path}: cannot read: {exc}") from None
    return parse_workload(data, str(path))
