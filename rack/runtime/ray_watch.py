"""The Ray driver's watch over its actors while a run waits: deaths, hangs, restarts.

A core that raises is kept by its host as a `ComponentError` (`CoreHost.failed`); an
actor that dies, or stops answering, says nothing. `ActorWatch.poll` (called every
`POLL_S` by the driver's wait loops, `rack.runtime.ray_runtime`) probes every actor with
`CoreHost.health()`, one probe in flight per actor, and acts on what comes back:

- **a death**: Ray raises `ActorDiedError` for a call to an actor that died and will
  not be restarted (not restartable, or its restarts used up): the run ends at once
  with `ActorLost` (`rack.runtime.errors`), naming the component, its node and process,
  the emulated time, and the open requests routed to it. Measured: under 2 s from
  `kill -9` of a decode engine's process to the driver's error (tests/test_ray_deaths.py).
- **a restart**: a restartable actor (a crash target, or every engine with
  `Scenario.max_restarts`) is restarted by Ray; calls in flight then fail with
  `ActorUnavailableError` and later ones wait for the new process. The restarted host
  tells the registry (`CoreHost.note_restart`), which tells an injected crash from a
  real death; the registry's answer to its probe lists the real deaths. Each one is
  handed to the fault injector (`FaultInjector.instance_died`), which recovers it as an
  injected crash (peers told, the restarted core reloads its weights, the router
  re-dispatches what it lost) while the instance has restarts left
  (`ComponentSpec.restarts`); one death more ends the run (`ActorLost`, "died again").
- **silence**: a probe unanswered for the run's liveness timeout
  (`rack.wiring.pace.liveness_timeout_s`, from its dilation and TPOT target) means a
  hung actor: a restartable one is killed so that Ray restarts it (then recovered as a
  death), any other ends the run (`ActorLost`, "hung"); a restarting actor that is not
  back within `RESTART_TIMEOUT_S` (or the liveness timeout, if longer) ends it too.
- **a failure**: the earliest `ComponentError` by emulated time, as before.

Deaths come before failures: a peer that failed because an actor died is not the cause.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .errors import ActorLost, ComponentError, RayDaemonLost

POLL_S = 1.0
"""Wall seconds between two polls of the actors while a run waits."""
PROBE_WAIT_S = 0.5
"""Wall seconds a poll waits for the probes' answers before it looks at what came."""
RESTART_TIMEOUT_S = 120.0
"""Wall seconds a restarting actor may take to come back (a new process, its imports;
seen at 2-3 s on a loaded 2-core host, docs/robustness.md)."""


#: Ray daemons without which a run cannot go on (`lost_daemon`).
DAEMONS = ("gcs_server", "raylet")


def lost_daemon() -> tuple[str, int, str | None] | None:
    """(kind, pid, Ray's log folder) of a daemon of the local Ray this process started
    (`DAEMONS`) that has died, or None: none died, or Ray was not started here (a
    cluster's daemons are not this process's to watch). Reads Ray's node object (the
    processes it started, polled as children of this process)."""
    import sys

    worker = getattr(getattr(sys.modules.get("ray"), "_private", None), "worker", None)
    node = getattr(worker, "_global_node", None)
    if node is None:
        return None
    try:
        dead = node.dead_processes()
        logs = node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - Ray's private API: no answer is no death seen
        return None
    for kind, proc in dead:
        if kind in DAEMONS:
            return kind, proc.pid, logs
    return None


class ActorWatch:
    """Watches the actors of a `RayTopology` (module docstring).

    topo: the run's `rack.runtime.ray_runtime.RayTopology`; liveness_s: wall seconds a
    probe may stay unanswered; injector: the fault injector's core name (None: none),
    to which real deaths of restartable instances are handed.
    """

    def __init__(self, ray: Any, topo: Any, liveness_s: float, injector: str | None = "faults") -> None:
        self.ray, self.topo, self.liveness_s = ray, topo, float(liveness_s)
        self.actors: dict[str, Any] = topo.actors
        #: the collector's records at the last checkpoint (`ray_runtime._wait_with_progress`),
        #: as a partial run's dict, or None
        self.checkpoint: dict | None = None
        self.specs = {s.name: s for s in topo.specs}
        self.restartable = {n for n, s in self.specs.items() if s.weight_load_s is not None}
        self.injector = injector if injector in self.actors else None
        now = time.time()
        self.pid = {n: topo.infos[n]["pid"] for n in self.actors}
        self.last_ok = dict.fromkeys(self.actors, now)
        self.last_t: dict[str, float | None] = dict.fromkeys(self.actors, None)
        self.down: dict[str, float] = {}            # restarting since (wall s)
        self.probes: dict[str, tuple[Any, float]] = {}
        self.deaths_seen = 0
        self.deaths: dict[str, int] = {}
        self.handed: list[dict] = []                 # real deaths handed to the injector
        self.next_poll = now + POLL_S

    def due(self) -> bool:
        """True when `POLL_S` has passed since the last poll."""
        return time.time() >= self.next_poll

    def poll(self) -> None:
        """Probe every actor once and act on the answers (module docstring). Raises
        `RayDaemonLost` for a lost Ray daemon, `ActorLost` for a lost actor, else the
        earliest `ComponentError`."""
        self.daemon_check()
        now = time.time()
        for name, actor in self.actors.items():
            if name not in self.probes:
                self.probes[name] = (actor.health.remote(), now)
        refs = [ref for ref, _ in self.probes.values()]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=PROBE_WAIT_S)
        ready = set(ready)
        now = time.time()
        failures: list[ComponentError] = []
        deaths: list[dict] | None = None
        for name in list(self.probes):
            ref, sent = self.probes[name]
            if ref not in ready:
                self._silent(name, now - sent, now)
                continue
            del self.probes[name]
            try:
                h = self.ray.get(ref, timeout=10)
            except self.ray.exceptions.ActorUnavailableError:
                self.down.setdefault(name, now)          # restarting: later calls wait for it
                continue
            except self.ray.exceptions.RayActorError as exc:
                raise self.lost(name, exc, "died", "died") from None
            self.down.pop(name, None)
            self.last_ok[name], self.last_t[name], self.pid[name] = now, h["t_s"], h["pid"]
            if h["failure"] is not None:
                failures.append(h["failure"])
            if name == "collector":
                deaths = h["deaths"]
        if deaths:
            self._restarts(deaths)
        self.next_poll = time.time() + POLL_S
        if failures:
            raise min(failures, key=lambda f: f.t_s if f.t_s is not None else math.inf)

    def _silent(self, name: str, waited: float, now: float) -> None:
        """A probe of `name` unanswered for `waited` wall seconds."""
        if name in self.down:
            limit = max(RESTART_TIMEOUT_S, self.liveness_s)
            if now - self.down[name] > limit:
                raise self.lost(name, TimeoutError(f"no answer {now - self.down[name]:.0f} s after it went down"),
                                "not back", f"died and was not back within {limit:.0f} s")
            return
        if waited <= self.liveness_s:
            return
        cause = TimeoutError(f"no answer to the driver's probe for {waited:.0f} s (liveness timeout "
                             f"{self.liveness_s:.0f} s: rack.wiring.pace.liveness_timeout_s)")
        if name in self.restartable and self.specs[name].restarts > 0:
            # hung, but it may restart: kill it, Ray restarts it, and it is recovered as a death
            try:
                self.ray.kill(self.actors[name], no_restart=False)
            except Exception:  # noqa: BLE001 - then it stays silent and ends the run below
                pass
            self.down[name] = now
            return
        raise self.lost(name, cause, "hung", f"stopped answering ({waited:.0f} s without an answer)")

    def _restarts(self, deaths: list[dict]) -> None:
        """The registry's real deaths: hand the new ones to the injector, or end the
        run for an instance with no restart left."""
        for d in deaths[self.deaths_seen:]:
            self.deaths_seen += 1
            name = d["instance"]
            self.deaths[name] = self.deaths.get(name, 0) + 1
            self.pid[name] = d["pid_before"] or self.pid[name]
            allowed = self.specs[name].restarts
            if self.deaths[name] > allowed or self.injector is None:
                nth = self.deaths[name]
                raise self.lost(name, RuntimeError(f"Ray restarted it as process {d['pid']}; death {nth} of "
                                                   f"{allowed} allowed"),
                                "died again" if allowed else "died",
                                f"died (death {nth}; it may survive {allowed})" if allowed else "died",
                                t_s=d["t_s"])
            self.handed.append(dict(d))
            self.actors[self.injector].deliver.remote("instance_died", (name, d["pid_before"], d["t_s"]))

    def daemon_check(self) -> None:
        """Raise `RayDaemonLost` if a daemon of the local Ray this process started has
        died (`lost_daemon`): checked at every poll and before any actor is reported
        lost (a dead raylet takes its workers with it: the daemon is the cause)."""
        lost = lost_daemon()
        if lost is not None:
            kind, pid, logs = lost
            raise RayDaemonLost(kind, pid, (time.time() - self.topo.epoch) / self.topo.dilation, logs)

    def lost(self, name: str, cause: BaseException, how: str, detail: str, t_s: float | None = None) -> ActorLost:
        """The `ActorLost` error for actor `name` (with the open requests routed to it,
        read from the router and the collector when they answer); `RayDaemonLost`
        instead when a Ray daemon of this run died."""
        self.daemon_check()
        info = self.topo.infos.get(name, {})
        now = (time.time() - self.topo.epoch) / self.topo.dilation
        spec = self.specs.get(name)
        return ActorLost(name, now if t_s is None else t_s, cause, how=how, detail=detail,
                         node_ip=info.get("node_ip"), node_id=self.topo.nodes.get(name), pid=self.pid.get(name),
                         last_answer_t_s=self.last_t.get(name), held=self._held(name),
                         restarts=spec.restarts if spec is not None else 0,
                         can_restart=spec is not None and spec.kind in ("prefill", "decode"))

    def _held(self, name: str) -> list[int] | None:
        """Open requests routed to engine `name` (None for another component, or when
        the router or the collector does not answer)."""
        if self.specs.get(name) is None or self.specs[name].kind not in ("prefill", "decode", "both"):
            return None
        try:
            ids = self.ray.get(self.actors["router"].query.remote("routed_to", name), timeout=10)
            return list(self.ray.get(self.actors["collector"].query.remote("still_open", ids), timeout=10))
        except Exception:  # noqa: BLE001 - best effort: the error is raised either way
            return None

    def call(self, name: str, ref: Any, timeout_s: float) -> Any:
        """`ray.get(ref)` of a call to actor `name`, its death or silence as `ActorLost`."""
        try:
            return self.ray.get(ref, timeout=min(timeout_s, self.liveness_s))
        except self.ray.exceptions.ActorUnavailableError:
            raise self.lost(name, RuntimeError("unavailable"), "died", "died") from None
        except self.ray.exceptions.RayActorError as exc:
            raise self.lost(name, exc, "died", "died") from None
        except self.ray.exceptions.GetTimeoutError:
            raise self.lost(name, TimeoutError(f"no answer within {min(timeout_s, self.liveness_s):.0f} s"),
                            "hung", "stopped answering") from None


__all__ = ["ActorWatch", "POLL_S", "PROBE_WAIT_S", "RESTART_TIMEOUT_S"]
