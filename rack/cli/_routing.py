"""`--router-policy` and `--prefix-weight`: the router of every scenario a command runs
(`rack run`, `rack compare`), as `[router] policy` and `prefix_weight` set it in a
scenario file. Not a command module (leading underscore)."""

from __future__ import annotations

from typing import Optional, Sequence

import typer

from rack.cli._checks import fail

POLICY_OPTION = typer.Option(None, "--router-policy", help="router policy of every scenario: round_robin, "
                             "least_outstanding_work or prefix_aware (KV-cache-aware, docs/workloads.md) "
                             "[default: the scenario's]")
WEIGHT_OPTION = typer.Option(None, "--prefix-weight", help="prefix_aware: weight of a prompt's uncached "
                             "tokens against an instance's backlog [default: the scenario's, 1]")


def with_routing(scenarios: Sequence, policy: Optional[str], weight: Optional[float]) -> list:
    """`scenarios` with their router's policy and prefix weight replaced (None: kept),
    or a one-line error naming the option."""
    from rack.wiring.scenario import ScenarioError

    out = []
    for sc in scenarios:
        try:
            out.append(sc.with_router(policy=policy, prefix_weight=weight))
        except ScenarioError as exc:
            fail(f"--router-policy/--prefix-weight: {exc}")
    return out
