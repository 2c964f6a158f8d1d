"""Lazy trace readers: a file in, `Request`s out, one row at a time.

`open_trace` returns a `TraceReader`; iterating it streams the file (never holding
more than one row), converts times once to seconds from the first row's timestamp,
validates every field and either raises a `TraceError` naming file, line and field, or
(``skip_bad_rows=True``) skips the row and counts it by reason. Iterating again
re-reads the file and resets the counters.

Skip reasons (keys of `TraceReader.skipped`): ``missing_field``, ``not_a_number``
(a length or timestamp that is not a number), ``negative_length``, ``zero_length``,
``time_backwards``, ``bad_hashes``, ``extra_fields`` (a CSV row with more fields
than its header), ``invalid_json`` (also a row nested deeper than
`MAX_ROW_DEPTH`), ``too_long`` (a length above
`MAX_TOKENS`). Files may be gzip-compressed (read as they are streamed); a file that
is not UTF-8 text is a TraceError naming the line of its first bad byte
(`workloads.textfile`).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .errors import TraceError
from .formats import TIME_UNIT_WORDS, TIME_UNITS, Schema, detect_schema
from .jsontext import MAX_ROW_DEPTH, brackets, json_depth
from .names import resolve_trace
from .request import MAX_TOKENS, Request
from .textfile import check_text, content_sha256, open_text, text_error
from .timeparse import make_datetime_parser

_MISSING = object()
_INT_ONLY = {int}
_HASH_SPLIT = re.compile(r"[,;\s]+")
_MAX_EXAMPLES = 5


class _BadRow(Exception):
    """Internal: one field of one row is bad (turned into a TraceError with the line)."""

    def __init__(self, field: str | None, problem: str, reason: str) -> None:
        self.field, self.problem, self.reason = field, problem, reason


class _FailedRequest(Exception):
    """Internal: a row of a request that failed in the source system (0 output tokens)."""


def _count_slow(value: Any, field: str) -> int:
    """A token count from anything other than a plain int; raises _BadRow."""
    if type(value) is str:
        text = value.strip()
        if not text:
            raise _BadRow(field, "missing (empty value)", "missing_field")
        if not text.isascii():       # int() and float() also read other scripts' digits
            raise _BadRow(field, f"expected an integer token count in ASCII digits, got {text[:40]!r}",
                          "not_a_number")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if number.is_integer():
            return int(number)
    elif type(value) is float and value.is_integer():
        return int(value)
    raise _BadRow(field, f"expected an integer token count, got {value!r}", "not_a_number")


def _typed(value: Any, field: str) -> Any:
    """A JSON row's token count as it is, unless it is a string: raises _BadRow."""
    if type(value) is str:
        raise _BadRow(field, f"expected a JSON number (a token count), got the string {value[:40]!r}",
                      "not_a_number")
    return value


def _length_error(field: str, n: int) -> _BadRow:
    if n > MAX_TOKENS:
        return _BadRow(field, f"{n:.3g} tokens is beyond any model's context (expected at most "
                       f"{MAX_TOKENS:,}, workloads.request.MAX_TOKENS)", "too_long")
    reason = "negative_length" if n < 0 else "zero_length"
    return _BadRow(field, f"expected a token count >= 1, got {n}", reason)


def _parse_hash_text(text: str, field: str) -> tuple[int, ...]:
    body = text.strip().strip("[]()")
    if not body.strip():
        return ()
    if not body.isascii():
        raise _BadRow(field, f"expected a list of integer block hashes in ASCII digits, got {text[:80]!r}",
                      "bad_hashes")
    try:
        return tuple(int(x) for x in _HASH_SPLIT.split(body.strip()))
    except ValueError:
        raise _BadRow(field, f"expected a list of integer block hashes, got {text[:80]!r}",
                      "bad_hashes") from None


class TraceReader:
    """A lazy, re-iterable reader of one trace file; iterating yields `Request`s.

    Attributes:
      path (Path), name (what the user asked for), format (schema name), schema,
      skip_bad_rows, has_timestamps (False for a length-only source: every
      `arrival_s` is 0.0), block_size (tokens per hash block).
    Counters of the latest pass (reset when a new iteration starts; partial if the
    iteration was stopped early, see `complete`):
      rows_read: data rows looked at (yielded + skipped + failed);
      requests: rows yielded;
      skipped: {reason: count} of bad rows skipped (only with skip_bad_rows);
      skipped_examples: the first few skipped rows' error messages;
      failed_requests: rows of requests that failed at the source (BurstGPT: 0
        response tokens); counted and reported, never yielded, never an error;
      complete: True once the whole file was read.
    Ids: a request's id is its data row's 0-based index in the file (blank lines not
    counted); skipped and failed rows keep their index, so ids can have gaps.

    Raises TraceError (on iteration) for an empty file, a missing column, or, unless
    skip_bad_rows, the first bad row.
    """

    def __init__(self, path: Path, schema: Schema, *, skip_bad_rows: bool = False,
                 name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name if name is not None else str(path)
        self.schema = schema
        self.format = schema.name
        self.skip_bad_rows = bool(skip_bad_rows)
        self.has_timestamps = schema.has_timestamps
        self.block_size = schema.block_size
        self._reset()

    # -- counters --------------------------------------------------------------------
    def _reset(self) -> None:
        self.rows_read = 0
        self.requests = 0
        self.skipped: dict[str, int] = {}
        self.skipped_examples: list[str] = []
        self.failed_requests = 0
        self.complete = False

    @property
    def rows_skipped(self) -> int:
        """Total bad rows skipped in the latest pass."""
        return sum(self.skipped.values())

    def counters(self) -> dict[str, Any]:
        """The counters of the latest pass as a JSON-ready dict."""
        return {
            "path": str(self.path),
            "format": self.format,
            "rows_read": self.rows_read,
            "requests": self.requests,
            "skipped_rows": self.rows_skipped,
            "skipped_by_reason": dict(self.skipped),
            "skipped_examples": list(self.skipped_examples),
            "failed_requests": self.failed_requests,
            "complete": self.complete,
        }

    def sha256(self) -> str:
        """Hex SHA-256 of the file's content, decompressed if gzip (for provenance;
        `workloads.textfile.content_sha256`)."""
        return content_sha256(self.path)

    def __repr__(self) -> str:
        return f"TraceReader({str(self.path)!r}, format={self.format!r}, skip_bad_rows={self.skip_bad_rows})"

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Request]:
        self._reset()
        rows = self._iter_jsonl() if self.schema.container == "jsonl" else self._iter_csv()
        return self._text_errors(rows)

    def _text_errors(self, rows: Iterator[Request]) -> Iterator[Request]:
        # a bad byte or corrupt gzip data past the part `check_text` saw: file and line
        try:
            yield from rows
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
            raise text_error(self.path, exc) from None

    def _error(self, line: int | None, field: str | None, problem: str,
               reason: str | None = None) -> TraceError:
        return TraceError(str(self.path), line, field, problem, reason)

    def _skip(self, line: int, bad: _BadRow) -> None:
        err = self._error(line, bad.field, bad.problem, bad.reason)
        if not self.skip_bad_rows:
            raise err from None  # the internal _BadRow is not the user's business
        self.skipped[bad.reason] = self.skipped.get(bad.reason, 0) + 1
        if len(self.skipped_examples) < _MAX_EXAMPLES:
            self.skipped_examples.append(str(err))

    def _time_converter(self) -> Callable[[Any], float] | None:
        s = self.schema
        if s.timestamp is None:
            return None
        field = s.timestamp
        if s.time_unit == "datetime":
            parse = make_datetime_parser()
            example = "a date-time such as '2023-11-16 18:15:46.6805900'"

            def conv(value: Any) -> float:
                if type(value) is not str:
                    raise _BadRow(field, f"expected {example}, got {value!r}", "not_a_number")
                try:
                    return parse(value)
                except (ValueError, IndexError):
                    if not value.strip():
                        raise _BadRow(field, "missing (empty value)", "missing_field") from None
                    raise _BadRow(field, f"expected {example}, got {value!r}",
                                  "not_a_number") from None
            return conv

        word = TIME_UNIT_WORDS[s.time_unit]

        def conv_number(value: Any) -> float:
            t = type(value)
            if t is int or t is float:
                x = value
            elif t is str:
                try:
                    if not value.isascii():      # float() also reads other scripts' digits
                        raise ValueError
                    x = float(value)
                except ValueError:
                    if not value.strip():
                        raise _BadRow(field, "missing (empty value)", "missing_field") from None
                    raise _BadRow(field, f"expected a number of {word}, got {value!r}",
                                  "not_a_number") from None
            else:
                raise _BadRow(field, f"expected a number of {word}, got {value!r}", "not_a_number")
            if not math.isfinite(x):
                raise _BadRow(field, f"expected a finite number of {word}, got {value!r}",
                              "not_a_number")
            return x
        return conv_number

    def _builder(self) -> Callable[..., Request]:
        """build(line, row_id, ts, prompt, output, hashes, tenant, slo) -> Request.

        Raw values are JSON values or CSV text (`_MISSING` when absent). Per-pass state
        (time origin, previous timestamp) lives in this closure: a row only moves it
        once the whole row is valid, so a skipped row never shifts the time base.
        """
        s = self.schema
        to_time = self._time_converter()
        divisor = TIME_UNITS.get(s.time_unit, 1.0)  # units per second
        unit = "" if s.time_unit == "datetime" else f" {s.time_unit}"
        f_ts, f_in, f_out, f_h = s.timestamp, s.prompt_tokens, s.output_tokens, s.block_hashes
        bs = s.block_size
        fail_on_zero = s.zero_output_is_failure
        # a JSON row types its values: a token count written as a string ("1000") is a
        # mistake in the file, not CSV text to read
        typed = s.container == "jsonl"
        labels: dict[str, str] = {}
        state: list[Any] = [None, -math.inf, None, 0]  # t0, previous t, its raw text, its line

        def label(value: Any) -> str | None:
            if value is _MISSING or value is None or value == "":
                return None
            value = str(value)
            return labels.setdefault(value, value)  # share one str per distinct label

        def build(line: int, row_id: int, ts: Any, p: Any, o: Any, h: Any,
                  ten: Any, slo: Any) -> Request:
            if to_time is not None:
                if ts is _MISSING:
                    raise _BadRow(f_ts, "missing", "missing_field")
                t = to_time(ts)
                if t < state[1]:
                    raise _BadRow(
                        f_ts,
                        f"goes backwards: {ts}{unit} is earlier than "
                        f"{state[2]}{unit} on line {state[3]}",
                        "time_backwards",
                    )
            if type(p) is not int:
                if p is _MISSING:
                    raise _BadRow(f_in, "missing", "missing_field")
                p = _count_slow(_typed(p, f_in) if typed else p, f_in)
            if not 1 <= p <= MAX_TOKENS:
                raise _length_error(f_in, p)
            if type(o) is not int:
                if o is _MISSING:
                    raise _BadRow(f_out, "missing", "missing_field")
                o = _count_slow(_typed(o, f_out) if typed else o, f_out)
            failed = False
            if o > MAX_TOKENS:
                raise _length_error(f_out, o)
            if o < 1:
                if o == 0 and fail_on_zero:
                    failed = True
                else:
                    raise _length_error(f_out, o)
            hashes = None
            if f_h is not None:
                if type(h) is list:
                    if h and set(map(type, h)) != _INT_ONLY:
                        raise _BadRow(f_h, "expected a list of integer block hashes, got "
                                      f"{str(h)[:80]}", "bad_hashes")
                    hashes = tuple(h)
                elif h is _MISSING:
                    raise _BadRow(f_h, "missing", "missing_field")
                elif type(h) is str:
                    hashes = _parse_hash_text(h, f_h)
                elif h is not None:
                    raise _BadRow(f_h, f"expected a list of integer block hashes, got {h!r}",
                                  "bad_hashes")
                # one hash per block, the last block partial: exactly ceil(p / bs); too
                # few would make the prefix cache under-count, too many is not this prompt
                if hashes is not None and len(hashes) != -(-p // bs):
                    raise _BadRow(
                        f_h,
                        f"{len(hashes)} block hashes, but a prompt of {p} tokens has "
                        f"{-(-p // bs)} blocks of {bs} tokens (expected {-(-p // bs)})",
                        "bad_hashes",
                    )
            if failed:
                # counted, never yielded; it neither sets the time origin (the first
                # valid row does) nor moves the previous timestamp
                raise _FailedRequest
            if to_time is not None:
                if state[0] is None:
                    state[0] = t
                state[1], state[2], state[3] = t, ts, line
                arrival = (t - state[0]) / divisor
            else:
                arrival = 0.0
            return Request(row_id, arrival, p, o, hashes, bs, label(ten), label(slo))

        return build

    def _iter_jsonl(self) -> Iterator[Request]:
        s = self.schema
        build = self._builder()
        keys = (s.timestamp, s.prompt_tokens, s.output_tokens, s.block_hashes, s.tenant,
                s.slo_class)
        k_ts, k_in, k_out, k_h, k_ten, k_slo = keys
        # JSONDecoder.raw_decode on text skips json.loads' type and encoding checks
        # (about 30% faster); anything it does not take goes through json.loads,
        # whose message then names the problem.
        raw_decode = json.JSONDecoder().raw_decode
        missing = _MISSING
        line = 0
        with open_text(self.path) as f:
            for raw in f:
                line += 1
                if brackets(raw) > MAX_ROW_DEPTH:
                    depth = json_depth(raw)
                    if depth > MAX_ROW_DEPTH:    # before the parser: it recurses per level
                        self.rows_read += 1
                        self._skip(line, _BadRow(None, f"invalid JSON (nested {depth:,} levels deep; a "
                                                 f"trace row nests at most {MAX_ROW_DEPTH})", "invalid_json"))
                        continue
                try:
                    d, end = raw_decode(raw)
                    if end < len(raw) - 1 and raw[end:].strip():
                        d = json.loads(raw)  # trailing text: let json.loads report it
                except ValueError:
                    try:
                        d = json.loads(raw)
                    except ValueError as e:
                        if not raw.strip():
                            continue  # blank line (e.g. a trailing newline)
                        self.rows_read += 1
                        # json's messages for a control character or an open string end in
                        # "at" (it appends the position itself): the column follows here
                        msg = getattr(e, "msg", str(e)).removesuffix(" at")
                        col = getattr(e, "colno", None)
                        self._skip(line, _BadRow(None, f"invalid JSON ({msg}"
                                                 + (f" at column {col})" if col else ")"),
                                                 "invalid_json"))
                        continue
                row_id = self.rows_read
                self.rows_read += 1
                if type(d) is not dict:
                    self._skip(line, _BadRow(None, f"expected a JSON object, got "
                                             f"{type(d).__name__}", "invalid_json"))
                    continue
                get = d.get
                try:
                    req = build(
                        line, row_id,
                        get(k_ts, missing) if k_ts is not None else None,
                        get(k_in, missing), get(k_out, missing),
                        get(k_h, missing) if k_h is not None else None,
                        get(k_ten) if k_ten is not None else None,
                        get(k_slo) if k_slo is not None else None,
                    )
                except _BadRow as bad:
                    if bad.problem == "missing":
                        bad.problem = f"missing (the row has keys: {', '.join(map(str, d))})"
                    self._skip(line, bad)
                    continue
                except _FailedRequest:
                    self.failed_requests += 1
                    continue
                self.requests += 1
                yield req
        if self.rows_read == 0:
            raise self._error(1, None, "the file is empty (expected one JSON object per line)")
        self.complete = True

    def _iter_csv(self) -> Iterator[Request]:
        s = self.schema
        build = self._builder()
        with open_text(self.path, newline="") as f:
            rows = csv.reader(f)
            try:
                header = next(rows)
                while not header:  # leading blank lines
                    header = next(rows)
            except StopIteration:
                raise self._error(1, None, "the file is empty (no header and no rows)") from None
            except csv.Error as e:
                raise self._error(rows.line_num, None, f"not valid CSV ({e})") from None
            names = [c.strip() for c in header]
            index = {n: i for i, n in enumerate(names)}
            header_line = rows.line_num

            def column(name: str | None, required: bool) -> int | None:
                if name is None:
                    return None
                if name in index:
                    return index[name]
                if required:
                    raise self._error(header_line, name, "column not found in the header "
                                      f"(columns: {', '.join(names)})")
                return None  # an optional label column the file does not have

            i_ts = column(s.timestamp, True)
            i_in = column(s.prompt_tokens, True)
            i_out = column(s.output_tokens, True)
            i_h = column(s.block_hashes, True)
            i_ten = column(s.tenant, False)
            i_slo = column(s.slo_class, False)
            required = [(i, n) for i, n in ((i_ts, s.timestamp), (i_in, s.prompt_tokens),
                                            (i_out, s.output_tokens), (i_h, s.block_hashes))
                        if i is not None]
            width = max(i for i, _ in required) + 1
            n_cols = len(names)
            while True:
                try:
                    row = next(rows)
                except StopIteration:
                    break
                except csv.Error as e:
                    raise self._error(rows.line_num, None, f"not valid CSV ({e})") from None
                n = len(row)
                if not n:
                    continue  # blank line
                row_id = self.rows_read
                self.rows_read += 1
                line = rows.line_num
                if n > n_cols:
                    # csv would read it, but a value with an unquoted comma (or a
                    # stray delimiter) has shifted its columns: not this header's row
                    self._skip(line, _BadRow(None, f"the row has {n} fields but the header (line "
                                             f"{header_line}) has {n_cols} columns; quote a value "
                                             "that holds a comma", "extra_fields"))
                    continue
                if n < width:
                    name = next(name for i, name in required if i >= n)
                    self._skip(line, _BadRow(name, f"missing (the row has {n} of {n_cols} "
                                             "columns)", "missing_field"))
                    continue
                try:
                    req = build(
                        line, row_id,
                        row[i_ts] if i_ts is not None else None,
                        row[i_in], row[i_out],
                        row[i_h] if i_h is not None else None,
                        row[i_ten] if i_ten is not None and i_ten < n else None,
                        row[i_slo] if i_slo is not None and i_slo < n else None,
                    )
                except _BadRow as bad:
                    self._skip(line, bad)
                    continue
                except _FailedRequest:
                    self.failed_requests += 1
                    continue
                self.requests += 1
                yield req
        if self.rows_read == 0:
            raise self._error(header_line + 1, None, "no data rows after the header")
        self.complete = True


def open_trace(path_or_name: str | os.PathLike, format: str | None = None,
               skip_bad_rows: bool = False,
               mapping: Mapping[str, Any] | None = None) -> TraceReader:
    """Open a trace by PATH or NAME (see `resolve_trace`) as a lazy `TraceReader`.

    format: None (detect from the first line), ``"mooncake"``, ``"azure"``,
      ``"burstgpt"``, ``"vidur"`` (alias ``"lengths"``), or ``"csv"``/``"jsonl"``/
      ``"generic"`` with `mapping`.
    mapping: column mapping for a generic file, or overrides for a preset; keys
      ``timestamp``, ``time_unit`` (``s``/``ms``/``us``/``ns``/``datetime``),
      ``prompt_tokens``, ``output_tokens``, ``block_hashes``, ``block_size``,
      ``tenant``, ``slo_class`` (see `workloads.formats.Schema.from_mapping`).
    skip_bad_rows: skip and count bad rows instead of raising.
    Nothing but the first line (and up to 64 KiB checked for text) is read here.
    Raises TraceError (unknown name, missing file, not UTF-8 text, compressed other
    than with gzip, empty file, unknown layout) or ValueError (bad format/mapping).
    """
    path = resolve_trace(path_or_name)
    check_text(path)
    schema = detect_schema(path, format, mapping)
    return TraceReader(path, schema, skip_bad_rows=skip_bad_rows, name=str(path_or_name))
