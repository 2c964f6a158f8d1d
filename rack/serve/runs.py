"""Per-run figures of `rack serve` in the client's clock (pure functions, no I/O).

A benchmark client reports the throughput of *its* run: requests completed over the
wall seconds from its first request to its last response. A server session may hold
several such runs with idle time between them, and its whole-session figures (over
emulated seconds, from the rack's first arrival to its last event) match none of
them. So the front's rows (`rack.serve.frontend.LiveFront.records`, one per request
that reached the rack) are grouped into runs two ways:

- **idle-separated runs** (`split_runs`): a new run starts at a request received when
  nothing was in flight for at least `IDLE_GAP_S` wall seconds (every earlier
  response had ended that long before);
- **windows** a user opens and closes (`POST /rack/runs`, `POST /rack/runs/{id}/close`):
  the requests received between the two.

`run_figures` gives each run's figures twice: in wall seconds (what the client's report
shows) and in emulated seconds (wall / dilation: what the emulated rack did, comparable
with `rack run`). A request meets the SLO when completed with the rack's recorded TTFT
(emulated) <= the SLO's TTFT and its mean time per output token <= the SLO's TPOT, as
`rack.measure.metrics` judges a run; goodput is such requests per second.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: Wall seconds with nothing in flight that end a client run (a benchmark client's
#: warm-up pause or the gap between two invocations is longer; its own requests of
#: one run overlap or follow within milliseconds).
IDLE_GAP_S = 5.0


def split_runs(rows: Sequence[dict], idle_gap_s: float = IDLE_GAP_S) -> list[list[dict]]:
    """The rows grouped into idle-separated runs (module docstring), in order of
    receipt. Each row needs `received_wall_s` and `ended_wall_s` (wall clock, s)."""
    runs: list[list[dict]] = []
    busy_until = -math.inf
    for r in sorted(rows, key=lambda r: r["received_wall_s"]):
        if not runs or r["received_wall_s"] > busy_until + idle_gap_s:
            runs.append([])
        runs[-1].append(r)
        busy_until = max(busy_until, r.get("ended_wall_s") or r["received_wall_s"])
    return runs


def _median(x: list[float]) -> float | None:
    return float(np.median(x)) if x else None


def run_figures(rows: Sequence[dict], dilation: float, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """One run's figures (module docstring): {"requests", "completed", "failed",
    "wall_s" (first receipt to last response end), "emulated_s" (wall_s / dilation),
    "throughput": {"requests_per_s", "output_tokens_per_s"} in wall seconds,
    "throughput_emulated": the same per emulated second, "goodput": {"requests_per_s"
    (wall), "requests_per_emulated_s", "slo_attainment", "slo": {"ttft_s", "tpot_s"}},
    "ttft_p50_s" / "tpot_p50_s" (the rack's records, emulated s) and "ttft_p50_wall_s" /
    "tpot_p50_wall_s" (x dilation: what a client should measure)}. Empty rows give zeros
    and None medians. dilation: wall s per emulated s (> 0)."""
    done = [r for r in rows if r.get("outcome") == "completed"]
    start = min((r["received_wall_s"] for r in rows), default=0.0)
    end = max((r.get("ended_wall_s") or r["received_wall_s"] for r in rows), default=0.0)
    wall = max(0.0, end - start)
    ttft, tpot, good = [], [], 0
    for r in done:
        a, f, c = r.get("t_arrival_s"), r.get("t_first_token_s"), r.get("t_completion_s")
        if a is None or f is None:
            continue
        ttft.append(f - a)
        n = int(r.get("output_tokens") or 0)
        per_token = (c - f) / (n - 1) if c is not None and n > 1 else None
        if per_token is not None:
            tpot.append(per_token)
        good += (f - a) <= slo_ttft_s and (per_token is None or per_token <= slo_tpot_s)
    out_tokens = sum(int(r.get("output_tokens") or 0) for r in done)
    rate = lambda n, s: n / s if s > 0 else 0.0  # noqa: E731
    emulated = wall / dilation
    m_ttft, m_tpot = _median(ttft), _median(tpot)
    return {
        "requests": len(rows), "completed": len(done), "failed": len(rows) - len(done),
        "wall_s": wall, "emulated_s": emulated,
        "throughput": {"requests_per_s": rate(len(done), wall), "output_tokens_per_s": rate(out_tokens, wall)},
        "throughput_emulated": {"requests_per_s": rate(len(done), emulated),
                                "output_tokens_per_s": rate(out_tokens, emulated)},
        "goodput": {"requests_per_s": rate(good, wall), "requests_per_emulated_s": rate(good, emulated),
                    "slo_attainment": good / len(rows) if rows else 0.0,
                    "slo": {k: v if math.isfinite(v) else None           # JSON has no inf
                            for k, v in (("ttft_s", slo_ttft_s), ("tpot_s", slo_tpot_s))}},
        "ttft_p50_s": m_ttft, "tpot_p50_s": m_tpot,
        "ttft_p50_wall_s": None if m_ttft is None else m_ttft * dilation,
        "tpot_p50_wall_s": None if m_tpot is None else m_tpot * dilation,
    }


def _deviation(observed: list[float], recorded: list[float]) -> float | None:
    """median(observed) / median(recorded) - 1, or None without samples."""
    if not observed or not recorded:
        return None
    ref = float(np.median(recorded))
    return float(np.median(observed)) / ref - 1.0 if ref > 0 else None


def client_agreement(rows: Sequence[dict], dilation: float) -> dict:
    """What the clients of the completed streamed responses among `rows` measured,
    against rack's records: {"compared" (responses), "ttft_dev", "tpot_dev" (median
    TTFT and time per output token as a client measures them, over rack's recorded
    ones x dilation, minus 1; None without samples), "tpot_wall_s" (rack's median time
    per output token x dilation)}. A client's side is measured at the front as the
    chunks leave: TTFT from the HTTP receipt to the first chunk, time per output token
    from the first chunk to the last over the tokens after the first (as GuideLLM,
    AIPerf and inference-perf compute them; the network adds the same on both ends).
    A stream whose client went away before its last token counts for TTFT only."""
    obs_ttft, rec_ttft, obs_tpot, rec_tpot = [], [], [], []
    for r in rows:
        first, last = r.get("first_chunk_wall_s"), r.get("last_chunk_wall_s")
        a, f, c = r.get("t_arrival_s"), r.get("t_first_token_s"), r.get("t_completion_s")
        if r.get("outcome") != "completed" or first is None or a is None or f is None:
            continue
        obs_ttft.append(first - r["received_wall_s"])
        rec_ttft.append((f - a) * dilation)
        n = int(r.get("output_tokens") or 0)
        # a client that went away saw only the first `tokens_sent` tokens: its time per
        # output token is not that of the whole response rack recorded
        whole = int(r.get("tokens_sent", n) or 0) >= n and not r.get("client_disconnected")
        if n > 1 and c is not None and whole:
            obs_tpot.append((last - first) / (n - 1))
            rec_tpot.append((c - f) * dilation / (n - 1))
    return {"compared": len(obs_ttft), "ttft_dev": _deviation(obs_ttft, rec_ttft),
            "tpot_dev": _deviation(obs_tpot, rec_tpot), "tpot_wall_s": _median(rec_tpot)}


def run_line(label: str, f: dict) -> str:
    """One line of `rack serve`'s summary for a run's figures (`run_figures`)."""
    t, te, g = f["throughput"], f["throughput_emulated"], f["goodput"]
    return (f"{label}: {f['completed']}/{f['requests']} completed over {f['wall_s']:.1f} wall s "
            f"({f['emulated_s']:.2f} emulated s): {t['requests_per_s']:.3g} req/s, "
            f"{t['output_tokens_per_s']:.4g} output tok/s wall ({te['requests_per_s']:.3g} req/s emulated); "
            f"goodput {g['requests_per_s']:.3g} req/s wall ({g['requests_per_emulated_s']:.3g} emulated), "
            f"SLO attainment {g['slo_attainment']:.0%}")


__all__ = ["IDLE_GAP_S", "client_agreement", "run_figures", "run_line", "split_runs"]
