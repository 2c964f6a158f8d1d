"""Replay controls on request iterators, and `load_requests` (a trace, filtered, as a list).

Every control takes and returns an iterator of `Request`s in arrival order, so a
multi-GB trace streams through them; `window` stops reading at the window's end.
Ids are kept (they still name the trace row); arrival times are re-based to the
window start and then divided by the rate scale.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any, Iterable, Iterator, Mapping

from .errors import TraceError
from .reader import TraceReader, open_trace
from .request import MAX_TOKENS, Request
from .meta import RequestMeta

def parse_window(text: str) -> tuple[float | None, float | None]:
    """``"60:180"`` -> (60.0, 180.0) seconds; either side may be empty (``":300"``).

    START must be finite and >= 0 (trace time starts at 0: a negative start would shift
    every arrival later); END finite and after START, or empty (open: ``"60:"``). Raises
    ValueError on anything else: an empty window, ``":"`` (neither side: no window),
    an infinite or NaN side (write an open end as ``"60:"``), digits other than ASCII.
    """
    start, sep, end = text.partition(":")
    form = f"window must look like START:END in seconds (e.g. 60:180, or 60: for an open end), got {text[:40]!r}"
    if not sep or not (start.strip() or end.strip()) or not text.isascii():
        raise ValueError(form)
    try:
        lo = float(start) if start.strip() else None
        hi = float(end) if end.strip() else None
    except ValueError:
        raise ValueError(form) from None
    if lo is not None and not (math.isfinite(lo) and lo >= 0):
        raise ValueError(f"window start must be a finite number of seconds >= 0, got {start.strip()!r} in {text!r}")
    if hi is not None and not math.isfinite(hi):
        raise ValueError(f"window end must be a finite number of seconds (leave it empty for an open end: "
                         f"{start.strip() or '0'}:), got {end.strip()!r}")
    if hi is not None and hi <= (lo or 0.0):
        raise ValueError(f"window end must be after its start, got {text!r}")
    return lo, hi


def select_window(requests: Iterable[Request], start_s: float | None = None,
           end_s: float | None = None) -> Iterator[Request]:
    """Requests with ``start_s <= arrival_s < end_s``, arrivals re-based to ``start_s``.

    None means open on that side. The input must be in arrival order (every reader
    guarantees it); reading stops at the first arrival >= end_s. Raises ValueError if
    end_s <= start_s or if the input goes backwards in time.
    """
    start = 0.0 if start_s is None else float(start_s)
    end = math.inf if end_s is None else float(end_s)
    if not end > start:
        raise ValueError(f"window end ({end_s} s) must be after its start ({start_s} s)")
    previous = -math.inf
    for r in requests:
        t = r.arrival_s
        if t < previous:
            raise ValueError(f"requests are not in arrival order (request {r.id} at {t} s "
                             f"after one at {previous} s); sort them before windowing")
        previous = t
        if t >= end:
            return
        if t >= start:
            if start:
                r = Request(r.id, t - start, r.prompt_tokens, r.output_tokens, r.block_hashes,
                            r.block_size, r.tenant, r.slo_class, r.reasoning_tokens, r.turn)
            yield r


def scale_rate(requests: Iterable[Request], factor: float) -> Iterator[Request]:
    """Divide every arrival time by `factor`: 2.0 replays twice as fast (inter-arrival
    times halved), 0.5 half as fast. Raises ValueError unless factor is finite and > 0."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate_scale must be a finite number > 0, got {factor}")
    if factor == 1.0:
        yield from requests
        return
    for r in requests:
        yield Request(r.id, r.arrival_s / factor, r.prompt_tokens, r.output_tokens,
                      r.block_hashes, r.block_size, r.tenant, r.slo_class, r.reasoning_tokens, r.turn)


def sample_fraction(requests: Iterable[Request], fraction: float, seed: int = 0) -> Iterator[Request]:
    """Keep each request independently with probability `fraction` (seeded, so the same
    seed keeps the same requests). Raises ValueError unless 0 < fraction <= 1."""
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"sample fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        yield from requests
        return
    draw = random.Random(seed).random
    for r in requests:
        if draw() < fraction:
            yield r


def take(requests: Iterable[Request], n: int | None) -> Iterator[Request]:
    """The first `n` requests (all if None); stops reading after the n-th.
    Raises ValueError if n < 0."""
    if n is None:
        yield from requests
        return
    if n < 0:
        raise ValueError(f"max_requests must be >= 0, got {n}")
    if n == 0:
        return
    for i, r in enumerate(requests, 1):
        yield r
        if i >= n:
            return


def scale_output(requests: Iterable[Request], factor: float) -> Iterator[Request]:
    """Multiply every output length by `factor` (rounded, at least 1 token; the
    reasoning tokens by the same factor).
    Raises ValueError unless factor is finite and > 0."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"output_scale must be a finite number > 0, got {factor}")
    if factor == 1.0:
        yield from requests
        return
    for r in requests:
        scaled = r.output_tokens * factor
        if scaled > MAX_TOKENS:
            # the scale is the mistake, not the request: name it (a 300-digit count
            # on "Request 0" said neither)
            raise ValueError(f"output_scale (--output-scale) {factor:g}: request {r.id}'s {r.output_tokens:,} "
                             f"output tokens would become {scaled:.3g}, beyond any model's context (at most "
                             f"{MAX_TOKENS:,} tokens, workloads.request.MAX_TOKENS)")
        out = max(1, round(scaled))
        yield Request(r.id, r.arrival_s, r.prompt_tokens, out, r.block_hashes, r.block_size,
                      r.tenant, r.slo_class, min(out, round(r.reasoning_tokens * factor)), r.turn)


def replay(requests: Iterable[Request], *, window: tuple[float | None, float | None] | None = None,
           rate_scale: float = 1.0, max_requests: int | None = None, sample: float = 1.0,
           seed: int = 0, output_scale: float = 1.0) -> Iterator[Request]:
    """All replay controls in their fixed order: window (trace seconds, re-based to its
    start) -> sample (fraction, seed) -> max_requests -> rate_scale -> output_scale.

    Lazy. Raises ValueError on bad parameters (when iteration starts).
    """
    it: Iterable[Request] = requests
    if window is not None:
        it = select_window(it, *window)
    it = sample_fraction(it, sample, seed)
    it = take(it, max_requests)
    it = scale_rate(it, rate_scale)
    return scale_output(it, output_scale)


class RequestList(RequestMeta, list):
    """A `list[Request]` that also says where it came from (for a run's results).

    Attributes (`workloads.table.RequestMeta`): name (as asked), path, format,
    controls (the replay parameters), rows_read, skipped_rows, skipped_by_reason,
    skipped_examples, failed_requests (reader counters; partial if a window stopped
    reading early, see `complete`).
    """

    def __init__(self, requests: Iterable[Request] = (), **meta: Any) -> None:
        list.__init__(self, requests)
        self._set_meta(len(self), meta)


def untimed_problem(reader: TraceReader) -> str:
    """What is wrong with replaying `reader`'s trace as it is, when it has no
    timestamps: the start of the error messages that refuse it."""
    return (f"has no timestamps (a {reader.format} length distribution: token lengths only, "
            "every arrival at 0 s)")


def load_requests(name_or_path: str | os.PathLike | TraceReader, *,
                  window: tuple[float | None, float | None] | None = None,
                  rate_scale: float = 1.0, max_requests: int | None = None,
                  sample: float = 1.0, seed: int = 0, skip_bad_rows: bool = False,
                  output_scale: float = 1.0, format: str | None = None,
                  mapping: Mapping[str, Any] | None = None, compact: bool = False,
                  allow_untimed: bool = False):
    """Read a trace (NAME, PATH or an open `TraceReader`) through the replay controls.

    window: (start_s, end_s) in trace seconds, either None for open; arrivals are
      re-based to start_s. rate_scale: arrival times divided by it (2.0 = twice the
      rate). max_requests: keep the first n (after window and sampling). sample:
      keep each request with this probability (seeded by `seed`). output_scale:
      output lengths multiplied by it (rounded, >= 1). Ids are the trace's row ids
      (not renumbered). format, mapping, skip_bad_rows: see `open_trace`.
    compact: return a `workloads.table.RequestTable` (numpy columns, built as the
      file streams: no `Request` object is kept) instead of a list.
    allow_untimed: accept a trace without timestamps (a length distribution such as
      ``arxiv_lengths``): its rows in file order, every arrival at 0 s, for the caller
      to re-time (`workloads.load.retime`, or a closed loop); window and rate_scale,
      which act on trace seconds, are then refused.

    Returns a `RequestList` (or a RequestTable) (a list, plus counters such as skipped rows for the run's
    results). Raises TraceError for bad input, for a trace without timestamps unless
    `allow_untimed` (`untimed_problem`), or when nothing is left; ValueError for bad
    parameters (a window or rate scale on a trace without timestamps).
    """
    reader = name_or_path if isinstance(name_or_path, TraceReader) else open_trace(
        name_or_path, format=format, skip_bad_rows=skip_bad_rows, mapping=mapping)
    if not reader.has_timestamps:
        if not allow_untimed:
            raise TraceError(str(reader.path), None, None, untimed_problem(reader) + (
                "; re-time its requests with a request rate (on the command line: --request-rate R of "
                "rack run, compare, sweep and bench-serve; in Python: load_requests(..., "
                "allow_untimed=True), then workloads.load.retime) or draw from its lengths "
                "(EmpiricalLengths.from_trace)"))
        if window is not None or rate_scale != 1.0:
            raise ValueError(f"{reader.name} {untimed_problem(reader)}: window and rate_scale (trace "
                             "seconds) have nothing to act on; leave them out and re-time the requests "
                             "(workloads.load.retime)")
    controls = {"window": list(window) if window is not None else None,
                "rate_scale": rate_scale, "max_requests": max_requests, "sample": sample,
                "seed": seed, "output_scale": output_scale, "skip_bad_rows": reader.skip_bad_rows}
    rows = replay(reader, window=window, rate_scale=rate_scale, max_requests=max_requests,
                  sample=sample, seed=seed, output_scale=output_scale)
    if compact:
        from .table import RequestTable

        requests = RequestTable.from_requests(rows)
    else:
        requests = list(rows)
    c = reader.counters()
    if not requests:
        if c["requests"] == 0 and c["rows_read"]:
            why = f"all {c['rows_read']} rows were skipped as bad ({c['skipped_by_reason']})"
        elif window is not None:
            # the usual cause: a window outside the trace; say where the trace is
            first = last = None
            for r in reader:
                first = r.arrival_s if first is None else first
                last = r.arrival_s
            span = ("it has no requests" if first is None else
                    f"its arrivals span {first:g} to {last:g} s")
            lo, hi = (0.0 if window[0] is None else window[0]), (math.inf if window[1] is None else window[1])
            others = ", ".join(f"{k}={v}" for k, v in (("rate_scale", rate_scale), ("sample", sample),
                                                           ("max_requests", max_requests))
                               if v not in (None, 1, 1.0))
            why = (f"none arrives in the window [{lo:g}, {hi:g}) s; {span}"
                   + (f" (with {others})" if others else ""))
        else:
            why = f"none passed the replay controls {controls}"
        raise TraceError(str(reader.path), None, None, f"no requests to replay: {why}")
    meta = dict(name=reader.name, path=str(reader.path), format=reader.format,
        controls=controls, rows_read=c["rows_read"], skipped_by_reason=c["skipped_by_reason"],
        skipped_examples=c["skipped_examples"], failed_requests=c["failed_requests"],
        complete=c["complete"])
    return requests.with_meta(**meta) if compact else RequestList(requests, **meta)
