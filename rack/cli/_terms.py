"""`--term KEY=VALUE` (repeatable): set an uncertain term of the cost and energy model
(`devices.uncertainty`) for `rack run`, `rack compare` and `rack estimate`, as a
scenario's `[terms]` table does; `--energy-boundary system|devices`: what the reported
energy counts, as a scenario's `[energy].boundary` does (`rack.measure.energy`). Not a
command module (leading underscore)."""

from __future__ import annotations

from typing import List, Optional, Sequence

import typer

from rack.cli._checks import fail

TERM_OPTION = typer.Option(None, "--term", help="set an uncertain term, KEY=VALUE (repeatable), e.g. "
                           "cs3.prefill_efficiency=0.3; keys, ranges and sources: docs/devices.md "
                           "('Uncertain terms') [default: the scenario's / the catalog's]")


BOUNDARY_OPTION = typer.Option(None, "--energy-boundary", help="what energy counts: system (the accelerators "
                               "plus the hosts, NICs and switch ports each needs) or devices (accelerators alone) "
                               "[default: the scenario's [energy].boundary, system]")


def with_boundary(scenarios: Sequence, boundary: Optional[str]) -> list:
    """`scenarios` with `[energy].boundary` = `boundary` (None: as they are), or a
    one-line error naming `--energy-boundary`."""
    from rack.wiring.settings import ENERGY_BOUNDARIES

    if boundary is None:
        return list(scenarios)
    if boundary not in ENERGY_BOUNDARIES:
        fail(f"--energy-boundary: expected one of {', '.join(ENERGY_BOUNDARIES)}, got {boundary!r}")
    return [sc.with_overrides(energy={**sc.energy.model_dump(), "boundary": boundary}) for sc in scenarios]


def parse_terms(options: Optional[List[str]]) -> dict[str, float]:
    """{key: value} of the `--term` options, or a one-line error naming the option."""
    from devices.uncertainty import parse_term

    out: dict[str, float] = {}
    for text in options or []:
        try:
            key, value = parse_term(text)
        except ValueError as exc:
            fail(str(exc))
        out[key] = value
    return out


def with_terms(scenarios: Sequence, terms: dict[str, float]) -> list:
    """`scenarios` with `terms` set over their own `[terms]`, or a one-line error."""
    from rack.wiring.scenario import ScenarioError

    if not terms:
        return list(scenarios)
    out = []
    for sc in scenarios:
        try:
            out.append(sc.with_overrides(terms={**sc.terms, **terms}))
        except ScenarioError as exc:
            fail(f"--term: {exc}")
    return out
