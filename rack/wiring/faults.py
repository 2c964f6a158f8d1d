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

This module is the configuration side (the faults a scenario names, checked against
its pools and links); `rack.wiring.topology.apply_faults` wires them into a run,
`rack.serving.fault_injector.FaultInjector` applies them, and
`rack.measure.faults.faults_section` builds results.json's `faults` block.
docs/robustness.md has the protocol and its limits.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rack.serving.fault_injector import CRASH_KINDS, FAULT_KINDS, FAULT_REASONS, LINK_KINDS
from workloads.clock import MAX_EMULATED_S

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
    # times within the span float64 seconds resolve to 1 us (workloads.clock)
    at_s: float = Field(ge=0, le=MAX_EMULATED_S, description="emulated time of the fault, s")
    target: str = Field(min_length=1, description="instance, pool or link name")
    duration_s: Optional[float] = Field(default=None, gt=0, le=MAX_EMULATED_S, description="interval length, s")
    factor: Optional[float] = Field(default=None, gt=0, lt=1, description="link_degrade: bandwidth multiplier")
    count: int = Field(default=1, ge=1, le=2**31 - 1, description="frame_corrupt: payloads to corrupt")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="numpy seed (>= 0, 64-bit)")

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
        if key in out:
            raise ValueError(f"--fault {text!r}: {key} given twice" + (" (+DURATION_S is duration_s)"
                                                                       if key == "duration_s" else ""))
        out[key] = _number(value)
    return out


def _number(text: str) -> Any:
    """`text` as an int or float if it reads as one in ASCII digits (so a validation
    error shows the number given, not a string), else unchanged for the validation to
    name (int() and float() also read other scripts' digits)."""
    if not text.isascii():
        return text
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


__all__ = ["CRASH_KINDS", "FAULT_KINDS", "FAULT_REASONS", "FaultConfig", "LINK_KINDS", "OPTION_FORMAT",
           "check_faults", "parse_fault_option", "resolve_target"]
