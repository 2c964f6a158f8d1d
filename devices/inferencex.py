"""Measured serving points in InferenceX's published layout (`measured_rows.csv`).

SemiAnalysis's InferenceX runs (2026) publish, per benchmark point, the deployment
(hardware, GPU count, framework, precision, TP / EP / DP attention, for a
disaggregated deployment prefill and decode GPU counts as `prefill/decode`), the
closed-loop load (input / output lengths, concurrency) and what was measured: median
TTFT and TPOT (seconds), tokens/s per user and per GPU and, for some points, the mean
GPU-board power per GPU and tokens per joule. `load_inferencex_rows(path)` reads that
CSV exactly as published (column names and units of `COLUMNS`; see the README that
ships beside the packaged copy, `devices/catalog/inferencex/README.md`) and turns each
row into a `devices.serving_rows.ServingRow` the closed-loop estimate prices, or says
why it cannot:

- a model the catalog does not have is named with its model (`MODEL_NAMES` maps the
  source's display names to catalog keys; DeepSeek-R1-0528 is DeepSeek-V3's
  architecture: its config.json has the same shape);
- a legacy disaggregated row (before 2025-12-19) gives no prefill/decode GPU split;
- a power-only record gives no latency.

Units converted once, here: seconds -> milliseconds for the ServingRow fields (which
carry gpu-calibration.csv's units); tokens/s per GPU and W per GPU unchanged.
Disaggregated rows: the worker counts are in the `notes` column ("N prefill worker(s)
x tpT, M decode worker(s) x tpU"); the source's output tokens/s per GPU is per
*decode* GPU and its total per all P + D GPUs (README), which is what
`closed_loop_estimate` predicts.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import re
from dataclasses import dataclass
from pathlib import Path

from .catalog import CATALOG_DIR, CatalogError, resolve_model
from .serving_rows import ServingRow

#: Columns of measured_rows.csv, in order (units as the source defines them: README).
COLUMNS = (
    "id", "hardware", "gpu_count", "framework", "framework_version", "model", "precision", "isl", "osl", "tp",
    "ep", "dp", "disagg_prefill_gpus", "disagg_decode_gpus", "concurrency", "ttft_median_s", "tpot_median_s",
    "tok_s_per_user", "output_tok_s_per_gpu", "total_tok_s_per_gpu", "power_w_per_gpu", "tokens_per_joule",
    "date", "source_repo", "source_path", "source_commit", "notes",
)
#: The packaged copy of the public extract (its README gives sources and attribution).
PACKAGED_ROWS = CATALOG_DIR / "inferencex" / "measured_rows.csv"
#: InferenceX's display model names -> catalog model keys (None: architecture not in
#: the catalog; the row is answered with that reason).
MODEL_NAMES = {
    "DeepSeek-R1-0528": "deepseek-r1-0528",      # alias of deepseek-v3 (same config.json shape)
}
#: InferenceX framework names -> the serving-row framework names `devices.borrow`
#: knows ("trt" is TensorRT-LLM; Dynamo, MoRI and ATOM run SGLang / TensorRT-LLM /
#: vLLM underneath).
FRAMEWORKS = {
    "SGLang": "sglang", "vLLM": "vllm", "TensorRT-LLM": "trt", "ATOM": "atom", "MoRI+SGLang": "mori-sglang",
    "Dynamo+SGLang": "dynamo-sglang", "Dynamo+TensorRT-LLM": "dynamo-trt", "Dynamo+vLLM": "dynamo-vllm",
}
_WORKERS = re.compile(r"(\d+) prefill worker\(s\) x tp(\d+), (\d+) decode worker\(s\) x tp(\d+)")
_SPEC = re.compile(r"spec_decoding=(\w+)")


@dataclass(frozen=True)
class MeasuredRow:
    """One row of the file: its raw cells, the ServingRow it deploys (None when it
    cannot be priced) and why not (`problem`), plus what was measured of power.

    power_w_per_gpu: mean GPU-board power per GPU over the load window (W; idle
    included), or None; tokens_per_joule: (input + output) tokens per joule of GPU-board
    energy, or None; saturated: an 8k-prompt row at 64 or more users (the issue's
    saturated-prefill set).
    """

    id: str
    model: str
    hardware: str
    framework: str
    row: ServingRow | None
    problem: str
    power_w_per_gpu: float | None
    tokens_per_joule: float | None
    concurrency: int | None
    isl: int | None

    @property
    def saturated(self) -> bool:
        return is_saturated(self.isl, self.concurrency)


#: The issue's check set of saturated rows: 8k-token prompts and at least 64 users.
SATURATED_ISL, SATURATED_USERS = 8192, 64


def is_saturated(isl: int | None, concurrency: int | None) -> bool:
    """Whether a row of `isl` prompt tokens at `concurrency` users is a saturated row
    (`SATURATED_ISL` prompts, at least `SATURATED_USERS` users)."""
    return isl == SATURATED_ISL and (concurrency or 0) >= SATURATED_USERS


def _num(path: Path, line: int, col: str, text: str, kind=float):
    text = (text or "").strip()
    if not text:
        return None
    try:
        v = kind(float(text)) if kind is int else float(text)
    except ValueError:
        raise CatalogError(f"{path}:{line}: column {col!r}: expected a number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise CatalogError(f"{path}:{line}: column {col!r}: expected a positive number, got {text!r}")
    return v


def _sides(text: str) -> tuple[str, str]:
    """'a/b' -> (a, b); 'a' -> (a, a)."""
    parts = (text or "").split("/")
    return (parts[0], parts[-1])


def _to_serving(path: Path, line: int, raw: dict) -> tuple[ServingRow | None, str]:
    model = MODEL_NAMES.get(raw["model"])
    if model is None:
        try:
            resolve_model(raw["model"].lower())
            model = raw["model"].lower()
        except CatalogError:
            return None, f"model {raw['model']!r} is not in the catalog (devices/catalog/models)"
    framework = FRAMEWORKS.get(raw["framework"])
    if framework is None:
        return None, f"framework {raw['framework']!r} is not known (known: {', '.join(FRAMEWORKS)})"
    ttft, tpot = _num(path, line, "ttft_median_s", raw["ttft_median_s"]), _num(path, line, "tpot_median_s",
                                                                              raw["tpot_median_s"])
    tput = _num(path, line, "total_tok_s_per_gpu", raw["total_tok_s_per_gpu"])
    if ttft is None or tpot is None or tput is None:
        return None, "no measured TTFT, TPOT or throughput (a power-only record)"
    gpus = _num(path, line, "gpu_count", raw["gpu_count"], int)
    if gpus is None:
        return None, "legacy disaggregated row: no prefill/decode GPU split in the source"
    spec = _SPEC.search(raw["notes"] or "")
    common = dict(
        id=raw["id"], hardware=raw["hardware"].lower(), gpus_total=gpus, model=model,
        precision=raw["precision"].lower(), framework=framework,
        spec_decoding=spec.group(1) if spec else "none",
        isl_tokens=_num(path, line, "isl", raw["isl"], int), osl_tokens=_num(path, line, "osl", raw["osl"], int),
        concurrency_requests=_num(path, line, "concurrency", raw["concurrency"], int),
        median_tpot_ms=tpot * 1e3, median_ttft_ms=ttft * 1e3, total_tokens_per_s_per_gpu=tput,
        tokens_per_s_per_user=_num(path, line, "tok_s_per_user", raw["tok_s_per_user"]),
        output_tokens_per_s_per_gpu=_num(path, line, "output_tok_s_per_gpu", raw["output_tok_s_per_gpu"]),
        image_tag=raw["framework_version"] or "", date=raw["date"] or "",
        source=f"{raw['source_repo']} {raw['source_path']} @ {raw['source_commit']}", notes=raw["notes"] or "")
    if common["isl_tokens"] is None or common["osl_tokens"] is None:
        return None, "no fixed input/output lengths (an agentic trace replay)"
    flag = {"true": True, "false": False}
    if raw["disagg_prefill_gpus"].strip():
        m = _WORKERS.search(raw["notes"] or "")
        if m is None:
            return None, "disaggregated row without worker counts in its notes"
        (tp_p, tp_d), (ep_p, ep_d), (dp_p, dp_d) = _sides(raw["tp"]), _sides(raw["ep"]), _sides(raw["dp"])
        pre = _num(path, line, "disagg_prefill_gpus", raw["disagg_prefill_gpus"], int)
        dec = _num(path, line, "disagg_decode_gpus", raw["disagg_decode_gpus"], int)
        return ServingRow(**common, disaggregated=True, prefill_gpus=pre, prefill_workers=int(m.group(1)),
                          prefill_tp=int(tp_p), prefill_ep=int(ep_p), prefill_dp_attention=flag[dp_p.lower()],
                          decode_gpus=dec, decode_workers=int(m.group(3)), decode_tp=int(tp_d),
                          decode_ep=int(ep_d), decode_dp_attention=flag[dp_d.lower()]), ""
    return ServingRow(**common, disaggregated=False, tp=int(raw["tp"]), ep=int(raw["ep"] or 1),
                      dp_attention=flag[raw["dp"].lower()]), ""


def load_inferencex_rows(path: str | Path | None = None) -> list[MeasuredRow]:
    """Every row of an InferenceX measured-rows CSV (`COLUMNS`; default: the packaged
    copy, `PACKAGED_ROWS`), each with its ServingRow or the reason it has none.

    Raises:
        CatalogError: unreadable file, a header without `COLUMNS` (missing ones named),
            or a cell of the wrong type (file, line, column).
    """
    path = Path(path) if path is not None else PACKAGED_ROWS
    try:
        f = open(path, newline="", encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"{path}: cannot read measured rows: {e.strerror or e}") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}: not InferenceX's measured-rows layout: missing columns {missing}")
        out = []
        for line, raw in enumerate(reader, 2):
            try:
                row, problem = _to_serving(path, line, raw)
            except (KeyError, ValueError) as e:
                raise CatalogError(f"{path}:{line}: cannot read row {raw.get('id')!r}: {e}") from None
            out.append(MeasuredRow(
                id=raw["id"], model=raw["model"], hardware=raw["hardware"], framework=raw["framework"], row=row,
                problem=problem, power_w_per_gpu=_num(path, line, "power_w_per_gpu", raw["power_w_per_gpu"]),
                tokens_per_joule=_num(path, line, "tokens_per_joule", raw["tokens_per_joule"]),
                concurrency=_num(path, line, "concurrency", raw["concurrency"], int),
                isl=_num(path, line, "isl", raw["isl"], int)))
    if not out:
        raise CatalogError(f"{path}: no rows")
    return out


def is_inferencex_csv(path: str | Path) -> bool:
    """Whether the CSV at `path` has InferenceX's measured-rows header (False when
    unreadable: the caller's reader names the problem)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return all(c in header for c in ("ttft_median_s", "tpot_median_s", "total_tok_s_per_gpu", "gpu_count"))


#: The issue's criteria on these rows: median |error| of TPOT and throughput per GPU
#: over every DeepSeek-R1 row, of TTFT over its saturated rows (8k prompts, >= 64
#: users), of tokens per joule over the rows with measured power.
LIMITS = {"tpot_s": 0.15, "throughput_per_gpu": 0.15, "ttft_s": 0.25, "tokens_per_joule": 0.15}
#: The model whose rows the criteria cover.
CRITERIA_MODEL = "DeepSeek-R1-0528"
METRICS = ("ttft_s", "tpot_s", "throughput_per_gpu", "power_w_per_gpu", "tokens_per_joule")


def measured_figures(m: MeasuredRow) -> dict:
    """The row's measured figures in `closed_loop_estimate`'s units (only those given)."""
    from .serving_rows import measured

    out = measured(m.row) if m.row is not None else {}
    out.pop("input_per_prefill_gpu", None)
    if m.power_w_per_gpu:
        out["power_w_per_gpu"] = m.power_w_per_gpu
    if m.tokens_per_joule:
        out["tokens_per_joule"] = m.tokens_per_joule
    return out


def _why(m: MeasuredRow, errors: dict, lender: str) -> str:
    """Why a row is off, from what is known of it (not a fitted excuse): the source's
    own caveats, borrowed software terms, speculative decoding's assumed acceptance, and
    what a queue-dominated TTFT is sensitive to."""
    r, notes = m.row, []
    if "implausibl" in (r.notes or "").lower():
        notes.append("the source flags this row's figures as implausible")
    if lender:
        notes.append(f"borrows {lender}'s software terms (its leave-one-device-out error applies)")
    if r.spec_decoding != "none":
        notes.append("MTP: acceptance rate assumed, not measured for this stack and date")
    if "ttft_s" in errors and abs(errors["ttft_s"]) > 0.5 and r.concurrency_requests >= 64:
        notes.append("queue-dominated TTFT: N / X - (O - 1) TPOT magnifies throughput and TPOT errors")
    if r.disaggregated and r.prefill_gpus and r.decode_gpus and (r.prefill_workers or 1) > 1:
        notes.append("several prefill workers: the router's balance across them is assumed perfect")
    if not r.image_tag:
        notes.append("no image tag (history row): the stack version is unknown")
    return "; ".join(notes) or "no known cause: the stack's fitted terms miss this deployment"


def saturated_ttft_by_stack(errors: dict[tuple[str, str], list[float]]) -> list[dict]:
    """The saturated rows' TTFT errors grouped by (hardware, framework): [{"hardware",
    "framework", "rows", "signed_median" (relative error), "within" (rows within the
    TTFT criterion)}], most rows first. A systematic signed median names a mechanism a
    stack's terms miss (one sign) rather than noise (both signs around 0)."""
    out = [{"hardware": h, "framework": f, "rows": len(v), "signed_median": float(np.median(v)),
            "within": sum(abs(e) <= LIMITS["ttft_s"] for e in v)} for (h, f), v in errors.items()]
    return sorted(out, key=lambda d: (-d["rows"], d["hardware"], d["framework"]))


def check_rows(rows: list[MeasuredRow], worst: int = 10, replay=None) -> dict:
    """Every row priced by the closed-loop estimate against what it measured.

    `replay`: None, or a function ServingRow -> {"ttft_s", "tpot_s",
    "throughput_per_gpu"} that runs the row as its benchmark ran it (e.g.
    rack.experiments.validation_runs.replay_figures: the benchmark client's closed loop
    through the engines); its figures replace the closed form's, and power per GPU
    stays the closed form's (its load shares), tokens per joule the replayed
    throughput over it. A replay that raises RuntimeError (requests that did not
    complete) leaves its row unanswered with that reason; the other rows go on.

    Returns {"rows": [{"id", "model", "hardware", "framework", "curve", "concurrency",
    "saturated", "borrowed_from", "predicted", "measured", "relative_error"} or {"id",
    "model", ..., "unanswered": reason}], "summary": {"answered", "unanswered" (by
    reason), "priced_by", "criteria_rows", "median_abs_error" {metric: e} over the criteria's rows,
    "n" {metric: rows}, "limits", "met" {metric: bool}}, "worst": [{"id", "curve",
    "metric", "error", "why"}] (the `worst` largest |log error| among criteria rows)}.
    """
    from .borrow import resolve_stack
    from .serving_rows import closed_loop_estimate, deployment

    out, errs, worst_rows = [], {k: [] for k in LIMITS}, []
    by_stack: dict[tuple[str, str], list[float]] = {}     # saturated TTFT errors per (hardware, framework)
    unanswered: dict[str, int] = {}
    for m in rows:
        base = {"id": m.id, "model": m.model, "hardware": m.hardware, "framework": m.framework,
                "concurrency": m.concurrency, "saturated": m.saturated}
        if m.row is None:
            out.append({**base, "unanswered": m.problem})
            unanswered[m.problem] = unanswered.get(m.problem, 0) + 1
            continue
        dep = deployment(m.row)
        lender = resolve_stack(dep.device, dep.stack).borrowed_from
        est, meas = closed_loop_estimate(dep), measured_figures(m)
        if replay is not None:
            try:
                est = {**est, **replay(m.row)}
            except RuntimeError as e:       # a replay that cannot be read: this row is unanswered
                reason = f"replay: {e}"
                out.append({**base, "unanswered": reason})
                unanswered[reason] = unanswered.get(reason, 0) + 1
                continue
            est["tokens_per_joule"] = est["throughput_per_gpu"] / est["power_w_per_gpu"]
        pred = {k: est[k] for k in METRICS}
        rel = {k: pred[k] / meas[k] - 1.0 for k in METRICS if k in meas}
        out.append({**base, "curve": m.row.curve, "borrowed_from": lender or None, "predicted": pred,
                    "measured": meas, "relative_error": rel})
        if m.model != CRITERIA_MODEL:
            continue
        for k in LIMITS:
            if k in rel and (k != "ttft_s" or m.saturated):
                errs[k].append(abs(rel[k]))
        if m.saturated and "ttft_s" in rel:
            by_stack.setdefault((m.hardware, m.framework), []).append(rel["ttft_s"])
        k_bad = max(rel, key=lambda k: abs(math.log1p(rel[k])))
        worst_rows.append({"id": m.id, "curve": m.row.curve, "concurrency": m.concurrency, "metric": k_bad,
                           "error": rel[k_bad], "why": _why(m, rel, lender)})
    med = {k: float(np.median(v)) if v else None for k, v in errs.items()}
    worst_rows.sort(key=lambda w: -abs(math.log1p(w["error"])))
    crit = [m for m in rows if m.model == CRITERIA_MODEL]
    return {"rows": out, "worst": worst_rows[:worst], "summary": {
        "answered": sum(1 for o in out if "unanswered" not in o), "unanswered": unanswered,
        "priced_by": "closed-loop estimate" if replay is None else "engine replay of the benchmark client",
        "criteria_model": CRITERIA_MODEL, "criteria_rows": len(crit),
        "criteria_unanswered": [m.id for m in crit if m.row is None],
        "median_abs_error": med, "n": {k: len(v) for k, v in errs.items()}, "limits": LIMITS,
        "saturated_ttft_by_stack": saturated_ttft_by_stack(by_stack),
        "met": {k: med[k] is not None and med[k] <= lim for k, lim in LIMITS.items()}}}


__all__ = ["COLUMNS", "CRITERIA_MODEL", "LIMITS", "METRICS", "check_rows", "measured_figures", "FRAMEWORKS", "MODEL_NAMES", "MeasuredRow", "PACKAGED_ROWS", "is_inferencex_csv",
           "SATURATED_ISL", "SATURATED_USERS", "is_saturated", "load_inferencex_rows", "saturated_ttft_by_stack"]
