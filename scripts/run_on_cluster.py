#!/usr/bin/env python3
"""Launch a local multi-node Ray cluster and run the split rack on it (a script to copy).

    python scripts/run_on_cluster.py                 # head + a `prefill` node + a `decode` node
    python scripts/run_on_cluster.py --window 0:6 --dilation 10

The prefill pool is pinned to the node offering the custom resource `prefill`, the
decode pool to `decode` (the scenario's `resources` per pool); router, collector and
interconnect stay on the head. It prints where every component ran (from inside the
actors) and the run's summary, then tears the cluster down. On a real cluster, start the
nodes with `ray start --head` / `ray start --address=HEAD:6379 --resources='{"prefill": 8}'`
and pass `--address auto` to `rack run` instead.
"""

from __future__ import annotations

import argparse

from rack.measure.results import summary_text
from rack.run.runner import run_scenario
from rack.runtime.cluster import LocalCluster, parse_node_spec
from rack.wiring.load import load_scenario
from workloads import load_requests, parse_window


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--trace", default="mooncake-excerpt")
    ap.add_argument("--window", default="0:4")
    ap.add_argument("--output-scale", type=float, default=0.25, help="shorten outputs to keep the run brief")
    ap.add_argument("--dilation", type=float, default=10.0)
    args = ap.parse_args()

    base = load_scenario(args.scenario)
    data = base.model_dump()
    for pool in data["pools"]:
        pool["resources"] = {"prefill" if pool["role"] == "prefill" else "decode": 1}
    data["placement"] = {"router": {"head": 1}, "collector": {"head": 1}, "interconnect": {"head": 1}}
    data["dilation"] = args.dilation
    scenario = type(base).model_validate(data)
    requests = load_requests(args.trace, window=parse_window(args.window), output_scale=args.output_scale)

    cluster = LocalCluster([parse_node_spec("prefill=8", "prefill"), parse_node_spec("decode=8", "decode")])
    address = cluster.up()
    try:
        print(f"cluster at {address}: nodes {cluster.node_ids}")
        out = run_scenario(scenario, requests, runtime="ray", address=address, timeout_s=600)
        node_name = {v: k for k, v in cluster.node_ids.items()}
        for component, node in sorted(out.results["emulation"]["nodes"].items()):
            print(f"  {component:>14} ran on node {node_name.get(node, node[:12])}")
        print(summary_text(out.results))
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
