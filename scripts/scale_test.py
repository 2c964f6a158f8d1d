#!/usr/bin/env python
"""Multi-node scale test of the Ray runtime on one machine (same as `rack scale-test`).

    python scripts/scale_test.py --workers 1,2,3 --prefill 2 --decode 1 --rate-scales 1,2,4,8

For each worker-node count K: a local cluster (head + K workers), the scenario's prefill
and decode pools pinned to their nodes, the trace replayed at each rate-scale R on the
Ray and the virtual runtime; prints throughput, messages/s per actor, KV bytes across
nodes, lateness p50/p99 per actor, completion, agreement with virtual time, and the
largest R within the lateness bound. See rack/cli/scale_test.py and docs/multinode.md.
"""

import sys

from rack.cli import main

if __name__ == "__main__":
    sys.argv = ["rack", "scale-test", *sys.argv[1:]]
    main()
