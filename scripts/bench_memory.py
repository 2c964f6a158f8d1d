"""Peak RSS of long virtual replays (the memory section of `rack bench`; docs/bench.md).

Run: .venv/bin/python scripts/bench_memory.py [N ...] [--source random,mooncake] [--scenario NAME]
         [--rate R] [--no-memory] [--json]
(default N: 100000 1400000, both sources; each 1.4 M replay takes 30-40 min on a 2-core machine).
"""

import argparse
import json
import sys

from rack.experiments.bench_memory import RATE_PER_S, SIZES, SOURCES, memory_section, render_memory


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=list(SIZES), help="requests per replay")
    ap.add_argument("--scenario", default=None, help="scenario name or file [default: helios-cs3-kimi-k2]")
    ap.add_argument("--rate", type=float, default=RATE_PER_S, help="arrival rate, req/s")
    ap.add_argument("--source", default=",".join(SOURCES),
                    help="comma-separated sources: random (generated), mooncake (a repeated Mooncake trace, read)")
    ap.add_argument("--no-memory", action="store_true", help="skip the run with records held in memory")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    sec = memory_section(args.sizes, scenario=args.scenario, rate_per_s=args.rate,
                         compare_memory=not args.no_memory, sources=args.source.split(","),
                         progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    sec["argv"] = sys.argv
    if args.json:
        print(json.dumps(sec, indent=2))
    else:
        from rich.console import Console

        render_memory(sec, Console())
    return 0


if __name__ == "__main__":
    sys.exit(main())
