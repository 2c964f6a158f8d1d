"""Requests from a workload file (`WorkloadSpec`): a mixture of clients, each with its
rate schedule, gap shape, lengths, reasoning share and sessions.

Per client and window: arrival times from `workloads.arrivals.window_times` (exactly
round(rate x window) arrivals when the file's `exact_counts` is true, else a
stationary renewal process); each arrival is a request, or for a client with
`session` the first turn of a session whose later turns follow after think times
(`workloads.prefix.conversation_turns`), with block hashes from one `PrefixHasher`
(system prompts are shared within a client, never across clients). A session's turns
use the lengths of the window it started in; turns at or after the workload's end are
dropped. A session with `think_after = "answer"` is replayed turn by turn: its requests
carry `Request.turn` (label "<client>/<session number>", the think time before each
turn) and are kept whole once the session started before the end. Lengths: for a
client without sessions `input_tokens` is the prompt; with sessions it is each turn's
new user message (the prompt also holds the system prompt, the session's initial
context and the history). reasoning_tokens = round(share x output_tokens).

Seeding: the seed is split (``SeedSequence.spawn``) into one stream per client, and
each of those into arrivals / lengths / reasoning / sessions, so editing one client
does not move another's requests. Ids are 0..n-1 in arrival order (ties: client
order, then session, then turn); `tenant` is the client's name, `slo_class` its
`slo_class`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .arrivals import (ConstantArrivals, GammaArrivals, PoissonArrivals, WeibullArrivals,
                       window_times)
from .prefix import PrefixHasher, conversation_turns, renumber_hashes, zipf_choice
from .replay import RequestList
from .request import Request, Turn
from .synth import check_generated
from .workload_spec import (Client, ShareFixed, ShareUniform, WorkloadSpec, token_distribution)


@dataclass(frozen=True)
class ClientWindow:
    """One window of one client, fully resolved: [start_s, end_s), rate, gap process
    (at that rate, or None when the rate is 0), token distributions and share spec."""

    client: int
    start_s: float
    end_s: float
    rate_per_s: float
    process: Any
    input_tokens: Any
    output_tokens: Any
    reasoning_share: Any


def _process(kind: str, rate: float, cv: float | None, shape: float | None):
    if rate <= 0:
        return None
    if kind == "gamma":
        return GammaArrivals(rate, cv)
    if kind == "weibull":
        return WeibullArrivals(rate, shape=shape) if shape is not None else WeibullArrivals(rate, cv=cv)
    if kind == "constant":
        return ConstantArrivals(rate)
    return PoissonArrivals(rate)


def client_windows(spec: WorkloadSpec, index: int, end_s: float) -> list[ClientWindow]:
    """The resolved windows of client `index`, cut at `end_s`."""
    c: Client = spec.clients[index]
    if c.rate_per_s is not None:
        raw = [(0.0, c.rate_per_s, None)]
    elif c.rates is not None:
        raw = [(i * spec.window_s, r, None) for i, r in enumerate(c.rates)]
    else:
        raw = [(w.start_s, w.rate_per_s, w) for w in c.windows]
    out = []
    for i, (start, rate, w) in enumerate(raw):
        if i + 1 < len(raw):
            stop = raw[i + 1][0]
        else:  # a schedule's last window lasts window_s; a constant rate lasts to the end
            stop = math.inf if c.rate_per_s is not None else start + spec.window_s
        stop = min(stop, end_s)
        if stop <= start:
            continue
        own = w is not None and w.arrival is not None
        kind = (w.arrival if own else c.arrival) or "poisson"
        cv = w.cv if (w is not None and w.cv is not None) else (None if own else c.cv)
        shape = w.shape if (w is not None and w.shape is not None) else (None if own else c.shape)
        pick = (lambda name: getattr(w, name) if w is not None and getattr(w, name) is not None
                else getattr(c, name))
        share = pick("reasoning_share")
        out.append(ClientWindow(index, float(start), float(stop), float(rate),
                                _process(kind, rate, cv, shape),
                                token_distribution(pick("input_tokens")),
                                token_distribution(pick("output_tokens")), share))
    return out


def _shares(share: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if share is None:
        return np.zeros(n)
    if isinstance(share, ShareFixed):
        return np.full(n, share.value)
    if isinstance(share, ShareUniform):
        return rng.uniform(share.min, share.max, n)
    keys = sorted(share.pmf, key=float)
    p = np.array([share.pmf[k] for k in keys])
    return np.array([float(k) for k in keys])[rng.choice(len(keys), n, p=p / p.sum())]


def _client_rows(spec: WorkloadSpec, index: int, end_s: float, exact: bool,
                 seq: np.random.SeedSequence, hasher: PrefixHasher) -> list[tuple]:
    """(arrival_s, client, session, turn, prompt, output, reasoning, hashes, Turn or None) rows."""
    c = spec.clients[index]
    rng_arr, rng_len, rng_share, rng_sess = (np.random.default_rng(s) for s in seq.spawn(4))
    s = c.session
    rows: list[tuple] = []
    session_no = 0
    for w in client_windows(spec, index, end_s):
        if w.process is None:
            continue
        starts = window_times(w.process, w.start_s, w.end_s, exact=exact, seed=rng_arr)
        n = starts.size
        if n == 0:
            continue
        if s is None:
            prompt, output = w.input_tokens.draw(n, rng_len), w.output_tokens.draw(n, rng_len)
            reason = np.rint(_shares(w.reasoning_share, n, rng_share) * output).astype(np.int64)
            for t, p, o, r in zip(starts.tolist(), prompt.tolist(), output.tolist(), reason.tolist()):
                rows.append((t, index, session_no, 0, p, o, r, None, None))
                session_no += 1
            continue
        turns = np.minimum(rng_sess.geometric(1.0 / s.turns_mean, n), s.max_turns)
        sys_of = zipf_choice(s.system_prompts, s.system_prompt_zipf, n, rng_sess)
        total = int(turns.sum())
        user, answer = w.input_tokens.draw(total, rng_len), w.output_tokens.draw(total, rng_len)
        reason = np.rint(_shares(w.reasoning_share, total, rng_share) * answer).astype(np.int64)
        think = _think_times(s, total, rng_sess)
        # drawn last, and only when asked for: the other draws stay as they were
        context = (token_distribution(s.initial_context_tokens).draw(n, rng_sess).tolist()
                   if s.initial_context_tokens is not None else [0] * n)
        chained = s.think_after == "answer"
        k = 0
        for t0, nt, sp, h0 in zip(starts.tolist(), turns.tolist(), sys_of.tolist(), context):
            if s.max_prompt_tokens is not None:     # the first turn must fit: cut its context
                h0 = max(0, min(h0, s.max_prompt_tokens - s.system_prompt_tokens - int(user[k])))
            label = f"{c.name}/{session_no}"
            for j, (t, p, o) in enumerate(conversation_turns(
                    t0, user[k:k + nt], answer[k:k + nt], think[k:k + nt],
                    s.system_prompt_tokens, s.max_prompt_tokens, h0)):
                # a chained session started before the end is kept whole (its later
                # turns' times are estimates: they go when the previous turn ends)
                if t >= end_s and not chained:
                    break
                h = hasher.hashes(p, s.system_prompt_tokens, (index, sp), (index, session_no))
                turn = Turn(label, j, float(think[k + j - 1]) if j else 0.0) if chained else None
                rows.append((t, index, session_no, j, p, o, int(reason[k + j]), h, turn))
            k += nt
            session_no += 1
    return rows


def _think_times(s: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` think times (s) of session spec `s`: exponential with mean `think_time_s`, or
    log-normal with that mean and CV `think_time_cv` (heavy-tailed tool latencies)."""
    if s.think_time_s <= 0:
        return np.zeros(n)
    if s.think_time_cv is None:
        return rng.exponential(s.think_time_s, n)
    sigma2 = math.log1p(s.think_time_cv ** 2)
    return rng.lognormal(math.log(s.think_time_s) - sigma2 / 2, math.sqrt(sigma2), n)


def _check_size(spec: WorkloadSpec, end_s: float, where: str) -> None:
    """Raise ValueError naming the client when the expected number of requests (rate x
    window length, x the mean turns of a session client) is above
    `synth.MAX_GENERATED_REQUESTS`, before anything is drawn."""
    total = 0.0
    for i, c in enumerate(spec.clients):
        # a geometric number of turns capped at max_turns: its mean is below both
        turns = min(c.session.turns_mean, c.session.max_turns) if c.session is not None else 1.0
        expected = sum(w.rate_per_s * (w.end_s - w.start_s) for w in client_windows(spec, i, end_s)) * turns
        total += expected
        check_generated(total, f"{where}: clients[0..{i}] (up to {c.name!r}), their rates over {end_s:g} s,")


def generate_workload(spec: WorkloadSpec, *, seed: int | None = None,
                      duration_s: float | None = None, source: str | None = None) -> RequestList:
    """The requests of `spec` (see the module docstring), up to `duration_s` (default:
    the spec's `end_s`), seeded by `seed` (default: the spec's). Returns a
    `RequestList` (name = `source` or the spec's name). Raises ValueError on a bad
    duration or when it would generate more than `synth.MAX_GENERATED_REQUESTS`."""
    seed = spec.seed if seed is None else int(seed)
    end_s = spec.end_s if duration_s is None else float(duration_s)
    if not (math.isfinite(end_s) and end_s > 0):
        raise ValueError(f"duration must be a finite number of seconds > 0, got {end_s}")
    _check_size(spec, end_s, source or spec.name)
    hasher = PrefixHasher(spec.block_size)
    seqs = np.random.SeedSequence(seed).spawn(len(spec.clients))
    rows: list[tuple] = []
    for i, seq in enumerate(seqs):
        rows.extend(_client_rows(spec, i, end_s, spec.exact_counts, seq, hasher))
    rows.sort(key=lambda r: r[:4])
    names = [c.name for c in spec.clients]
    slo = [c.slo_class for c in spec.clients]
    reqs = renumber_hashes(Request(i, t, p, o, h, spec.block_size, names[c], slo[c], r, turn)
                           for i, (t, c, _, _, p, o, r, h, turn) in enumerate(rows))
    return RequestList(reqs, name=source or spec.name, path=source, format="workload",
                       controls={"seed": seed, "duration_s": end_s,
                                 "exact_counts": spec.exact_counts})


def realised_windows(spec: WorkloadSpec, requests: Sequence[Request], *,
                     duration_s: float | None = None) -> list[dict]:
    """Per client and window: the file's rate and mean lengths beside what `requests`
    realised (requests of that client, by `tenant`, arriving in the window).

    Rows: {client, start_s, end_s, rate_per_s, realised_rate_per_s, requests,
    input_mean, realised_input_mean, output_mean, realised_output_mean,
    reasoning_share_realised, sessions}. For a session client the file's rate is the
    rate of new sessions (later turns add requests) and input_mean is the new user
    message per turn, so only the output mean compares directly.
    """
    end_s = spec.end_s if duration_s is None else float(duration_s)
    by_client: dict[str, list[Request]] = {}
    for r in requests:
        by_client.setdefault(r.tenant, []).append(r)
    rows = []
    for i, c in enumerate(spec.clients):
        mine = by_client.get(c.name, [])
        t = np.array([r.arrival_s for r in mine])
        p = np.array([r.prompt_tokens for r in mine])
        o = np.array([r.output_tokens for r in mine])
        z = np.array([r.reasoning_tokens for r in mine])
        for w in client_windows(spec, i, end_s):
            sel = (t >= w.start_s) & (t < w.end_s) if t.size else np.zeros(0, bool)
            n = int(sel.sum())
            rows.append({
                "client": c.name, "start_s": w.start_s, "end_s": w.end_s,
                "rate_per_s": w.rate_per_s, "realised_rate_per_s": n / (w.end_s - w.start_s),
                "requests": n, "sessions": c.session is not None,
                "input_mean": w.input_tokens.mean,
                "realised_input_mean": float(p[sel].mean()) if n else None,
                "output_mean": w.output_tokens.mean,
                "realised_output_mean": float(o[sel].mean()) if n else None,
                "reasoning_share_realised": float(z[sel].sum() / o[sel].sum()) if n else None,
            })
    return rows
