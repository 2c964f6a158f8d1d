#!/usr/bin/env python3
"""Replay a trace through the split rack with the public Python API (a script to copy).

    python scripts/replay_trace.py                       # shipped excerpt, virtual runtime
    python scripts/replay_trace.py --trace azure_conv --rate-scale 2 --runtime virtual
    python scripts/replay_trace.py --runtime ray --window 0:6

It prints the summary, the per-pool utilisation and the slowest requests, and writes
the usual results folder.
"""

from __future__ import annotations

import argparse

import numpy as np

from rack.measure.results import summary_text, write_results
from rack.run.runner import run_scenario, trace_info
from rack.wiring.load import load_scenario
from workloads import load_requests, parse_window, resolve_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=None, help="scenario name or TOML path")
    ap.add_argument("--trace", default="mooncake-excerpt")
    ap.add_argument("--runtime", choices=("virtual", "ray"), default="virtual")
    ap.add_argument("--window", default=None, help="START:END seconds")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--address", default=None, help="Ray cluster address (ray runtime)")
    ap.add_argument("--out", default="rack-results/replay")
    args = ap.parse_args()

    try:
        scenario = load_scenario(args.scenario)
        window = parse_window(args.window) if args.window else None
        requests = load_requests(args.trace, window=window, rate_scale=args.rate_scale)
    except ValueError as exc:  # ScenarioError, TraceError, CatalogError, a bad window: say what, no traceback
        raise SystemExit(f"error: {exc}")
    info = trace_info(resolve_trace(args.trace), requests.summary(), window=args.window,
                      rate_scale=args.rate_scale)
    out = run_scenario(scenario, requests, runtime=args.runtime, address=args.address, trace_info=info)
    print(summary_text(out.results))

    cols = out.columns
    slowest = np.argsort(np.nan_to_num(cols["ttft_s"], nan=-1.0))[::-1][:5]
    print("\nslowest TTFT:")
    for i in slowest:
        print(f"  request {cols['id'][i]}: prompt {cols['prompt_tokens'][i]} tokens, "
              f"TTFT {cols['ttft_s'][i] * 1e3:.1f} ms, queued "
              f"{(cols['t_prefill_start'][i] - cols['t_arrival'][i]) * 1e3:.1f} ms")
    folder = write_results(args.out, out.results, out.columns)
    print(f"\nresults in {folder}")
    if args.runtime == "ray" and args.address is None:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
