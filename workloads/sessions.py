"""Sessions replayed turn by turn: the turns of each session (`Request.turn`) chained
in order, so that a runtime sends a turn only after the previous one ended (plus its
think time); and selections that keep sessions whole.

Plain functions on request lists (no numpy); `rack.serving.router.Router` uses
`session_chains` to schedule, a sweep uses `take_sessions` to size a run.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from .request import Request


def _unit(r: Request, position: int) -> Hashable:
    """The session a request belongs to: its turn's label, or itself (no turn)."""
    return r.turn.session if r.turn is not None else ("request", position)


def session_chains(requests: Sequence[Request]) -> tuple[list[int], list[int]]:
    """(heads, chain) of `requests` (a list in the order the runtime holds them).

    heads: the position of each session's first turn, ordered by (its arrival_s, its
    position): the order in which sessions start. chain[p]: the position of the turn
    that follows the request at position p in its session, -1 for a session's last
    turn. Turns of a session are chained by (turn.index, position), so a session from
    which a selection dropped a turn still runs in order, the gap closed. A request
    without a turn is a session of one request. O(n log n).
    """
    members: dict[Hashable, list[tuple[int, int]]] = {}
    for p, r in enumerate(requests):
        members.setdefault(_unit(r, p), []).append((r.turn.index if r.turn is not None else 0, p))
    chain = [-1] * len(requests)
    heads = []
    for turns in members.values():
        turns.sort()
        for (_, a), (_, b) in zip(turns, turns[1:]):
            chain[a] = b
        heads.append(turns[0][1])
    heads.sort(key=lambda p: (requests[p].arrival_s, p))
    return heads, chain


def take_sessions(requests: Sequence[Request], n: int) -> list[Request]:
    """The requests of the first `n` sessions (in order of each one's first request in
    `requests`), whole; a request without a turn counts as one session. Order kept.
    Raises ValueError for n < 1."""
    if n < 1:
        raise ValueError(f"take_sessions: n must be >= 1, got {n}")
    kept: set = set()
    out = []
    for p, r in enumerate(requests):
        u = _unit(r, p)
        if u not in kept:
            if len(kept) >= n:
                continue
            kept.add(u)
        out.append(r)
    return out


def count_sessions(requests: Sequence[Request]) -> int:
    """Sessions among `requests` (a request without a turn counts as one)."""
    return len({_unit(r, p) for p, r in enumerate(requests)})


__all__ = ["count_sessions", "session_chains", "take_sessions"]
