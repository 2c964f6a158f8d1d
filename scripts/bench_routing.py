#!/usr/bin/env python
"""Prefix-cache hit ratio and TTFT of each router policy on a trace (whole-trace figures
for the README; the test suite checks a slice: tests/test_prefix_routing.py).

    python scripts/bench_routing.py                          # mooncake_conv, default scenario
    python scripts/bench_routing.py --max-requests 1500
    python scripts/bench_routing.py --policy prefix_aware --prefix-weight 1 --prefix-weight 3
    python scripts/bench_routing.py --prefill-instances 4     # twice the default's prefill pool

Every policy runs the same requests through the same scenario (only `[router] policy`
and `prefix_weight` change) on the virtual runtime. Printed per run: the achieved hit
ratio (hit blocks / looked-up full blocks, summed over the prefill instances), TTFT
p50/p99, blocks evicted, and the wall time; then the trace's ideal hit ratio (an
unbounded cache shared by every instance) and the same with the instances' KV capacity
pooled into one LRU cache (`results.json` `prefix_cache`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rack.serving.router import POLICIES  # noqa: E402
from rack.run.runner import run_scenario  # noqa: E402
from rack.wiring.load import load_scenario  # noqa: E402
from workloads import load_requests  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="mooncake_conv", help="trace name or path [mooncake_conv]")
    ap.add_argument("--scenario", default=None, help="scenario name or TOML [the default scenario]")
    ap.add_argument("--max-requests", type=int, default=None, help="first N requests [all]")
    ap.add_argument("--policy", action="append", choices=POLICIES,
                    help="policy to run (repeatable) [all]")
    ap.add_argument("--prefix-weight", action="append", type=float,
                    help="prefix_aware's weight (repeatable) [1]")
    ap.add_argument("--prefill-instances", type=int, default=None,
                    help="instances of every prefill pool (more prefix-cache capacity) [the scenario's]")
    args = ap.parse_args(argv)
    reqs = load_requests(args.trace)
    if args.max_requests:
        reqs = reqs[: args.max_requests]
    base = load_scenario(args.scenario)
    if args.prefill_instances:
        pools = [{**p.model_dump(), **({"instances": args.prefill_instances} if p.role == "prefill" else {})}
                 for p in base.pools]
        base = base.with_overrides(pools=pools)
    runs = [(p, w) for p in (args.policy or POLICIES)
            for w in ((args.prefix_weight or [1.0]) if p == "prefix_aware" else [None])]
    pre = sum(p.instances for p in base.pools if p.role == "prefill")
    print(f"{len(reqs)} requests of {args.trace} through {base.name} ({pre} prefill instances; virtual runtime)")
    print(f"{'policy':<32}{'hit ratio':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'evicted':>10}{'wall s':>8}")
    pc = None
    for policy, w in runs:
        router = {**base.router.model_dump(), "policy": policy}
        if w is not None:
            router["prefix_weight"] = w
        sc = base.with_overrides(router=router)
        t0 = time.perf_counter()
        res = run_scenario(sc, reqs, runtime="virtual").results
        wall = time.perf_counter() - t0
        pc, ttft = res["prefix_cache"], res["latency"]["ttft_s"]
        if pc is None:
            print("no prefix cache or no block hashes: nothing to compare")
            return 1
        label = policy if w is None else f"{policy} (prefix_weight {w:g})"
        print(f"{label:<32}{pc['hit_ratio']:>10.3f}{ttft['p50']:>10.3f}{ttft['p99']:>10.3f}"
              f"{pc['evicted_blocks']:>10,}{wall:>8.1f}")
    print(f"ideal hit ratio {pc['ideal_hit_ratio']:.3f} (unbounded cache shared by every instance); "
          f"{pc['capacity_hit_ratio']:.3f} with the instances' {pc['capacity_blocks']:,} blocks pooled in one LRU cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
