"""Tokens without a model: prompt lengths from text, prefix-block hashes, filler output.

The emulator has no model weights and downloads nothing at run time, so it has no
model tokenizer. Prompt lengths are taken, in order of preference, from

1. `prompt_token_ids` / a prompt given as token ids: exact (their count);
2. text: an estimate. The text is cut into pieces by the pre-tokenizer rule of
   byte-level BPE tokenizers (GPT-2's regular expression: contractions, runs of
   letters with their leading space, runs of digits, runs of other symbols,
   whitespace), written here with Python's `re` (letters = `[^\\W\\d_]`), and each
   piece is cut into tokens (`text_chunks`) of at most n characters, its leading space
   riding on the first: n = 6 for letters (common English words are one token in
   GPT-style vocabularies; longer words split), 3 for digits (cl100k and Llama 3
   split numbers into groups of at most 3 digits) and 3 for symbol runs; a whitespace
   piece or a contraction is one token. A piece's kind is the regular expression's
   branch that matched it. It is an estimate, not any model's tokenizer; the package
   ships a Hugging Face tokenizer that cuts text exactly so (`rack.serve.tokenizer`),
   for clients that must agree with the server without a download, and `rack serve
   --tokenizer` counts with a model's own.

Chat messages add `CHAT_TOKENS_PER_MESSAGE` per message and `CHAT_REPLY_TOKENS` for
the reply's priming, the counts OpenAI's cookbook gives for its chat models
("How to count tokens with tiktoken": 3 per message, 3 for the reply).

Prefix-block hashes (for the prefix cache) come from the request's `rack_block_hashes`
field when given, else from the prompt itself: a chained 64-bit xxhash over each
block of `block_size` token ids (or text pieces), so two prompts that share their
first k blocks share their first k hashes, as vLLM's prefix caching hashes blocks.

Output text is filler: one short English word per token (`filler`), each a single
piece of at most 6 letters with its leading space, so the text's own estimate
(`count_text_tokens`) equals the token count.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import xxhash

#: GPT-2's pre-tokenizer pattern with Python `re` classes (module docstring); the
#: group names are the pieces' kinds.
_PIECES = re.compile(r"""(?P<c>'(?:[sdmt]|ll|ve|re))|(?P<l> ?[^\W\d_]+)|(?P<d> ?\d+)|(?P<s> ?[^\s\w]+)"""
                     r"""|(?P<w>\s+(?!\S)|\s+)""")
#: Characters per token by kind (letters, digits, symbols); contractions and
#: whitespace pieces are one token.
CHARS_PER_TOKEN = {"l": 6, "d": 3, "s": 3}
CHAT_TOKENS_PER_MESSAGE = 3
CHAT_REPLY_TOKENS = 3
#: Tokens per prefix-block hash derived from a prompt (vLLM's default KV block size).
DERIVED_BLOCK_SIZE = 16
_WORDS = ("the", "rack", "wafer", "token", "fill", "decode", "cache", "link", "batch", "step",
          "block", "model", "time", "layer", "flow", "queue")


def text_pieces(text: str) -> list[str]:
    """The pre-tokenizer pieces of `text` (module docstring)."""
    return [m.group() for m in _PIECES.finditer(text)]


def _pieces(text: str):
    """(piece, kind) of `text`, kind one of "c", "l", "d", "s", "w"."""
    return ((m.group(), m.lastgroup) for m in _PIECES.finditer(text))


def _piece_tokens(piece: str, kind: str) -> int:
    n = CHARS_PER_TOKEN.get(kind)
    if n is None:
        return 1
    return -(-(len(piece) - piece.startswith(" ")) // n)


def text_chunks(text: str) -> list[str]:
    """The tokens of `text` as strings (module docstring): they join to `text` less
    any character no piece matches (`_`, which the pattern leaves out)."""
    out = []
    for p, kind in _pieces(text):
        n = CHARS_PER_TOKEN.get(kind)
        if n is None:
            out.append(p)
            continue
        first = n + p.startswith(" ")
        out.append(p[:first])
        out.extend(p[i:i + n] for i in range(first, len(p), n))
    return out


def count_text_tokens(text: str) -> int:
    """Estimated tokens of `text` (module docstring); 0 for ""."""
    return sum(_piece_tokens(p, k) for p, k in _pieces(text))


def text_token_keys(text: str) -> list[str]:
    """One key per estimated token of `text` (a piece of n tokens repeats n times with
    its index), for hashing prefix blocks of text prompts."""
    out = []
    for p, kind in _pieces(text):
        n = _piece_tokens(p, kind)
        out.extend([p] if n == 1 else [f"{p}\x00{i}" for i in range(n)])
    return out


def block_hashes(tokens: Sequence, block_size: int = DERIVED_BLOCK_SIZE) -> tuple[int, ...]:
    """Chained 64-bit hashes of the prompt's blocks of `block_size` tokens (token ids,
    or `text_token_keys`), one per block, the last possibly partial; signed int64 values
    (as the readers store trace hashes)."""
    out = []
    prev = b""
    for i in range(0, len(tokens), block_size):
        block = tokens[i:i + block_size]
        if block and isinstance(block[0], str):
            data = "\x01".join(block).encode("utf-8", "surrogatepass")
        else:
            data = np.asarray(block, dtype=np.int64).tobytes()
        h = xxhash.xxh64(prev + data).digest()
        prev = h
        out.append(int.from_bytes(h, "little", signed=True))
    return tuple(out)


def filler(start: int, n: int) -> str:
    """The filler text of output tokens start .. start + n - 1 (one word per token)."""
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in range(start, start + n))


__all__ = ["CHARS_PER_TOKEN", "CHAT_REPLY_TOKENS", "CHAT_TOKENS_PER_MESSAGE", "DERIVED_BLOCK_SIZE",
           "block_hashes", "count_text_tokens", "filler", "text_chunks", "text_pieces", "text_token_keys"]
