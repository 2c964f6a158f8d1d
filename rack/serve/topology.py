"""A scenario's components for live serving: the replay topology plus the front.

`live_topology(scenario)` is `rack.wiring.topology.build_topology(scenario, [])` with
three additive changes, none to a core's behaviour on replayed requests:

- a `Gateway` core named "front" (kind "front"), hosted on the Ray driver by
  `rack.serve.ray_front.FrontHost` (the HTTP server) with the scenario's
  `[placement] front` resources, so that on a cluster it can sit on its own node;
- every engine streams to it (`stream_to="front"`: planned token times, cuts, first
  tokens) and the collector opens rows for requests it has not seen and reports every
  end to it (`live_front="front"`);
- nothing else: the router receives live requests through its `submit_live` handler.
"""

from __future__ import annotations

import dataclasses

from rack.wiring.scenario import Scenario
from rack.wiring.topology import ComponentSpec, Ref, build_topology

FRONT = "front"
#: The Ray actor class that hosts the front's core and its HTTP server.
FRONT_HOST = "rack.serve.ray_front:FrontHost"
_STREAMING_KINDS = ("prefill", "decode", "both")


def live_topology(scenario: Scenario) -> list[ComponentSpec]:
    """The components of `scenario` for a live front (module docstring), in an order
    where each one's peers come first. Raises ScenarioError as `build_topology`."""
    out = []
    for spec in build_topology(scenario, []):
        if spec.kind in _STREAMING_KINDS:
            spec = dataclasses.replace(spec, kwargs={**spec.kwargs, "stream_to": Ref(FRONT)})
        elif spec.kind == "collector":
            spec = dataclasses.replace(spec, kwargs={**spec.kwargs, "live_front": Ref(FRONT)})
        out.append(spec)
    out.append(ComponentSpec(FRONT, "rack.serve.gateway:Gateway", {"router": Ref("router")}, "front",
                             resources=dict(scenario.placement.front), host=FRONT_HOST))
    return out


__all__ = ["FRONT", "FRONT_HOST", "live_topology"]
