"""The split-versus-colocated study: the same as `rack study` (see rack/experiments/study/).

Run: python scripts/study.py [--quick] [--out docs/findings.md] [--workers 2] [--render-only]
Writes docs/findings.md, docs/findings/*.png and docs/findings/study.json.gz (~15 min on
two cores; --quick is a smoke test of a few seconds).
"""

import sys

from rack.cli import _register_commands
from rack.cli.app import app


def main() -> None:
    _register_commands()
    app(["study", *sys.argv[1:]])


if __name__ == "__main__":
    main()
