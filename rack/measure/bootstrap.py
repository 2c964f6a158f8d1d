"""Bootstrap replicates of one run's figures over its requests: how much a figure
that sums or takes a median over the completed requests moves when the run's requests
are resampled with replacement (Efron's bootstrap). The study's ratios take their 90 %
intervals from these replicates (`rack.experiments.equal_interactivity`,
`rack.experiments.study.analysis`)."""

from __future__ import annotations

import warnings
from typing import Mapping, Optional

import numpy as np

#: Bootstrap replicates per point (resamples of its completed requests).
BOOTSTRAP = 200
#: Seed of every point's resampling (the same requests give the same replicates).
BOOTSTRAP_SEED = 20260723


def bootstrap(speed: np.ndarray, tokens: np.ndarray, replicates: int = BOOTSTRAP,
              seed: int = BOOTSTRAP_SEED, prompt: Optional[np.ndarray] = None) -> dict:
    """The point's uncertainty from its own requests: `replicates` resamples (with
    replacement, the same indices for both arrays) of its completed requests.

    speed: tokens/s per user of each completed request (NaN where it has < 2 output
    tokens); tokens: each one's output tokens (same length). Returns {"boot_x": the
    replicates' median tokens/s per user, "boot_tokens": each replicate's output tokens
    over the point's (every throughput metric, per device, kW or $/h, is proportional
    to output tokens at a fixed energy and cost, so a replicate's metric is the point's
    times this), and with `prompt` (each one's prompt tokens) "boot_prompt": each
    replicate's prompt tokens over the point's}, 5 significant digits; empty lists when
    the point has no completed request. A
    bootstrap over requests treats the requests of one closed loop as independent,
    which neighbouring requests sharing a batch are not: the interval is a lower bound
    on the run-to-run spread (docs/interactivity.md)."""
    n = int(tokens.size)
    if n == 0 or tokens.sum() <= 0:
        return {"boot_x": [], "boot_tokens": [], **({"boot_prompt": []} if prompt is not None else {})}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(replicates, n))
    tok = tokens[idx].sum(axis=1) / tokens.sum()
    extra = {}
    if prompt is not None:
        total = prompt.sum()
        extra["boot_prompt"] = ([float(f"{v:.5g}") for v in prompt[idx].sum(axis=1) / total] if total > 0
                                else [1.0] * replicates)
    with np.errstate(all="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)      # a resample with no 2-token request: NaN
            x = np.nanmedian(speed[idx], axis=1)
    return {"boot_x": [None if not np.isfinite(v) else float(f"{v:.5g}") for v in x],
            "boot_tokens": [float(f"{v:.5g}") for v in tok], **extra}



def output_token_replicates(columns: Mapping[str, np.ndarray]) -> list[float]:
    """`bootstrap(...)["boot_tokens"]` of a run's completed requests from its
    per-request columns ("outcome", "output_tokens"): each replicate's output tokens
    over the run's (a figure proportional to output tokens at a fixed energy and cost,
    tokens per joule or per dollar, is the run's times this)."""
    done = np.asarray(columns["outcome"]) == "completed"
    tokens = np.asarray(columns["output_tokens"], dtype=np.float64)[done]
    return bootstrap(np.full(tokens.shape, np.nan), tokens)["boot_tokens"]


__all__ = ["BOOTSTRAP", "BOOTSTRAP_SEED", "bootstrap", "output_token_replicates"]
