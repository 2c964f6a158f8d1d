"""Write a run's results folder: `results.json`, `requests.csv` and `summary.txt`
(and `error.log` for a run that failed).

`results.json` schema (stable; documented in docs/run.md): `status` ("complete";
"aborted": a component raised or the rack stalled, and the results are what was
measured until then; "interrupted": SIGINT/SIGTERM stopped the replay, and the results
are what finished until then), `error` (aborted runs only: component, t_s, request_id,
type, message, components_without_stats; docs/robustness.md), `interrupted`
(interrupted runs only: signal, t_s), `requests`, `latency`,
`throughput`, `goodput`, `kv_transfer`, `memory`, `utilization`, `emulation`,
`provenance`, `energy`, `cost`, `breakdown` (see rack.measure.energy and rack.measure.breakdown).
`requests.csv` has one row per request: id, prompt/output tokens,
outcome, reason, preemptions, recomputed_tokens (KV tokens recomputed after
preemptions), ttft_s, tpot_s, e2e_s, meets_slo and every lifecycle time (t_arrival ...
t_completion, emulated seconds; empty when it did not happen; t_decode_admit is the first
admission to a decode batch, t_decode_readmit the last re-admission after a preemption).
"""

from __future__ import annotations

import csv
import json
import math
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def to_json(results: dict) -> str:
    """results.json text: NaN/inf become null, numpy values become plain numbers."""
    return json.dumps(_clean(results), indent=2, sort_keys=False)


#: Rows converted to Python values at a time by `write_requests_csv` (a million rows'
#: columns as Python objects would take ~1 GB).
CSV_BLOCK_ROWS = 1 << 15


def write_requests_csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    """One row per request (see the module docstring), written block by block."""
    names = list(columns)
    n = len(columns["id"])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for a in range(0, n, CSV_BLOCK_ROWS):
            cols = [columns[k][a:a + CSV_BLOCK_ROWS].tolist() for k in names]
            for row in zip(*cols):
                w.writerow(["" if v != v else repr(v) if isinstance(v, float) else v for v in row])


def fmt_s(v: float | None) -> str:
    """Seconds as a short human string (us/ms/s)."""
    if v is None:
        return "-"
    if v < 1e-3:
        return f"{v * 1e6:.1f} us"
    if v < 1.0:
        return f"{v * 1e3:.1f} ms"
    return f"{v:.2f} s"


def not_arrived_note(requests: dict) -> str:
    """" (N of them had not arrived)" for results.json's `requests` section when the
    run stopped before N requests arrived, else ""."""
    n = requests.get("not_arrived")
    return f" ({n} of them had not arrived)" if n else ""


def summary_text(results: dict) -> str:
    """A plain-text summary of one run (what `rack run` prints)."""
    r, lat = results["requests"], results["latency"]
    lines = []
    if results.get("status") == "interrupted":
        why = results.get("interrupted") or {}
        at = f" at t={why['t_s']:.6f} s" if why.get("t_s") is not None else ""
        lines.append(f"RUN INTERRUPTED ({why.get('signal') or 'stop request'}{at}): the figures below cover "
                     "the requests that finished until then")
    if results.get("status") == "aborted":
        err = results.get("error", {})
        missing = err.get("components_without_stats") or []
        lines.append(f"RUN ABORTED: {err.get('message') if 'component' not in err else _component_error(err)}; "
                     "the figures below cover what was measured until then"
                     + (f" (no statistics from {', '.join(missing)})" if missing else ""))
    e = results["emulation"]
    lines += [f"scenario {results['provenance']['scenario']}  runtime {e['runtime']}"
             + (f"  dilation {e['dilation']}" if e['dilation'] else "")
             + f"  wall {e['wall_s']:.1f} s",
             f"requests: {r['submitted']} submitted, {r['completed']} completed, {r['rejected']} rejected,"
             f" {r['failed']} failed"
             + (f", {r['open']} " + ("unfinished" if results.get("status") == "interrupted" else "never ended")
                + not_arrived_note(r)
                if r.get("open") else "")
             + (f" (reasons: {r['rejected_by_reason'] | r['failed_by_reason']})"
                if r['rejected'] or r['failed'] else "")
             + (f"; {r['truncated']} truncated to the context limit" if r.get("truncated") else "")]
    if r.get("skipped_rows") or r.get("source_failed"):
        lines.append(f"trace rows not replayed: {r.get('skipped_rows', 0)} bad rows skipped"
                     + (f" {r['skipped_by_reason']}" if r.get("skipped_rows") else "")
                     + f", {r.get('source_failed', 0)} requests that failed at the source (excluded)")
    cols = ("mean", "min", "p50", "p90", "p99")
    lines.append(f"{'metric':<8}" + "".join(f"{c:>11}" for c in cols))
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        s = lat[key]
        lines.append(f"{label:<8}" + "".join(f"{fmt_s(s.get(p)):>11}" for p in cols))
    # a client-side replay (`rack bench-serve`) has no KV, memory or lateness figures
    t, g, kv = results["throughput"], results["goodput"], results.get("kv_transfer") or {"transfers": 0}
    lines.append(f"throughput: {t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:.0f} output tok/s"
                 f" over {t['duration_s']:.1f} s emulated (first arrival to last request event)")
    where = (f"arrivals {g['window_s'][0]:.1f}-{g['window_s'][1]:.1f} s, warm-up and drain excluded"
             if g.get("basis") == "steady_state" else
             "whole run: the arrivals came in a burst shorter than the requests' median time in the rack"
             if g.get("basis_reason") == "burst" else "whole run: too few arrivals for a steady-state window")
    lines.append(f"goodput: {g['requests_per_s']:.2f} req/s meeting TTFT<={g['slo']['ttft_s']*1e3:.0f} ms and "
                 f"TPOT<={g['slo']['tpot_s']*1e3:.0f} ms of {g['offered_requests_per_s']:.2f} req/s offered "
                 f"({where}); SLO attainment {g['slo_attainment']:.1%} of all requests")
    if kv["transfers"]:
        lines.append(f"KV transfer: {kv['transfers']} transfers, {kv['bytes_logical']/1e9:.2f} GB logical, "
                     f"{kv['bytes_shipped']/1e6:.2f} MB shipped, {kv['checksum_failures']} checksum failures, "
                     f"time p50 {fmt_s(kv['time_s']['p50'])} p99 {fmt_s(kv['time_s']['p99'])}")
    pc = results.get("prefix_cache")
    if pc:
        lines.append(f"prefix cache: {pc['lookups']} lookups, hit ratio {pc['hit_ratio']:.3f}: "
                     f"{pc['hit_tokens']:,} of {pc.get('cacheable_tokens', 0):,} cacheable prompt tokens served "
                     "from cache (ideal "
                     + (f"{pc['ideal_hit_ratio']:.3f}" if pc["ideal_hit_ratio"] is not None else "unknown")
                     + ": an unbounded cache shared by every instance"
                     + (f"; {pc['capacity_hit_ratio']:.3f} with the instances' {pc['capacity_blocks']:,} blocks pooled"
                        if pc.get("capacity_hit_ratio") is not None else "") + "); "
                     f"{pc['hit_blocks']:,} of {pc['hit_blocks'] + pc['miss_blocks']:,} full blocks hit, "
                     f"{pc['miss_tokens']:,} prompt tokens computed")
    for pool, m in results.get("memory", {}).items():
        u = results["utilization"].get(pool, {})
        stack = f" ({u['stack']})" if u.get("stack") else ""
        lines.append(f"pool {pool}: {m['devices']} x {u.get('device', 'devices')}{stack}, memory peak "
                     f"{m['peak_bytes']/1e9:.1f} of {m['capacity_bytes']/1e9:.1f} GB, MFU {u.get('compute', 0):.2%}, "
                     f"MBU {u.get('memory_bandwidth', 0):.2%}, busy {u.get('busy_fraction', 0):.1%} per device")
    en, co = results.get("energy"), results.get("cost")
    if en:
        tpj = en["tokens_per_joule"]
        usd = co.get("usd_per_mtok") if co else None
        where = {"system": "devices + hosts, NICs, switches", "devices": "devices only"}.get(en.get("boundary"), "")
        lines.append(f"energy{f' ({where})' if where else ''}: {en['joules'] / 3.6e6:.2f} kWh over "
                     f"{en['window_s']:.1f} s from t=0 (mean "
                     f"{en['mean_power_w'] / 1e3:.1f} kW, idle {en['idle_power_w'] / 1e3:.1f} kW), "
                     + (f"{tpj:.4g} output tokens/J" if tpj else "no output tokens")
                     + (f"; cost ${usd:.2f} per million output tokens ({co['basis']})" if usd is not None else ""))
    if e["runtime"] == "ray":
        ls = e["lateness_s"]
        lines.append(f"lateness (emulated): p50 {fmt_s(ls['p50'])}, p99 {fmt_s(ls['p99'])}, max {fmt_s(ls['max'])}")
        tpot50 = lat["tpot_s"]["p50"]
        # `rack serve` judges pacing on what its clients measured (its own summary
        # line, `rack.serve.runs.client_agreement`), not on a TPOT no client sees
        if tpot50 and ls["p99"] and ls["p99"] > 0.01 * tpot50 and "serve" not in results:
            lines.append(f"WARNING: p99 lateness {fmt_s(ls['p99'])} is more than 1% of the median TPOT "
                         f"{fmt_s(tpot50)}: the host could not keep pace; raise --dilation")
    f = results.get("faults")
    if f and (f["injected"] or f.get("actor_deaths") or f["checksum_failures"] or f["requests_failed"]):
        no_target = f"{f['no_target']} with no target at that time, " if f.get("no_target") else ""
        deaths = f"{f['actor_deaths']} actor death(s) (not injected), " if f.get("actor_deaths") else ""
        lines.append(f"faults: {f['injected']} injected, {deaths}{f['recovered']} recovered, {no_target}"
                     f"{f['requests_failed']} requests failed, {f['checksum_failures']} checksum "
                     f"failures caught, {f['payloads_resent']} KV payloads re-sent")
    if f:
        late = [r for r in f["list"] if not r.get("applied") and not r.get("error")]
        if late:
            lines.append(f"faults: {len(late)} of {len(f['list'])} not applied (scheduled after the run ended: "
                         + ", ".join(f"{r['kind']} at {r['at_s']:g} s" for r in late[:3])
                         + (", ..." if len(late) > 3 else "") + ")")
        for err in f["errors"]:
            lines.append(f"WARNING: {err}")
    if e["violations"]:
        lines.append(f"WARNING: {len(e['violations'])} accounting violation(s): {e['violations'][:3]}")
    return "\n".join(lines)


def _component_error(err: dict) -> str:
    if err.get("line"):             # a lost Ray actor (rack.runtime.errors.ActorLost): its own line
        return err["line"]
    req = f" (request {err['request_id']})" if err.get("request_id") is not None else ""
    t = f" at t={err['t_s']:.6f} s" if err.get("t_s") is not None else ""
    return f"component {err['component']!r} raised{t}{req}: {err['type']}: {err['message']}"


def write_error_log(out_dir: str | Path, exc: BaseException) -> Path:
    """Write `exc`'s traceback (with its causes, and the traceback a cause kept from
    another process: `remote_traceback`, Ray) to `out_dir`/error.log; returns the path."""
    path = Path(out_dir) / "error.log"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    cause: BaseException | None = exc
    while cause is not None:
        remote = getattr(cause, "remote_traceback", None)
        if remote:
            text += "\nWhere it was raised (in the component's process):\n" + remote
            break
        cause = cause.__cause__
    path.write_text(text)
    return path


def write_results(out_dir: str | Path, results: dict, columns: dict[str, np.ndarray]) -> Path:
    """Write requests.csv, summary.txt and then results.json into `out_dir` (created).

    results.json comes last and whole (`write_text_atomic`): a reader that finds it
    finds a complete results.json and the files written before it, never a truncated
    one (a full disk, a process killed mid-write) or an earlier run's beside this one's
    requests. Raises OSError when a file cannot be written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_requests_csv(out / "requests.csv", columns)
    (out / "summary.txt").write_text(summary_text(results) + "\n")
    write_text_atomic(out / "results.json", to_json(results))
    return out


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it and `os.replace`: the
    file is the old one or the new one, whole, at every instant. The temporary file is
    removed when the write fails (OSError raised)."""
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
