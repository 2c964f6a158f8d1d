"""CI's log must end with pytest's summary line (`N passed in ...`): `.ci/run` must not
add a `-q` to the one pyproject already sets (`-qq` hides that line)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _quiet_level(args: list[str]) -> int:
    level = 0
    for a in args:
        if a == "--quiet":
            level += 1
        elif re.fullmatch(r"-[a-zA-Z]*q+[a-zA-Z]*", a):
            level += a.count("q")
    return level


def test_ci_keeps_the_pytest_summary_line():
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    runs = [shlex.split(line) for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if "pytest" in line and not line.lstrip().startswith("#")]
    assert runs, "no pytest call in .ci/run"
    for args in runs:
        level = _quiet_level(shlex.split(addopts)) + _quiet_level(args[args.index("pytest") + 1:])
        assert level <= 1, f"{' '.join(args)} with addopts {addopts!r}: -q given {level} times"
