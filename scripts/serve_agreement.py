#!/usr/bin/env python
"""Replay a trace slice through `rack run --runtime ray` and through `rack serve` with
the HTTP load generator, and print completed count, median TTFT and TPOT of both with
their ratios (issue 17's agreement check).

    python scripts/serve_agreement.py [--trace azure-conv-excerpt] [--window 0:10] [--dilation D]
"""

import argparse
import json
import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rack.serve.agreement import http_vs_ray  # noqa: E402
from rack.wiring.load import load_scenario  # noqa: E402
from workloads import load_requests, parse_window  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--trace", default="azure-conv-excerpt")
    ap.add_argument("--window", default="0:10")
    ap.add_argument("--dilation", type=float, default=None)
    ap.add_argument("--address", default=None)
    a = ap.parse_args()
    sc = load_scenario(a.scenario).with_overrides(dilation=a.dilation)
    reqs = list(load_requests(a.trace, window=parse_window(a.window)))
    print(json.dumps(http_vs_ray(sc, reqs, address=a.address), indent=2))


if __name__ == "__main__":
    main()
