#!/usr/bin/env python
"""Start or stop a multi-node Ray cluster on this one machine.

    python scripts/local_cluster.py up --node prefill=2 --node decode=1   # head + 2 workers
    python scripts/local_cluster.py status
    rack run --address "$(python scripts/local_cluster.py address)" --scenario my-placed.toml
    python scripts/local_cluster.py down

The same as `rack cluster ...` (rack/cli/cluster.py, rack/runtime/cluster.py):
`ray.cluster_utils.Cluster` with one head (resource `head=64`) and one raylet per
`--node` (RES=N[,RES=N...][,cpus=N][,store_mb=N]; default prefill=8 and decode=8),
held by a background process; `down` stops it and checks that no process is left.
"""

import sys

from rack.cli import main

if __name__ == "__main__":
    sys.argv = ["rack", "cluster", *sys.argv[1:]]
    main()
