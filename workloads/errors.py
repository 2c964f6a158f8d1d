"""The one exception type for bad trace input.

Every problem a reader finds in a file (a missing field, a length that is not a
positive integer, a timestamp that goes backwards, an empty file, an unknown trace
name) is raised as a `TraceError` whose message names the file, the line and the
field, so that the user can open the file at that line and fix it.
"""

from __future__ import annotations

from typing import Sequence


def field_path(loc: Sequence) -> str:
    """A pydantic error location as the project's error messages name a field:
    ("pools", 1, "device") -> "pools[1].device" (scenario and workload files)."""
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def non_finite(value: object, where: str = ""):
    """(field path, value) of every float in `value` (nested dicts and lists, as read
    from TOML, which reads `inf` and `nan`) that is NaN or infinite; paths as
    `field_path` writes them ("clients[0].session.think_time_s")."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from non_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from non_finite(v, f"{where}[{i}]")


def refuse_non_finite(cls, data: object) -> object:
    """A pydantic "before" model validator (attach with `model_validator(mode="before")`)
    that refuses the first NaN or infinite number anywhere in the document: TOML reads
    `inf` and `nan`, no field of a scenario or workload means anything at either, and a
    NaN passes every range check (NaN > 0 is False, but so is NaN <= 0)."""
    for where, value in non_finite(data):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return data


class TraceError(ValueError):
    """Bad trace input.

    Attributes: `path` (str, the file or the name that was asked for), `line` (1-based
    physical line number in the file, or None when the problem is not on one line),
    `field` (the column/key name, or None), `problem` (what was wrong and what was
    expected), `reason` (a short stable key such as ``"negative_length"``, used to
    count skipped rows; None for errors that cannot be skipped).

    `str(err)` is ``"{path}:{line}: field '{field}': {problem}"``; the line and field
    parts are left out when they are None.
    """

    def __init__(
        self,
        path: str,
        line: int | None,
        field: str | None,
        problem: str,
        reason: str | None = None,
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        self.reason = reason
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        if self.field is None:
            return f"{where}: {self.problem}"
        return f"{where}: field '{self.field}': {self.problem}"

    def __reduce__(self):  # keep the attributes when pickled (e.g. across Ray actors)
        return (TraceError, (self.path, self.line, self.field, self.problem, self.reason))
