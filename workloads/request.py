"""`Request`: one inference request of a workload (the unit every component passes around)."""

from __future__ import annotations

import math
from dataclasses import dataclass


MAX_TOKENS = 100_000_000
"""Longest prompt or output a request may have (tokens): 10x the longest context window
published for any model (10 M tokens, Llama 4 Scout, Meta, April 2025). A length above
it is a broken trace row (e.g. 10**30), refused before it reaches the integer and
float arithmetic of the engines and the metrics."""


@dataclass(frozen=True, slots=True)
class Turn:
    """Where a request sits in a multi-turn session replayed turn by turn (an agent's
    loop of model calls and tool calls, or a user's chat): the runtime sends turn
    `index` of `session` `think_time_s` seconds after the previous turn ended (the
    tool call, or the user reading and typing), never before; turn 0 goes at its
    arrival (or, in a closed loop, when a slot frees). The turns of a label are
    chained by `index` (`workloads.sessions.session_chains`; a gap left by a selection
    is closed).

    Raises ValueError for an empty session label, a negative index or a negative or
    non-finite think time.
    """

    session: str
    index: int
    think_time_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.session or self.index < 0 or not (
                math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"Turn: session must be a non-empty label, index >= 0 and "
                             f"think_time_s a finite number >= 0, got {self.session!r}, "
                             f"{self.index}, {self.think_time_s}")


@dataclass(frozen=True, slots=True)
class Request:
    """One LLM inference request, immutable and cheap (slots; traces hold 10^5-10^7 of them).

    Fields (fixed by docs/interfaces.md):
      id: unique within a run. Readers number data rows of the file from 0 in file
        order; replay controls keep those ids (so a filtered run still points at
        trace rows), generators number their output from 0.
      arrival_s: arrival time in seconds from the trace (or window) start, >= 0.
      prompt_tokens: prompt (prefill) length in tokens, 1 <= n <= MAX_TOKENS.
      output_tokens: tokens to generate (decode), 1 <= n <= MAX_TOKENS.
      block_hashes: one prefix-block hash per `block_size`-token block of the prompt,
        in order (the last block may be partial), or None when the source has none.
        Two requests whose first k hashes agree share their first k blocks.
      block_size: tokens per hash block (Mooncake traces: 512).
      tenant, slo_class: optional labels (e.g. BurstGPT's model and log type; a
        workload file's client name).
      reasoning_tokens: how many of the output tokens are reasoning (thinking)
        tokens, 0 <= reasoning_tokens <= output_tokens (0 when the source does not
        say). They are decoded like any output token; the count lets results report
        the reasoning share (ServeGen's reason_ratio).
      turn: a `Turn` when the request is a turn of a session that the runtime
        replays turn by turn (each turn sent a think time after the previous one
        ended); None (the default): the request goes at its own arrival time.

    Raises ValueError if a length is < 1 or > MAX_TOKENS, block_size < 1 or
    reasoning_tokens is outside [0, output_tokens].
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] | None = None
    block_size: int = 512
    tenant: str | None = None
    slo_class: str | None = None
    reasoning_tokens: int = 0
    turn: Turn | None = None

    def __post_init__(self) -> None:
        # A few comparisons: cheap enough for 10^7 rows, and they stop a zero-length
        # request (a division by zero) or an absurd one (int64 overflow) from reaching
        # an engine, where either would fail much later.
        if not (1 <= self.prompt_tokens <= MAX_TOKENS and 1 <= self.output_tokens <= MAX_TOKENS) \
                or self.block_size < 1:
            raise ValueError(
                f"Request {self.id}: prompt_tokens ({self.prompt_tokens}) and output_tokens "
                f"({self.output_tokens}) must be in [1, {MAX_TOKENS:,}], block_size "
                f"({self.block_size}) >= 1"
            )
        if self.reasoning_tokens and not 0 <= self.reasoning_tokens <= self.output_tokens:
            raise ValueError(f"Request {self.id}: reasoning_tokens ({self.reasoning_tokens}) must be "
                             f"between 0 and output_tokens ({self.output_tokens})")
