"""Benchmark the KV frame codec against a plain memory copy measured in the same run.

For each frame size (default 1, 16 and 128 MB, 1 MB = 2**20 bytes) it times, median
of `--repeats` runs (default 5):
  copy     np.copyto of the body into a preallocated buffer (the memory-speed yardstick)
  encode   encode_frame(header, body, out=<preallocated>)   (hash + one body copy)
  decode   decode_frame(frame)                              (header parse + hash, zero-copy)
  enc+dec  both, back to back
run round-robin so all four see the same machine load, and prints GB/s (1 GB = 1e9
bytes of body) and the ratio enc+dec rate / copy rate. The
target (DESIGN.md "The KV payload", issue brief): ratio >= 0.5 at 16 MB.

Run: .venv/bin/python scripts/bench_codec.py [--sizes-mb 1 16 128] [--repeats 5] [--json]
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Callable, List, Optional

import msgpack
import numpy as np
import typer
import xxhash
from rich.console import Console
from rich.table import Table

from interconnect.codec import FrameHeader, decode_frame, encode_frame, frame_size

app = typer.Typer(add_completion=False)
_SAMPLE_S = 0.01


def bench_size(n_bytes: int, repeats: int) -> dict:
    """Time copy / encode / decode / encode+decode of an `n_bytes` body; rates in GB/s.

    The four operations run round-robin (copy, encode, decode, enc+dec, copy, ...) so
    that each sees the same machine load, which matters on a shared host; each figure
    is the median of its `repeats` samples (each sample averages as many calls as fit
    in ~10 ms of copying), after one untimed warm-up round.
    """
    body = np.random.default_rng(0).integers(0, 256, n_bytes, dtype=np.uint8)
    header = FrameHeader(request_id=1, layer_start=0, layer_end=8, token_start=0, token_end=4096,
                         dtype="fp8", shape=(n_bytes,), logical_bytes=n_bytes)
    copy_dst = np.ones(n_bytes, dtype=np.uint8)  # touched: no page faults in the timing
    out = np.ones(frame_size(header, n_bytes), dtype=np.uint8)
    frame = encode_frame(header, body, out=out)
    ops: dict[str, Callable[[], object]] = {
        "copy": lambda: np.copyto(copy_dst, body),
        "encode": lambda: encode_frame(header, body, out=out),
        "decode": lambda: decode_frame(frame),
        "encode_decode": lambda: decode_frame(encode_frame(header, body, out=out)),
    }
    for fn in ops.values():  # warm-up: page in buffers, build the random block
        fn()
    t = time.perf_counter()
    ops["copy"]()
    # calls per sample: enough for ~10 ms, so timer and scheduler noise stay small
    calls = max(1, int(_SAMPLE_S / max(time.perf_counter() - t, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t) / calls)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    rate = lambda name: n_bytes / med[name] / 1e9  # noqa: E731
    return {
        "size_mb": n_bytes / 2**20,
        "bytes": n_bytes,
        "copy_GBps": rate("copy"),
        "encode_GBps": rate("encode"),
        "decode_GBps": rate("decode"),
        "encode_decode_GBps": rate("encode_decode"),
        "ratio_encode_decode_vs_copy": med["copy"] / med["encode_decode"],
        "calls_per_sample": calls,
    }


@app.command()
def main(
    sizes_mb: Optional[List[int]] = typer.Option(None, "--sizes-mb", help="frame body sizes in MiB (default 1 16 128)"),
    repeats: int = typer.Option(5, min=1, help="timed runs per figure (median is reported)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Encode/decode throughput of the KV frame codec next to a memcpy of the same size."""
    sizes = sizes_mb or [1, 16, 128]
    rows = [bench_size(mb << 20, repeats) for mb in sizes]
    provenance = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "msgpack": ".".join(map(str, msgpack.version)),
        "xxhash": xxhash.VERSION,
        "machine": platform.machine(),
        "repeats": repeats,
    }
    if as_json:
        print(json.dumps({"results": rows, "provenance": provenance}, indent=2))
        return
    table = Table(title=f"KV frame codec vs memcpy (median of {repeats}; GB/s = 1e9 bytes/s)")
    for col in ("size", "copy", "encode", "decode", "enc+dec", "enc+dec / copy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['size_mb']:.0f} MB",
            f"{r['copy_GBps']:.2f}",
            f"{r['encode_GBps']:.2f}",
            f"{r['decode_GBps']:.2f}",
            f"{r['encode_decode_GBps']:.2f}",
            f"{r['ratio_encode_decode_vs_copy']:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    app()
