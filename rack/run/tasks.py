"""`run_scenario` as a task of `rack.runtime.parallel.map_virtual_runs`: module-level
functions of one picklable item, so that a process pool or a Ray task can run them
by reference."""

from __future__ import annotations

from .runner import run_scenario


def virtual_results(item: tuple) -> dict:
    """A ready-made `fn` for `map_virtual_runs`: item = (scenario, requests) or
    (scenario, requests, trace_info); returns `run_scenario(..., runtime="virtual").results`
    (the results.json dict)."""
    scenario, requests, *rest = item
    return run_scenario(scenario, requests, runtime="virtual", trace_info=rest[0] if rest else None).results


def virtual_run_output(item: tuple):
    """Like `virtual_results` but returns the whole `RunOutput` (results, per-request
    columns, component stats, topology), for callers that need more than results.json.
    item may end with a dict of more `run_scenario` keyword arguments (a closed loop)."""
    scenario, requests, *rest = item
    return run_scenario(scenario, requests, runtime="virtual", trace_info=rest[0] if rest else None,
                        **(rest[1] if len(rest) > 1 else {}))
