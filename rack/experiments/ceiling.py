"""The physics ceiling of a split rack's gain over the wafer alone (docs/devices.md,
"What taking prefill off the wafer can gain").

The wafer alone spends its pipeline time on prompt tokens and on decode tokens. A prompt
token never costs the wafer more pipeline time than a decode token at the same batch and
context (tests/test_wafer_pipeline.py holds the invariant: a prompt token's arithmetic is
a decode token's, without the per-step weight reads, and the prompts of several requests
stream through the layer regions at once as decode micro-batches do). So the prompts take
at most P / O of the time the wafer spends on its O output tokens, P the prompt tokens it
computes (prefix-cache hits excluded). Moving every prompt to GPUs frees at most that
share, so at equal tokens/s per user the same wafers give at most (1 + P / O) times the
output tokens/s; the split rack draws the wafers' power and the GPUs'. Its tokens/s per
kW over the wafer alone's is therefore at most

    ceiling = (1 + P / O) x (power of the wafer alone) / (power of the split rack)

with each rack's mean power over its run (its own energy boundary). On a 1k-in/1k-out
chat workload without cache hits this is 2x the power ratio, itself below 1: a reading
above it says a prompt token cost the wafer more than a decode token, which the cost
model rules out.
"""

from __future__ import annotations

import math


def split_ratio_ceiling(prompt_tokens: float, output_tokens: float, alone_power_w: float,
                        split_power_w: float) -> float:
    """The largest split / wafer-alone ratio of tokens/s per kW physics allows at equal
    tokens/s per user (see the module docstring).

    Args:
        prompt_tokens: prompt tokens the wafer alone computes (cache hits excluded), >= 0.
        output_tokens: output tokens it generates, > 0 (same workload; only P / O counts).
        alone_power_w: the wafer alone's mean power (W), > 0.
        split_power_w: the split rack's mean power (W), > 0.
    Returns: (1 + P / O) x alone_power_w / split_power_w.
    Raises: ValueError on a negative or non-finite count, output_tokens <= 0 or a
        power <= 0.
    """
    vals = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "alone_power_w": alone_power_w,
            "split_power_w": split_power_w}
    for name, v in vals.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v)) or v < 0:
            raise ValueError(f"split_ratio_ceiling: {name} must be a finite number >= 0, got {v!r}")
    for name in ("output_tokens", "alone_power_w", "split_power_w"):
        if not vals[name] > 0:
            raise ValueError(f"split_ratio_ceiling: {name} must be > 0, got {vals[name]!r}")
    return (1.0 + prompt_tokens / output_tokens) * alone_power_w / split_power_w


__all__ = ["split_ratio_ceiling"]
