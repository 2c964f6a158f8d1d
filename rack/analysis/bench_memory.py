"""`rack bench`'s memory section: peak RSS of long virtual replays.

Each figure is one `rack run --runtime virtual` of a synthetic trace (vLLM's random
dataset: `--dataset random --num-prompts N --request-rate R`, prompts 1024 +- 50% and
outputs 128 +- 50% tokens, Poisson arrivals), in a child process of its own so that its
peak resident set size is the run's alone: `os.wait4` returns the child's rusage, whose
`ru_maxrss` is the kernel's high-water mark of its RSS (KiB on Linux). The whole command
is measured: reading the trace, the replay, the metrics and writing the results folder.

Reported per run: requests, records ("disk": streamed to the results folder, or
"memory"), wall s, peak RSS (MB = 2**20 bytes), peak RSS per 100k requests (peak x 1e5 /
N: fixed costs included), and across the sizes of one records mode the marginal MB per
100k requests (the slope between the smallest and the largest run: what each further
100k requests cost). Target (issue 18): a 1,000,000-request replay under 1 GB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence

#: Requests per run of the full bench (the 1M run takes ~20-30 min on the project machine).
SIZES = (100_000, 1_000_000)
#: `--quick` sizes.
QUICK_SIZES = (10_000, 50_000)
#: Arrival rate (req/s): 1M requests span ~17 h of emulated time, about a day of the
#: production traffic the issue cites (1.4 M requests per day); the default rack
#: sustains it (TTFT p99 ~0.17 s, no queueing).
RATE_PER_S = 16.0
#: Peak RSS target of a 1M-request replay (bytes).
TARGET_1M_BYTES = 1 << 30
MB = float(1 << 20)


def replay_peak_rss(n: int, *, scenario: str | None = None, rate_per_s: float = RATE_PER_S,
                    records: str = "disk", seed: int = 0, out: str | None = None) -> dict:
    """Peak RSS of `rack run --runtime virtual` on `n` synthetic requests (module
    docstring), in a child process.

    records: "disk" or "memory" (`rack run --records`). out: the results folder (a
    temporary one, removed afterwards, when None).
    Returns {"requests", "records", "scenario", "rate_per_s", "wall_s", "peak_rss_mb",
    "peak_rss_mb_per_100k", "completed", "exit_code"}. Raises RuntimeError (with the
    child's last stderr lines) when the run fails.
    """
    import json
    import shutil

    folder = out or tempfile.mkdtemp(prefix="rack-bench-mem-")
    cmd = [sys.executable, "-c", "from rack.cli import main; main()", "run", "--runtime", "virtual",
           "--dataset", "random", "--num-prompts", str(n), "--request-rate", f"{rate_per_s:g}",
           "--range-ratio", "0.5", "--seed", str(seed), "--records", records, "--out", folder, "--json"]
    if scenario:
        cmd += ["--scenario", scenario]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"replay of {n} requests failed (exit {proc.returncode}): " + " | ".join(tail))
    try:
        with open(os.path.join(folder, "results.json")) as f:
            results = json.load(f)
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)
    peak = usage.ru_maxrss * 1024 / MB           # ru_maxrss is in KiB on Linux
    return {"requests": n, "records": records, "scenario": results["provenance"]["scenario"],
            "rate_per_s": rate_per_s, "wall_s": wall, "peak_rss_mb": peak,
            "peak_rss_mb_per_100k": peak * 1e5 / n, "completed": results["requests"]["completed"],
            "exit_code": proc.returncode}


def memory_section(sizes: Sequence[int] = SIZES, *, scenario: str | None = None,
                   rate_per_s: float = RATE_PER_S, compare_memory: bool = True,
                   progress: Callable[[str], None] = lambda _m: None) -> dict:
    """Peak RSS of replays of `sizes` requests with records streamed to disk, and (with
    `compare_memory`) of the smallest size with records held in memory.

    Returns {"runs": [replay_peak_rss rows], "marginal_mb_per_100k": {records mode: slope}
    (modes with two sizes or more), "largest": the largest disk run's row, "target_1M_mb"}.
    """
    runs = []
    plan = [(n, "disk") for n in sorted(sizes)]
    if compare_memory:
        plan.insert(1, (min(sizes), "memory"))     # after the same size streamed
    for n, mode in plan:
        progress(f"peak RSS: {n:,} requests, records in {mode}")
        runs.append(replay_peak_rss(n, scenario=scenario, rate_per_s=rate_per_s, records=mode))
    slopes = {}
    for mode in ("disk", "memory"):
        rows = sorted((r for r in runs if r["records"] == mode), key=lambda r: r["requests"])
        if len(rows) >= 2 and rows[-1]["requests"] > rows[0]["requests"]:
            a, b = rows[0], rows[-1]
            slopes[mode] = (b["peak_rss_mb"] - a["peak_rss_mb"]) * 1e5 / (b["requests"] - a["requests"])
    disk = [r for r in runs if r["records"] == "disk"]
    return {"runs": runs, "marginal_mb_per_100k": slopes,
            "largest": max(disk, key=lambda r: r["requests"]) if disk else None,
            "target_1M_mb": TARGET_1M_BYTES / MB}


def render_memory(section: dict, con) -> None:
    """Print the memory section as a table (`con`: a rich Console)."""
    from rich.table import Table

    t = Table(title="Peak RSS of virtual replays of synthetic traces (whole `rack run`, child process; MB = 2^20 B)")
    for col in ("requests", "records", "scenario", "wall s", "peak RSS MB", "MB per 100k requests"):
        t.add_column(col, justify="left" if col in ("records", "scenario") else "right")
    for r in section["runs"]:
        t.add_row(f"{r['requests']:,}", r["records"], r["scenario"], f"{r['wall_s']:,.0f}",
                  f"{r['peak_rss_mb']:,.0f}", f"{r['peak_rss_mb_per_100k']:,.1f}")
    con.print(t)
    for mode, slope in section["marginal_mb_per_100k"].items():
        con.print(f"records in {mode}: each further 100k requests adds {slope:,.1f} MB of peak RSS")


__all__ = ["QUICK_SIZES", "RATE_PER_S", "SIZES", "TARGET_1M_BYTES", "memory_section", "render_memory",
           "replay_peak_rss"]
