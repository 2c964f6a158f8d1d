"""`rack bench --peer`: rack's whole-trace replays beside NVIDIA Dynamo's mocker (the
Rust engine core behind AISimulate), measured in the same run.

For each trace and each matched pair (rack scenario, mocker deployment) it runs, in
fresh processes and alternately, each round going through every output scale (x1, x2): the
previous code's replay (with `--baseline REF`),
this code's replay (both in sweep mode, `rack.experiments.bench_baseline.replay_in`:
`run_scenario` alone is timed, after the trace is read and a 20-request warm-up), and
the mocker's `run_trace_replay` (`rack/experiments/peer_mocker.py`, run by its file path
with the peer's interpreter, so that rack never imports or depends on it). Figures are
medians over `repeat` rounds; CPU time is the child's `time.process_time` (every
thread), the figure to compare on a shared host; ratios are rack / mocker (< 1: rack
is cheaper).

Matched deployments (`PAIRS`): 4 aggregated workers against `gpu-only-kimi-k2` (4
colocated instances); 2 prefill + 2 decode workers against `helios-cs3-kimi-k2` and
`gpu-pd-kimi-k2` (2 prefill instances + wafer or GPU decode). The mocker runs twice per
round: with its own defaults (KV blocks of 64 tokens, 16,384 blocks per worker, at most
256 sequences and 8,192 batched tokens per step, its built-in polynomial timing model),
and, with `matched_blocks`, at the rack scenario's KV block size (16 tokens) with as many
more blocks as keep the same KV capacity in tokens (`matched_block_args`): the same
deployment at rack's block size, the mocker's side "peer_matched" (its block bookkeeping
is per block, so it costs it more; its TTFT and TPOT stay those of its default run). Its
times include reading the JSONL file. The traces go to it as Mooncake JSONL written
from the same requests rack replays (`write_mooncake_jsonl`: a Mooncake trace keeps its
hash ids, an Azure trace gets a fresh id per 512-token block, i.e. no shared prefixes,
as the Azure trace has none).

The peer's interpreter: the `python` argument, else the environment variable
`RACK_PEER_PYTHON`, else this interpreter. When it cannot import `dynamo.replay` the
section says so (`installed: False` with the reason) and measures nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from rack.experiments.bench_baseline import REPLAY_TIMEOUT_S, checkout, columns_diff, project_root, replay_in
from rack.experiments.peer_mocker import BLOCK_TOKENS as MOCKER_BLOCK_TOKENS
from rack.experiments.peer_mocker import GPU_BLOCKS as MOCKER_GPU_BLOCKS

#: (rack scenario, mocker mode, aggregated workers or (prefill, decode) workers).
PAIRS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("gpu-only-kimi-k2", "agg", (4,)),
    ("helios-cs3-kimi-k2", "pd", (2, 2)),
    ("gpu-pd-kimi-k2", "pd", (2, 2)),
)
PEER_TRACES = ("mooncake_conv", "azure_conv")
#: Environment variable naming the peer's interpreter.
ENV_VAR = "RACK_PEER_PYTHON"
#: Tokens per generated hash id for a trace without them (Mooncake's block).
HASH_BLOCK_TOKENS = 512
RUNNER = Path(__file__).resolve().parent / "peer_mocker.py"


def peer_python(python: str | None = None) -> str:
    """The interpreter that runs the mocker: `python`, $RACK_PEER_PYTHON, or this one."""
    return python or os.environ.get(ENV_VAR) or sys.executable


def peer_status(python: str) -> dict:
    """{"python", "installed": bool, "version" (ai-dynamo-runtime's, or None), "why"
    (when not installed)}: whether `python` can import the mocker's replay API."""
    code = ("import importlib.metadata as m, dynamo.replay; "
            "print(m.version('ai-dynamo-runtime'))")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"python": python, "installed": False, "version": None, "why": f"cannot run {python}: {exc}"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"python": python, "installed": False, "version": None,
                "why": f"{python} cannot import dynamo.replay ({last}); install it as docs/bench.md says"}
    return {"python": python, "installed": True, "version": r.stdout.strip()}


def write_mooncake_jsonl(requests: Sequence[Any], path: Path, block_tokens: int = HASH_BLOCK_TOKENS) -> int:
    """Write `requests` (`workloads.Request`s, arrival order) as Mooncake JSONL: one
    {"timestamp" (ms from the trace start), "input_length", "output_length", "hash_ids"}
    per line. A request's own `block_hashes` are kept (Mooncake); one without them gets
    ceil(prompt / block_tokens) ids never used before (no shared prefix). Returns the
    number of lines written."""
    next_id = 1 + max((max(r.block_hashes) for r in requests if r.block_hashes), default=-1)
    with open(path, "w") as f:
        for r in requests:
            if r.block_hashes:
                ids = list(r.block_hashes)
            else:
                k = -(-int(r.prompt_tokens) // block_tokens)
                ids = list(range(next_id, next_id + k))
                next_id += k
            f.write(json.dumps({"timestamp": round(float(r.arrival_s) * 1000.0, 3),
                                "input_length": int(r.prompt_tokens), "output_length": int(r.output_tokens),
                                "hash_ids": ids}) + "\n")
    return len(requests)


def scenario_block_tokens(scenario: str) -> int:
    """The KV block size (tokens) of rack scenario `scenario` (a name or a TOML path):
    its pools' `kv_block_tokens`. Raises ValueError when its pools differ (no single
    block size for the mocker to match)."""
    from rack.wiring.load import load_scenario

    sizes = {p.kv_block_tokens for p in load_scenario(scenario).pools}
    if len(sizes) != 1:
        raise ValueError(f"scenario {scenario!r}: its pools use KV blocks of {sorted(sizes)} tokens; "
                         "the mocker can match one size only")
    return sizes.pop()


def matched_block_args(block_tokens: int) -> dict:
    """The mocker's engine limits at rack's KV block size: {"block_tokens", "gpu_blocks"},
    the blocks per worker that hold the same tokens as its defaults (64 x 16,384 =
    1,048,576 tokens; `peer_mocker.py`), so that only the block size differs. Raises
    ValueError for a block size that does not divide that capacity."""
    tokens = MOCKER_BLOCK_TOKENS * MOCKER_GPU_BLOCKS
    if block_tokens < 1 or tokens % block_tokens:
        raise ValueError(f"KV block of {block_tokens} tokens: must divide the mocker's {tokens:,} tokens per worker")
    return {"block_tokens": int(block_tokens), "gpu_blocks": tokens // block_tokens}


def peer_replay(python: str, jsonl: Path, mode: str, workers: Sequence[int],
                limits: dict | None = None) -> dict:
    """One mocker replay of `jsonl` in a fresh `python` process (`peer_mocker.py`);
    limits: {"block_tokens", "gpu_blocks"} instead of the mocker's defaults
    (`matched_block_args`). Returns its JSON line ({"wall_s", "cpu_s", "requests",
    "completed", ...}); raises RuntimeError with its last lines if it fails."""
    cmd = [python, str(RUNNER), str(jsonl), "--mode", mode]
    cmd += ["--workers", str(workers[0])] if mode == "agg" else ["--prefill", str(workers[0]),
                                                                 "--decode", str(workers[1])]
    for key, value in (limits or {}).items():
        cmd += [f"--{key.replace('_', '-')}", str(int(value))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=REPLAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"mocker replay of {jsonl} took over {REPLAY_TIMEOUT_S:g} s") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr.strip() or r.stdout.strip()).splitlines()[-8:])
        raise RuntimeError(f"mocker replay of {jsonl} failed (exit {r.returncode}):\n{tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(statistics.median(vals)) if vals else math.nan


def peer_section(traces: Sequence[str] = PEER_TRACES, pairs: Sequence[tuple] = PAIRS, *, repeat: int = 3,
                 baseline: str | None = None, python: str | None = None,
                 output_scales: Sequence[float] = (1.0, 2.0),
                 window: tuple[float | None, float | None] | None = None, matched_blocks: bool = True,
                 progress: Callable[[str], None] = lambda _m: None) -> dict:
    """rack (this code and, with `baseline`, the previous code) beside the mocker on the
    whole `traces`, each pair of `pairs`, each output scale, alternating (module
    docstring). window: (start, end) s of each trace instead of the whole (tests).
    matched_blocks: also the mocker at each scenario's KV block size (side
    "peer_matched", ratios "cpu_ratio_to_peer_matched" and "wall_ratio_to_peer_matched",
    its limits under "mocker" as "matched").

    Returns {"peer": `peer_status`, "baseline_ref", "pairs", "traces": {trace: {
    "x{scale}": {scenario: {"mocker": {"mode", "workers"}, "requests", "cpu_s"
    {side: median s}, "wall_s" {side: median s}, "cpu_us_per_request" {side},
    "wall_us_per_request" {side}, "cpu_ratio_to_peer" {rack side: rack / mocker},
    "wall_ratio_to_peer", "cpu_speedup" (baseline / current, with a baseline),
    "events_per_request" {rack side}, "metrics" (`columns_diff` of baseline and current,
    first round, with "itl_summary_equal": their results' ITL summaries equal to the
    last bit, and both as "itl_s"), "runs" {side: [...]}, "peer_ttft_p50_ms" {mocker side:
    its first round's median TTFT, ms: the same deployment's at both block sizes}}}}}};
    sides are "current", "baseline", "peer" and "peer_matched".
    Without the peer installed, the rack sides still run and "peer" says why.
    Raises RuntimeError if a replay fails.
    """
    from workloads import load_requests

    status = peer_status(peer_python(python))
    out: dict[str, Any] = {"peer": status, "baseline_ref": baseline, "pairs": [list(p[:2]) + [list(p[2])] for p in pairs],
                           "traces": {}}
    if not status["installed"]:
        progress(f"peer: NOT INSTALLED ({status['why']}); rack replays only")
    current = project_root()
    import contextlib

    with (checkout(baseline) if baseline else contextlib.nullcontext(None)) as base, \
            tempfile.TemporaryDirectory(prefix="rack-bench-peer-") as tmp:
        sides = [("baseline", base)] if base is not None else []
        sides.append(("current", current))
        for trace in traces:
            jsonl = {scale: Path(tmp) / f"{Path(str(trace)).stem}-x{scale:g}.jsonl" for scale in output_scales}
            if status["installed"]:
                for scale, path in jsonl.items():
                    write_mooncake_jsonl(load_requests(trace, output_scale=scale, window=window), path)
            rows: dict[str, Any] = {f"x{scale:g}": {} for scale in output_scales}
            for scenario, mode, workers in pairs:
                # the mocker's sides: its defaults, then (matched_blocks) rack's block size
                mockers = [("peer", None)]
                if matched_blocks:
                    mockers.append(("peer_matched", matched_block_args(scenario_block_tokens(scenario))))
                runs = {scale: {s: [] for s in [*(s for s, _ in sides), *(m for m, _ in mockers)]}
                        for scale in output_scales}
                cols = {(scale, s): Path(tmp) / f"{s}-x{scale:g}.npz" for scale in output_scales for s, _ in sides}
                # each round runs every output scale, so that the doubled outputs' ratio
                # compares replays minutes apart at most, not a whole trace's section apart
                for i in range(max(1, int(repeat))):
                    for scale in output_scales:
                        for side, root in sides:
                            progress(f"peer comparison: {trace} x{scale:g} {scenario}, rack {side}, "
                                     f"round {i + 1}/{repeat}")
                            runs[scale][side].append(replay_in(
                                root, trace, scenario, output_scale=scale, mode="sweep", window=window,
                                columns_to=cols[scale, side] if i == 0 else None))
                        for side, limits in mockers if status["installed"] else ():
                            progress(f"peer comparison: {trace} x{scale:g}, mocker {mode} {workers}"
                                     f"{'' if limits is None else f' at {limits}'}, round {i + 1}/{repeat}")
                            runs[scale][side].append(peer_replay(status["python"], jsonl[scale], mode, workers, limits))
                for scale in output_scales:
                    row = _pair_row(runs[scale], [s for s, _ in sides], mockers, mode, workers)
                    if base is not None:
                        row["cpu_speedup"] = row["cpu_s"]["baseline"] / row["cpu_s"]["current"]
                        row["metrics"] = columns_diff(cols[scale, "baseline"], cols[scale, "current"])
                        # the ITL summary (mean, extremes, percentiles, count): equal to the last bit
                        itl = {s: runs[scale][s][0].get("itl_s") for s, _ in sides}
                        row["metrics"]["itl_summary_equal"] = itl["baseline"] == itl["current"]
                        row["metrics"]["itl_s"] = itl
                    rows[f"x{scale:g}"][scenario] = row
            out["traces"][trace] = rows
    return out


def _pair_row(runs: dict[str, list[dict]], racks: list[str], mockers: list[tuple[str, dict | None]],
              mode: str, workers: Sequence[int]) -> dict:
    """`peer_section`'s row of one pair at one output scale from its replays (`runs`:
    side -> the rounds' results), without the baseline's comparison."""
    n = runs["current"][0]["requests"]
    cpu = {s: _med(v, "cpu_s") for s, v in runs.items() if v}
    wall = {s: _med(v, "wall_s") for s, v in runs.items() if v}
    row: dict[str, Any] = {
        "mocker": {"mode": mode, "workers": list(workers), "matched": dict(mockers).get("peer_matched")},
        "requests": n, "cpu_s": cpu, "wall_s": wall,
        "cpu_us_per_request": {s: v / n * 1e6 for s, v in cpu.items()},
        "wall_us_per_request": {s: v / n * 1e6 for s, v in wall.items()},
        "events_per_request": {s: runs[s][0].get("events_per_request") for s in racks},
        "completed": {s: v[0].get("completed") for s, v in runs.items() if v},
        "runs": {s: [{"cpu_s": r.get("cpu_s"), "wall_s": r.get("wall_s")} for r in v] for s, v in runs.items() if v},
        "peer_ttft_p50_ms": {s: runs[s][0].get("ttft_p50_ms") for s, _ in mockers if runs[s]},
    }
    for side, _ in mockers:
        if side in cpu:
            row[f"cpu_ratio_to_{side}"] = {s: cpu[s] / cpu[side] for s in racks}
            row[f"wall_ratio_to_{side}"] = {s: wall[s] / wall[side] for s in racks}
    return row


def peer_checks(sec: dict, targets_s: float = 1e-9) -> dict:
    """The done-when figures of the peer section: per trace and pair, rack's CPU time
    over the mocker's (<= 1; at its defaults, and at rack's KV block size when measured),
    per-request metrics equal to the baseline's (<= 1e-9 s),
    events per request at most half the baseline's; and rack's CPU time with every
    output doubled over the original's (< 1.1)."""
    out: dict[str, dict] = {}
    for trace, rows in sec.get("traces", {}).items():
        for scenario, row in rows.get("x1", {}).items():
            key = f"peer.{trace}.{scenario}"
            r = row.get("cpu_ratio_to_peer")
            out[f"{key}.cpu_ratio_to_mocker"] = (
                {"value": r["current"], "target": "<= 1 (rack CPU / mocker CPU)", "ok": r["current"] <= 1.0}
                if r else {"value": None, "target": "<= 1", "ok": None, "na": "mocker not installed"})
            r = row.get("cpu_ratio_to_peer_matched")
            if r:
                out[f"{key}.cpu_ratio_to_mocker_at_rack_blocks"] = {
                    "value": r["current"], "ok": r["current"] <= 1.0,
                    "target": "<= 1 (rack CPU / mocker CPU, the mocker at {block_tokens}-token KV blocks, "
                              "{gpu_blocks:,} per worker)".format(**row["mocker"]["matched"])}
            m = row.get("metrics")
            if m:
                out[f"{key}.per_request_max_diff_s"] = {"value": m["max_abs_diff_s"], "target": f"<= {targets_s:g} s",
                                                        "ok": m["max_abs_diff_s"] <= targets_s}
                if "itl_summary_equal" in m:
                    out[f"{key}.itl_summary_equal"] = {"value": m["itl_summary_equal"],
                                                       "target": "the baseline's ITL mean, min, p50, p90, p99, max, n",
                                                       "ok": m["itl_summary_equal"]}
            ev = row.get("events_per_request", {})
            if ev.get("baseline") and ev.get("current") is not None:
                out[f"{key}.events_per_request"] = {"value": ev["current"],
                                                    "target": f"<= {ev['baseline'] / 2:.1f} (half the baseline's)",
                                                    "ok": ev["current"] <= ev["baseline"] / 2}
            dbl = rows.get("x2", {}).get(scenario)
            if dbl:     # judged on CPU time: wall time on a shared host drifts by more than 10%
                v = dbl["cpu_s"]["current"] / row["cpu_s"]["current"]
                out[f"{key}.doubled_output_cpu_ratio"] = {"value": v, "target": "< 1.10", "ok": v < 1.10}
    return out




def render_peer(sec: dict, con: Any, table: Callable[..., Any]) -> None:
    """Print `peer_section`'s result as a table (`table(title, cols, left)` makes one)."""
    st = sec["peer"]
    if not st["installed"]:
        con.print(f"[bold]Dynamo mocker NOT INSTALLED[/bold]: {st['why']}; rack's replays only.")
    base = sec.get("baseline_ref")
    t = table(f"rack beside NVIDIA Dynamo's mocker {st.get('version') or ''} (whole traces, same run, alternating; "
              "CPU = the child's process_time, us per request; ratio = rack / mocker)",
              ("trace", "outputs", "scenario", "mocker", "rack CPU us/req", "mocker CPU us/req", "CPU ratio",
               "wall ratio", "mocker at rack's blocks: CPU us/req", "CPU ratio", *(("previous CPU us/req", "speed-up", "max diff s", "ITL summary", "events/req prev / now")
                               if base else ("events/req",))),
              left=("trace", "outputs", "scenario", "mocker"))
    for trace, rows in sec["traces"].items():
        for scale, per in rows.items():
            for scenario, r in per.items():
                cpu = r["cpu_us_per_request"]
                ratio = r.get("cpu_ratio_to_peer", {})
                wr = r.get("wall_ratio_to_peer", {})
                ev = r["events_per_request"]
                mk = f"{r['mocker']['mode']} {'+'.join(map(str, r['mocker']['workers']))}"
                extra = ((f"{cpu['baseline']:,.0f}", f"{r['cpu_speedup']:.2f}",
                          f"{r['metrics']['max_abs_diff_s']:.1e}",
                          "same" if r["metrics"].get("itl_summary_equal") else "DIFFERS",
                          f"{ev.get('baseline') or 0:.1f} / {ev.get('current') or 0:.1f}") if base
                         else (f"{ev.get('current') or 0:.1f}",))
                matched = r.get("cpu_ratio_to_peer_matched", {})
                t.add_row(trace, scale, scenario, mk, f"{cpu['current']:,.0f}",
                          f"{cpu['peer']:,.0f}" if "peer" in cpu else "not installed",
                          f"{ratio['current']:.2f}" if ratio else "-", f"{wr['current']:.2f}" if wr else "-",
                          f"{cpu['peer_matched']:,.0f}" if "peer_matched" in cpu else "-",
                          f"{matched['current']:.2f}" if matched else "-", *extra)
    con.print(t)


__all__ = ["ENV_VAR", "PAIRS", "PEER_TRACES", "matched_block_args", "peer_checks", "peer_python", "peer_replay",
           "peer_section", "peer_status", "render_peer", "scenario_block_tokens", "write_mooncake_jsonl"]
