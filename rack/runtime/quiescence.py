"""Quiescence that cannot wait on a phantom: the check, after (and at the end of)
every run, that no component holds work for a request that has ended.

Every piece of per-request work a core holds (a transfer in flight, a KV reservation,
a handoff waiting for a retry) belongs to a request that is still open: the protocol
releases it before or when the request ends, whatever fault ended it (docs/robustness.md,
section 2). A core that breaks the rule would keep the rack busy after its last request
ended, and a driver waiting for every core to be idle would wait on a phantom until its
deadline (issue 37: a Ray fault storm left "1 transfer(s) in flight (e.g. request 9)"
after every request had ended, and the run failed at its deadline with nothing written).

So both drivers ask each core that reports work (`held_requests()`, a driver read of the
engines and the interconnect) which requests it holds, and the collector which of them
have ended (`Collector.ended_among`). What is held for an ended request is a
violation of the protocol: it is released (the core's `release(now, ids)` handler frees
it, nobody is told) so the run still ends at once, and reported
(`results.emulation.held_after_end`, and one line per core in
`results.emulation.violations`), which the tests require to be empty.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

__all__ = ["ended_holds", "hold_violations"]


def ended_holds(held: Mapping[str, Iterable[int]],
                ended_among: Callable[[list[int]], list[int]]) -> dict[str, list[int]]:
    """{core: sorted ids} of the requests each core of `held` ({core: request ids it
    holds work for}) holds although they have ended; `ended_among(ids)` answers which
    of `ids` have ended (one call for every core's ids). Cores holding nothing for an
    ended request are left out."""
    held = {name: sorted(set(int(i) for i in ids)) for name, ids in held.items()}
    every = sorted(set().union(*held.values())) if held else []
    ended = set(ended_among(every)) if every else set()
    return {name: [i for i in ids if i in ended] for name, ids in held.items()
            if any(i in ended for i in ids)}


def hold_violations(found: Mapping[str, list[int]]) -> list[str]:
    """One line per core of `ended_holds`'s answer, for `results.emulation.violations`."""
    return [f"{name} held work for {len(ids)} request(s) after they ended, e.g. {ids[:5]} (released)"
            for name, ids in sorted(found.items())]
