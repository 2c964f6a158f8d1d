"""Early stopping: end a virtual run as soon as its SLO verdict is decided.

A capacity search only needs to know whether a run's SLO attainment (requests meeting
both targets / submitted, `rack.measure.metrics`) reaches the target. An overloaded
run, whose queue grows without bound, is the slowest to replay and its verdict is
known long before its last request ends: once more than (1 - target) of the
submitted requests have certainly missed, no later request can lift the attainment
back to the target.

`SloWatch` is a `rack.runtime.interrupt.StopRequest` that the collector feeds
(`attach`): every first token and every request's end. A request has certainly
missed when its first token came later than the TTFT target after its arrival, when
it completed with a TPOT above the target, or when it was rejected or failed. Only
certain misses count, so a run stopped by the watch would have failed had it run on:
the verdict is the full run's. (Requests still waiting for their first token past
the deadline are not counted: engines report a batch's events after its run, so a
first token can still arrive with an earlier time stamp.)

`decide_pass=True` also stops a run whose pass is certain (enough requests met the
SLO that the rest cannot pull it under the target). A capacity search leaves it off:
the figures read at capacity (tokens/J, $/Mtok) come from that very run, which must
therefore be complete.

The comparisons reproduce `rack.measure.metrics`' definitions exactly, with a
relative margin of 1e-9 against float rounding, so that a request counts as missed
only when metrics would say so too.
"""

from __future__ import annotations

from typing import Any, Sequence

from rack.runtime.interrupt import StopRequest

#: Relative margin on the TTFT and TPOT comparisons: a miss must be beyond rounding.
MARGIN = 1e-9

#: `StopRequest.signal_name` of a run stopped because its verdict was decided.
FAILED = "slo_failed"
PASSED = "slo_passed"


class SloWatch(StopRequest):
    """Asks the replay to stop once its SLO verdict is decided (module docstring).

    requests: the run's requests (every one counted in the attainment's denominator).
    ttft_s, tpot_s: the scenario's SLO targets (s); offset_s: the fixed stages' delays
        added to every first token (`rack.measure.breakdown.apply_fixed_stages`:
        "before" + "after" stages, s).
    target: the SLO attainment a run must reach (0 < target <= 1), e.g. 0.9.
    decide_pass: also stop when the pass is certain.
    After the run: `decided` (None, "slo_failed" or "slo_passed"), `missed`, `met`,
    `submitted`, `t_s` (emulated s of the decision) and `record()` for the results.
    Raises ValueError for a target outside (0, 1] or negative targets.
    """

    def __init__(self, requests: Sequence[Any], *, ttft_s: float, tpot_s: float, target: float,
                 offset_s: float = 0.0, decide_pass: bool = False) -> None:
        super().__init__()
        if not (0.0 < target <= 1.0):
            raise ValueError(f"SloWatch: target must be in (0, 1], got {target!r}")
        if ttft_s < 0 or tpot_s < 0:
            raise ValueError(f"SloWatch: SLO targets must be >= 0 s, got TTFT {ttft_s!r}, TPOT {tpot_s!r}")
        self.ttft_limit = ttft_s * (1 + MARGIN) + 1e-12
        self.tpot_limit = tpot_s * (1 + MARGIN) + 1e-12
        self.offset_s = float(offset_s)
        self.target = float(target)
        self.decide_pass = bool(decide_pass)
        self.submitted = len(requests)
        self._outputs = {int(r.id): int(r.output_tokens) for r in requests}
        self._missed: set[int] = set()
        self.met = 0
        self.decided: str | None = None
        self.t_s: float | None = None
        self._now = 0.0

    @classmethod
    def for_scenario(cls, scenario: Any, requests: Sequence[Any], target: float, **kw: Any) -> "SloWatch":
        """A watch with `scenario`'s SLO targets and fixed stages (a `rack.wiring.scenario.Scenario`)."""
        offset = sum(s.latency_ms for s in scenario.fixed_stages) / 1e3
        return cls(requests, ttft_s=scenario.slo.ttft_ms / 1e3, tpot_s=scenario.slo.tpot_ms / 1e3,
                   target=target, offset_s=offset, **kw)

    @property
    def missed(self) -> int:
        """Requests certainly missing the SLO so far."""
        return len(self._missed)

    def attach(self, collector: Any) -> None:
        """Be told of `collector`'s first tokens and ends (`rack.serving.collector.Collector.watch`)."""
        collector.watch = self

    # ------------------------------------------------------------------ collector hooks
    def first_token(self, request_id: int, t: float, arrival: float) -> None:
        """The first output token of `request_id` was recorded at emulated `t` (s)."""
        if (t + self.offset_s) - arrival > self.ttft_limit:
            self._miss(request_id, t)

    def ended(self, request_id: int, outcome: str, arrival: float, first: float, completion: float,
              served: int | None) -> None:
        """`request_id` ended: `outcome`, and its recorded arrival, first token and
        completion times (s; NaN: none); `served`: output tokens if truncated."""
        if request_id in self._missed:
            return
        if outcome != "completed":
            self._miss(request_id, completion)
            return
        ttft = (first + self.offset_s) - arrival
        n = self._outputs.get(request_id, 0) if served is None else served
        if not ttft <= self.ttft_limit:           # NaN (no first token) misses too
            self._miss(request_id, completion)
            return
        if n >= 2 and not ((completion - first) / (n - 1) <= self.tpot_limit):
            self._miss(request_id, completion)
            return
        self.met += 1
        if self.decide_pass and self.decided is None and self.met / self.submitted >= self.target:
            self._decide(PASSED, completion)

    # ------------------------------------------------------------------ internals
    def _miss(self, request_id: int, t: float) -> None:
        self._missed.add(int(request_id))
        # attainment <= (submitted - missed) / submitted, computed as metrics computes it
        if self.decided is None and (self.submitted - len(self._missed)) / self.submitted < self.target:
            self._decide(FAILED, t)

    def _decide(self, verdict: str, t: float) -> None:
        self.decided = verdict
        self.t_s = float(t) if t == t else None
        self.request(verdict)

    def record(self) -> dict | None:
        """{"verdict": "failed" | "passed", "reason", "t_s", "missed", "met", "submitted",
        "attainment_bound" (an upper bound for a fail, a lower one for a pass)}, or None
        if the run was not stopped by this watch."""
        if self.decided is None:
            return None
        failed = self.decided == FAILED
        bound = (self.submitted - self.missed) / self.submitted if failed else self.met / self.submitted
        reason = (f"{self.missed} of {self.submitted} requests had already missed the SLO: attainment "
                  f"<= {bound:.4f} < target {self.target:g}" if failed else
                  f"{self.met} of {self.submitted} requests had already met the SLO: attainment "
                  f">= {bound:.4f} >= target {self.target:g}")
        return {"verdict": "failed" if failed else "passed", "reason": reason, "t_s": self.t_s,
                "missed": self.missed, "met": self.met, "submitted": self.submitted, "attainment_bound": bound}


__all__ = ["FAILED", "MARGIN", "PASSED", "SloWatch"]
