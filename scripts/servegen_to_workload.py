#!/usr/bin/env python3
"""Convert a ServeGen-style per-client characterisation into a rack workload file.

ServeGen (Xiang et al., "ServeGen: Workload Characterization and Generation of Large
Language Model Serving in Production", NSDI 2026; github.com/alibaba/ServeGen)
describes each client of a model by, per time window (600 s in its data):
- ``chunk-<id>-trace.csv``: rows ``start_s,rate,cv,pattern,arg1,arg2`` (no header):
  the client's request rate (req/s) and inter-arrival CV in the window, and the
  distribution fitted to its gaps: ``Gamma,shape,scale`` or ``Weibull,shape,scale``
  (an empty pattern: no traffic in the window);
- ``chunk-<id>-dataset.json``: {start_s: {"input_tokens": "{tokens: p, ...}",
  "output_tokens": "{...}", ["reason_ratio": "{share: p, ...}"]}}, PMFs written as
  Python dict literals (read here with ast.literal_eval, never eval).

The workload file keeps, per client and window, the measured rate and the fitted gap
shape (Weibull: the shape k; Gamma: CV = 1/sqrt(shape)); rack rescales the gaps to the
window's rate, as ServeGen's own generator does. Lengths: the client's PMFs pooled
over the chosen windows (weighted by each window's expected request count) and
merged into at most --max-pmf-points equal-probability buckets (each at its mean, so
the mean is kept up to rounding). A reasoning client's reason_ratio becomes its
reasoning_share PMF.

Licence: the ServeGen repository states no licence for its data (checked for this
converter), so rack ships no data derived from it. The example shipped with rack,
workloads/data/servegen_example.toml, is this converter's output on the
illustrative pool in scripts/examples/servegen_style_pool/, whose numbers were made
up for the example and are not ServeGen's. Run it on ServeGen's own files yourself:

    python scripts/servegen_to_workload.py PATH/TO/ServeGen/data/language/m-large \\
        --clients 20 --start 72000 --end 75600 --out m-large-20h.toml
    rack run --runtime virtual --workload m-large-20h.toml
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any


class ConvertError(ValueError):
    """Bad input: the message names the file (and line) and what was expected."""


def read_trace(path: Path) -> list[dict]:
    """Windows of one client: [{start_s, rate, cv, pattern, args}], sorted by start."""
    rows = []
    with open(path, newline="") as f:
        for line_no, row in enumerate(csv.reader(f), 1):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 6:
                raise ConvertError(f"{path}:{line_no}: expected 6 columns "
                                   f"(start_s,rate,cv,pattern,arg1,arg2), got {len(row)}")
            try:
                start, rate, cv = int(float(row[0])), float(row[1]), float(row[2])
                args = (float(row[4] or 0), float(row[5] or 0))
            except ValueError:
                raise ConvertError(f"{path}:{line_no}: expected numbers, got {row}") from None
            pattern = row[3].strip()
            if pattern not in ("", "Gamma", "Weibull"):
                raise ConvertError(f"{path}:{line_no}: unknown arrival pattern {pattern!r} "
                                   "(expected Gamma, Weibull or empty)")
            if rate < 0 or not math.isfinite(rate):
                raise ConvertError(f"{path}:{line_no}: rate must be >= 0, got {rate}")
            if pattern and rate > 0 and not (args[0] > 0):
                raise ConvertError(f"{path}:{line_no}: {pattern} shape must be > 0, got {args[0]}")
            rows.append({"start_s": start, "rate": rate if pattern else 0.0, "cv": cv,
                         "pattern": pattern, "args": args})
    rows.sort(key=lambda r: r["start_s"])
    return rows


def read_dataset(path: Path) -> dict[int, dict[str, dict[float, float]]]:
    """{window start: {field: {value: probability}}} of one client."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: not a JSON object of windows ({exc})") from None
    out: dict[int, dict[str, dict[float, float]]] = {}
    for ts, fields in raw.items():
        window = {}
        for name, text in fields.items():
            try:
                pmf = ast.literal_eval(text) if isinstance(text, str) else text
            except (ValueError, SyntaxError):
                raise ConvertError(f"{path}: window {ts} field {name}: not a {{value: p}} dict") from None
            if not isinstance(pmf, dict):
                raise ConvertError(f"{path}: window {ts} field {name}: not a {{value: p}} dict")
            if pmf:
                window[name] = {float(k): float(p) for k, p in pmf.items()}
        if window:
            out[int(float(ts))] = window
    return out


def _dataset_at(dataset: dict[int, Any], start: int) -> dict | None:
    """The dataset window in force at `start` (the latest one starting at or before it)."""
    keys = [k for k in dataset if k <= start]
    return dataset[max(keys)] if keys else None


def compress_pmf(pmf: dict[float, float], max_points: int, *, integer: bool = True) -> dict[str, float]:
    """`pmf` merged into at most `max_points` buckets of about equal probability, each
    at its probability-weighted mean (rounded to a token count >= 1 when `integer`);
    keys are TOML strings. The mean is kept up to that rounding."""
    items = sorted((v, p) for v, p in pmf.items() if p > 0)
    total = sum(p for _, p in items)
    if total <= 0:
        raise ConvertError("a PMF has no probability mass")
    buckets: list[list[tuple[float, float]]] = [[]]
    acc = 0.0
    for v, p in items:
        buckets[-1].append((v, p))
        acc += p / total
        if acc >= len(buckets) / max_points - 1e-12 and len(buckets) < max_points:
            buckets.append([])
    out: dict[float, float] = {}
    for b in buckets:
        mass = sum(p for _, p in b)
        if mass <= 0:
            continue
        mean = sum(v * p for v, p in b) / mass
        key = max(1, round(mean)) if integer else round(min(max(mean, 0.0), 1.0), 4)
        out[key] = out.get(key, 0.0) + mass / total
    return {(str(int(k)) if integer else f"{k:g}"): round(p, 8) for k, p in sorted(out.items())}


def _pooled(client: dict, field: str, windows: list[dict]) -> dict[float, float]:
    pooled: dict[float, float] = {}
    for w in windows:
        ds = _dataset_at(client["dataset"], w["start_s"])
        if ds is None or field not in ds or w["rate"] <= 0:
            continue
        weight = w["rate"] * w["length_s"]
        s = sum(ds[field].values())
        for v, p in ds[field].items():
            pooled[v] = pooled.get(v, 0.0) + weight * p / s
    return pooled


def convert(pool_dir: Path, *, clients: int | None = None, start_s: int = 0,
            end_s: int | None = None, max_pmf_points: int = 32, name: str | None = None,
            window_s: int = 600, seed: int = 0) -> dict:
    """The workload-file dict of the `clients` busiest clients of `pool_dir` over
    [start_s, end_s) (times relative to start_s in the output). Raises ConvertError."""
    pool_dir = Path(pool_dir)
    traces = sorted(pool_dir.glob("chunk-*-trace.csv"),
                    key=lambda p: int(re.findall(r"chunk-(\d+)-", p.name)[0]))
    if not traces:
        raise ConvertError(f"{pool_dir}: no chunk-<id>-trace.csv files (a ServeGen client pool folder)")
    found = []
    for tpath in traces:
        cid = int(re.findall(r"chunk-(\d+)-", tpath.name)[0])
        dpath = pool_dir / f"chunk-{cid}-dataset.json"
        if not dpath.is_file():
            raise ConvertError(f"{dpath}: missing (every trace file needs its dataset file)")
        rows = read_trace(tpath)
        stop = end_s if end_s is not None else (rows[-1]["start_s"] + window_s if rows else start_s)
        windows = []
        for i, r in enumerate(rows):
            nxt = rows[i + 1]["start_s"] if i + 1 < len(rows) else r["start_s"] + window_s
            lo, hi = max(r["start_s"], start_s), min(nxt, stop)
            if hi > lo:
                windows.append({**r, "start_s": lo, "length_s": hi - lo})
        expected = sum(w["rate"] * w["length_s"] for w in windows)
        if expected > 0:
            found.append({"id": cid, "windows": windows, "expected": expected,
                          "dataset": read_dataset(dpath)})
    if not found:
        raise ConvertError(f"{pool_dir}: no client has traffic in [{start_s}, {end_s}) s")
    found.sort(key=lambda c: (-c["expected"], c["id"]))
    chosen = sorted(found[:clients] if clients else found, key=lambda c: c["id"])
    out_clients = []
    for c in chosen:
        ws = []
        for w in c["windows"]:
            entry: dict[str, Any] = {"start_s": w["start_s"] - start_s, "rate_per_s": round(w["rate"], 6)}
            if w["rate"] > 0:
                shape = w["args"][0]
                if w["pattern"] == "Weibull":
                    entry.update(arrival="weibull", shape=round(shape, 6))
                else:
                    entry.update(arrival="gamma", cv=round(1 / math.sqrt(shape), 6))
            ws.append(entry)
        client: dict[str, Any] = {"name": f"client-{c['id']}", "windows": ws}
        for field in ("input_tokens", "output_tokens"):
            pooled = _pooled(c, field, c["windows"])
            if not pooled:
                raise ConvertError(f"{pool_dir}: client {c['id']} has no {field} PMF in its busy windows")
            client[field] = {"dist": "pmf", "pmf": compress_pmf(pooled, max_pmf_points)}
        ratio = _pooled(c, "reason_ratio", c["windows"])
        if ratio:
            top = max(ratio)
            if top > 1:  # ServeGen's dense form: bin i of n means i / (n - 1)
                ratio = {k / top: p for k, p in ratio.items()}
            client["reasoning_share"] = {"dist": "pmf", "pmf": compress_pmf(ratio, max_pmf_points,
                                                                            integer=False)}
        out_clients.append(client)
    span = (end_s if end_s is not None else max(w["start_s"] + w["length_s"] for c in chosen
                                                  for w in c["windows"])) - start_s
    return {"name": name or f"{pool_dir.name} ({len(out_clients)} clients)",
            "description": f"converted by scripts/servegen_to_workload.py from {pool_dir.name}, "
                           f"[{start_s}, {start_s + span}) s",
            "seed": seed, "duration_s": float(span), "window_s": float(window_s),
            "clients": out_clients}


# ----------------------------------------------------------------------- TOML output
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k) if not re.fullmatch(r'[A-Za-z0-9_-]+', k) else k} = "
                                f"{_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def to_toml(doc: dict, header: str = "") -> str:
    """The workload dict as TOML: top-level keys, then one [[clients]] table each."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    lines += [f"{k} = {_toml_value(v)}" for k, v in doc.items() if k != "clients"]
    for c in doc["clients"]:
        lines += ["", "[[clients]]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in c.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool_dir", type=Path, help="a ServeGen client-pool folder (chunk-<id>-trace.csv, chunk-<id>-dataset.json)")
    ap.add_argument("--out", type=Path, required=True, help="the workload TOML to write")
    ap.add_argument("--clients", type=int, default=None, help="keep the N busiest clients [default: all]")
    ap.add_argument("--start", type=int, default=0, help="first second of the span (window start)")
    ap.add_argument("--end", type=int, default=None, help="end of the span (s) [default: the last window's end]")
    ap.add_argument("--max-pmf-points", type=int, default=32, help="buckets per length PMF")
    ap.add_argument("--window-s", type=int, default=600, help="window length of the pool (ServeGen: 600)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="extra comment lines for the file's header")
    a = ap.parse_args(argv)
    try:
        doc = convert(a.pool_dir, clients=a.clients, start_s=a.start, end_s=a.end,
                      max_pmf_points=a.max_pmf_points, name=a.name, window_s=a.window_s, seed=a.seed)
    except ConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header = ("Workload file written by scripts/servegen_to_workload.py (see docs/workloads.md).\n"
              + a.note).rstrip("\n")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(to_toml(doc, header))
    n = len(doc["clients"])
    print(f"{a.out}: {n} clients, {doc['duration_s']:g} s, windows of {doc['window_s']:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
