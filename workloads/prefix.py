"""Shared-prefix workloads: system prompts and multi-turn conversations, with block hashes.

Model of the token stream: each conversation uses one of `system_prompts` system
prompts (popularity Zipf-like, P(k) ~ 1/(k+1)^s) and grows turn by turn: the prompt
of turn j is the system prompt, then every earlier turn's user message and answer,
then the new user message. Hashes follow a prefix cache's rule that a block's hash
names the whole prefix up to the block's end:
- a full block that lies inside the system prompt is shared by every conversation
  with that system prompt;
- any other block belongs to its conversation; a partial (last) block gets a hash
  that changes with how many tokens it holds, so it matches the same block later
  only once the block's content is the same.
Hashes are small integers numbered in order of first appearance (as Mooncake's
remapped ``hash_ids``).

Arrivals are open loop: conversations start as a Poisson process; the next turn of a
conversation arrives an exponential think time after the previous turn's arrival
(the trace does not know when the answer finishes).
"""

from __future__ import annotations

import numpy as np

from .lengths import LengthDistribution, LogNormalLengths
from .request import Request

#: Default per-turn lengths: a new user message of ~200 tokens and an answer of ~300
#: (means and CVs of the same order as ShareGPT-style chat; a placeholder, override it).
DEFAULT_TURN_LENGTHS = LogNormalLengths(prompt_mean=200, prompt_cv=1.0,
                                        output_mean=300, output_cv=0.8)


def shared_prefix_requests(n_conversations: int, conversation_rate_per_s: float, *,
                           system_prompts: int = 4, system_prompt_tokens: int = 1024,
                           system_prompt_zipf: float = 1.0, turns_mean: float = 3.0,
                           max_turns: int = 32,
                           turn_lengths: LengthDistribution = DEFAULT_TURN_LENGTHS,
                           think_time_mean_s: float = 30.0, block_size: int = 512,
                           max_prompt_tokens: int | None = None,
                           seed: int = 0) -> list[Request]:
    """Requests of `n_conversations` multi-turn conversations sharing system prompts.

    turns per conversation: 1 + geometric, mean `turns_mean` (1.0 gives single-turn),
    at most `max_turns`; a conversation also ends before a turn whose prompt would
    exceed `max_prompt_tokens`. turn_lengths: (new user tokens, answer tokens) per
    turn. block_size: tokens per hash block. Returns requests sorted by arrival, ids
    0..n-1 in that order, `tenant` = ``"conv<k>"`` (the conversation),
    `slo_class` = None. Raises ValueError on bad parameters.
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
    weights = 1.0 / np.arange(1, system_prompts + 1) ** system_prompt_zipf
    sys_of = rng_sys.choice(system_prompts, n_conversations, p=weights / weights.sum())
    turns = np.minimum(rng_turns.geometric(1.0 / turns_mean, n_conversations), max_turns)
    total_turns = int(turns.sum())
    user, answer = (a.tolist() for a in turn_lengths.sample(total_turns, rng_len))
    think = (rng_think.exponential(think_time_mean_s, total_turns).tolist()
             if think_time_mean_s > 0 else [0.0] * total_turns)

    ids: dict[tuple, int] = {}
    rows: list[tuple[float, int, int, int, int, tuple[int, ...]]] = []
    k = 0  # index into the per-turn draws
    for conv in range(n_conversations):
        s = int(sys_of[conv])
        history = system_prompt_tokens  # tokens before this turn's new user message
        t = float(starts[conv])
        n_turns = int(turns[conv])
        for turn in range(n_turns):
            prompt = history + user[k + turn]
            if max_prompt_tokens is not None and prompt > max_prompt_tokens and turn > 0:
                break
            hashes = []
            for b in range(-(-prompt // block_size)):
                end = min((b + 1) * block_size, prompt)
                if end <= system_prompt_tokens and end - b * block_size == block_size:
                    key: tuple = ("sys", s, b)
                else:
                    key = ("conv", conv, b, end - b * block_size)
                h = ids.get(key)
                if h is None:
                    h = ids[key] = len(ids)
                hashes.append(h)
            rows.append((t, conv, turn, prompt, answer[k + turn], tuple(hashes)))
            history = prompt + answer[k + turn]
            t += think[k + turn]
        k += n_turns
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    order: dict[int, int] = {}  # renumber hashes in order of first appearance in time
    out = []
    for i, (t, conv, _, p, o, h) in enumerate(rows):
        h = tuple([order.setdefault(x, len(order)) for x in h])
        out.append(Request(i, t, p, o, h, block_size, f"conv{conv}", None))
    return out
