#!/usr/bin/env python
"""Pacing soak of `rack serve` (issue 24: once, 13 of 30 streams got no token until
their 3,000-token decode had ended): start the scenario's rack with its HTTP front on
Ray (127.0.0.1, any free port), send BATCHES batches of STREAMS concurrent streams
(a share of the clients hanging up part-way, `rack.serve.soak`), and print each
batch's pacing lateness from the front's records. Exits 1 if any stream was held
(its first token more than half its decode late), or any stream or record is missing.

    python scripts/soak_serve.py                       # 20 batches of 60 streams, 1,000 tokens, dilation 40
    python scripts/soak_serve.py --batches 2 --streams 12 --output-tokens 200 --dilation 20

Bounded: every HTTP call has a timeout, and each batch lasts about output_tokens x
TPOT x dilation of wall time (~31 s at the defaults on the default scenario, whose
wafer decodes a step in ~0.77 ms); the whole soak at the defaults takes ~12 minutes.
The front sends one chunk per stream per decode step: 60 streams at dilation 10 are
~7,800 chunks/s, more than one Python process keeps up with on a loaded 2-core host
(every stream late together: saturation, reported as "late", not as "held").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="helios-cs3-kimi-k2")
    ap.add_argument("--dilation", type=float, default=40.0)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--streams", type=int, default=60)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=1000)
    ap.add_argument("--disconnect-share", type=float, default=0.2)
    ap.add_argument("--stall-s", type=float, default=1.0, help="wall seconds of lateness that count (held, late)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures to this file")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    from rack.serve.session import LiveServer
    from rack.serve.soak import soak
    from rack.wiring.load import load_scenario

    sc = load_scenario(args.scenario).with_overrides(dilation=args.dilation)
    key = "soak-key"
    server = LiveServer(sc, host="127.0.0.1", port=0, api_key=key)
    t0 = time.perf_counter()
    url = server.start()
    print(f"{sc.name} at {url} (dilation {sc.dilation:g}); {args.batches} batches of {args.streams} streams, "
          f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens, "
          f"{args.disconnect_share:.0%} of clients hanging up part-way", flush=True)

    def show(i, f):
        print(f"batch {i + 1:>2}: {f['answered_200']}/{f['streams']} answered 200, {f['rejected_429']} x 429, "
              f"{f['hung_up']} hung up, {f['errors']} errors, {f['completed_in_rack']} completed in the rack, "
              f"{f['no_record']} without record; lateness p50 {_ms(f['lateness_p50_s'])} p99 "
              f"{_ms(f['lateness_p99_s'])} max {_ms(f['lateness_max_s'])}, {f['late']} late (> {args.stall_s:g} s); "
              f"first token late by at most {_ms(f['first_token_late_max_s'])}, {f['held']} held; "
              f"{f['wall_s']:.1f} s", flush=True)

    try:
        out = asyncio.run(soak(url, model=sc.model, dilation=sc.dilation, api_key=key, batches=args.batches,
                               streams=args.streams,
                               prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                               disconnect_share=args.disconnect_share, stall_s=args.stall_s, seed=args.seed,
                               on_batch=show))
    finally:
        output = server.stop(5.0)
        import ray

        ray.shutdown()
    o = out["overall"]
    req = output.results["requests"]
    print(f"overall: {o['streams']} streams, {o['held']} held, {o['late']} late, lateness p50 {_ms(o['lateness_p50_s'])} "
          f"p99 {_ms(o['lateness_p99_s'])} max {_ms(o['lateness_max_s'])}; rack: {req['completed']} completed, "
          f"{req['rejected']} rejected, {req['failed']} failed of {req['submitted']}; "
          f"{time.perf_counter() - t0:.0f} s of wall time")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "batches": out["batches"], "overall": o,
                       "rack_requests": req, "serve": output.results.get("serve")}, f, indent=1)
    bad = o["held"] or o["errors"] or o["no_record"] or o["answered_200"] != o["streams"]
    return 1 if bad else 0


def _ms(x):
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
