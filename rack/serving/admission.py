"""Admission rules the router applies at arrival, before any prefill is spent: the
model's context limit, and requests whose KV can never fit an instance.

Pure functions and small value objects (no clock, no peers), so the router, the
metrics step (which must count a truncated request's tokens as served) and a live
front end apply the same rules.

Context limit (as vLLM's OpenAI server checks `max_model_len`): a prompt of `limit`
tokens or more leaves no room for an output token and is rejected
(`prompt_exceeds_context`). A prompt that fits but whose prompt + output exceeds the
limit follows the scenario's `context_overflow`: "reject" (`exceeds_context`, vLLM's
behaviour for `max_tokens` beyond the context) or "truncate" (the output is capped at
limit - prompt tokens; TPOT then divides by the tokens actually produced).

KV capacity: a request is rejected at admission when its prompt's KV exceeds the KV
capacity of every prefill-capable instance it could go to
(`prompt_exceeds_kv_capacity`), or when its final footprint on the decode side,
prompt + output - 1 tokens, exceeds every decode target's KV capacity
(`exceeds_decode_kv_capacity`). That holds under both decode admission policies: under
"reserve" the footprint is booked up front; under "preempt" the KV grows block by
block, and a request that outgrows the whole capacity could not complete even alone
(the decode engine would fail it after its prefill). The emulator knows each
request's output length, so it can refuse such a request before spending anything.
Capacities are the instance's memory after weights and workspace
(`devices.planner.plan_memory`), rounded to whole KV blocks as the engines' block
pools allocate them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Optional

ContextOverflow = Literal["reject", "truncate"]

#: Rejection reasons decided at admission (router).
ADMISSION_REASONS = ("prompt_exceeds_context", "exceeds_context", "prompt_exceeds_kv_capacity",
                     "exceeds_decode_kv_capacity", "router_queue_full")


def context_verdict(prompt_tokens: int, output_tokens: int, limit: Optional[int],
                    overflow: ContextOverflow = "reject") -> tuple[int, Optional[str]]:
    """(output tokens to serve, rejection reason or None) of a request under a context
    limit of `limit` tokens (None: no limit); see the module docstring."""
    if limit is None:
        return output_tokens, None
    if prompt_tokens >= limit:
        return 0, "prompt_exceeds_context"
    if prompt_tokens + output_tokens > limit:
        if overflow == "truncate":
            return limit - prompt_tokens, None
        return 0, "exceeds_context"
    return output_tokens, None


def decode_footprint(prompt_tokens: int, output_tokens: int) -> int:
    """KV tokens a request holds at its last decode step: its prompt and every output
    token but the last (whose KV is never written)."""
    return prompt_tokens + output_tokens - 1


@dataclass(frozen=True)
class KVFit:
    """The KV capacity of one instance: `capacity_bytes` for KV in paged blocks of
    `block_tokens` tokens of `block_bytes` bytes."""

    capacity_bytes: int
    block_tokens: int
    block_bytes: int

    def fits(self, tokens: int) -> bool:
        """Whether `tokens` tokens of KV (whole blocks) fit the capacity."""
        return -(-int(tokens) // self.block_tokens) * self.block_bytes <= self.capacity_bytes

    def fits_decode(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether a request can ever run on this decode instance (module docstring)."""
        return self.fits(decode_footprint(prompt_tokens, output_tokens))

    def max_tokens(self) -> int | float:
        """The most tokens of KV that fit: `fits(t)` holds exactly for integers t <= this
        (the capacity's whole blocks; inf with blocks of 0 bytes), so a caller checking
        many requests compares one number instead of calling `fits` per request."""
        if self.block_bytes == 0:
            return math.inf if self.capacity_bytes >= 0 else -1
        return self.capacity_bytes // self.block_bytes * self.block_tokens


def kv_fit_of(plan, kv_bytes_per_token: int, block_tokens: int) -> KVFit:
    """The `KVFit` of an instance with memory plan `plan` (`devices.planner.MemoryPlan`):
    its capacity less weights and workspace, as the engines' ledgers leave it."""
    kv = int(plan.capacity_bytes) - int(plan.weight_bytes) - int(plan.reserve_bytes)
    return KVFit(kv, int(block_tokens), int(block_tokens) * int(kv_bytes_per_token))


def first_fitting(fits: Mapping[str, KVFit], prompt_tokens: int, output_tokens: int,
                  decode: bool) -> list[str]:
    """Names in `fits` (in order) that can ever hold the request: its prompt's KV
    (prefill, `decode` False) or its decode footprint (`decode` True)."""
    if decode:
        return [n for n, f in fits.items() if f.fits_decode(prompt_tokens, output_tokens)]
    return [n for n, f in fits.items() if f.fits(prompt_tokens)]


__all__ = ["ADMISSION_REASONS", "ContextOverflow", "KVFit", "context_verdict", "decode_footprint", "first_fitting",
           "kv_fit_of"]
