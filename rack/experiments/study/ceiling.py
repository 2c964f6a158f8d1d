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

`physics_ceiling` is the one function the page calls: it reads P / O and the powers off
the curves and takes the ceiling from `rack.experiments.ceiling.split_ratio_ceiling` (the
formula and its derivation, docs/devices.md), with a bootstrap interval over P / O.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from rack.experiments.ceiling import split_ratio_ceiling


def _at(points: Sequence[Mapping], x: float, key: str, boot: bool = False):
    """`key` of a point list at tokens/s per user `x` as the readings read it
    (`rack.experiments.equal_interactivity`: interpolated between neighbouring points, a
    curve ending within `EQUAL_WITHIN` of x read at its end); None outside the range."""
    from rack.experiments.equal_interactivity import snap_x, value_at

    branch = [sorted(points, key=lambda p: p["concurrency"])]
    at = snap_x(branch, x, key)
    return None if at is None else value_at(branch, at, metric=key, boot=boot)


def physics_ceiling(split: Sequence[Mapping], wafer: Sequence[Mapping], x: Optional[float]) -> dict:
    """The ceiling of split / wafer-alone tokens/s per kW at `x` tokens/s per user.

    split, wafer: the two curves' points (`rack.experiments.interactivity.point_metrics`
    dicts: "prompt_tokens_computed", "output_tokens", "mean_power_w", `X_KEY`).
    Returns {"ceiling" (None where either curve cannot be read at x), "interval" (90 %
    over the wafer points' bootstrap replicates of their prompt and output tokens, P/O
    moving with them and the powers held; None without replicates), "x",
    "prompt_per_output" (P / O of the wafer alone), "power_ratio" (wafer alone's
    mean power over the split's), "formula"}."""
    import numpy as np

    from rack.experiments.equal_interactivity import COVERAGE

    out = {"ceiling": None, "interval": None, "x": x, "prompt_per_output": None, "power_ratio": None,
           "formula": "(1 + P/O of the wafer alone) x wafer-alone power / split power"}
    if x is None:
        return out
    with_ratio = []
    for p in wafer:
        if p.get("output_tokens") and p.get("prompt_tokens_computed") is not None:
            # a replicate's P/O: the computed prompt tokens scale with the resampled prompts
            bp, bt = p.get("boot_prompt"), p.get("boot_tokens")
            reps = list(np.asarray(bp) / np.asarray(bt)) if bp and bt and len(bp) == len(bt) else None
            # value_at scales a point's metric by its "boot_tokens": here the replicate's P/O factor
            with_ratio.append({**p, "_p_per_o": p["prompt_tokens_computed"] / p["output_tokens"],
                               "boot_tokens": reps})
    p_o = _at(with_ratio, x, "_p_per_o")
    pw, ps = _at(wafer, x, "mean_power_w"), _at(split, x, "mean_power_w")
    if p_o is None or not pw or not ps:
        return out
    reps = _at(with_ratio, x, "_p_per_o", boot=True)
    interval = None
    if reps is not None and np.isfinite(reps).any():
        c = (1.0 + reps[np.isfinite(reps)]) * pw / ps
        tail = (1 - COVERAGE) / 2 * 100
        interval = [float(np.percentile(c, tail)), float(np.percentile(c, 100 - tail))]
    return {**out, "ceiling": split_ratio_ceiling(p_o, 1.0, pw, ps), "interval": interval, "prompt_per_output": p_o,
            "power_ratio": pw / ps}


__all__ = ["physics_ceiling"]
