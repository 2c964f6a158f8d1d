"""Shared-prefix workloads: system prompts and multi-turn conversations, with block hashes.

Model of the token stream: each conversation uses one of `system_prompts` system
prompts (popularity Zipf-like, P(k) ~ 1/(k+1)^s) and grows turn by turn: the prompt
of turn j is the system prompt, then every earlier turn's user message and answer,
then the new user message. Hashes follow a prefix cache's rule that a block's hash
names the whole prefix up to the block's end (`PrefixHasher`):
- a full block that lies inside the system prompt is shared by every conversation
  with that system prompt;
- any other block belongs to its conversation; a partial (last) block gets a hash
  that changes with how many tokens it holds, so it matches the same block later
  only once the block's content is the same.
Hashes are small integers numbered in order of first appearance in time
(`renumber_hashes`, as Mooncake's remapped ``hash_ids``).

Arrivals are open loop: the next turn of a conversation arrives a think time after
the previous turn's arrival (a generated stream does not know when an answer
finishes; the closed loop that would wait for it is the runtime's job: requests that
carry `Request.turn`, as a workload file's `think_after = "answer"` sessions do, are
sent a think time after the previous turn's answer, `workloads.sessions`).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np

from .lengths import LengthDistribution, LogNormalLengths
from .request import Request

#: Default per-turn lengths: a new user message of ~200 tokens and an answer of ~300
#: (means and CVs of the same order as ShareGPT-style chat; a placeholder, override it).
DEFAULT_TURN_LENGTHS = LogNormalLengths(prompt_mean=200, prompt_cv=1.0,
                                        output_mean=300, output_cv=0.8)


class PrefixHasher:
    """Block hashes of prompts that share a prefix, one hash per `block_size` tokens.

    `hashes(prompt_tokens, shared_tokens, shared_key, own_key)`: the blocks that lie
    wholly inside the first `shared_tokens` tokens are named by (`shared_key`, block
    index), so every prompt with the same shared_key shares them; every other block by
    (`own_key`, block index, tokens in the block). Keys are any hashables (namespace
    them per generator, e.g. a client name); one hasher numbers every key it meets
    0, 1, 2, ... in order of first use.
    """

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._ids: dict[tuple, int] = {}

    def hashes(self, prompt_tokens: int, shared_tokens: int, shared_key: Hashable,
               own_key: Hashable) -> tuple[int, ...]:
        bs, ids = self.block_size, self._ids
        out = []
        for b in range(-(-prompt_tokens // bs)):
            fill = min((b + 1) * bs, prompt_tokens) - b * bs
            if (b + 1) * bs <= shared_tokens and fill == bs:
                key: tuple = ("shared", shared_key, b)
            else:
                key = ("own", own_key, b, fill)
            h = ids.get(key)
            if h is None:
                h = ids[key] = len(ids)
            out.append(h)
        return tuple(out)


def renumber_hashes(requests: Iterable[Request]) -> list[Request]:
    """The requests (in the order given: sort them by arrival first) with block hashes
    renumbered 0, 1, 2, ... in order of first appearance; other fields unchanged."""
    order: dict[int, int] = {}
    out = []
    for r in requests:
        if r.block_hashes is not None:
            r = Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens,
                        tuple([order.setdefault(x, len(order)) for x in r.block_hashes]),
                        r.block_size, r.tenant, r.slo_class, r.reasoning_tokens, r.turn)
        out.append(r)
    return out


def conversation_turns(start_s: float, user_tokens: Sequence[int], answer_tokens: Sequence[int],
                       think_s: Sequence[float], system_prompt_tokens: int,
                       max_prompt_tokens: int | None = None,
                       context_tokens: int = 0) -> list[tuple[float, int, int]]:
    """(arrival_s, prompt_tokens, output_tokens) of each turn of one conversation.

    Turn j's prompt = system prompt + `context_tokens` of the conversation's own
    earlier context + every earlier user message and answer + user message j; turn j+1
    arrives think_s[j] after turn j. The conversation ends before a turn (after the
    first) whose prompt would exceed `max_prompt_tokens`.
    """
    turns, history, t = [], system_prompt_tokens + int(context_tokens), float(start_s)
    for j, (u, a) in enumerate(zip(user_tokens, answer_tokens)):
        prompt = history + int(u)
        if max_prompt_tokens is not None and prompt > max_prompt_tokens and j > 0:
            break
        turns.append((t, prompt, int(a)))
        history = prompt + int(a)
        t += float(think_s[j])
    return turns


def zipf_choice(n_choices: int, exponent: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` draws from 0..n_choices-1 with P(k) ~ 1/(k+1)^exponent."""
    weights = 1.0 / np.arange(1, n_choices + 1) ** exponent
    return rng.choice(n_choices, size, p=weights / weights.sum())


def shared_prefix_requests(n_conversations: int, conversation_rate_per_s: float, *,
                           system_prompts: int = 4, system_prompt_tokens: int = 1024,
                           system_prompt_zipf: float = 1.0, turns_mean: float = 3.0,
                           max_turns: int = 32,
                           turn_lengths: LengthDistribution = DEFAULT_TURN_LENGTHS,
                           think_time_mean_s: float = 30.0, block_size: int = 512,
                           max_prompt_tokens: int | None = None,
                           seed: int = 0) -> list[Request]:
    """Requests of `n_conversations` multi-turn conversations sharing system prompts.

    Conversations start as a Poisson process. Turns per conversation: 1 + geometric,
    mean `turns_mean` (1.0 gives single-turn), at most `max_turns`; a conversation
    also ends before a turn whose prompt would exceed `max_prompt_tokens`.
    turn_lengths: (new user tokens, answer tokens) per turn; think times exponential
    with mean `think_time_mean_s`. block_size: tokens per hash block. Returns requests
    sorted by arrival, ids 0..n-1 in that order, `tenant` = ``"conv<k>"`` (the
    conversation), `slo_class` = None. Raises ValueError on bad parameters.
    """
    if n_conversations < 1 or conversation_rate_per_s <= 0 or system_prompts < 1:
        raise ValueError("n_conversations and system_prompts must be >= 1 and "
                         "conversation_rate_per_s > 0")
    if system_prompt_tokens < 0 or block_size < 1 or turns_mean < 1 or max_turns < 1:
        raise ValueError("system_prompt_tokens must be >= 0, block_size >= 1, "
                         "turns_mean >= 1, max_turns >= 1")
    if think_time_mean_s < 0 or system_prompt_zipf < 0:
        raise ValueError("think_time_mean_s and system_prompt_zipf must be >= 0")
    rng_start, rng_sys, rng_turns, rng_len, rng_think = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5))

    starts = np.concatenate(([0.0], np.cumsum(
        rng_start.exponential(1.0 / conversation_rate_per_s, n_conversations - 1))))
    sys_of = zipf_choice(system_prompts, system_prompt_zipf, n_conversations, rng_sys)
    turns = np.minimum(rng_turns.geometric(1.0 / turns_mean, n_conversations), max_turns)
    total_turns = int(turns.sum())
    user, answer = (a.tolist() for a in turn_lengths.sample(total_turns, rng_len))
    think = (rng_think.exponential(think_time_mean_s, total_turns).tolist()
             if think_time_mean_s > 0 else [0.0] * total_turns)

    hasher = PrefixHasher(block_size)
    rows: list[tuple[float, int, int, int, int, tuple[int, ...]]] = []
    k = 0  # index into the per-turn draws
    for conv in range(n_conversations):
        n = int(turns[conv])
        for turn, (t, prompt, out) in enumerate(conversation_turns(
                starts[conv], user[k:k + n], answer[k:k + n], think[k:k + n],
                system_prompt_tokens, max_prompt_tokens)):
            rows.append((t, conv, turn, prompt, out,
                         hasher.hashes(prompt, system_prompt_tokens, int(sys_of[conv]), conv)))
        k += n
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return renumber_hashes(Request(i, t, p, o, h, block_size, f"conv{conv}", None)
                           for i, (t, conv, _, p, o, h) in enumerate(rows))
