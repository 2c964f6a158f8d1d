"""The fault injector core: applies a scenario's faults at their emulated times
(`rack.wiring.faults` describes them; docs/robustness.md the protocol)."""

from __future__ import annotations

import heapq
import math
from typing import Any, Mapping, Sequence

from workloads.core import BROADCAST, Core

#: The fault kinds this core applies (the scenario side, `rack.wiring.faults`, checks a
#: scenario's faults against them).
FAULT_KINDS = ("decode_crash", "prefill_crash", "link_degrade", "link_flap", "frame_corrupt")
CRASH_KINDS = ("decode_crash", "prefill_crash")
LINK_KINDS = ("link_degrade", "link_flap", "frame_corrupt")
#: Failure reasons only fault handling produces (a request's KV stayed bad after its
#: re-sends; the decode engine kept losing it).
FAULT_REASONS = ("kv_checksum", "decode_unavailable")

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

    A real death (the Ray driver's `instance_died`: an engine's actor died without an
    injected fault and Ray restarted it) is handled as a crash that already happened: a
    record of the same kind ("cause": "actor_died"; injected faults have "injected"),
    `peer_lost` to every core, pings until the new incarnation answers, then the
    router's `recover`.

    Keyword args: faults: FaultConfig dicts plus "index", "instance" (the resolved
    target) and "weight_load_s", as `apply_faults` builds them; collector, router,
    interconnect: core names (interconnect None without links); restartable: {instance:
    {"kind": "decode_crash" | "prefill_crash", "weight_load_s": s}} of the instances
    whose real deaths are recovered (`Scenario.max_restarts`); name ("faults").
    """

    def __init__(self, *, faults: Sequence[dict], collector: str, router: str,
                 interconnect: str | None = None, restartable: Mapping[str, dict] | None = None,
                 name: str = "faults") -> None:
        super().__init__(name)
        self.collector = collector
        self.router = router
        self.interconnect = interconnect
        self.restartable = {k: dict(v) for k, v in (restartable or {}).items()}
        self.faults = [dict(f) for f in faults]
        self.records: dict[int, dict] = {}
        self._due: list[tuple[float, int, int, str]] = []      # (t, seq, fault index, step)
        self._seq = 0
        self._backoff: dict[int, float] = {}
        for f in self.faults:
            i = f["index"]
            rec = self._record(f, "injected")
            self.records[i] = rec
            self.send(collector, "note_fault", i, dict(rec))
            self._at(f["at_s"], i, "start")

    @staticmethod
    def _record(f: dict, cause: str) -> dict:
        rec = {k: f.get(k) for k in ("kind", "target", "at_s", "duration_s", "factor", "count", "seed",
                                     "weight_load_s")}
        rec.update(index=f["index"], instance=f["instance"], cause=cause, applied=False, applied_at_s=None,
                   recovered=False, recovered_at_s=None)
        return rec

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
            if step.startswith("ping:"):                # a restarting instance: ask again
                self.send(target, "ping", self.name, (i, step[5:]))
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
        # after the crash: up again as a new incarnation. An answer from the old one (a
        # driver that let it reply between the crash and its end) is not "back": ask again.
        if info["incarnation"] == rec["incarnations"][0]:
            self._retry_ping(now, i)
            return
        rec["restarted"] = True
        rec["incarnations"] = [rec["incarnations"][0], info["incarnation"]]
        rec["back_at_s"] = now
        # what it re-dispatched is read from the router's recovery records (with those of
        # later recoveries of the same instance it causes), in `faults_section`
        self.send(self.router, "recover", self.faults[i]["instance"], self.name, i)

    def instance_died(self, now: float, instance: str, incarnation: Any, at_s: float | None = None) -> None:
        """The Ray driver: `instance`'s actor died for real (not an injected fault) and
        Ray restarted it; `incarnation`: its process id before the death; at_s: the
        emulated time of the restart (default now). Recovered as an injected crash is,
        from the point where the instance is down: every core is told (`peer_lost`),
        the instance is pinged until its new incarnation answers, then the router
        re-dispatches what it lost. Raises KeyError for an instance not in
        `restartable` (its death ends the run on the driver's side instead)."""
        info = self.restartable[instance]
        i = len(self.faults)
        at = now if at_s is None else float(at_s)
        f = {"kind": info["kind"], "target": instance, "instance": instance, "at_s": at, "index": i,
             "weight_load_s": info.get("weight_load_s"), "seed": None, "count": None}
        self.faults.append(f)
        rec = self._record(f, "actor_died")
        rec.update(applied=True, applied_at_s=at, incarnations=[incarnation], work_before_crash=None,
                   serving_from_s=at + (info.get("weight_load_s") or 0.0))
        self.records[i] = rec
        self._note(i)
        self.send(BROADCAST, "peer_lost", instance)
        self.send(instance, "ping", self.name, (i, "after"))

    def send_failed(self, now: float, dst: str, method: str, args: tuple) -> None:
        """The Ray driver could not deliver a message (the actor is restarting): a ping
        is tried again after a back-off."""
        if method == "ping":
            self._retry_ping(now, *args[1])

    def _retry_ping(self, now: float, i: int, when: str = "after") -> None:
        """Ping again after a back-off. `when` is kept: a crash aimed at an instance
        still down from an earlier one ("before") applies once it is back (a "before"
        ping retried as "after" found no record of the crash: KeyError 'incarnations'
        in a Ray fault storm, issue 37)."""
        wait = min(PING_BACKOFF_S[1], self._backoff.get(i, PING_BACKOFF_S[0]))
        self._backoff[i] = wait * 2
        self._at(now + wait, i, "ping:" + when)

    def recovered(self, now: float, index: int, report: dict) -> None:
        """The router's reply to `recover`."""
        self.records[index].update(recovered=True, recovered_at_s=now)
        self._note(index)

    def is_idle(self) -> bool:
        return True

    def waiting_for(self) -> str:
        return ""


__all__ = ["FaultInjector", "PING_BACKOFF_S"]
