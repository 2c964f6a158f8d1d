"""Request-length distributions (seeded): fixed, uniform, log-normal, empirical.

Two layers:
- token distributions, one length each: `FixedTokens`, `UniformTokens`,
  `LogNormalTokens`, `PmfTokens` (an empirical PMF {tokens: probability}); each has
  ``draw(n, rng) -> int64 array (n,)`` with every value >= 1, and ``mean``;
- length distributions, (prompt, output) pairs: `FixedLengths`, `UniformLengths`,
  `LogNormalLengths` (independent prompt and output, built on the token
  distributions), `IndependentLengths` (any two token distributions) and
  `EmpiricalLengths` (pairs drawn jointly from a trace). Each has
  ``sample(n, rng) -> (prompt_tokens, output_tokens)``, two int64 arrays (n,).

`random_dataset_lengths` gives vLLM's `--dataset-name random` length law.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .bounds import MAX_LOGNORMAL_CV
from .request import MAX_TOKENS


def _check_count(name: str, value: int) -> int:
    if int(value) != value or not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{name} must be an integer in [1, {MAX_TOKENS:,}], got {value}")
    return int(value)


# ------------------------------------------------------------------ token distributions
@dataclass(frozen=True)
class FixedTokens:
    """Always `tokens` tokens."""

    tokens: int

    def __post_init__(self) -> None:
        _check_count("tokens", self.tokens)

    @property
    def mean(self) -> float:
        return float(self.tokens)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class UniformTokens:
    """Uniform on the integers [min, max], both included."""

    min: int
    max: int

    def __post_init__(self) -> None:
        a, b = _check_count("min", self.min), _check_count("max", self.max)
        if b < a:
            raise ValueError(f"max ({b}) must be >= min ({a})")

    @property
    def mean(self) -> float:
        return (self.min + self.max) / 2

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.min, self.max, n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormalTokens:
    """Log-normal with the given mean (tokens) and CV (at most MAX_LOGNORMAL_CV),
    rounded, clipped to [1, max] (max None: MAX_TOKENS).

    sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2, so the continuous law has
    exactly that mean and CV (rounding and the clip move the sample mean slightly).
    """

    mean_tokens: float
    cv: float
    max: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_tokens) and 1 <= self.mean_tokens <= MAX_TOKENS):
            raise ValueError(f"mean must be in [1, {MAX_TOKENS:,}] tokens, got {self.mean_tokens:g}")
        if not (math.isfinite(self.cv) and 0 <= self.cv <= MAX_LOGNORMAL_CV):
            raise ValueError(f"cv must be in [0, {MAX_LOGNORMAL_CV:g}] (a log-normal length law's CV), "
                             f"got {self.cv:g}")
        if self.max is not None:
            _check_count("max", self.max)
            if self.max < self.mean_tokens:
                # the clip would move most draws onto max: not the law asked for
                raise ValueError(f"max ({self.max}) must be >= mean ({self.mean_tokens:g}): "
                                 "a cap below the mean clips most lengths to the cap")

    @property
    def mean(self) -> float:
        return float(self.mean_tokens)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        s2 = math.log1p(self.cv * self.cv)
        x = rng.lognormal(math.log(self.mean_tokens) - s2 / 2, math.sqrt(s2), n)
        # no length beyond MAX_TOKENS (the rare tail above it at the largest CVs)
        return np.clip(np.rint(x), 1, self.max or MAX_TOKENS).astype(np.int64)


def normalised_probs(probs: Any) -> np.ndarray:
    """Probabilities of a PMF read from a file: finite, >= 0, summing to 1 within 1e-3
    (files round them), returned renormalised. Raises ValueError otherwise."""
    p = np.asarray(probs, dtype=np.float64)
    if not np.all(np.isfinite(p)) or p.size == 0 or p.min() < 0:
        raise ValueError("every PMF probability must be a finite number >= 0")
    total = float(p.sum())
    if abs(total - 1.0) > 1e-3:
        raise ValueError(f"PMF probabilities must sum to 1, got {total:.6g}")
    return p / total


@dataclass(frozen=True, eq=False)
class PmfTokens:
    """An empirical probability mass function: `values[i]` tokens with probability
    `probs[i]`. Probabilities must be >= 0 and sum to 1 within 1e-3 (they are then
    renormalised: PMFs read from files are rounded). Raises ValueError otherwise."""

    values: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.int64)
        p = np.asarray(self.probs, dtype=np.float64)
        if v.ndim != 1 or v.shape != p.shape or v.size == 0:
            raise ValueError("a PMF needs as many probabilities as values, at least one")
        if v.min() < 1:
            raise ValueError(f"every PMF value must be a token count >= 1, got {int(v.min())}")
        p = normalised_probs(p)
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "probs", p)
        object.__setattr__(self, "_cdf", np.cumsum(p))

    @classmethod
    def from_mapping(cls, pmf: Mapping[Any, float]) -> "PmfTokens":
        """From {tokens: probability}; keys may be ints or integer strings (TOML keys)."""
        items = []
        for k, p in pmf.items():
            try:
                tokens = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"PMF key {str(k)[:40]!r} is not an integer token count") from None
            if not 1 <= tokens <= MAX_TOKENS:
                raise ValueError(f"PMF key {str(k)[:40]!r} is not a token count in [1, {MAX_TOKENS:,}]")
            items.append((tokens, float(p)))
        items.sort()
        return cls(np.array([k for k, _ in items]), np.array([p for _, p in items]))

    @property
    def mean(self) -> float:
        return float(self.values @ self.probs)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        return self.values[np.minimum(idx, self.values.size - 1)]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PmfTokens) and np.array_equal(self.values, other.values)
                and np.array_equal(self.probs, other.probs))

    __hash__ = None  # type: ignore[assignment]


TokenDistribution = FixedTokens | UniformTokens | LogNormalTokens | PmfTokens


# ------------------------------------------------------------------ length distributions
@dataclass(frozen=True)
class IndependentLengths:
    """Prompt and output lengths drawn independently from two token distributions
    (prompt first, then output, from the same generator)."""

    prompt: TokenDistribution
    output: TokenDistribution

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.draw(n, rng), self.output.draw(n, rng)


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same prompt and output length (tokens)."""

    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _check_count("prompt_tokens", self.prompt_tokens)
        _check_count("output_tokens", self.output_tokens)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return IndependentLengths(FixedTokens(self.prompt_tokens),
                                  FixedTokens(self.output_tokens)).sample(n, rng)


@dataclass(frozen=True)
class UniformLengths:
    """Prompt and output lengths uniform on the integers [min, max] (inclusive), independent."""

    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int

    def __post_init__(self) -> None:
        for lo, hi in (("prompt_min", "prompt_max"), ("output_min", "output_max")):
            a, b = _check_count(lo, getattr(self, lo)), _check_count(hi, getattr(self, hi))
            if b < a:
                raise ValueError(f"{hi} ({b}) must be >= {lo} ({a})")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return IndependentLengths(UniformTokens(self.prompt_min, self.prompt_max),
                                  UniformTokens(self.output_min, self.output_max)).sample(n, rng)


@dataclass(frozen=True)
class LogNormalLengths:
    """Log-normal prompt and output lengths given by their mean (tokens) and CV.

    sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2, so the continuous
    distribution has exactly that mean and CV; samples are rounded to integers,
    clipped to [1, max] (max None: no cap). Independent prompt and output.
    """

    prompt_mean: float
    prompt_cv: float
    output_mean: float
    output_cv: float
    prompt_max: int | None = None
    output_max: int | None = None

    def __post_init__(self) -> None:
        self._sides()

    def _sides(self) -> IndependentLengths:
        sides = []
        for side in ("prompt", "output"):
            try:
                sides.append(LogNormalTokens(getattr(self, f"{side}_mean"),
                                             getattr(self, f"{side}_cv"), getattr(self, f"{side}_max")))
            except ValueError as e:
                raise ValueError(f"{side}_{e}") from None
        return IndependentLengths(*sides)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self._sides().sample(n, rng)


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """(prompt, output) pairs drawn uniformly, with replacement, from observed pairs.

    Pairs are drawn together, so the correlation between prompt and output length in
    the source is kept. `source` names where the pairs came from.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str | None = field(default=None)

    def __post_init__(self) -> None:
        p = np.asarray(self.prompt_tokens, dtype=np.int64)
        o = np.asarray(self.output_tokens, dtype=np.int64)
        if p.ndim != 1 or p.shape != o.shape or p.size == 0:
            raise ValueError("prompt_tokens and output_tokens must be two non-empty 1-D "
                             f"sequences of the same length, got shapes {p.shape} and {o.shape}")
        if p.min() < 1 or o.min() < 1:
            raise ValueError("every length must be >= 1 token")
        object.__setattr__(self, "prompt_tokens", p)
        object.__setattr__(self, "output_tokens", o)

    @classmethod
    def from_trace(cls, name_or_path: str | os.PathLike, *, format: str | None = None,
                   mapping: Mapping[str, Any] | None = None,
                   skip_bad_rows: bool = False) -> "EmpiricalLengths":
        """The length pairs of a trace (any format, with or without timestamps, e.g.
        ``"arxiv_lengths"``). Raises TraceError for bad input (see `open_trace`)."""
        from array import array

        from .reader import open_trace
        reader = open_trace(name_or_path, format=format, skip_bad_rows=skip_bad_rows,
                            mapping=mapping)
        p, o = array("q"), array("q")
        for r in reader:
            p.append(r.prompt_tokens)
            o.append(r.output_tokens)
        if not p:
            from .errors import TraceError
            raise TraceError(str(reader.path), None, None, "no valid requests to sample lengths from")
        return cls(np.frombuffer(p, dtype=np.int64), np.frombuffer(o, dtype=np.int64),
                   source=str(reader.path))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, self.prompt_tokens.size, n)
        return self.prompt_tokens[idx], self.output_tokens[idx]


def random_dataset_lengths(input_len: int, output_len: int, range_ratio: float = 0.0) -> UniformLengths:
    """vLLM's random dataset (`vllm bench serve --dataset-name random`,
    vllm/benchmarks/datasets.py): prompt lengths uniform on the integers
    [floor(I(1-r)), ceil(I(1+r))], output lengths on [max(1, floor(O(1-r))),
    ceil(O(1+r))], independent. vLLM also subtracts the tokenizer's special tokens
    from I; rack has no tokenizer, so I is the prompt length. Raises ValueError
    unless I, O >= 1 and 0 <= r < 1 (vLLM's bound)."""
    _check_count("input_len", input_len)
    _check_count("output_len", output_len)
    if not (0.0 <= range_ratio < 1.0):
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    lo_in, hi_in = math.floor(input_len * (1 - range_ratio)), math.ceil(input_len * (1 + range_ratio))
    lo_out, hi_out = math.floor(output_len * (1 - range_ratio)), math.ceil(output_len * (1 + range_ratio))
    return UniformLengths(max(1, lo_in), hi_in, max(1, lo_out), hi_out)


LengthDistribution = (FixedLengths | UniformLengths | LogNormalLengths | IndependentLengths
                      | EmpiricalLengths)
