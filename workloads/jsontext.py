"""JSON text from outside (trace rows, request bodies): how deep it nests, measured
without parsing it.

Python's `json` parser recurses once per level of nesting and raises `RecursionError`
near 1,000 levels (a row nested 100,000 `[` deep used to end `rack run` and `rack trace
stats` with that traceback, also with `--skip-bad-rows`). `json_depth` counts the
nesting on the text itself, outside strings, so a reader refuses such input as a bad
row or a bad request before the parser sees it.
"""

from __future__ import annotations

import functools
import re

#: Deepest JSON nesting of a trace row (a Mooncake row nests 2: the object and its hash
#: list); a deeper row is a bad row, found before the parser recurses into it.
MAX_ROW_DEPTH = 16

# A JSON string: a quote, then runs of ordinary characters and escapes (the unrolled
# form, linear in the string's length), then the closing quote.
_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_STRING_TEXT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


@functools.lru_cache(maxsize=1)
def _steps():
    """+1 for each byte that opens an array or object, -1 for each that closes one."""
    import numpy as np

    step = np.zeros(256, dtype=np.int8)
    step[[ord("["), ord("{")]] = 1
    step[[ord("]"), ord("}")]] = -1
    return step


def json_depth(text: bytes | str) -> int:
    """The deepest nesting of arrays and objects in JSON `text` (0 for a scalar), counted
    on the characters outside strings (an unterminated string's brackets count)."""
    import numpy as np

    if isinstance(text, str):
        bare = _STRING_TEXT.sub("", text).encode("utf-8", "surrogatepass")
    else:
        bare = _STRING_BYTES.sub(b"", text)
    steps = _steps()[np.frombuffer(bare, dtype=np.uint8)]
    steps = steps[steps != 0]
    return int(np.cumsum(steps, dtype=np.int64).max()) if steps.size else 0


def brackets(text: str) -> int:
    """How many arrays and objects `text` opens at most (a cheap upper bound of its
    depth: a reader measures `json_depth` only when this is large)."""
    return text.count("[") + text.count("{")


__all__ = ["MAX_ROW_DEPTH", "brackets", "json_depth"]
