#!/usr/bin/env python
"""Replay a trace or synthetic load against an OpenAI-compatible endpoint (rack serve,
vLLM, SGLang, ...) and write the same results folder as `rack run`: the script form of
`rack bench-serve` (same options; see `python scripts/bench_serve.py --help`).

    rack serve --dilation 20 &
    python scripts/bench_serve.py --base-url http://127.0.0.1:8000 --window 0:3
"""

import sys

from rack.cli import main

if __name__ == "__main__":
    sys.argv[1:1] = ["bench-serve"]
    main()
