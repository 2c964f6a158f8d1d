"""Chunked-prefill sizes from a TPOT target (the rule `chunk_tokens = "tpot"` applies).

A colocated engine's iteration is a decode step of its running batch with prompt chunks
piggybacked on it (vLLM's and Sarathi-Serve's chunked prefill: one token budget per
iteration shared by the decode tokens and the chunks). Every decoding user waits for the
whole iteration, so the iteration's time is the TPOT those users see while prompts are
being prefilled. Sarathi-Serve (Agrawal et al., OSDI 2024, section 4) picks the token
budget as the largest whose iterations stay within the TPOT SLO, profiled on the
hardware; rack prices the iterations with the cost model instead of a profile.

Two sizes, for a TPOT target T:
- `prompt_chunk_tokens` (vLLM's long_prefill_token_threshold: tokens one prompt may take
  of an iteration): the largest n whose chunk alone takes at most T / 2
  (`CostModel.mixed([n], [0], [])`). On a wafer a chunk is one stream through the layer
  regions, n tokens one after another (`CostModel._stream_prefill`), so this is what
  bounds a step's latency path: with the fitted 40.6 us per token and ~0.75 ms through
  Kimi-K2's 61 layers on 28 CS-3, T = 80 ms gives ~970 tokens per prompt per step
  instead of the 8,192-token chunk that held every decoding user for ~333 ms.
- `chunk_tokens` (the iteration's budget, vLLM's max_num_batched_tokens): the largest b
  such that b prompt tokens in chunks of that size (ceil(b / n) prompts at once, at most
  `max_streams` of them) take at most T: on a wafer the other half of the target goes to
  the arithmetic of the other prompts' streams, which share the regions.
The halves leave the decode step its own share: on a wafer the decode tokens are in
flight beside the streams and a step takes the longer of the two paths; on a GPU a
fused iteration reads the weights once for both parts. Both sizes are searched over
whole tokens (bisection: a chunk's time never falls when it grows, tests/
test_devices_costmodel.py), capped at `max_tokens`.
"""

from __future__ import annotations

import math

import numpy as np

#: Longest chunk the search considers (tokens): far beyond any context served here.
MAX_CHUNK_TOKENS = 1 << 20


def _largest(fits, lo: int, hi: int) -> int:
    """The largest integer x in [lo, hi] with fits(x), given fits(lo) and a monotone fits."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def tpot_chunks(cost, tpot_s: float, max_streams: int = 1, max_tokens: int = MAX_CHUNK_TOKENS) -> dict:
    """Chunk sizes whose iterations keep within a TPOT target (see the module docstring).

    Args:
        cost: a `devices.costmodel.CostModel` (one instance).
        tpot_s: the TPOT target (s), > 0.
        max_streams: prompts an iteration may carry at once (the engine's max_num_seqs), >= 1.
        max_tokens: the largest size considered (tokens), >= 1.
    Returns: {"prompt_chunk_tokens": n, "chunk_tokens": b, "prompt_chunk_s": time of a
        chunk of n tokens alone, "step_s": time of b tokens in chunks of n, "tpot_s": the
        target}. Sizes are at least 1: when even one token takes longer than the target
        the sizes are 1 and the times say by how much the target is missed.
    Raises: ValueError on a target <= 0, max_streams < 1 or max_tokens < 1.
    """
    if not (tpot_s > 0 and math.isfinite(tpot_s)):
        raise ValueError(f"tpot_chunks: the TPOT target must be a positive number of seconds, got {tpot_s!r}")
    if int(max_streams) < 1 or int(max_tokens) < 1:
        raise ValueError(f"tpot_chunks: max_streams and max_tokens must be >= 1, got {max_streams}, {max_tokens}")
    none = np.zeros(0)

    def chunk_s(n: int) -> float:
        return cost.mixed(np.array([n]), np.zeros(1), none).time_s

    def step_s(b: int, n: int) -> float:
        k, r = divmod(b, n)
        chunks = np.array([n] * k + ([r] if r else []))
        return cost.mixed(chunks, np.zeros(chunks.size), none).time_s

    n = _largest(lambda x: chunk_s(x) <= tpot_s / 2, 1, int(max_tokens))
    b = _largest(lambda x: step_s(x, n) <= tpot_s, n, max(n, min(int(max_tokens), n * int(max_streams))))
    return {"prompt_chunk_tokens": n, "chunk_tokens": b, "prompt_chunk_s": chunk_s(n), "step_s": step_s(b, n),
            "tpot_s": float(tpot_s)}


__all__ = ["MAX_CHUNK_TOKENS", "tpot_chunks"]
