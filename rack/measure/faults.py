"""What injected faults cost: results.json's `faults` block, and the work a crashed
instance did before its crash added back to its stats (docs/robustness.md)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rack.wiring.faults import CRASH_KINDS, FAULT_REASONS

#: Work counters of an engine's stats (`devices.engines.common.Utilisation`) that a
#: crash resets and `with_work_before_crashes` restores.
WORK_KEYS = ("busy_s", "flops", "bytes", "iterations", "device_busy_s")


def with_work_before_crashes(stats: dict, snapshot: dict) -> dict:
    """`stats` (component -> stats dict) with each crashed instance's work before its
    crashes added back: busy_s, flops, bytes and iterations summed over its
    incarnations, and the utilisation ratios (busy_fraction, MFU, MBU) recomputed from
    the sums over the instance's elapsed time. Without this a crash would make the run
    look cheaper: the restarted instance's counters start at 0, so energy (integrated
    from busy time) and utilisation would miss the work done before the crash.
    Components without crashes are returned as they are (the same dicts)."""
    from devices.engines.common import Utilisation

    before: dict[str, list[dict]] = {}
    for rec in snapshot.get("faults", []):
        if rec.get("kind") in CRASH_KINDS and rec.get("applied") and rec.get("work_before_crash"):
            before.setdefault(rec["instance"], []).append(rec["work_before_crash"])
    out = dict(stats)
    for name, works in before.items():
        st = stats.get(name)
        if st is None:
            continue
        u = Utilisation()
        for w in [st, *works]:
            u.add(w.get("busy_s", 0.0), w.get("flops", 0.0), w.get("bytes", 0.0), int(w.get("iterations", 0)),
                  w.get("device_busy_s", w.get("busy_s", 0.0)))
        st = dict(st)
        st.update(u.as_dict(float(st.get("peak_flops", 0.0)), float(st.get("memory_bandwidth", 0.0)),
                            float(st.get("elapsed_s", 0.0))))
        st["incarnations_counted"] = 1 + len(works)
        out[name] = st
    return out


def faults_section(snapshot: dict, stats: dict, columns: dict) -> dict:
    """results.json's `faults` (docs/robustness.md, section 5).

    Counts of requests are of distinct requests: a fault's record counts each request it
    actually affected once, and a request re-dispatched by two faults counts once in
    each record and once in the totals. A crash affects the requests the instance lost
    with it: those the router re-dispatched after it (`snapshot["recoveries"]`, each
    recovery of an instance attributed to its latest crash at or before the recovery:
    also the later recoveries a crash causes, e.g. of a submission that found the
    instance down). A frame_corrupt that found no payload to corrupt says
    "no target at that time" (`outcome`) and is neither recovered nor a failure.

    Keys: "errors" (faults that could not be applied or recovered from: a bug, with
    its exception), "injected", "actor_deaths" (real deaths of Ray actors, handled as
    crashes: records with "cause" "actor_died"), "recovered" (both kinds),
    "no_target", "requests_failed" (requests
    a fault made fail: re-dispatched ones that did not complete, plus failures with a
    fault-only reason, FAULT_REASONS), "requests_redispatched", "requests_recovered"
    (re-dispatched and completed), "kv_resent_after_restart", "payloads_resent" (after
    a checksum failure), "frames_corrupted", "checksum_failures", "transfers_lost"
    (receiver restarted mid-transfer), "list": per-fault records."""
    records = [dict(r) for r in snapshot.get("faults", [])]
    ic = stats.get("interconnect") or {}
    corr = {c["tag"]: c for c in ic.get("corruption", [])}
    ids = np.asarray(columns.get("id", np.zeros(0, np.int64)), dtype=np.int64)
    outcome = np.asarray(columns.get("outcome", np.zeros(len(ids), object)))
    reason = np.asarray(columns.get("reason", np.zeros(len(ids), object)))
    by_fault = _redispatched_by_fault(records, snapshot.get("recoveries", []))
    redispatched = {int(x) for rec in snapshot.get("recoveries", []) for x in rec["ids"]}
    # only the requests faults touched are looked up (no dict of every request of a long run)
    touched = np.isin(ids, np.fromiter(redispatched, np.int64, len(redispatched)))
    completed = set(ids[touched & (outcome == "completed")].tolist())
    failed_rows = outcome == "failed"
    fault_failed = {i for i, why in zip(ids[failed_rows].tolist(), reason[failed_rows].tolist())
                    if why in FAULT_REASONS}
    for r in records:
        if r["kind"] == "frame_corrupt":
            c = corr.get(r["index"], {"corrupted": 0, "recovered": 0})
            r["frames_corrupted"] = int(c["corrupted"])
            r["payloads_recovered"] = int(c["recovered"])
            if r["applied"] and not c["corrupted"]:
                r["outcome"] = "no target at that time"
                r["recovered"] = None
            else:
                r["recovered"] = bool(r["applied"] and c["recovered"] == c["corrupted"])
        if r["kind"] in CRASH_KINDS:
            hit = by_fault.get(r["index"], set())
            ok = hit & completed
            r["requests_redispatched"] = len(hit)
            r["requests_recovered"] = len(ok)
            r["requests_failed"] = len(hit) - len(ok)
    failed = (redispatched - completed) | fault_failed
    pre = [s for s in stats.values() if s.get("role") == "prefill"]
    return {
        "errors": [f"fault {r['index']} ({r['kind']}): {r['error']}" for r in records if r.get("error")],
        "injected": sum(1 for r in records if r["applied"] and r.get("cause") != "actor_died"),
        # real deaths of actors (Ray), recovered by restarting them (Scenario.max_restarts)
        "actor_deaths": sum(1 for r in records if r.get("cause") == "actor_died"),
        "recovered": sum(1 for r in records if r["recovered"]),
        "no_target": sum(1 for r in records if r.get("outcome") == "no target at that time"),
        "requests_failed": len(failed),
        "requests_redispatched": len(redispatched),
        "requests_recovered": len(redispatched & completed),
        "kv_resent_after_restart": int(sum(s.get("kv_resent_after_restart", 0) for s in pre)),
        "payloads_resent": int(sum(s.get("resends", 0) for s in pre)),
        "frames_corrupted": int(ic.get("frames_corrupted", 0)),
        "checksum_failures": int(ic.get("checksum_failures", 0)),
        "transfers_lost": int(ic.get("lost_transfers", 0)),
        "list": records,
    }


def _redispatched_by_fault(records: Sequence[dict], recoveries: Sequence[dict]) -> dict[int, set[int]]:
    """{fault index: ids re-dispatched because of it}: each recovery of an instance
    belongs to the latest applied crash of that instance at or before its time."""
    crashes: dict[str, list[tuple[float, int]]] = {}
    for r in records:
        if r["kind"] in CRASH_KINDS and r.get("applied"):
            crashes.setdefault(r["instance"], []).append((float(r["applied_at_s"]), int(r["index"])))
    out: dict[int, set[int]] = {}
    for rec in recoveries:
        before = [c for c in crashes.get(rec["instance"], ()) if c[0] <= rec["t"]]
        if before:
            out.setdefault(max(before)[1], set()).update(int(x) for x in rec["ids"])
    return out


__all__ = ["WORK_KEYS", "faults_section", "with_work_before_crashes"]
