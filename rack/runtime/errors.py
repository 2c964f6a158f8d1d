"""How a run that cannot go on says why: `ComponentError`, raised by either runtime.

A component (router, engine, interconnect, collector, fault injector) that raises an
exception ends the run. The runtime catches it where it drives the component and
raises `ComponentError` naming the component, the emulated time, the request the
component was handling (if one can be told) and the original exception, with the
records gathered up to then (`partial`), so the caller can still write what was
measured (`rack.run.runner.RunAborted`, results marked "aborted").

This module knows nothing of asyncio or Ray: the drivers of the engine-core design
(DESIGN.md, "One model, two clocks") raise the same error when a core's handler raises.
"""

from __future__ import annotations

import traceback
from typing import Any, Iterable, Mapping


class ComponentError(RuntimeError):
    """A component raised: the run cannot go on.

    Attributes: component (name, e.g. "decode-0"), t_s (emulated s when it raised, or
    None), request_id (the request it was handling, or None), cause (the original
    exception; also `__cause__`), partial (the runtime's records up to the failure:
    the dict `run_topology_virtual` returns, or None if none could be gathered),
    remote_traceback (the cause's traceback as text, when raised in a Ray actor).
    `str(err)` is one line: "component 'decode-0' raised at t=1.234567 s (request 17):
    ValueError: ...".
    """

    def __init__(self, component: str, t_s: float | None, request_id: int | None,
                 cause: BaseException, partial: dict | None = None) -> None:
        self.component = component
        self.t_s = t_s
        self.request_id = request_id
        self.cause = cause
        self.partial = partial
        self.remote_traceback: str | None = None   # the cause's traceback, kept as text across Ray
        super().__init__(self._line())
        self.__cause__ = cause

    def _line(self) -> str:
        when = f" at t={self.t_s:.6f} s" if self.t_s is not None else ""
        req = f" (request {self.request_id})" if self.request_id is not None else ""
        text = " ".join(str(self.cause).split()) or "(no message)"
        return f"component {self.component!r} raised{when}{req}: {type(self.cause).__name__}: {text}"

    def __reduce__(self):  # picklable across Ray (partial records are dropped)
        return (ComponentError, (self.component, self.t_s, self.request_id, self.cause),
                {"remote_traceback": self.remote_traceback})

    def details(self) -> dict:
        """results.json's `error` section: component, t_s, request_id, type, message."""
        return {"component": self.component, "t_s": self.t_s, "request_id": self.request_id,
                "type": type(self.cause).__name__, "message": str(self.cause)}

    def traceback_text(self) -> str:
        """The original exception's traceback (for the run's error log); the text kept
        where it was raised when it came from another process (Ray)."""
        if self.cause.__traceback__ is None and self.remote_traceback:
            return self.remote_traceback
        return "".join(traceback.format_exception(type(self.cause), self.cause, self.cause.__traceback__))


class ActorLost(ComponentError):
    """A component's Ray actor was lost without an injected fault: it died (its process
    killed, its node gone), stopped answering (`rack.wiring.pace.liveness_timeout_s`),
    died more often than its restarts allow, or was not back from a restart in time.
    Raised by the Ray driver, which names the component, where it ran and what it held.

    Attributes beyond ComponentError's: how ("died", "hung", "died again", "not back"),
    node_ip, node_id, pid (its last process), last_answer_t_s (emulated s of its last
    answer to the driver), held (ids of the open requests routed to it, None when that
    could not be read or it is not an engine), restarts (real deaths it may survive,
    `Scenario.max_restarts`), can_restart (a prefill or decode instance: the only
    components `max_restarts` covers), detail (the how in words). `t_s` is when the
    driver noticed, in emulated seconds.
    """

    def __init__(self, component: str, t_s: float | None, cause: BaseException, *, how: str, detail: str,
                 node_ip: str | None = None, node_id: str | None = None, pid: int | None = None,
                 last_answer_t_s: float | None = None, held: list[int] | None = None, restarts: int = 0,
                 can_restart: bool = True) -> None:
        self.how, self.detail = how, detail
        self.node_ip, self.node_id, self.pid = node_ip, node_id, pid
        self.last_answer_t_s, self.held, self.restarts = last_answer_t_s, held, restarts
        self.can_restart = can_restart
        super().__init__(component, t_s, None, cause)

    def _line(self) -> str:
        where = ", ".join(x for x in (f"node {self.node_ip}" if self.node_ip else "",
                                      f"pid {self.pid}" if self.pid else "") if x)
        when = f" at about t={self.t_s:.3f} s of emulated time" if self.t_s is not None else ""
        last = (f" (it last answered at t={self.last_answer_t_s:.3f} s)"
                if self.last_answer_t_s is not None else "")
        if self.held is None:
            held = ""
        else:
            eg = f", e.g. {', '.join(map(str, self.held[:8]))}" if self.held else ""
            held = f"; {len(self.held)} open request(s) routed to it{eg}"
        if not self.can_restart:
            budget = "only prefill and decode instances are restarted"
        elif self.restarts:
            budget = f"max_restarts = {self.restarts}"
        else:
            budget = "no restarts configured (scenario max_restarts, rack run --max-restarts)"
        cause = (str(self.cause).strip().splitlines() or ["(no message)"])[0].rstrip(".")
        lost = "; the run's per-request records were in it" if self.component == "collector" else ""
        return (f"the actor of component {self.component!r} ({where}) {self.detail}{when}{last}, not an injected "
                f"fault; {budget}{held}{lost}: {type(self.cause).__name__}: {cause}")

    def __reduce__(self):  # the driver's own error; picklable for completeness
        state = {k: v for k, v in self.__dict__.items() if k != "partial"}
        return (_actor_lost, (self.component, self.t_s, self.cause, state))

    def details(self) -> dict:
        """ComponentError's details plus how, node_ip, node_id, pid, last_answer_t_s,
        held_requests (count, None if unknown), held_request_ids (up to 100), restarts
        and line (`str(self)`); message is the cause's first line."""
        out = super().details()
        out.update(message=(str(self.cause).strip().splitlines() or [""])[0], how=self.how, line=str(self),
                   node_ip=self.node_ip, node_id=self.node_id, pid=self.pid, last_answer_t_s=self.last_answer_t_s,
                   held_requests=None if self.held is None else len(self.held),
                   held_request_ids=None if self.held is None else list(self.held[:100]), restarts=self.restarts)
        return out


def _actor_lost(component, t_s, cause, state):
    err = ActorLost(component, t_s, cause, how=state["how"], detail=state["detail"])
    err.__dict__.update(state)
    return err


class RayRunError(RuntimeError):
    """The Ray run could not start (missing resources, actors not placed in time) or
    did not finish in time."""


class RayDaemonLost(RayRunError):
    """A daemon of the local Ray this process started (its GCS server or its raylet)
    died during a run: Ray cannot go on (actors lose their node or their directory, and
    Ray itself ends the driver about a minute later). Raised by the Ray driver's watch
    within a poll of the death (`rack.runtime.ray_watch`), naming the daemon and its
    process; `partial` holds what could be saved (the actors' records if they still
    answer, else the collector's last checkpoint), `details()` results.json's `error`."""

    def __init__(self, daemon: str, pid: int, t_s: float | None, log_dir: str | None = None) -> None:
        what = {"gcs_server": "GCS server", "raylet": "raylet"}.get(daemon, daemon)
        super().__init__(f"the Ray {what} of this run (pid {pid}) died"
                         + (f" at about t={t_s:.3f} s of emulated time" if t_s is not None else "")
                         + ": Ray cannot go on without it" + (f" (Ray's logs: {log_dir})" if log_dir else ""))
        self.daemon, self.pid, self.t_s, self.log_dir = daemon, pid, t_s, log_dir
        self.partial: dict | None = None

    def details(self) -> dict:
        return {"component": f"ray:{self.daemon}", "t_s": self.t_s, "request_id": None,
                "type": "RayDaemonLost", "message": str(self), "pid": self.pid, "ray_logs": self.log_dir}


class RunFailed(RuntimeError):
    """One run of a map failed (`rack.runtime.parallel`): `index` of its item in the
    input, `cause` the exception it raised (for a Ray task, an instance of the original
    exception class)."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"run {index} failed: {type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


def owners(components: Mapping[str, Any]) -> dict[int, str]:
    """{id(object): component name} for `components` and the objects wrappers such as
    `rack.wiring.faults.Restartable` hold in `inner` (the current incarnation)."""
    out: dict[int, str] = {}
    for name, obj in components.items():
        out[id(obj)] = name
        inner = getattr(obj, "__dict__", {}).get("inner")
        if inner is not None:
            out[id(inner)] = name
    return out


def component_of(frames: Iterable[Any], owned: Mapping[int, str]) -> str | None:
    """The component of the first of `frames` that is a method of one (its `self`)."""
    for frame in frames:
        name = owned.get(id(frame.f_locals.get("self")))
        if name is not None:
            return name
    return None


def locate(exc: BaseException, components: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(component name, request id) of the frames `exc` passed through.

    The component is the one whose method is innermost in the traceback (see
    `owners`); the request is the innermost frame's local that is a
    `workloads.Request` or holds one in `.req` (an engine's job). Best effort: None
    parts when nothing matches.
    """
    frames = list(_frames(exc))
    return component_of(frames, owners(components)), request_of(frames)


def request_of(frames: Iterable[Any]) -> int | None:
    """The id of the first `workloads.Request` among `frames`' locals (directly, or
    as the `.req` of a local such as an engine's job), or None."""
    from workloads.request import Request

    for frame in frames:
        for value in frame.f_locals.values():
            if not isinstance(value, Request):
                value = getattr(value, "req", None) if not isinstance(value, (int, float, str)) else None
            if isinstance(value, Request):
                return value.id
    return None


def _frames(exc: BaseException) -> Iterable[Any]:
    """Frames of `exc`'s traceback, innermost first."""
    return reversed([f for f, _ in traceback.walk_tb(exc.__traceback__)])
