"""Fault injection: what can go wrong in a run, when, and what the rack did about it.

A scenario's `faults` list (or `rack run --fault ...`) names faults, each at an
emulated time with a seed:

- `decode_crash` / `prefill_crash`: an engine instance dies and restarts empty. On the
  Ray runtime its actor is killed for real (`ray.kill(actor, no_restart=False)`) and Ray
  restarts it; the restarted actor rebuilds its component from its `ComponentSpec`. On
  the virtual runtime the instance is wrapped in `Restartable`, which stops the old
  object (`halt()`: its loop ends, calls waiting inside it raise `PeerLost` in their
  callers, as calls to a dead actor do on Ray) and constructs a fresh one from the same
  arguments, as Ray re-runs the constructor. Recovery is the components' own code, the
  same on both runtimes: a prefill instance that still holds a request's KV sends it
  again (`PrefillEngine._handoff` on PeerLost); the injector, acting as the health
  monitor that sees the instance come back, calls `Router.recover(instance)`, which
  re-dispatches every open request that no live component holds (re-prefilled on
  another prefill instance; the decode engines first drop the KV reservations of a lost
  prefill instance's requests).
- `link_degrade` (bandwidth x `factor` for `duration_s`) and `link_flap` (link down for
  `duration_s`): `Interconnect.degrade` / `flap`; transfers slow down or stop, and
  resume when the interval ends.
- `frame_corrupt`: one byte of one frame is flipped in `count` payloads
  (`Interconnect.corrupt`); the receiver's checksum catches each, the sender re-sends
  (`PrefillEngine.max_resends`), and the counts are reported.

Every request still ends exactly once (completed, rejected or failed with a reason).
`faults_section` builds results.json's `faults` block. docs/robustness.md has the
protocol and its limits.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import re
from typing import Any, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.core import BROADCAST, Core

FAULT_KINDS = ("decode_crash", "prefill_crash", "link_degrade", "link_flap", "frame_corrupt")
CRASH_KINDS = ("decode_crash", "prefill_crash")
LINK_KINDS = ("link_degrade", "link_flap", "frame_corrupt")
#: Failure reasons only fault handling produces (a request's KV stayed bad after its
#: re-sends; the decode engine kept losing it).
FAULT_REASONS = ("kv_checksum", "decode_unavailable")
_ROLE_OF = {"decode_crash": "decode", "prefill_crash": "prefill"}


class FaultConfig(BaseModel):
    """One injected fault (TOML `[[faults]]`, or `rack run --fault`).

    kind: decode_crash | prefill_crash | link_degrade | link_flap | frame_corrupt.
    at_s: emulated time of the fault (s from the trace start), >= 0.
    target: crashes: an instance (`decode-0`) or a pool (`decode`: the instance is drawn
        from `seed`) of the matching role; link faults: a link name; frame_corrupt: a
        link name or "*" (any link).
    duration_s: link_degrade / link_flap: length of the interval (required, > 0);
        frame_corrupt: window in which payloads are corrupted (default: until `count`).
    factor: link_degrade: bandwidth multiplier in (0, 1) (required).
    count: frame_corrupt: payloads to corrupt (each of a different request), >= 1.
    seed: picks the crashed instance of a pool, the corrupted frame and byte.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    kind: Literal["decode_crash", "prefill_crash", "link_degrade", "link_flap", "frame_corrupt"]
    at_s: float = Field(ge=0, description="emulated time of the fault, s")
    target: str = Field(min_length=1, description="instance, pool or link name")
    duration_s: Optional[float] = Field(default=None, gt=0, description="interval length, s")
    factor: Optional[float] = Field(default=None, gt=0, lt=1, description="link_degrade: bandwidth multiplier")
    count: int = Field(default=1, ge=1, description="frame_corrupt: payloads to corrupt")
    seed: int = Field(default=0, ge=0, description="numpy seed (>= 0)")

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> "FaultConfig":
        k = self.kind
        if k in ("link_degrade", "link_flap") and self.duration_s is None:
            raise ValueError(f"duration_s: required for {k} (seconds the link is "
                             f"{'degraded' if k == 'link_degrade' else 'down'})")
        if k == "link_degrade" and self.factor is None:
            raise ValueError("factor: required for link_degrade (bandwidth multiplier in (0, 1), e.g. 0.25)")
        if k != "link_degrade" and self.factor is not None:
            raise ValueError(f"factor: only link_degrade takes a factor, not {k}")
        if k in CRASH_KINDS and self.duration_s is not None:
            raise ValueError(f"duration_s: {k} takes none (the instance restarts at once; "
                             "on Ray it is down while Ray restarts its actor)")
        if k != "frame_corrupt" and self.count != 1:
            raise ValueError(f"count: only frame_corrupt takes a count, not {k}")
        return self


# ----------------------------------------------------------------------------- config

_OPTION_RE = re.compile(r"^(?P<kind>[a-z_]+):(?P<target>[^@]+)@(?P<at>[^,+]+)"
                        r"(?:\+(?P<dur>[^,]+))?(?P<rest>(?:,[a-z_]+=[^,]+)*)$")
OPTION_FORMAT = "KIND:TARGET@AT_S[+DURATION_S][,factor=F][,count=N][,seed=S]"


def parse_fault_option(text: str) -> dict:
    """A `--fault` value as a FaultConfig dict, e.g. "decode_crash:decode-0@5",
    "link_degrade:gpu-to-wafer@10+5,factor=0.25", "frame_corrupt:*@1,count=3,seed=7".
    Values are validated later with the scenario. Raises ValueError naming the format."""
    m = _OPTION_RE.match(text.strip())
    if not m:
        raise ValueError(f"--fault {text!r}: expected {OPTION_FORMAT} with KIND one of {', '.join(FAULT_KINDS)}")
    out: dict[str, Any] = {"kind": m["kind"], "target": m["target"], "at_s": _number(m["at"])}
    if m["dur"] is not None:
        out["duration_s"] = _number(m["dur"])
    for item in filter(None, m["rest"].split(",")):
        key, _, value = item.partition("=")
        if key not in ("factor", "count", "seed", "duration_s"):
            raise ValueError(f"--fault {text!r}: unknown key {key!r}; expected factor, count, seed or duration_s")
        out[key] = _number(value)
    return out


def _number(text: str) -> Any:
    """`text` as an int or float if it reads as one (so a validation error shows the
    number given, not a string), else unchanged for the validation to name."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _instances(pool) -> list[str]:
    return [f"{pool.name}-{i}" for i in range(pool.instances)]


def check_faults(scenario) -> None:
    """Check every fault's target against the scenario's pools and links; raises
    ValueError "faults[i].target: ..." naming what exists. Called by Scenario's validation."""
    links = [l.name for l in scenario.links]
    for i, f in enumerate(scenario.faults):
        where = f"faults[{i}].target"
        if f.kind in CRASH_KINDS:
            role = _ROLE_OF[f.kind]
            pools = [p for p in scenario.pools if p.role == role]
            names = {p.name for p in pools} | {n for p in pools for n in _instances(p)}
            if f.target not in names:
                have = ", ".join(n for p in pools for n in [p.name, *_instances(p)]) or "none"
                raise ValueError(f"{where}: {f.kind} needs a {role} instance or pool, got {f.target!r} "
                                 f"({role} pools and instances: {have})")
        else:
            if not links:
                raise ValueError(f"{where}: {f.kind} needs a KV link, but the scenario has none")
            ok = f.target in links or (f.kind == "frame_corrupt" and f.target == "*")
            if not ok:
                extra = " or '*'" if f.kind == "frame_corrupt" else ""
                raise ValueError(f"{where}: no link named {f.target!r}; expected one of {links}{extra}")


def resolve_target(scenario, fault: FaultConfig) -> str:
    """The instance or link a fault hits: a crash on a pool picks an instance from
    `fault.seed` (uniformly); otherwise the target as written."""
    if fault.kind in CRASH_KINDS:
        for p in scenario.pools:
            if p.name == fault.target:
                return _instances(p)[int(np.random.default_rng(fault.seed).integers(p.instances))]
    return fault.target


def apply_faults(scenario, specs: list) -> list:
    """The topology with the scenario's faults wired in: crash targets marked
    restartable (`ComponentSpec.weight_load_s`: a driver rebuilds them, reloading their
    weights for that long) and a `FaultInjector` core (kind "faults") after the router.
    Returns `specs` unchanged when there is no fault."""
    if not scenario.faults:
        return specs
    from rack.topology import ComponentSpec, weight_load_s

    faults = []
    for i, f in enumerate(scenario.faults):
        d = f.model_dump()
        d.update(index=i, instance=resolve_target(scenario, f))
        faults.append(d)
    crashed = {d["instance"] for d in faults if d["kind"] in CRASH_KINDS}
    load_s = {s.name: weight_load_s(scenario, scenario.pool(s.pool), s.kwargs["cost"])
              for s in specs if s.name in crashed}
    for d in faults:
        d["weight_load_s"] = load_s.get(d["instance"])
    out = []
    for s in specs:
        if s.name in crashed:
            s = dataclasses.replace(s, weight_load_s=load_s[s.name])
        out.append(s)
    names = {s.name for s in out}
    out.append(ComponentSpec("faults", "rack.faults:FaultInjector", {
        "faults": faults, "collector": "collector", "router": "router",
        "interconnect": "interconnect" if "interconnect" in names else None,
    }, "faults"))
    return out


# ----------------------------------------------------------------------------- the injector core

#: Back-off of a ping to an instance that is still restarting (emulated s): from 1 ms,
#: doubling, capped at 0.5 s (on Ray a message to a restarting actor fails until it is up).
PING_BACKOFF_S = (1e-3, 0.5)


class FaultInjector(Core):
    """Applies the scenario's faults at their emulated times and reports each one to
    the collector (`note_fault`), which returns the records in its snapshot.

    A crash: the injector pings the instance (`ping`, answered by the driver with its
    incarnation and its work counters so far: energy and utilisation still count the
    work a crash wipes out), sends it `crash(at_s)` (the driver replaces it with a fresh
    core that reloads its weights until at_s + weight_load_s; on Ray the actor is
    killed and restarted), tells every core `peer_lost` (exchanges in flight with the
    instance are void), pings it until it answers as a new incarnation (on Ray a
    message fails while the actor restarts: `send_failed`, tried again after a
    back-off), then asks the router to `recover` it. Link faults go to the
    interconnect (`degrade`, `flap`, `corrupt`).

    Keyword args: faults: FaultConfig dicts plus "index", "instance" (the resolved
    target) and "weight_load_s", as `apply_faults` builds them; collector, router,
    interconnect: core names (interconnect None without links); name ("faults").
    """

    def __init__(self, *, faults: Sequence[dict], collector: str, router: str,
                 interconnect: str | None = None, name: str = "faults") -> None:
        super().__init__(name)
        self.collector = collector
        self.router = router
        self.interconnect = interconnect
        self.faults = [dict(f) for f in faults]
        self.records: dict[int, dict] = {}
        self._due: list[tuple[float, int, int, str]] = []      # (t, seq, fault index, step)
        self._seq = 0
        self._backoff: dict[int, float] = {}
        for f in self.faults:
            i = f["index"]
            rec = {k: f.get(k) for k in ("kind", "target", "at_s", "duration_s", "factor", "count", "seed",
                                         "weight_load_s")}
            rec.update(index=i, instance=f["instance"], applied=False, applied_at_s=None, recovered=False,
                       recovered_at_s=None)
            self.records[i] = rec
            self.send(collector, "note_fault", i, dict(rec))
            self._at(f["at_s"], i, "start")

    def _at(self, t: float, index: int, step: str) -> None:
        heapq.heappush(self._due, (t, self._seq, index, step))
        self._seq += 1
        self.wake_at = self._due[0][0]

    def _note(self, index: int) -> None:
        self.send(self.collector, "note_fault", index, dict(self.records[index]))

    def on_wake(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, _, i, step = heapq.heappop(self._due)
            f, rec = self.faults[i], self.records[i]
            kind, target = f["kind"], f["instance"]
            if step == "ping":                          # a restarting instance: ask again
                self.send(target, "ping", self.name, (i, "after"))
            elif step == "restored":                    # a link fault's interval ended
                rec.update(recovered=True, recovered_at_s=now)
                self._note(i)
            elif kind in CRASH_KINDS:
                self.send(target, "ping", self.name, (i, "before"))
            elif kind in ("link_degrade", "link_flap"):
                end = f["at_s"] + f["duration_s"]
                if kind == "link_degrade":
                    self.send(self.interconnect, "degrade", target, f["factor"], now, end)
                else:
                    self.send(self.interconnect, "flap", target, now, end)
                rec.update(applied=True, applied_at_s=now)
                self._note(i)
                self._at(end, i, "restored")            # the link model restores it at `end`
            else:  # frame_corrupt: the interconnect counts the catches and the intact re-sends
                end = f["at_s"] + f["duration_s"] if f["duration_s"] is not None else math.inf
                self.send(self.interconnect, "corrupt", f["count"], f["seed"], now, end,
                          None if target == "*" else target, i)
                rec.update(applied=True, applied_at_s=now)
                self._note(i)
        self.wake_at = self._due[0][0] if self._due else math.inf

    def pong(self, now: float, tag: tuple, info: dict) -> None:
        """The driver's answer to `ping` (the instance is up)."""
        i, when = tag
        rec = self.records[i]
        target = self.faults[i]["instance"]
        if when == "before":
            rec["incarnations"] = [info["incarnation"]]
            rec["work_before_crash"] = info.get("work")
            self.send(target, "crash", now)
            self.send(BROADCAST, "peer_lost", target)
            # a restarted instance reloads its weights before it serves again (both
            # drivers; on Ray the restart's own wall time is not added)
            rec.update(applied=True, applied_at_s=now,
                       serving_from_s=now + (rec.get("weight_load_s") or 0.0))
            self._note(i)
            self.send(target, "ping", self.name, (i, "after"))
            return
        # after the crash: up again as a new incarnation
        rec["restarted"] = info["incarnation"] != rec["incarnations"][0]
        rec["incarnations"] = [rec["incarnations"][0], info["incarnation"]]
        rec["back_at_s"] = now
        # what it re-dispatched is read from the router's recovery records (with those of
        # later recoveries of the same instance it causes), in `faults_section`
        self.send(self.router, "recover", self.faults[i]["instance"], self.name, i)

    def send_failed(self, now: float, dst: str, method: str, args: tuple) -> None:
        """The Ray driver could not deliver a message (the actor is restarting): a ping
        is tried again after a back-off."""
        if method != "ping":
            return
        i = args[1][0]
        wait = min(PING_BACKOFF_S[1], self._backoff.get(i, PING_BACKOFF_S[0]))
        self._backoff[i] = wait * 2
        self._at(now + wait, i, "ping")

    def recovered(self, now: float, index: int, report: dict) -> None:
        """The router's reply to `recover`."""
        self.records[index].update(recovered=True, recovered_at_s=now)
        self._note(index)

    def is_idle(self) -> bool:
        return True

    def waiting_for(self) -> str:
        return ""


# ----------------------------------------------------------------------------- results

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
    its exception), "injected", "recovered", "no_target", "requests_failed" (requests
    a fault made fail: re-dispatched ones that did not complete, plus failures with a
    fault-only reason, FAULT_REASONS), "requests_redispatched", "requests_recovered"
    (re-dispatched and completed), "kv_resent_after_restart", "payloads_resent" (after
    a checksum failure), "frames_corrupted", "checksum_failures", "transfers_lost"
    (receiver restarted mid-transfer), "list": per-fault records."""
    records = [dict(r) for r in snapshot.get("faults", [])]
    ic = stats.get("interconnect") or {}
    corr = {c["tag"]: c for c in ic.get("corruption", [])}
    outcome = dict(zip(columns["id"].tolist(), columns["outcome"].tolist())) if len(columns.get("id", ())) else {}
    reason = dict(zip(columns["id"].tolist(), columns["reason"].tolist())) if outcome else {}
    by_fault = _redispatched_by_fault(records, snapshot.get("recoveries", []))
    redispatched = {int(x) for rec in snapshot.get("recoveries", []) for x in rec["ids"]}
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
            ids = by_fault.get(r["index"], set())
            ok = [x for x in ids if outcome.get(x) == "completed"]
            r["requests_redispatched"] = len(ids)
            r["requests_recovered"] = len(ok)
            r["requests_failed"] = len(ids) - len(ok)
    failed = {i for i in redispatched if outcome.get(i) != "completed"}
    failed |= {i for i, o in outcome.items() if o == "failed" and reason.get(i) in FAULT_REASONS}
    pre = [s for s in stats.values() if s.get("role") == "prefill"]
    return {
        "errors": [f"fault {r['index']} ({r['kind']}): {r['error']}" for r in records if r.get("error")],
        "injected": sum(1 for r in records if r["applied"]),
        "recovered": sum(1 for r in records if r["recovered"]),
        "no_target": sum(1 for r in records if r.get("outcome") == "no target at that time"),
        "requests_failed": len(failed),
        "requests_redispatched": len(redispatched),
        "requests_recovered": sum(1 for i in redispatched if outcome.get(i) == "completed"),
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


__all__ = [
    "CRASH_KINDS", "FAULT_KINDS", "FAULT_REASONS", "LINK_KINDS", "OPTION_FORMAT", "FaultConfig",
    "FaultInjector", "Restartable", "WORK_KEYS", "apply_faults", "check_faults", "faults_section",
    "parse_fault_option", "resolve_target", "retry_on_peer_lost", "with_work_before_crashes",
]
