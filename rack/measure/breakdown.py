"""Where the time goes: each request's end-to-end time split into stages along the
token's path, fixed stages outside the rack, and a Chrome/Perfetto trace of timelines.

Stages, from the collector's lifecycle times (emulated seconds; a stage whose events
did not happen, e.g. the KV stages of a colocated request, lasts 0):

    <fixed stages "before">   gateway, auth, ... (configured, constant)
    admission                 arrival -> prefill_queued (router: policy, admission)
    queueing                  prefill_queued -> prefill_start (waiting for a prefill slot)
    prefix_cache_lookup       0 in the emulator (a hash lookup at admission); configure a
                              fixed stage to charge it
    prefill                   prefill_start -> prefill_end (chunked prefill compute,
                              including chunks of other prompts interleaved with it)
    kv_reserve_wait           prefill_end -> kv_reserved (decode memory reservation)
    kv_transfer_wait          kv_reserved -> transfer_start
    kv_transfer               transfer_start -> transfer_end (link, shared max-min fairly)
    decode_admission_wait     transfer_end (or prefill_end) -> decode_admit
    first_decode_step         decode_admit -> first_token: the decode engine's first step,
                              when the client's first token comes from it (a split
                              deployment with first_token = "decode"); 0 when the first
                              token came earlier (from prefill, or colocated)
    decode                    first_token (or decode_admit) -> completion
    <fixed stages "after">    serialization, network to the client, ... (constant)

Missing events are filled forward with the latest earlier time, so the rack's stages
of a completed request sum exactly to completion - arrival, and with the fixed stages
to its E2E latency.

Fixed stages are pure delays (no contention), so they are applied exactly after the
run: a delay before the rack shifts every event but the arrival by the same amount
(inter-arrival times, hence the rack's behaviour, are unchanged); a delay after the
rack shifts the first token and the completion (every token equally: ITL and TPOT are
unchanged). TTFT and E2E grow by the sum of all fixed stages.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from rack.measure.metrics import completed_mask
from rack.wiring.settings import FixedStage

#: Rack stages in path order: (name, start event, end event).
RACK_STAGES: tuple[tuple[str, str, str], ...] = (
    ("admission", "arrival", "prefill_queued"),
    ("queueing", "prefill_queued", "prefill_start"),
    ("prefix_cache_lookup", "prefill_start", "prefill_start"),
    ("prefill", "prefill_start", "prefill_end"),
    ("kv_reserve_wait", "prefill_end", "kv_reserved"),
    ("kv_transfer_wait", "kv_reserved", "transfer_start"),
    ("kv_transfer", "transfer_start", "transfer_end"),
    ("decode_admission_wait", "transfer_end", "decode_admit"),
    ("first_decode_step", "decode_admit", "first_token"),
    ("decode", "first_token", "completion"),
)
# Path order; a first token earlier than decode_admit (from prefill) is clamped forward
# to it by the fill below, so first_decode_step is 0 and each part is counted once.
_ORDER = ("arrival", "prefill_queued", "prefill_start", "prefill_end", "kv_reserved",
          "transfer_start", "transfer_end", "decode_admit", "first_token", "completion")


def apply_fixed_stages(snapshot: dict, stages: Sequence[FixedStage]) -> dict:
    """A copy of the collector `snapshot` with the fixed stages' delays applied to its
    lifecycle times (see the module docstring); the snapshot itself when there are none."""
    if not stages:
        return snapshot
    before = sum(s.latency_ms for s in stages if s.where == "before") / 1e3
    after = sum(s.latency_ms for s in stages if s.where == "after") / 1e3
    times = np.array(snapshot["times"], dtype=np.float64, copy=True)
    col = {n: i for i, n in enumerate(snapshot["events"])}
    others = [i for n, i in col.items() if n != "arrival"]
    times[:, others] += before
    for name in ("first_token", "completion"):
        times[:, col[name]] += after
    out = dict(snapshot)
    out["times"] = times
    if snapshot.get("end_s") is not None:
        # a request's end moves with the rack's events, and a completed one ends for
        # the client at its (delayed) completion
        end = np.asarray(snapshot["end_s"], dtype=np.float64) + before
        out["end_s"] = np.where(completed_mask(snapshot), end + after, end)
    return out


def stage_durations(columns: Mapping[str, np.ndarray], stages: Sequence[FixedStage] = ()) -> dict[str, np.ndarray]:
    """Per-request stage durations (s) of completed requests, in path order.

    columns: the per-request table of a run (`RunOutput.columns`: outcome, t_<event>),
        whose times already include the fixed stages (`apply_fixed_stages`).
    Returns {stage: array of shape (n_completed,)}; fixed "before" stages first, "after"
    stages last; the rows sum to each request's E2E latency.
    """
    done = np.asarray(columns["outcome"]) == "completed"
    t = {e: np.asarray(columns[f"t_{e}"], dtype=np.float64)[done] for e in _ORDER}
    n = int(done.sum())
    before = [s for s in stages if s.where == "before"]
    after = [s for s in stages if s.where == "after"]
    pre = sum(s.latency_ms for s in before) / 1e3
    post = sum(s.latency_ms for s in after) / 1e3
    # The rack's own timeline starts after the "before" stages and ends before the
    # "after" ones (which moved first_token and completion).
    filled: dict[str, np.ndarray] = {}
    last = t["arrival"] + pre
    for e in _ORDER[1:]:
        v = t[e].copy()
        if e in ("first_token", "completion"):
            v = v - post
        v = np.where(np.isnan(v), last, np.maximum(v, last))
        filled[e] = v
        last = v
    filled["arrival"] = t["arrival"] + pre
    out: dict[str, np.ndarray] = {}
    for s in before:
        out[s.name] = np.full(n, s.latency_ms / 1e3)
    for name, a, b in RACK_STAGES:
        out[name] = filled[b] - filled[a]
    for s in after:
        out[s.name] = np.full(n, s.latency_ms / 1e3)
    return out


def stage_breakdown(columns: Mapping[str, np.ndarray], stages: Sequence[FixedStage] = ()) -> dict:
    """Mean and p99 (linear interpolation) of each stage over completed requests.

    Returns {"stages": [{"stage", "mean_s", "p99_s", "share" (mean / mean E2E)}], "e2e_mean_s",
    "n"}; an empty run gives zeros.
    """
    d = stage_durations(columns, stages)
    n = len(next(iter(d.values()))) if d else 0
    total = sum(float(v.mean()) for v in d.values()) if n else 0.0
    rows = []
    for name, v in d.items():
        mean = float(v.mean()) if n else 0.0
        rows.append({"stage": name, "mean_s": mean, "p99_s": float(np.percentile(v, 99)) if n else 0.0,
                     "share": mean / total if total > 0 else 0.0})
    return {"stages": rows, "e2e_mean_s": total, "n": n}


def stage_order(breakdowns: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The stages of several `stage_breakdown` outputs (label -> breakdown), each once, in
    the order they first appear (a report's rows, a plot's stacking order)."""
    stages: list[str] = []
    for b in breakdowns.values():
        for row in b["stages"]:
            if row["stage"] not in stages:
                stages.append(row["stage"])
    return stages


def chrome_trace(columns: Mapping[str, np.ndarray], *, sample: int = 200, seed: int = 0,
                 label: str = "rack", stages: Sequence[FixedStage] = ()) -> dict:
    """A Chrome/Perfetto trace (JSON object format) of `sample` completed requests.

    One track (tid) per request, one complete event ("ph": "X", microseconds) per
    non-empty stage; open it at https://ui.perfetto.dev or chrome://tracing.
    The sample is drawn without replacement with numpy's default_rng(seed).
    """
    done = np.flatnonzero(np.asarray(columns["outcome"]) == "completed")
    d = stage_durations(columns, stages)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(done), size=min(sample, len(done)), replace=False)) if len(done) else []
    arrival = np.asarray(columns["t_arrival"], dtype=np.float64)[done]
    ids = np.asarray(columns["id"])[done]
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": label}}]
    for k in pick:
        t = float(arrival[k])
        rid = int(ids[k])
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": rid,
                       "args": {"name": f"request {rid}"}})
        for name, v in d.items():
            dur = float(v[k])
            if dur > 0:
                events.append({"name": name, "cat": "stage", "ph": "X", "pid": 1, "tid": rid,
                               "ts": t * 1e6, "dur": dur * 1e6})
            t += dur
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def engine_tracks(stats: Mapping[str, dict], label: str, first_pid: int, *,
                  max_points: int = 5000) -> tuple[list[dict], int]:
    """Chrome/Perfetto counter tracks of one run's engines and links: one process per
    instance ("<label>: <instance>") with counters "waiting", "running", "KV occupancy
    (%)" and "prefix-cache hits (blocks)" (cumulative), one per KV link with
    "utilisation (%)" (`rack.measure.timeseries`). Pids from `first_pid` on. A series
    longer than `max_points` is drawn as its time-weighted means over that many windows.
    Returns (trace events, number of processes used)."""
    from rack.measure.timeseries import counter_points, instance_series, link_series

    inst, links = instance_series(stats), link_series(stats)
    end = max([float(d["t_s"][-1]) for d in (*inst.values(), *links.values()) if d["t_s"].size] or [0.0])
    events: list[dict] = []
    tracks = [(name, [("waiting", d["queue_depth"], 1.0), ("running", d["running"], 1.0),
                      ("KV occupancy (%)", d["kv_occupancy"], 100.0),
                      *([("prefix-cache hits (blocks)", d["prefix_hit_blocks"], 1.0)]
                        if d["prefix_lookup_blocks"].any() else [])], d["t_s"])
              for name, d in inst.items()]
    tracks += [(name, [("utilisation (%)", d["utilisation"], 100.0)], d["t_s"]) for name, d in links.items()]
    for pid, (name, counters, t) in enumerate(tracks, start=first_pid):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{label}: {name}"}})
        for cname, v, scale in counters:
            ts, vs = counter_points(t, v, end, max_points)
            events += [{"name": cname, "ph": "C", "pid": pid, "ts": x * 1e6, "args": {"value": y * scale}}
                       for x, y in zip(ts.tolist(), vs.tolist())]
    return events, len(tracks)


def write_chrome_trace(path: Any, traces: Mapping[str, Mapping[str, np.ndarray]], *, sample: int = 200,
                       stages: Mapping[str, Sequence[FixedStage]] | None = None,
                       engines: Mapping[str, Mapping[str, dict]] | None = None) -> None:
    """Write one trace file with a process per scenario (`traces`: label -> columns)
    and, with `engines` (label -> the run's component stats), the engine and link
    counter tracks of each (`engine_tracks`)."""
    events: list[dict] = []
    for pid, (label, cols) in enumerate(traces.items(), start=1):
        tr = chrome_trace(cols, sample=sample, label=label, stages=(stages or {}).get(label, ()))
        for ev in tr["traceEvents"]:
            ev["pid"] = pid
            events.append(ev)
    pid = len(traces) + 1
    for label, stats in (engines or {}).items():
        tracks, n = engine_tracks(stats, label, pid)
        events += tracks
        pid += n
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


__all__ = ["RACK_STAGES", "apply_fixed_stages", "chrome_trace", "engine_tracks",
           "stage_breakdown", "stage_durations", "write_chrome_trace"]
