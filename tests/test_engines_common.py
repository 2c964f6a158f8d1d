"""Engine helpers: the step log, speculative-step arithmetic, long runs split into
bounded chunks, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.engines.common import GrowingArray, emitted_after, steps_for
from _engine_fakes import FakeCost, make_requests as _reqs, run_decode as _run


def test_growing_array_keeps_global_indices_after_dropping_head():
    g = GrowingArray(16)
    g.extend(np.arange(10.0))
    g.extend(np.arange(10.0, 100.0))
    assert len(g) == 100
    g.drop_before(60)
    assert g.base == 60 and len(g) == 100
    assert np.array_equal(g.slice(70, 73), [70.0, 71.0, 72.0])
    g.extend(np.array([100.0]))
    assert g.slice(99, 101).tolist() == [99.0, 100.0]
    with pytest.raises(IndexError):
        g.slice(59, 61)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([1.0, 1.5, 2.0, 2.5, 3.0, 1 / 0.3, 3.439, 4.999]))
def test_steps_for_is_the_fewest_steps_emitting_n(n, tps):
    s = steps_for(n, tps)
    assert emitted_after(s, n, tps) == n
    if s > 0:
        assert emitted_after(s - 1, n, tps) < n
    # every step emits at least one token, at most ceil(tps)
    e = emitted_after(np.arange(s + 1), n, tps)
    q = np.diff(e)
    assert np.all(q >= 1) and np.all(q <= int(np.ceil(tps)))
    arr = steps_for(np.array([n, n + 1]), tps)
    assert arr[0] == s and arr[1] >= s


def test_long_runs_are_split_and_the_step_log_is_compacted():
    reqs = _reqs([20_001, 30_000, 50])
    eng, col, stats = _run(reqs, max_steps_per_wake=1000)
    assert stats["steps"] == 29_999
    assert stats["wakeups"] >= 30 and stats["wakeups"] <= 40
    assert eng._t_end.base > 0                                  # old steps forgotten
    for r in reqs:
        o = col.outcomes[r.id]
        assert o["itl_s"].shape == (r.output_tokens - 1,)
        assert np.mean(o["itl_s"]) == pytest.approx(o["t"] / (r.output_tokens - 1), rel=1e-9)


def test_runs_are_deterministic():
    reqs = _reqs([5, 50, 500, 77])
    arrivals = [0.0, 0.011, 0.0123, 0.5]
    a = _run(reqs, cost=FakeCost(tokens_per_step=1.7), arrivals=arrivals, policy="preempt")[1]
    b = _run(reqs, cost=FakeCost(tokens_per_step=1.7), arrivals=arrivals, policy="preempt")[1]
    assert a.events_log == b.events_log
    for rid in a.outcomes:
        assert a.outcomes[rid]["t"] == b.outcomes[rid]["t"]
        assert np.array_equal(a.outcomes[rid]["itl_s"], b.outcomes[rid]["itl_s"])
