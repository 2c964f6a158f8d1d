"""Benchmark the emulator itself: the same as `rack bench` (see rack/experiments/bench.py, docs/bench.md).

Run: python scripts/bench.py [--json] [--repeat N] [--quick] [--skip-ray] ...
"""

import sys

from rack.cli import main

if __name__ == "__main__":
    sys.argv = ["rack", "bench", *sys.argv[1:]]
    main()
