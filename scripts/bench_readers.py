#!/usr/bin/env python
"""Benchmark the trace readers: rows/s on the real traces, and flat memory on a big file.

    .venv/bin/python scripts/bench_readers.py                 # speed + 100x memory check
    .venv/bin/python scripts/bench_readers.py --scale 0       # speed only
    .venv/bin/python scripts/bench_readers.py --repeat 5 --scale 20

Speed: each trace (full files when found, see `rack trace list`, else the shipped
excerpts) is read `--repeat` times through `open_trace`; the best pass is reported as
rows/s and seconds per 10,000 rows.

Memory: a Mooncake-format file `--scale` times the conversation trace is generated
(its rows repeated with shifted timestamps) in a temporary directory; the 1x and the
Nx file are each read in a fresh process that reports its peak RSS. Streaming keeps
the peak flat; the check fails (exit 1) if the big file needs more than
`--max-growth-mib` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workloads import TraceError, open_trace, resolve_trace  # noqa: E402
from workloads.textfile import open_text  # noqa: E402

TRACES = ["mooncake_conv", "azure_conv", "azure_code", "arxiv_lengths"]
FALLBACK = {"mooncake_conv": "mooncake-excerpt", "azure_conv": "azure-conv-excerpt"}


def read_all(path: Path) -> tuple[int, float]:
    """Read every row (keeping none); return (rows, seconds)."""
    reader = open_trace(path)
    t0 = time.perf_counter()
    n = 0
    for _ in reader:
        n += 1
    return n, time.perf_counter() - t0


def speed(repeat: int) -> None:
    print(f"{'trace':<22}{'rows':>10}{'best s':>10}{'rows/s':>12}{'s/10k rows':>12}")
    for name in TRACES:
        try:
            path = resolve_trace(name)
        except TraceError:
            if name not in FALLBACK:
                print(f"{name:<22}  (not found, skipped)")
                continue
            name = FALLBACK[name]
            path = resolve_trace(name)
        runs = [read_all(path) for _ in range(repeat)]
        rows, best = min(runs, key=lambda r: r[1])
        print(f"{name:<22}{rows:>10,}{best:>10.3f}{rows / best:>12,.0f}{best / rows * 1e4:>12.3f}")


def make_big(src: Path, dst: Path, scale: int) -> int:
    """Write `scale` copies of a Mooncake JSONL file, each shifted past the previous one."""
    with open_text(src) as f:                 # plain or gzip (the shipped traces are gzip)
        lines = f.read().splitlines()
    prefix = '{"timestamp": '
    parsed = []
    for line in lines:
        if not line.startswith(prefix):
            raise SystemExit(f"{src}: expected Mooncake rows starting with {prefix!r}")
        ts, rest = line[len(prefix):].split(",", 1)
        parsed.append((int(ts), rest))
    period = parsed[-1][0] + 3000
    with open(dst, "w") as f:
        for k in range(scale):
            off = k * period
            f.write("".join(f"{prefix}{ts + off},{rest}\n" for ts, rest in parsed))
    return len(parsed) * scale


def worker(path: str) -> None:
    """Child process: read `path`, print rows, seconds and peak RSS (MiB) as JSON."""
    rows, seconds = read_all(Path(path))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_rss_mib": peak_kib / 1024}))


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def memory(scale: int, max_growth_mib: float, keep: bool) -> bool:
    src = resolve_trace("mooncake_conv")          # shipped with the package
    with tempfile.TemporaryDirectory(prefix="bench_readers_") as tmp:
        big = Path(tmp) / f"mooncake_x{scale}.jsonl"
        t0 = time.perf_counter()
        rows = make_big(src, big, scale)
        print(f"\ngenerated {big.name}: {rows:,} rows, {big.stat().st_size / 2**20:,.0f} MiB "
              f"in {time.perf_counter() - t0:.1f} s")
        small, large = measure(src), measure(big)
        for label, m in (("1x", small), (f"{scale}x", large)):
            print(f"{label:>5}: {m['rows']:>12,} rows {m['seconds']:>8.2f} s "
                  f"{m['rows'] / m['seconds']:>10,.0f} rows/s   peak RSS {m['peak_rss_mib']:.1f} MiB")
        growth = large["peak_rss_mib"] - small["peak_rss_mib"]
        ok = growth <= max_growth_mib
        print(f"peak RSS growth for {scale}x the rows: {growth:+.1f} MiB "
              f"({'flat' if ok else 'NOT FLAT'}; limit {max_growth_mib} MiB)")
        if keep:
            kept = Path.cwd() / big.name
            os.replace(big, kept)
            print(f"kept {kept}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="passes per trace (best is reported)")
    ap.add_argument("--scale", type=int, default=100,
                    help="size of the generated file in copies of the Mooncake trace (0: skip)")
    ap.add_argument("--max-growth-mib", type=float, default=16.0,
                    help="allowed peak-RSS growth from 1x to the scaled file")
    ap.add_argument("--keep", action="store_true", help="keep the generated file in the cwd")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    speed(args.repeat)
    if args.scale > 0 and not memory(args.scale, args.max_growth_mib, args.keep):
        sys.exit(1)


if __name__ == "__main__":
    main()
