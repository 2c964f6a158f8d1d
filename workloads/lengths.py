"""Request-length distributions (seeded): fixed, uniform, log-normal, empirical.

Each has ``sample(n, rng) -> (prompt_tokens, output_tokens)``, two int64 arrays of
shape (n,) with every value >= 1.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


def _check_count(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return int(value)


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same prompt and output length (tokens)."""

    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _check_count("prompt_tokens", self.prompt_tokens)
        _check_count("output_tokens", self.output_tokens)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return (np.full(n, self.prompt_tokens, dtype=np.int64),
                np.full(n, self.output_tokens, dtype=np.int64))


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
        return (rng.integers(self.prompt_min, self.prompt_max, n, endpoint=True, dtype=np.int64),
                rng.integers(self.output_min, self.output_max, n, endpoint=True, dtype=np.int64))


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
        for name in ("prompt_mean", "output_mean"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 1):
                raise ValueError(f"{name} must be >= 1 token, got {v}")
        for name in ("prompt_cv", "output_cv"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be >= 0, got {v}")
        for name in ("prompt_max", "output_max"):
            if getattr(self, name) is not None:
                _check_count(name, getattr(self, name))

    @staticmethod
    def _draw(mean: float, cv: float, cap: int | None, n: int,
              rng: np.random.Generator) -> np.ndarray:
        s2 = math.log1p(cv * cv)
        x = rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)
        return np.clip(np.rint(x), 1, cap if cap is not None else None).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return (self._draw(self.prompt_mean, self.prompt_cv, self.prompt_max, n, rng),
                self._draw(self.output_mean, self.output_cv, self.output_max, n, rng))


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


LengthDistribution = FixedLengths | UniformLengths | LogNormalLengths | EmpiricalLengths
