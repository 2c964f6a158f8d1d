"""Sessions replayed turn by turn (`Request.turn`): each turn sent its think time after
the previous turn of its session ended, and with `max_concurrency` at most that many
sessions looping at once (virtual runtime)."""

from __future__ import annotations

import numpy as np
import pytest

from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import Request, Turn, session_chains, take_sessions


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("gpu-only-kimi-k2")


def _sessions(n_sessions: int, turns: int, think_s: float = 0.25, start_gap_s: float = 0.0):
    """Requests of `n_sessions` sessions of `turns` turns, listed turn-major (arrival
    order of an open-loop estimate), ids 0.. in that order."""
    rows = []
    for j in range(turns):
        for s in range(n_sessions):
            rows.append((s * start_gap_s + j * 1.0, s, j))
    rows.sort()
    return [Request(id=i, arrival_s=t, prompt_tokens=1500 + 400 * j, output_tokens=20 + s,
                    turn=Turn(f"s{s}", j, think_s * (1 + s) if j else 0.0))
            for i, (t, s, j) in enumerate(rows)]


def _by_session(reqs, cols):
    pos = {int(i): k for k, i in enumerate(cols["id"])}
    out: dict[str, list] = {}
    for r in reqs:
        k = pos[r.id]
        out.setdefault(r.turn.session, []).append((r.turn.index, cols["t_arrival"][k], cols["t_end"][k],
                                                   r.turn.think_time_s))
    return {s: sorted(v) for s, v in out.items()}


def test_each_turn_goes_its_think_time_after_the_previous_turn_ends(scenario):
    reqs = _sessions(3, 4, start_gap_s=0.1)
    out = run_scenario(scenario, reqs, runtime="virtual")
    assert out.results["requests"]["completed"] == 12
    for s, turns in _by_session(reqs, out.columns).items():
        assert turns[0][1] == pytest.approx(int(s[1:]) * 0.1, abs=1e-12)      # first turn: its arrival
        for (_, _, end_prev, _), (_, sent, _, think) in zip(turns, turns[1:]):
            assert sent == pytest.approx(end_prev + think, abs=1e-9)          # never before its answer


def test_max_concurrency_counts_sessions_not_requests(scenario):
    reqs = _sessions(5, 3, think_s=0.1)
    out = run_scenario(scenario, reqs, runtime="virtual", max_concurrency=2, think_time_s=0.05)
    sessions = _by_session(reqs, out.columns)
    spans = sorted((v[0][1], v[-1][2]) for v in sessions.values())
    # at most two sessions between a first turn's send and a last turn's end
    ev = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in ev])) == 2
    # sessions start in order; the third starts 0.05 s after the first session ends
    starts = sorted(v[0][1] for v in sessions.values())
    first_end = min(b for _, b in spans)
    assert starts[:2] == [0.0, 0.0] and starts[2] == pytest.approx(first_end + 0.05, abs=1e-9)


def test_a_refused_turn_does_not_stall_its_session(scenario):
    reqs = [Request(0, 0.0, 1000, 10, turn=Turn("a", 0)),
            Request(1, 0.5, 131072 + 10, 10, turn=Turn("a", 1, 0.1)),  # over Kimi-K2's context
            Request(2, 1.0, 1200, 10, turn=Turn("a", 2, 0.1))]
    out = run_scenario(scenario, reqs, runtime="virtual")
    r = out.results["requests"]
    assert (r["completed"], r["rejected"]) == (2, 1)
    assert r["rejected_by_reason"] == {"prompt_exceeds_context": 1}


def test_session_chains_and_take_sessions():
    reqs = _sessions(3, 2) + [Request(99, 0.5, 100, 5)]
    reqs.sort(key=lambda r: r.arrival_s)
    heads, chain = session_chains(reqs)
    assert [reqs[p].turn.session if reqs[p].turn else None for p in heads] == ["s0", "s1", "s2", None]
    for p, nxt in enumerate(chain):
        if nxt >= 0:
            assert reqs[nxt].turn.session == reqs[p].turn.session and reqs[nxt].turn.index == reqs[p].turn.index + 1
    kept = take_sessions(reqs, 2)
    assert {r.turn.session for r in kept} == {"s0", "s1"} and len(kept) == 4
