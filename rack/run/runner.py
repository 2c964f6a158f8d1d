"""Run a scenario on a request list with either runtime and assemble `results.json`.

This is the public Python API of the main job:

    from rack.run.runner import run_scenario
    from rack.wiring.load import load_scenario
    from workloads import load_requests
    out = run_scenario(load_scenario(), load_requests("mooncake-excerpt"), runtime="virtual")
    print(out.results["latency"]["ttft_s"]["p50"])
"""

from __future__ import annotations

import math
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rack import __version__
from rack.measure import metrics
from rack.measure.breakdown import apply_fixed_stages, stage_breakdown
from rack.measure.energy import cost_section, energy_section
from rack.measure.faults import faults_section, with_work_before_crashes
from rack.runtime.interrupt import RunStopped, StopRequest, deferred
from rack.runtime.quiescence import hold_violations
from rack.serving.records import DiskRecordSet, assemble as assemble_records
from rack.wiring.scenario import Scenario
from rack.wiring.topology import ComponentSpec, build_topology
from workloads.clock import check_time_span
from workloads.textfile import content_sha256


#: Payload accounting's sampled verification (`run_scenario(kv_payload="account")`):
#: the first KV payload of each prefill instance and one in this many after it are
#: built and checked as real frames. 64 keeps the build cost at ~1/64 of shipping
#: every payload while a replay of ~10^4 transfers still checks ~150 real ones.
KV_VERIFY_EVERY = 64

KV_PAYLOADS = ("bytes", "account")

RUN_STATUSES = ("complete", "aborted", "interrupted")
"""results.json `status`: "complete" (every request ended), "aborted" (a component
raised, or the rack stalled: what was measured until then, `error` says why) or
"interrupted" (stopped by SIGINT/SIGTERM or a `StopRequest`: what finished until then,
`interrupted` says when; the requests that had not ended count as `unfinished`)."""


@dataclass
class RunOutput:
    """What a run produced: `results` (the results.json dict), `columns` (per-request
    table, numpy columns), `stats` (raw component stats) and the topology."""

    results: dict
    columns: dict[str, np.ndarray]
    stats: dict[str, dict]
    specs: list[ComponentSpec] = field(default_factory=list)
    snapshot: dict = field(default_factory=dict)


class RunInterrupted(RuntimeError):
    """The run was stopped on request (SIGINT, SIGTERM: `rack.runtime.interrupt`).

    `output`: a RunOutput of what finished until then, `results["status"]` ==
    "interrupted", `results["interrupted"]` = {"signal", "t_s"} and the requests that
    had not ended counted under `requests.unfinished`. `str(err)` is one line.
    """

    def __init__(self, cause: BaseException, output: RunOutput) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.output = output


class RunAborted(RuntimeError):
    """The run stopped before every request ended: a component raised
    (`rack.runtime.errors.ComponentError`) or the rack stalled (`VirtualTimeDeadlock`).

    `output`: a RunOutput of what was measured until then, `results["status"]` ==
    "aborted" and `results["error"]` naming the cause (open requests counted under
    `requests.open`). `cause`: the runtime's exception. `str(err)` is its one line.
    """

    def __init__(self, cause: BaseException, output: RunOutput) -> None:
        super().__init__(" ".join(str(cause).split()))
        self.cause = cause
        self.output = output
        self.__cause__ = cause


def _pool_sections(scenario: Scenario, specs: Sequence[ComponentSpec], stats: dict) -> tuple[dict, dict]:
    memory, util = {}, {}
    for pool in scenario.pools:
        names = [s.name for s in specs if s.pool == pool.name]
        st = [stats[n] for n in names if n in stats]
        if not st:
            continue
        memory[pool.name] = {
            "capacity_bytes": int(sum(s["memory"]["capacity_bytes"] for s in st)),
            "peak_bytes": int(sum(s["memory"]["peak_bytes"] for s in st)),
            "weight_bytes": int(sum(s["memory"]["held_bytes"].get("weights", 0) for s in st)),
            "instances": len(st),
            "devices": len(st) * pool.devices_per_instance,
            "peak_fraction": float(max(s["memory"]["peak_bytes"] / s["memory"]["capacity_bytes"] for s in st)),
        }
        dev = next(s.kwargs["cost"].device for s in specs if s.pool == pool.name)
        util[pool.name] = {
            "compute": float(np.mean([s["mfu"] for s in st])),
            "memory_bandwidth": float(np.mean([s["mbu"] for s in st])),
            # per device: a pipeline stage idles while the other stages work
            "busy_fraction": float(np.mean([s.get("device_busy_fraction", s["busy_fraction"]) for s in st])),
            "running_fraction": float(np.mean([s["busy_fraction"] for s in st])),   # an iteration in flight
            "device": dev.key, "stack": dev.stack_label,
        }
    return memory, util


def _kv_section(stats: dict) -> dict:
    ic = stats.get("interconnect")
    if ic is None:
        return {"transfers": 0, "bytes_logical": 0, "bytes_shipped": 0, "checksum_failures": 0,
                "time_s": metrics.summarize(np.zeros(0)), "links": {}}
    bad_frames = sum(s.get("bad_frames", 0) for s in stats.values() if s.get("role") == "decode")
    return {
        "transfers": ic["transfers"],
        "bytes_logical": int(ic["bytes_logical"]),
        "bytes_shipped": int(ic["bytes_shipped"]),
        "checksum_failures": int(ic["checksum_failures"]),
        "bad_frames_at_receivers": int(bad_frames),
        "failed_transfers": int(ic["failed_transfers"]),
        "payload_scale": ic["payload_scale"],
        # payloads described, not built (`run_scenario(kv_payload="account")`; the
        # mode is in provenance.load)
        "described_transfers": int(ic.get("described_transfers", 0)),
        "time_s": metrics.summarize(np.asarray(ic["transfer_time_s"])),
        "links": {name: {"utilization": l["utilisation"], "bytes_logical": int(l["bytes_logical"]),
                         "transfers": l["transfers"], "peak_concurrent": l["peak_flows"],
                         "bandwidth_Bps": l["bandwidth_Bps"]}
                  for name, l in ic["links"].items()},
    }


def _prefix_cache_section(stats: dict, requests: Sequence[Any]) -> dict | None:
    """The prefix caches' counters summed over instances (`devices.memory.PrefixCacheStats`)
    with the project's one hit ratio, `hit_ratio` = prompt tokens served from the cache /
    the prompts' cacheable tokens (full blocks, less the last position); beside it the
    same ratio of an ideal cache over the run's requests (`workloads.ideal_prefix_hits`:
    `ideal_hit_ratio`, an unbounded cache shared by every instance, as `rack trace stats`
    computes it; `capacity_hit_ratio`, the instances' KV capacity pooled into one LRU
    cache, what routing alone could reach with this rack's memory). Block-level figures
    are named apart (`block_hit_ratio`, `ideal_block_hit_ratio`). `miss_tokens` are the
    prompt tokens computed by the instances that looked up their cache.
    `recomputed_blocks`/`recomputed_tokens`: the ideal cache's block hits the rack missed,
    i.e. full prompt blocks an earlier-arriving request also held that were computed again
    (evicted before their reuse, cached on another instance, or computed by two requests
    at once). None when no instance has a prefix cache or no request carries block hashes."""
    caches = [s["prefix_cache"] for s in stats.values() if s.get("prefix_cache")]
    if not caches or not (requests.any_hashes if hasattr(requests, "any_hashes")
                          else any(r.block_hashes for r in requests)):
        return None
    from workloads import PrefixHits, ideal_prefix_hits

    tot = {k: int(sum(c.get(k, 0) for c in caches)) for k in
           ("lookups", "hit_blocks", "miss_blocks", "hit_tokens", "miss_tokens", "cacheable_tokens",
            "evicted_blocks")}
    looked = tot["hit_blocks"] + tot["miss_blocks"]
    bs = next(r.block_size for r in requests if r.block_hashes)
    capacity = sum(int(s["kv_capacity_bytes"]) // (bs * int(s["prefix_cache_bytes_per_token"]))
                   for s in stats.values() if s.get("prefix_cache") and s.get("prefix_cache_bytes_per_token"))
    try:
        ideal, pooled = ideal_prefix_hits(requests), ideal_prefix_hits(requests, capacity)
    except TypeError:       # hashes that are not hashes (requests built in code): no ideal
        ideal = pooled = PrefixHits()
    # blocks an earlier-arriving request also held that were computed again: evicted
    # before their reuse, cached on another instance, or computed by both at once
    recomputed = max(0, ideal.hit_blocks - tot["hit_blocks"])
    return {**tot,
            "hit_ratio": tot["hit_tokens"] / tot["cacheable_tokens"] if tot["cacheable_tokens"] else 0.0,
            "block_hit_ratio": tot["hit_blocks"] / looked if looked else 0.0,
            "ideal_hit_ratio": ideal.hit_ratio, "ideal_block_hit_ratio": ideal.block_hit_ratio,
            "capacity_blocks": capacity, "capacity_hit_ratio": pooled.hit_ratio,
            "recomputed_blocks": recomputed, "recomputed_tokens": recomputed * bs}


def _trace_counts(trace_info: dict | None) -> dict:
    """Rows of the source that never became requests: bad rows skipped
    (`--skip-bad-rows`) and requests that failed at the source (BurstGPT rows with 0
    response tokens). They are not submitted, so they are reported beside the counts."""
    reader = (trace_info or {}).get("reader") or {}
    return {"skipped_rows": int(reader.get("skipped_rows", 0) or 0),
            "skipped_by_reason": dict(reader.get("skipped_by_reason", {}) or {}),
            "source_failed": int(reader.get("failed_requests", 0) or 0)}


def _energy_cost_sections(scenario: Scenario, specs: Sequence[ComponentSpec], raw: dict,
                          results: dict, cols: dict) -> dict:
    """`energy`, `cost` and `breakdown` sections (rack.measure.energy, rack.measure.breakdown). Energy is
    integrated from time 0 to the run's end: its last request event (the latest engine
    clock if no request has an event). Not the engines' clocks when the results are
    collected: on Ray those run on while the stats are gathered (~0.2 s of emulated
    time at dilation 20), which would add idle energy the virtual runtime does not."""
    window = metrics.last_event_s(raw["snapshot"]["times"])
    if window is None:
        window = max([float(raw.get("now") or 0.0)] +
                     [float(s.get("elapsed_s", 0.0)) for s in raw["stats"].values()])
    done = cols["outcome"] == "completed"
    out_tok = int(cols["output_tokens"][done].sum())
    in_tok = int(cols["prompt_tokens"][done].sum())
    energy = energy_section(scenario, specs, raw["stats"], window, out_tok, in_tok)
    return {"energy": energy, "cost": cost_section(scenario, specs, energy, out_tok, in_tok),
            "breakdown": stage_breakdown(cols, scenario.fixed_stages)}


def _provenance(scenario: Scenario, trace_info: dict | None, runtime: str, loop_type: str) -> dict:
    try:
        import importlib.metadata as md
        ray_version = md.version("ray")
    except Exception:  # Ray is optional for the virtual runtime
        ray_version = None
    return {
        "package": "rack-emulator", "version": __version__,
        "scenario": scenario.name, "config": scenario.model_dump(mode="json"),
        "trace": trace_info or {}, "seed": scenario.seed,
        "python": sys.version.split()[0], "platform": platform.platform(),
        "numpy": np.__version__, "ray": ray_version,
        "runtime": runtime, "event_loop": loop_type,
    }


def run_scenario(scenario: Scenario, requests: Sequence[Any], *, runtime: str = "virtual",
                 address: str | None = None, trace_info: dict | None = None,
                 progress: bool = False, timeout_s: float | None = None,
                 max_concurrency: int | None = None, think_time_s: float = 0.0,
                 records_dir: str | None = None, stop: StopRequest | None = None,
                 kv_payload: str = "bytes", kv_verify_every: int = KV_VERIFY_EVERY,
                 timeseries: bool = True) -> RunOutput:
    """Replay `requests` (sorted by arrival) through `scenario` and measure it.

    runtime: "virtual" (in-process virtual time, deterministic) or "ray" (one actor per
        component, wall clock dilated by `scenario.dilation`; Ray starts locally unless
        `address` is given).
    timeout_s: Ray runtime only: wall-clock limit for the whole replay.
    max_concurrency: closed loop: at most this many requests in the rack at once, the
        next sent `think_time_s` after one ends (`rack.serving.router.Router.run`); None: open
        loop (every request at its arrival time).
    records_dir: virtual runtime only: stream the per-request records to this folder as
        they end (`rack.serving.records`) instead of holding them: memory stays bounded
        by the requests in flight; the results are the same.
    stop: a `rack.runtime.interrupt.StopRequest` the runtime polls; once requested the
        replay stops and RunInterrupted is raised with what finished.
    kv_payload: "bytes" (every KV payload built, shipped and verified as real msgpack
        frames) or "account" (virtual runtime only: sweeps, comparisons, the study):
        payloads described, their frame counts and sizes exact, no bytes built; the
        first payload of each prefill instance and one in `kv_verify_every` after it
        are built and checked against their description. On the virtual runtime the
        bytes change no figure (the link is charged the logical size), so both give
        the same results; `kv_transfer.payload` says which was used.
    timeseries: record every engine's gauges over time at each of its events (stats'
        "timeseries", "memory_t_s", "batch_t_s": `rack run`'s timeseries.csv and plots,
        `rack compare`'s) and each link's utilisation (the interconnect's links'
        "series"); False: not recorded (their arrays are empty), for runs that
        read none of them (sweeps, capacity searches, the study, `rack bench`'s
        replays): ~10% less work per event, every other figure the same.
    Returns a RunOutput whose `results["status"]` is "complete".
    Raises ValueError for a bad argument, ScenarioError for a bad scenario and
    TimeSpanError for arrivals beyond `workloads.clock.MAX_EMULATED_S` (all before
    anything starts); RunAborted (with the results measured until then, status
    "aborted") when a component raises or the virtual rack stalls; RunInterrupted (with
    the results of what finished, status "interrupted") when `stop` is requested;
    RayRunError for a Ray run that could not start or timed out.
    """
    if runtime not in ("virtual", "ray"):
        raise ValueError(f"runtime: expected 'virtual' or 'ray', got {runtime!r}")
    if records_dir is not None and runtime != "virtual":
        raise ValueError("records_dir: records stream to a folder on the virtual runtime only "
                         "(a Ray run's collector may live on another node)")
    # checked here, before anything starts (a component refusing them would abort the run)
    if max_concurrency is not None and not (isinstance(max_concurrency, int) and max_concurrency >= 1):
        raise ValueError(f"max_concurrency: expected an integer >= 1 (or None: open loop), got {max_concurrency!r}")
    if not (math.isfinite(think_time_s) and think_time_s >= 0):
        raise ValueError(f"think_time_s: expected a finite number of seconds >= 0, got {think_time_s!r}")
    if kv_payload not in KV_PAYLOADS:
        raise ValueError(f"kv_payload: expected one of {', '.join(KV_PAYLOADS)}, got {kv_payload!r}")
    if kv_payload == "account" and runtime != "virtual":
        raise ValueError("kv_payload 'account': the Ray runtime always ships real KV bytes")
    if kv_payload == "account" and not (isinstance(kv_verify_every, int) and kv_verify_every >= 1):
        raise ValueError(f"kv_verify_every: expected an integer >= 1, got {kv_verify_every!r}")
    if runtime == "virtual" and hasattr(requests, "sorted_by_arrival"):
        # a workloads.RequestTable: replayed as columns (no Request object per request)
        requests = requests.sorted_by_arrival()
        ids = requests.ids
    else:
        requests = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        ids = [r.id for r in requests]
    if requests:
        check_time_span(requests[-1].arrival_s)
    specs = build_topology(scenario, ids)
    for spec in specs:
        if spec.kind == "collector" and records_dir is not None:
            spec.kwargs["records_dir"] = str(records_dir)
        if spec.kind == "prefill" and kv_payload == "account":
            spec.kwargs["kv_verify_every"] = int(kv_verify_every)
        if not timeseries and spec.kind in ("prefill", "decode", "both", "interconnect"):
            spec.kwargs["timeseries"] = False
    wall0 = time.perf_counter()
    load = {"max_concurrency": max_concurrency, "think_time_s": think_time_s, "kv_payload": kv_payload,
            "kv_verify_every": int(kv_verify_every) if kv_payload == "account" else None}
    try:
        if runtime == "virtual":
            from rack.runtime.virtual_run import run_topology_virtual
            raw = run_topology_virtual(specs, requests, max_concurrency=max_concurrency,
                                       think_time_s=think_time_s, stop=stop)
        else:
            from rack.wiring.pace import liveness_timeout_s
            from rack.runtime.ray_runtime import run_topology_ray
            raw = run_topology_ray(specs, requests, dilation=scenario.dilation, address=address,
                                   progress=progress, timeout_s=timeout_s,
                                   max_concurrency=max_concurrency, think_time_s=think_time_s,
                                   stop=stop, liveness_timeout_s=liveness_timeout_s(
                                       scenario.dilation, scenario.slo.tpot_ms / 1e3))
    except RunStopped as exc:
        if exc.partial is None:
            raise
        output = assemble(scenario, specs, requests, exc.partial, runtime, time.perf_counter() - wall0,
                           trace_info, load, status={"status": "interrupted", "interrupted": exc.details()})
        raise RunInterrupted(exc, output) from exc
    except Exception as exc:
        partial = getattr(exc, "partial", None)
        if partial is None:
            raise
        details = getattr(exc, "details", None)
        error = details() if details else {"type": type(exc).__name__, "message": " ".join(str(exc).split())}
        error["components_without_stats"] = list(partial.get("stats_missing", []))
        output = assemble(scenario, specs, requests, partial, runtime, time.perf_counter() - wall0,
                           trace_info, load, status={"status": "aborted", "error": error})
        raise RunAborted(exc, output) from exc
    # every request ended: a signal now waits for the results (`StopRequest.deferred`)
    with deferred(stop):
        return assemble(scenario, specs, requests, raw, runtime, time.perf_counter() - wall0, trace_info, load)


def assemble(scenario: Scenario, specs: Sequence[ComponentSpec], requests: Sequence[Any], raw: dict,
             runtime: str, wall: float, trace_info: dict | None, load: dict,
             status: dict | None = None) -> RunOutput:
    """The RunOutput of a run's raw records (`run_topology_*`'s dict, or the `partial`
    records of a run that stopped, with `status` {"status": "aborted", "error": ...});
    also a live session's (`rack.serve.session`)."""
    loop_type = raw.get("loop_type", "unknown")
    dilation = scenario.dilation if runtime == "ray" else None
    if raw["snapshot"].get("records_dir"):       # streamed: read the rows back (not the ITL samples)
        n_events = len(raw["snapshot"]["events"])
        raw["snapshot"] = {**raw["snapshot"], **assemble_records(DiskRecordSet(raw["snapshot"]["records_dir"]),
                                                         raw["snapshot"]["ids"], n_events)}
    # a crashed instance's work before its crash still counts (energy, utilisation)
    raw["stats"] = with_work_before_crashes(raw["stats"], raw["snapshot"])
    snapshot = apply_fixed_stages(raw["snapshot"], scenario.fixed_stages)
    results, cols = metrics.compute(snapshot, requests, scenario.slo.ttft_ms / 1e3,
                                    scenario.slo.tpot_ms / 1e3)
    results = {**(status or {"status": "complete"}), **results}
    results["requests"].update(_trace_counts(trace_info))
    results["prefix_cache"] = _prefix_cache_section(raw["stats"], requests)
    memory, util = _pool_sections(scenario, specs, raw["stats"])
    lateness_all = np.concatenate([np.asarray(v, dtype=np.float64) for v in raw["lateness"].values()]) \
        if raw["lateness"] else np.zeros(0)
    late = metrics.summarize(lateness_all) if lateness_all.size else \
        {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "n": 0}
    end = metrics.last_event_s(snapshot["times"]) or 0.0
    results.update({
        "kv_transfer": _kv_section(raw["stats"]),
        "memory": memory,
        "utilization": util,
        "emulation": {
            "runtime": runtime, "dilation": dilation, "wall_s": wall,
            "emulated_s": raw.get("now"),
            # float64 spacing at the run's last event (s): <= 1 us up to MAX_EMULATED_S
            "time_resolution_s": math.ulp(end),
            "lateness_s": late,
            "lateness_by_actor": {k: metrics.summarize(np.asarray(v)) for k, v in raw["lateness"].items()},
            # work a component held for a request that had ended (released at once so
            # the run could end; rack.runtime.quiescence): each core is a violation
            "violations": list(raw["snapshot"]["violations"]) + hold_violations(raw.get("held_after_end") or {}),
            "held_after_end": raw.get("held_after_end") or {},
            # events for requests whose records had already been written out (ended a
            # chunk earlier; rack.serving.collector): counted, not recorded
            "late_events": raw["snapshot"].get("late_events", {}),
            "records": "disk" if raw["snapshot"].get("records_dir") else "memory",
            # Ray runtime: component -> Ray node id (read inside each actor), and per-actor
            # messages, KV bytes crossing nodes, clock offsets (rack.runtime.ray_runtime).
            "nodes": raw.get("nodes", {}),
            "ray": raw.get("ray"),
        },
        "provenance": {**_provenance(scenario, trace_info, runtime, loop_type), "load": load},
    })
    results.update(_energy_cost_sections(scenario, specs, raw, results, cols))
    # injected faults and what they cost (rack.wiring.faults, docs/robustness.md)
    results["faults"] = faults_section(raw["snapshot"], raw["stats"], cols)
    return RunOutput(results=results, columns=cols, stats=raw["stats"], specs=list(specs),
                     snapshot=raw["snapshot"])


def trace_info(path, reader_summary: dict | None = None, **controls) -> dict:
    """Provenance of a trace file: path, sha256 (of the content, decompressed if gzip:
    the checksum the trace's source publishes), replay controls and reader counters."""
    return {"path": str(path), "sha256": content_sha256(path), "controls": controls,
            "reader": reader_summary or {}}
