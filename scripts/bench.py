"""Benchmark the emulator itself: the same as `rack bench` (see rack/analysis/bench.py, docs/bench.md).

Run: .venv/bin/python scripts/bench.py [--json] [--repeat N] [--quick] [--skip-ray] ...
"""

from rack.analysis.bench import main

if __name__ == "__main__":
    main()
