#!/usr/bin/env python3
"""Replay a Mooncake-format JSONL trace through NVIDIA Dynamo's mocker (the peer that
`rack bench --peer` measures rack against; docs/bench.md) and print one JSON line:

    {"peer": "dynamo-mocker", "version", "mode", "wall_s", "cpu_s", "requests",
     "completed", "ttft_p50_ms", "tpot_p50_ms", "engine_args"}

It runs in the peer's own interpreter (a separate virtualenv is fine: it imports only
the standard library and `dynamo`), so that rack never depends on it:

    python3 -m venv venv-peer
    venv-peer/bin/pip install ai-dynamo-runtime==1.6.1
    venv-peer/bin/pip install --no-deps ai-dynamo==1.6.1     # it pins `aisimulate`, not needed offline
    venv-peer/bin/pip install aiohttp msgspec prometheus-client pyzmq tqdm typing-extensions zstandard
    venv-peer/bin/python rack/experiments/peer_mocker.py TRACE.jsonl --mode agg --workers 4

Modes: "agg" (`--workers` aggregated workers, `extra_engine_args`) or "pd" (`--prefill`
prefill and `--decode` decode workers, `prefill_engine_args` / `decode_engine_args`).
The mocker's built-in timing model (polynomial) needs no data files. Engine limits
are the mocker's defaults, spelled out: KV blocks of 64 tokens, 16,384 blocks per
worker, at most 256 sequences and 8,192 batched tokens per step. rack's scenarios use
16-token blocks: `--block-tokens 16 --gpu-blocks 65536` is the same deployment (the same
KV capacity in tokens) at their block size, which `rack bench --peer` measures too; the
trace's hash ids cover `--trace-block` tokens each (Mooncake: 512). `wall_s` and `cpu_s` (`time.process_time`: every thread of this process) time the
`run_trace_replay` call alone, which includes reading the JSONL file.

Exit status 3 when `dynamo` cannot be imported (the peer is not installed here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

#: The mocker's own defaults for its engines (ai-dynamo-runtime 1.6.1's `MockEngineArgs`),
#: spelled out so that the comparison states them: KV block size (tokens), KV blocks per
#: worker, sequences per step, batched tokens per step.
BLOCK_TOKENS = 64
GPU_BLOCKS = 16384
MAX_SEQS = 256
CHUNK_TOKENS = 8192


def engine_args(role: str, block_tokens: int, max_seqs: int, chunk_tokens: int, gpu_blocks: int) -> dict:
    """The mocker's engine config for one worker role ("aggregated", "prefill",
    "decode"): vLLM backend, prefix caching and chunked prefill on."""
    return {"engine": {"backend": "vllm", "worker_type": role, "block_size": block_tokens,
                       "num_gpu_blocks": gpu_blocks,
                       "max_num_seqs": max_seqs, "max_num_batched_tokens": chunk_tokens,
                       "enable_prefix_caching": True, "enable_chunked_prefill": True}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="Mooncake-format JSONL (timestamp ms, input_length, output_length, hash_ids)")
    ap.add_argument("--mode", choices=("agg", "pd"), default="agg")
    ap.add_argument("--workers", type=int, default=4, help="aggregated workers (--mode agg)")
    ap.add_argument("--prefill", type=int, default=2, help="prefill workers (--mode pd)")
    ap.add_argument("--decode", type=int, default=2, help="decode workers (--mode pd)")
    ap.add_argument("--trace-block", type=int, default=512, help="tokens per hash id of the trace")
    ap.add_argument("--block-tokens", type=int, default=BLOCK_TOKENS, help="KV block size of the engines")
    ap.add_argument("--max-seqs", type=int, default=MAX_SEQS)
    ap.add_argument("--chunk-tokens", type=int, default=CHUNK_TOKENS)
    ap.add_argument("--gpu-blocks", type=int, default=GPU_BLOCKS, help="KV blocks per worker")
    args = ap.parse_args(argv)
    try:
        from dynamo.replay import run_trace_replay
    except ImportError as exc:
        print(json.dumps({"peer": "dynamo-mocker", "error": f"not installed: {exc}"}))
        return 3
    try:
        from importlib.metadata import version
        ver = version("ai-dynamo-runtime")
    except Exception:  # noqa: BLE001 - provenance only
        ver = None
    kw: dict = {"trace_block_size": args.trace_block}
    limits = (args.block_tokens, args.max_seqs, args.chunk_tokens, args.gpu_blocks)
    if args.mode == "agg":
        kw.update(extra_engine_args=engine_args("aggregated", *limits), num_workers=args.workers)
    else:
        kw.update(prefill_engine_args=engine_args("prefill", *limits),
                  decode_engine_args=engine_args("decode", *limits),
                  num_prefill_workers=args.prefill, num_decode_workers=args.decode)
    w0, c0 = time.perf_counter(), time.process_time()
    report = run_trace_replay([args.trace], **kw)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s = report.summary
    print(json.dumps({"peer": "dynamo-mocker", "version": ver, "mode": args.mode, "wall_s": wall, "cpu_s": cpu,
                      "requests": s.get("num_requests"), "completed": s.get("completed_requests"),
                      "ttft_p50_ms": s.get("median_ttft_ms"), "tpot_p50_ms": s.get("median_tpot_ms"),
                      "engine_args": {k: v for k, v in kw.items() if k != "trace_block_size"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
