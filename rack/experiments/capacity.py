"""Capacity by bisection over a rate ladder, with early stopping.

A deployment's capacity is the highest rung of a rate ladder whose SLO attainment
reaches the target, scanning up from the lowest until the first miss
(`rack.experiments.sweep.max_sustainable_rate`, DistServe's goodput). Walking the whole
ladder runs every rung; the overloaded ones, whose queues grow without bound, are the
slowest runs and carry the least information. When attainment falls monotonically
with rate, bisection finds the same rung in ceil(log2(rungs + 1)) runs:

- the search keeps `lo` (highest rung known to pass, -1 before any) and `hi` (lowest
  rung known to miss, len(ladder) before any) and runs the rung halfway between until
  they are neighbours; the answer is rung `lo` (None if -1; "every rate tried held"
  when `hi` is past the top, i.e. the top rung itself passed);
- each run stops as soon as its miss is certain (`rack.experiments.slo_watch.SloWatch`:
  more than 1 - target of the submitted requests have already missed), so an
  overloaded rung costs a fraction of its full replay. A passing run always runs to
  its end: the figures at capacity (tokens/J, $/Mtok) are read from it;
- afterwards the measured points are checked against monotonicity: attainment may not
  rise with rate by more than `MONOTONE_TOLERANCE` (a run stopped early counts with its
  upper bound). Where a pair contradicts it, every rung below `hi` not yet measured is
  run ("the ladder walked"), so the answer is the full ladder's again, and the search
  record says so. A point that failed to run (an error) also falls back to the walk.

Every deployment's search runs on one pool (`rack.runtime.run_pool`): the next rung of
one deployment starts as soon as its previous run ends, whatever the others do.
`capacity_sweep` returns a `rack.experiments.sweep.SweepResult` like `rate_sweep`'s, with
a "search" entry per deployment in its summary.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rack.experiments.sweep import (DEFAULT_ATTAINMENT_TARGET, SweepResult, Task, Workload, rate_summary,
                                 not_run, run_task)
from rack.wiring.scenario import Scenario

#: Largest rise of SLO attainment with rate still taken as noise (a share of the
#: requests): the shipped study's full ladders rose by at most 0.0007 between
#: neighbouring rungs (one request of 1,750), never across the target.
MONOTONE_TOLERANCE = 0.005

SEARCHES = ("bisect", "ladder")


class _Search:
    """One deployment's search over `rungs` (sorted rates)."""

    def __init__(self, scenario: Scenario, rungs: Sequence[float], target: float, method: str) -> None:
        self.scenario = scenario
        self.rungs = list(rungs)
        self.target = target
        self.lo, self.hi = -1, len(self.rungs)
        self.points: dict[int, dict] = {}
        self.walk = method == "ladder"
        self.note = "" if method == "bisect" else "every rung run (--search ladder)"

    def first(self) -> list[int]:
        return list(range(len(self.rungs))) if self.walk else [self._mid()]

    def _mid(self) -> int:
        return (self.lo + self.hi) // 2

    def passes(self, p: dict) -> bool:
        return "error" not in p and p["slo_attainment"] >= self.target

    def record(self, i: int, p: dict) -> list[int]:
        """Record rung i's point; the rungs to run next (empty: nothing more)."""
        self.points[i] = p
        if self.walk:
            return []
        if "error" in p:
            return self._fall_back(f"rung {self.rungs[i]:g} could not run ({p['error'][:80]})", everything=True)
        if self.passes(p):
            self.lo = i
        else:
            self.hi = i
        if self.hi - self.lo > 1:
            return [self._mid()]
        bad = self._contradiction()
        return self._fall_back(f"not monotone ({bad})") if bad else []

    def _contradiction(self) -> str:
        """A pair of measured rungs whose attainment rises with rate beyond the tolerance."""
        pts = sorted(self.points.items())
        for a, (i, p) in enumerate(pts):
            hi_i = p.get("stopped_early", {}).get("attainment_bound", p["slo_attainment"]) \
                if p.get("stopped_early", {}).get("verdict") == "failed" else p["slo_attainment"]
            for j, q in pts[a + 1:]:
                lo_j = 0.0 if q.get("stopped_early", {}).get("verdict") == "failed" else q["slo_attainment"]
                if lo_j > hi_i + MONOTONE_TOLERANCE:
                    return (f"attainment rises from {hi_i:.4f} at {self.rungs[i]:g} to {lo_j:.4f} at "
                            f"{self.rungs[j]:g}")
        return ""

    def _fall_back(self, why: str, everything: bool = False) -> list[int]:
        """Walk the ladder: every rung not yet run below the first miss found (all
        of them after an error, where no miss bounds the walk)."""
        self.walk = True
        self.note = f"{why}: the ladder walked" + ("" if everything else " below the first miss")
        top = len(self.rungs) if everything else self.hi
        return [i for i in range(top) if i not in self.points]

    def summary(self) -> dict:
        stopped = sum(1 for p in self.points.values() if p.get("stopped_early"))
        return {"method": "ladder" if self.walk else "bisection", "rungs": len(self.rungs),
                "runs": len(self.points), "stopped_early": stopped, "note": self.note}


def capacity_sweep(scenarios: Sequence[Scenario], workload: Workload, rate_scales: Sequence[float], *,
                   target: float = DEFAULT_ATTAINMENT_TARGET, base_rate: Optional[float] = None,
                   workers: int = 2, address: Optional[str] = None, progress: bool = True,
                   absolute: bool = False, search: str = "bisect", early_stop: bool = True) -> SweepResult:
    """Each scenario's capacity on `workload` over the ladder `rate_scales` (module docstring).

    Arguments as `rack.experiments.sweep.rate_sweep`'s; search: "bisect" or "ladder"
    (every rung, as rate_sweep); early_stop: end each run once its miss is certain.
    Returns a SweepResult of kind "rate" whose points are the rungs run (a point cut
    short carries "stopped_early": its verdict, reason and attainment bound; its other
    figures cover only what ran) and whose summary is `rate_summary`'s plus "search":
    {scenario: {"method" ("bisection" | "ladder"), "rungs", "runs", "stopped_early",
    "note" (why the ladder was walked)}} and "early_stop". Raises ValueError for an
    unknown `search` or an empty ladder.
    """
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rack.runtime import run_pool
    from rack.runtime.interrupt import current_stop
    from rack.runtime.parallel import RunsStopped

    if search not in SEARCHES:
        raise ValueError(f"search: expected one of {', '.join(SEARCHES)}, got {search!r}")
    rungs = sorted({float(r) for r in rate_scales})
    if not rungs or not all(math.isfinite(r) and r > 0 for r in rungs):
        raise ValueError(f"rate_scales: expected finite rates > 0, got {list(rate_scales)!r}")
    searches = [_Search(s, rungs, target, search) for s in scenarios]
    shared = run_pool.current() if address is None else None
    pool = shared or run_pool.RunPool(workers, address)
    inflight: dict[int, tuple[_Search, int]] = {}

    def launch(s: _Search, i: int) -> None:
        r = s.rungs[i]
        task = Task(s.scenario.model_dump(mode="json"), workload, rate_scale=r,
                    labels={"scenario": s.scenario.name, "rate_scale": r,
                            "rate_per_s": r * base_rate if base_rate else None},
                    early_stop=target if early_stop else None)
        inflight[pool.submit(run_task, task)] = (s, i)

    bar = Progress(TextColumn("capacity search"), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True, disable=not progress)
    try:
        with bar:
            tid = bar.add_task("capacity search", total=None)
            for s in searches:
                for i in s.first():
                    launch(s, i)
            done = 0
            while inflight:
                try:
                    ticket, res = pool.next_done()
                except (RunsStopped, KeyboardInterrupt) as exc:
                    # a signal (rack.runtime.interrupt): keep the rungs that finished, mark
                    # the ones in flight, start no more
                    pool.cancel()
                    if isinstance(exc, KeyboardInterrupt) and current_stop() is None:
                        raise
                    for s, i in inflight.values():
                        s.points[i] = not_run({"scenario": s.scenario.name, "rate_scale": s.rungs[i],
                                               "rate_per_s": s.rungs[i] * base_rate if base_rate else None})
                    inflight.clear()
                    break
                s, i = inflight.pop(ticket)
                if isinstance(res, BaseException):
                    res = {"scenario": s.scenario.name, "rate_scale": s.rungs[i],
                           "error": f"{type(res).__name__}: {res}"}
                for j in s.record(i, res):
                    launch(s, j)
                done += 1
                bar.update(tid, completed=done)
    finally:
        if shared is None:
            pool.close()
    points = [p for s in searches for _, p in sorted(s.points.items())]
    summary = rate_summary(scenarios, points, target, base_rate)
    summary["search"] = {s.scenario.name: s.summary() for s in searches}
    summary["early_stop"] = bool(early_stop)
    return SweepResult("rate", "rate_per_s" if absolute else "rate_scale", points, summary, workload.describe())


__all__ = ["MONOTONE_TOLERANCE", "SEARCHES", "capacity_sweep"]
