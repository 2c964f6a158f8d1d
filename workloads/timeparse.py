"""Fast parsing of trace date-times into seconds.

Azure LLM traces stamp each request with a wall-clock date-time
(2023: ``2023-11-16 18:15:46.6805900``, 7 fractional digits, no zone;
2024: ``2024-05-10 00:00:00.009930+00:00``, zone suffix, fraction sometimes left out).
`datetime.fromisoformat` is slow for 10^7 rows and, before Python 3.11, rejects
7 fractional digits, so the common shape is parsed by hand and anything else
falls back to `datetime.fromisoformat`.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Callable


def make_datetime_parser() -> Callable[[str], float]:
    """Return ``parse(text) -> seconds`` for date-times of one file.

    Seconds are counted from midnight (UTC, or the naive zone) of the first date the
    parser sees, which keeps full float precision (sub-microsecond) even for a
    week-long trace. Zone suffixes (``Z``, ``+HH:MM``, ``-HH:MM``) are applied; a
    naive time is taken as UTC. Raises ValueError on text that is not a date-time
    (digits of other scripts included: only ASCII digits are read).
    """
    day_offsets: dict[str, float] = {}
    ref: list[int] = []

    def day_offset(day: str) -> float:
        ordinal = date.fromisoformat(day).toordinal()
        if not ref:
            ref.append(ordinal)
        off = (ordinal - ref[0]) * 86400.0
        day_offsets[day] = off
        return off

    def slow(text: str) -> float:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if dt.tzinfo is not None:
            dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
        day = dt.date().isoformat()
        base = day_offsets.get(day)
        if base is None:
            base = day_offset(day)
        return base + dt.hour * 3600 + dt.minute * 60 + dt.second + dt.microsecond * 1e-6

    def parse(text: str) -> float:
        if not text.isascii():       # int() and float() also read other scripts' digits
            raise ValueError(f"not an ASCII date-time: {text[:40]!r}")
        if len(text) < 19 or text[10] not in " T" or text[13] != ":" or text[16] != ":":
            return slow(text)
        day = text[:10]
        base = day_offsets.get(day)
        if base is None:
            base = day_offset(day)
        rest = text[17:]
        zone = 0
        if rest[-1:] == "Z":
            rest = rest[:-1]
        elif len(rest) >= 8 and rest[-6] in "+-" and rest[-3] == ":":
            zone = int(rest[-5:-3]) * 3600 + int(rest[-2:]) * 60
            if rest[-6] == "-":
                zone = -zone
            rest = rest[:-6]
        hour = int(text[11:13])
        minute = int(text[14:16])
        second = float(rest)
        if not (0 <= hour < 24 and 0 <= minute < 60 and 0.0 <= second < 61.0):
            raise ValueError(f"time out of range: {text!r}")
        if not rest[:1].isdigit():  # float() also takes 'nan', '+5', ' 5'
            raise ValueError(f"bad seconds: {text!r}")
        return base + hour * 3600 + minute * 60 + second - zone

    return parse
