"""Fitting the wafer's prompt terms on the wafer prompt rows of the calibration file.

Two terms, each fitted on the rows that measure it (least squares in log error, one
dimension each, bounded):
- `prompt_token_layer_s` of the CS-3 hardware (shared by its stacks: it is the wafer's
  dataflow, `HardwareSpec.prompt_token_layer_s`), on the server-side rows
  (`prefill_time`, `prefill_rate`: no front end in them);
- `request_latency_s` of each stack with client TTFT rows (`ttft`): the front end
  (HTTP, tokenising, the internet to the measuring client) beside the prompt's time.

`fit_wafer_prompt()` returns the values, whether either sits at a bound, and every
row's error at the fitted values; `rack validate` prints the rows, the catalog carries
the values (devices/catalog/devices/cs3*.toml) and a test checks the two agree.
"""

from __future__ import annotations

import math

import numpy as np

from .catalog import resolve_device
from .validation import PROMPT_KINDS, CalibrationRow, load_rows, predict

#: (lower, upper) of each term: a prompt token holds a layer region for 1 us-1 ms (the
#: decode path's whole per-layer latency is 10-17 us, calibration.md); a front end adds
#: 0-1 s to a TTFT.
BOUNDS = {"prompt_token_layer_s": (1e-6, 1e-3), "request_latency_s": (0.0, 1.0)}
HARDWARE = "cs3"


def _golden(f, lo: float, hi: float, iters: int = 80) -> float:
    """argmin of a unimodal f on [lo, hi] (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _loss(rows: list[CalibrationRow], update) -> float:
    errs = [math.log(predict(r, update(resolve_device(r.device)))[0] / r.published) for r in rows]
    return float(np.sum(np.square(errs)))


def fit_wafer_prompt(rows: list[CalibrationRow] | None = None) -> dict:
    """The fitted prompt terms and the rows' errors.

    Returns {"prompt_token_layer_s": value, "request_latency_s": {stack entry: value},
    "at_bound": [term names at a bound], "rows": [{"name", "kind", "published",
    "predicted", "relative_error"}]}.
    Raises ValueError when the rows hold no server-side wafer prompt row.
    """
    rows = rows if rows is not None else load_rows()
    wafer = [r for r in rows if r.kind in PROMPT_KINDS and resolve_device(r.device).kind == "wafer"]
    server = [r for r in wafer if r.kind != "ttft"]
    if not server:
        raise ValueError("no server-side wafer prompt row (kind prefill_time or prefill_rate) to fit on")
    lo, hi = BOUNDS["prompt_token_layer_s"]
    log_tau = _golden(lambda x: _loss(server, lambda d: d.model_copy(update={"prompt_token_layer_s": math.exp(x)})),
                      math.log(lo), math.log(hi))
    tau = math.exp(log_tau)
    at_bound = []
    if not lo * 1.01 < tau < hi / 1.01:
        at_bound.append("prompt_token_layer_s")
    fronts: dict[str, float] = {}
    rlo, rhi = BOUNDS["request_latency_s"]
    for dev in sorted({r.device for r in wafer if r.kind == "ttft"}):
        mine = [r for r in wafer if r.kind == "ttft" and r.device == dev]
        fit = lambda d, v: d.model_copy(update={"prompt_token_layer_s": tau, "request_latency_s": v})  # noqa: E731
        fronts[dev] = _golden(lambda v: _loss(mine, lambda d: fit(d, v)), rlo, rhi)
        if not rlo + 1e-3 < fronts[dev] < rhi - 1e-3:
            at_bound.append(f"{dev}.request_latency_s")
    out_rows = []
    for r in wafer:
        upd = {"prompt_token_layer_s": tau}
        if r.device in fronts:
            upd["request_latency_s"] = fronts[r.device]
        value, _ = predict(r, resolve_device(r.device).model_copy(update=upd))
        out_rows.append({"name": r.name, "kind": r.kind, "published": r.published, "predicted": value,
                         "relative_error": value / r.published - 1.0})
    return {"prompt_token_layer_s": tau, "request_latency_s": fronts, "at_bound": at_bound, "rows": out_rows}


__all__ = ["BOUNDS", "fit_wafer_prompt"]
