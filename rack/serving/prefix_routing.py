"""KV-cache-aware routing: the router's index of what each prefill instance caches, and
the `prefix_aware` policy's choice.

Design (as NVIDIA Dynamo's KV router, and llm-d's prefix-cache scorer beside its queue
scorer):

- **KV events, not peeking.** Each prefill instance publishes the changes of its prefix
  cache to the router as they happen (`kv_events(instance, events)`, events
  ("stored", keys) / ("removed", keys), keys (block_size, block hash): vLLM's
  BlockStored / BlockRemoved events that Dynamo's KV indexer consumes). The router
  keeps `CachedBlockIndex`: for every block key, the set of instances that hold it. It
  never reads an instance's state; what it knows is what the instances told it, so it
  lags them by the messages in flight, as a real router does.
- **Overlap.** A block hash identifies a block *and everything before it* (chained
  hashes: Mooncake's `hash_ids`, vLLM's block hashes), and an engine reuses only the
  longest leading run of a prompt's full blocks it holds. So instance i's overlap with
  a request is o_i = the length of the longest leading run of the request's full-block
  hashes present in i's index entry (Dynamo's `OverlapScores`).
- **Cost.** With P the request's prompt tokens, b its block size, W_i instance i's
  outstanding prompt tokens (the `load` it reports, plus what the router placed on it
  earlier in the same tick) and C_i = min(o_i * b, P - 1) the tokens i would serve from
  its cache (at least one token is always computed, as the engines do):

      cost_i = W_i + w * (P - C_i)          (w = `prefix_weight`, default 1)

  With w = 1 it is the prompt tokens instance i must compute before this prompt's
  last token: its backlog plus this prompt's uncached part, a proxy of the prompt's
  time to first token. This is Dynamo's KV-router cost (`overlap_score_weight` x
  prefill blocks + decode blocks) with no decode term (a prefill instance decodes
  nothing), in tokens instead of blocks. The instances count their queued prompts net
  of the prefix their cache held at arrival (`PrefillEngine(kv_events=True)`), so W
  and P - C are in the same terms. The request goes to the cheapest candidate; ties go
  to the larger overlap, then the name. With w = 1 a request leaves the instance that
  caches its prefix only when that instance's backlog exceeds another's by more than
  the tokens the cache would save; w > 1 values a hit above the work it saves now
  (the copy kept on one instance also serves the conversation's later turns, and is
  not duplicated on another), as llm-d weighs its prefix-cache scorer above its
  queue scorer.

Nothing here reads a clock or sends a message: the router core calls it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence


class CachedBlockIndex:
    """Which instances hold which prefix-cache blocks, from their KV events.

    Args:
        instances: the instance names the index tracks (events from others are ignored).

    Keys are (block_size, hash) tuples, as `devices.memory.PrefixCache` keys its
    entries. Each key maps to a bit mask of the instances holding it, so a lookup costs
    one dictionary probe per prompt block whatever the number of instances.
    """

    def __init__(self, instances: Sequence[str]) -> None:
        self._bit = {n: 1 << i for i, n in enumerate(instances)}
        self._names = list(instances)
        self._where: dict[tuple[int, int], int] = {}
        self.events = 0            # events applied (stored + removed lists)

    def apply(self, instance: str, events: Iterable[tuple[str, Sequence[tuple[int, int]]]]) -> None:
        """Apply `instance`'s events, in order: ("stored", keys) adds it to every key's
        holders, ("removed", keys) takes it away. Raises ValueError for another kind."""
        bit = self._bit.get(instance)
        if bit is None:
            return
        where = self._where
        for kind, keys in events:
            self.events += 1
            if kind == "stored":
                for k in keys:
                    where[k] = where.get(k, 0) | bit
            elif kind == "removed":
                for k in keys:
                    m = where.get(k, 0) & ~bit
                    if m:
                        where[k] = m
                    else:
                        where.pop(k, None)
            else:
                raise ValueError(f"KV event from {instance!r}: expected 'stored' or 'removed', got {kind!r}")

    def clear(self, instance: str) -> None:
        """Forget everything `instance` held (it restarted with an empty cache)."""
        bit = self._bit.get(instance)
        if bit is None:
            return
        for k in [k for k, m in self._where.items() if m & bit]:
            m = self._where[k] & ~bit
            if m:
                self._where[k] = m
            else:
                del self._where[k]

    def blocks(self, instance: str) -> int:
        """How many blocks `instance` is known to hold (O(index); for tests and stats)."""
        bit = self._bit.get(instance, 0)
        return sum(1 for m in self._where.values() if m & bit)

    def overlaps(self, hashes: Sequence[int], block_size: int) -> dict[str, int]:
        """{instance: length of the longest leading run of `hashes` it holds}, for every
        tracked instance (0 for those holding none)."""
        out = dict.fromkeys(self._names, 0)
        alive = (1 << len(self._names)) - 1
        where, bs = self._where, int(block_size)
        for j, h in enumerate(hashes):
            m = where.get((bs, h), 0) & alive
            gone = alive & ~m
            if gone:
                for n in self._names:
                    if gone & self._bit[n]:
                        out[n] = j
                alive = m
            if not alive:
                return out
        for n in self._names:
            if alive & self._bit[n]:
                out[n] = len(hashes)
        return out


def cached_tokens(req, overlap_blocks: int) -> int:
    """Prompt tokens an instance holding `overlap_blocks` leading blocks of `req` serves
    from its cache: min(blocks x block size, prompt - 1) (`devices.engines.common.prefix_lookup`)."""
    return max(0, min(overlap_blocks * req.block_size, req.prompt_tokens - 1))


def prefix_aware_choice(req, candidates: Sequence[str], load: Mapping[str, float],
                        index: CachedBlockIndex, weight: float = 1.0,
                        among_tied: Callable[[list[str]], str] | None = None) -> tuple[str, int]:
    """The candidate with the lowest cost W_i + weight x (P - C_i) (module docstring),
    more cached tokens first, and the prompt tokens it is expected to serve from its
    cache. `load` holds W_i (tokens); `candidates` is not empty. Candidates that tie on
    both go to `among_tied` (the router's round robin among the tied), else the first
    by name."""
    if req.block_hashes:
        full = req.block_hashes[: req.prompt_tokens // req.block_size]
        over = index.overlaps(full, req.block_size)
    else:
        over = {}
    keys = {}
    for n in candidates:
        c = cached_tokens(req, over.get(n, 0))
        keys[n] = ((load[n] + weight * (req.prompt_tokens - c), -c), c)
    best = min(k for k, _ in keys.values())
    tied = sorted(n for n, (k, _) in keys.items() if k == best)
    name = among_tied(tied) if among_tied is not None and len(tied) > 1 else tied[0]
    return name, keys[name][1]


__all__ = ["CachedBlockIndex", "cached_tokens", "prefix_aware_choice"]
