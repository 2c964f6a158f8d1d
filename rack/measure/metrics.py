"""Metrics of a run, from the collector's records and the components' stats.

Definitions (pinned by tests, stated in docs/run.md):
- TTFT = first_token - arrival: the moment the client receives the first output token,
  queueing included. Colocated: the end of the prompt's last prefill chunk. Split
  (first_token = "decode", the default): the end of the decode engine's first step
  after the KV has landed, so TTFT includes the KV's waits and transfer; split with
  first_token = "prefill": the end of the prompt on the prefill instance.
- E2E = completion - arrival. TPOT = (E2E - TTFT) / (output_tokens - 1), only for
  requests with >= 2 output tokens. ITL = every gap between consecutive output tokens
  of every completed request (the first token's wait is not an ITL sample), so the
  mean of a request's ITLs equals its TPOT.
- Rejected and failed requests give no latency samples but count in `submitted`.
- Goodput = completed requests meeting both SLO targets (TTFT <= ttft_ms and TPOT <=
  tpot_ms; a one-token request has no TPOT and meets that target) per second, measured
  at steady state: over the requests that arrived in the steady-state window (the
  arrival span less its first and last `STEADY_TRIM`, the warm-up and the drain; a
  half-open interval [start, end), so a steady rate r gives r, not r + 1 / length),
  divided by the window's length; the offered rate is measured the same way, so a
  rack that meets the SLO for every request has goodput = offered rate. (Dividing by
  first arrival to last completion instead lets the drain of a time-compressed trace
  dominate.) With fewer than `STEADY_MIN_REQUESTS` arrivals in the window (or all
  arrivals at one instant), or a window shorter than the median time its requests
  spent in the rack (a burst, all in flight at once: dividing by the window would
  report a rate the rack never served), the whole run is the window, as
  `goodput.basis` and `goodput.basis_reason` say.
  SLO attainment = requests meeting both targets / submitted (DistServe).
- The run's duration (throughput) is from the first arrival to the last request's end.
- Percentiles: linear interpolation between closest ranks (numpy's default method),
  for every sample size; an empty sample gives null. Means are correctly rounded
  (`math.fsum`). Samples too many for memory (a long run's inter-token latencies,
  streamed to disk) get the same numbers from their chunks (`rack.measure.quantiles`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from rack.measure import quantiles
from rack.serving.records import ITLSamples, SampleChunks

PERCENTILES = (50, 90, 99)
#: Share of the arrival span at each end left out of the steady-state window (warm-up,
#: drain); see the module docstring.
STEADY_TRIM = 0.10
#: Fewest arrivals the steady-state window must hold to be used.
STEADY_MIN_REQUESTS = 10


def summarize(values: np.ndarray | SampleChunks) -> dict:
    """{"mean", "min", "p50", "p90", "p99", "max", "n"} of `values` (NaN left out; nulls
    when empty): an array, or samples in chunks (`rack.serving.records.SampleChunks`,
    `ITLSamples`: arrays and (values, counts) runs), which give the same numbers as the
    expanded samples in one array, without being loaded at once."""
    if isinstance(values, SampleChunks):
        n = len(values)
        if n == 0:
            return summarize(np.zeros(0))
        p = quantiles.linear_percentiles(values, n, PERCENTILES)
        lo = min(float((c if type(c) is not tuple else c[0]).min()) for c in values)
        hi = max(float((c if type(c) is not tuple else c[0]).max()) for c in values)
        return {"mean": quantiles.exact_fsum(values) / n, "min": lo, "p50": p[0], "p90": p[1],
                "p99": p[2], "max": hi, "n": n}
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": None, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    p = np.percentile(v, PERCENTILES)
    return {"mean": quantiles.exact_fsum([v]) / v.size, "min": float(v.min()), "p50": float(p[0]),
            "p90": float(p[1]), "p99": float(p[2]), "max": float(v.max()), "n": int(v.size)}


def itl_samples(snapshot: dict) -> np.ndarray | SampleChunks:
    """The inter-token latency samples of a collector snapshot: its "itl"
    (`rack.serving.records.ITLSamples`), or "itl_flat" (an array: a client-side
    snapshot, `rack.serve.loadgen`)."""
    return snapshot["itl"] if "itl" in snapshot else snapshot["itl_flat"]


def itl_array(snapshot: dict) -> np.ndarray:
    """Every inter-token latency sample of a collector snapshot in one array (plots;
    `itl_samples` summarizes them without expanding)."""
    v = itl_samples(snapshot)
    return v.expanded() if isinstance(v, ITLSamples) else np.asarray(v, dtype=np.float64)


def completed_mask(snapshot: dict) -> np.ndarray:
    """Which of a collector snapshot's requests completed (bool, aligned with "ids")."""
    return np.asarray(snapshot["outcome"]) == 1 + list(snapshot["outcomes"]).index("completed")


def per_request(snapshot: dict, requests: Sequence[Any]) -> dict[str, np.ndarray]:
    """Per-request columns aligned with `snapshot["ids"]`: prompt/output tokens,
    outcome, every lifecycle time, ttft_s, tpot_s, e2e_s, meets-SLO flags need SLOs
    and are added by `compute`."""
    ids = snapshot["ids"]
    prompt, requested = _lengths(ids, requests)
    # a request truncated to the context limit produced fewer tokens than it asked for
    output = requested.copy()
    served = snapshot.get("output_tokens_served") or {}
    if served:
        at = {int(i): k for k, i in enumerate(ids.tolist())}
        for rid, n in served.items():
            output[at[int(rid)]] = n
    times = snapshot["times"]
    col = {n: i for i, n in enumerate(snapshot["events"])}
    outcome = np.array(snapshot["outcomes"] + ["open"], dtype=object)[snapshot["outcome"] - 1]
    completed = completed_mask(snapshot)
    arrival = times[:, col["arrival"]]
    ttft = np.where(completed, times[:, col["first_token"]] - arrival, np.nan)
    e2e = np.where(completed, times[:, col["completion"]] - arrival, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(completed & (output >= 2), (e2e - ttft) / (output - 1), np.nan)
    # after a preemption: the KV tokens recomputed (prompt + tokens generated before it)
    # and the last re-admission (t_decode_admit stays the first admission)
    recomputed = np.zeros(len(ids), np.int64)
    readmit = np.full(len(ids), np.nan)
    extra = (snapshot.get("recomputed_tokens") or {}, snapshot.get("readmitted_s") or {})
    if extra[0] or extra[1]:
        at = {int(i): k for k, i in enumerate(ids.tolist())}
        for rid, n in extra[0].items():
            recomputed[at[int(rid)]] = n
        for rid, t in extra[1].items():
            readmit[at[int(rid)]] = t
    cols = {"id": ids, "prompt_tokens": prompt, "output_tokens": output,
            "requested_output_tokens": requested, "outcome": outcome,
            "reason": _reasons(ids, snapshot["reason"]),
            "preemptions": snapshot["preemptions"], "recomputed_tokens": recomputed,
            "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}
    for name, i in col.items():
        cols[f"t_{name}"] = times[:, i]
    cols["t_decode_readmit"] = readmit
    # when each request ended in the rack, whatever its outcome (s)
    cols["t_end"] = np.asarray(snapshot.get("end_s", np.full(len(ids), np.nan)), dtype=np.float64)
    return cols


def _reasons(ids: np.ndarray, reason: dict) -> np.ndarray:
    """Object array of each request's reason ("" for none), aligned with `ids`, from
    the snapshot's {id: reason} (which names only the requests that have one)."""
    out = np.full(len(ids), "", dtype=object)
    if reason:
        order = np.argsort(ids, kind="stable")
        have = np.fromiter(reason.keys(), dtype=np.int64, count=len(reason))
        k = np.searchsorted(ids[order], have)
        k[k >= len(ids)] = 0
        known = ids[order][k] == have if len(ids) else np.zeros(len(have), bool)
        out[order[k[known]]] = np.array(list(reason.values()), dtype=object)[known]
    return out


def _lengths(ids: np.ndarray, requests: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, output tokens) of the requests with `ids`, in that order (int64
    arrays; no dict of a million requests). Raises KeyError for an id with no request."""
    table = isinstance(getattr(requests, "ids", None), np.ndarray)      # a workloads.RequestTable
    rid = requests.ids if table else np.fromiter((r.id for r in requests), dtype=np.int64, count=len(requests))
    order = np.argsort(rid, kind="stable")
    k = np.searchsorted(rid[order], ids)
    k[k >= len(rid)] = 0
    if len(ids) and (not len(rid) or not np.array_equal(rid[order][k], ids)):
        raise KeyError(f"no request with id(s) {np.asarray(ids)[rid[order][k] != ids][:3].tolist() if len(rid) else ids[:3].tolist()}")
    pick = order[k]
    if table:
        return requests.prompts[pick], requests.outputs[pick]
    prompt = np.fromiter((r.prompt_tokens for r in requests), dtype=np.int64, count=len(requests))
    output = np.fromiter((r.output_tokens for r in requests), dtype=np.int64, count=len(requests))
    return prompt[pick], output[pick]


def last_event_s(times: np.ndarray) -> float | None:
    """The latest request event in a collector's (requests x events) time table (emulated
    s; NaN = not happened), or None if no request has an event: where a run ends."""
    if not np.size(times) or np.all(np.isnan(times)):
        return None
    return float(np.nanmax(times))


def steady_window(arrivals: np.ndarray) -> tuple[float, float] | None:
    """(start, end) in emulated s of the steady-state window of these arrival times
    (module docstring), or None when it would hold fewer than `STEADY_MIN_REQUESTS`
    arrivals or has no length."""
    a = np.asarray(arrivals, dtype=np.float64)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return None
    lo, hi = float(a.min()), float(a.max())
    start, end = lo + STEADY_TRIM * (hi - lo), hi - STEADY_TRIM * (hi - lo)
    inside = int(np.count_nonzero((a >= start) & (a < end)))
    if end <= start or inside < STEADY_MIN_REQUESTS:
        return None
    return start, end


def goodput_section(arrivals: np.ndarray, meets: np.ndarray, duration_s: float,
                    slo_ttft_s: float, slo_tpot_s: float, ends: np.ndarray | None = None) -> dict:
    """results.json's `goodput`: steady-state goodput and offered rate (module docstring),
    SLO attainment over every request that arrived, and the window used. A request with
    no arrival time (NaN: an interrupted or aborted run stopped before its arrival) was
    never offered and counts nowhere here.

    ends: when each request ended in the rack (s, NaN: open), aligned with `arrivals`;
    with it, a window shorter than the median time its requests spent in the rack is no
    steady state (a burst: they were all in flight at once) and the whole run is used
    (`basis_reason` says which rule applied)."""
    arrived = ~np.isnan(arrivals)
    if not arrived.all():
        arrivals, meets = arrivals[arrived], meets[arrived]
        ends = None if ends is None else ends[arrived]
    n = int(arrivals.shape[0])
    win = steady_window(arrivals)
    why = None if win is not None else "too_few_arrivals"
    if win is not None:
        # half-open [start, end): n arrivals at a steady rate r span n / r seconds, so a
        # closed interval would count one arrival too many (17 in a 16 s window at 1/s)
        inside = (arrivals >= win[0]) & (arrivals < win[1])
        length, basis = win[1] - win[0], "steady_state"
        if ends is not None:
            ended = inside & ~np.isnan(ends)
            if ended.any() and float(np.median(ends[ended] - arrivals[ended])) > length:
                win, why = None, "burst"
    if win is None:
        inside = np.ones(n, dtype=bool)
        length, basis = duration_s, "whole_run"
    rate = (lambda x: x / length if length > 0 else 0.0)
    good_in = int(np.count_nonzero(meets & inside))
    n_in = int(np.count_nonzero(inside))
    return {
        "requests_per_s": rate(good_in),
        "offered_requests_per_s": rate(n_in),
        "slo_attainment": float(meets.sum() / n) if n else 0.0,
        "requests_meeting_slo": int(meets.sum()),
        "basis": basis,
        "basis_reason": why,
        "window_s": list(win) if win is not None else None,
        "window_requests": n_in,
        "window_slo_attainment": good_in / n_in if n_in else 0.0,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
    }


def compute(snapshot: dict, requests: Sequence[Any], slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """The request, latency, throughput and goodput sections of results.json."""
    cols = per_request(snapshot, requests)
    outcome = cols["outcome"]
    completed = outcome == "completed"
    names = [*snapshot["outcomes"], "open"]
    codes = np.bincount(np.asarray(snapshot["outcome"], dtype=np.int64), minlength=len(names) + 1)
    counts = Counter({names[c - 1]: int(k) for c, k in enumerate(codes.tolist()) if c and k})
    counts["open"] += int(codes[0])
    reasons: dict[str, Counter] = {"rejected": Counter(), "failed": Counter()}
    ended_badly = np.flatnonzero((outcome == "rejected") | (outcome == "failed"))
    for o, r in zip(outcome[ended_badly].tolist(), cols["reason"][ended_badly].tolist()):
        reasons[o][r] += 1
    times = snapshot["times"]
    n = len(cols["id"])
    arrivals = cols["t_arrival"]
    start = float(np.nanmin(arrivals)) if n and not np.all(np.isnan(arrivals)) else 0.0
    end = last_event_s(times)
    end = start if end is None else end
    duration = max(end - start, 0.0)
    ttft, tpot = cols["ttft_s"], cols["tpot_s"]
    meets = completed & (ttft <= slo_ttft_s) & (np.isnan(tpot) | (tpot <= slo_tpot_s))
    cols["meets_slo"] = meets
    out_tokens = int(cols["output_tokens"][completed].sum())
    rate = (lambda x: x / duration if duration > 0 else 0.0)
    return {
        "requests": {
            "submitted": n,
            "completed": int(counts.get("completed", 0)),
            "rejected": int(counts.get("rejected", 0)),
            "failed": int(counts.get("failed", 0)),
            "open": int(counts.get("open", 0)),
            # not ended when the run stopped (interrupted or aborted runs): completed +
            # rejected + failed + unfinished = submitted; "open" is the same count
            "unfinished": int(counts.get("open", 0)),
            # of the unfinished, those whose arrival time the run never reached (not
            # offered: left out of the goodput section's rates and SLO attainment)
            "not_arrived": int(np.count_nonzero(np.isnan(arrivals))),
            "rejected_by_reason": dict(reasons["rejected"]),
            "failed_by_reason": dict(reasons["failed"]),
            "preemptions": int(np.sum(cols["preemptions"])),
            # KV tokens decode engines recomputed after preemptions (per request in requests.csv)
            "recomputed_tokens": int(np.sum(cols["recomputed_tokens"])),
            # output capped at the context limit (context_overflow = "truncate")
            "truncated": int(np.sum(cols["output_tokens"] != cols["requested_output_tokens"])),
        },
        "latency": {
            "ttft_s": summarize(ttft),
            "tpot_s": summarize(tpot),
            "itl_s": summarize(itl_samples(snapshot)),
            "e2e_s": summarize(cols["e2e_s"]),
        },
        "throughput": {
            "duration_s": duration,
            "requests_per_s": rate(int(completed.sum())),
            "output_tokens_per_s": rate(out_tokens),
            "input_tokens_per_s": rate(int(cols["prompt_tokens"][completed].sum())),
            "output_tokens": out_tokens,
        },
        "goodput": goodput_section(arrivals, meets, duration, slo_ttft_s, slo_tpot_s, ends=cols["t_end"]),
    }, cols
