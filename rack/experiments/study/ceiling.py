"""The physics ceiling of a split/wafer-alone ratio of tokens/s per kW at equal
interactivity, derived from the runs' own token counts and power.

Taking prefill off a wafer pipeline frees at most the pipeline time its prompt tokens
held. As long as a prompt token costs the wafer no more pipeline time than a decode
token at the same batch and context (the wafer cost model's invariant, issue 33), the
prompt tokens the wafer alone computed, P (cache hits excluded), held at most P / (P +
O) of its time, O being its output tokens. With the same wafers the split can then emit
at most (1 + P / O) times the wafer alone's output at the same tokens/s per user, and
it draws the split's power instead of the wafer alone's:

    split / wafer-alone tokens/s per kW  <=  (1 + P / O) x power(wafer alone) / power(split)

P / O and the two mean powers are read from the two curves' points at the reading's
tokens/s per user (interpolated linearly between neighbouring points, as the readings
are). Assumes both deployments have the same wafers (true of every shipped pair); the
split's GPUs only add power. A measured ratio above the ceiling means the wafer alone
is charged more per prompt token than per decode token, or the split reuses cached
prompts the wafer alone recomputes: the page says so.

`physics_ceiling` is the one function the page calls; a cost-model ceiling (the wafer's
own per-token costs) can replace it there.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence



def _at(points: Sequence[Mapping], x: float, key: str) -> Optional[float]:
    """`key` of a point list at tokens/s per user `x`, interpolated between the two
    neighbouring points (by concurrency) whose x bracket it; None outside the range."""
    from rack.experiments.equal_interactivity import value_at

    return value_at([sorted(points, key=lambda p: p["concurrency"])], x, metric=key)


def physics_ceiling(split: Sequence[Mapping], wafer: Sequence[Mapping], x: Optional[float]) -> dict:
    """The ceiling of split / wafer-alone tokens/s per kW at `x` tokens/s per user.

    split, wafer: the two curves' points (`rack.experiments.interactivity.point_metrics`
    dicts: "prompt_tokens_computed", "output_tokens", "mean_power_w", `X_KEY`).
    Returns {"ceiling" (None where either curve cannot be read at x), "x",
    "prompt_per_output" (P / O of the wafer alone), "power_ratio" (wafer alone's
    mean power over the split's), "formula"}."""
    out = {"ceiling": None, "x": x, "prompt_per_output": None, "power_ratio": None,
           "formula": "(1 + P/O of the wafer alone) x wafer-alone power / split power"}
    if x is None:
        return out
    with_ratio = [{**p, "_p_per_o": p["prompt_tokens_computed"] / p["output_tokens"]} for p in wafer
                  if p.get("output_tokens") and p.get("prompt_tokens_computed") is not None]
    p_o = _at(with_ratio, x, "_p_per_o")
    pw, ps = _at(wafer, x, "mean_power_w"), _at(split, x, "mean_power_w")
    if p_o is None or not pw or not ps:
        return out
    return {**out, "ceiling": (1.0 + p_o) * pw / ps, "prompt_per_output": p_o, "power_ratio": pw / ps}


__all__ = ["physics_ceiling"]
