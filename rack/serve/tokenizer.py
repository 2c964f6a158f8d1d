"""The token counter of `rack serve`: rack's default, or a model's Hugging Face tokenizer.

A client and the server agree on a prompt's length only when they cut its text into
the same tokens. Two counters do that here, both offline:

- `DefaultTokenizer` (no `--tokenizer`): rack's own rule (`rack.serve.tokens`), in pure
  Python. The package ships the same rule as a Hugging Face tokenizer folder
  (`SHIPPED`, built by `scripts/build_tokenizer.py`; `tests/test_serve_tokenizer.py`
  checks both cut thousands of texts into the same tokens with the same ids), so a
  benchmark client pointed at that folder (`--tokenizer`, `--processor`, ... of
  GuideLLM, AIPerf, inference-perf) counts exactly what the server counts;
- `HFTokenizer` (`rack serve --tokenizer PATH`): a `tokenizer.json` (or a folder
  holding one) loaded with the `tokenizers` library, which never downloads. A text
  prompt counts `len(encode(text).ids)` with the tokenizer's special tokens (e.g. a
  BOS its post-processor adds), as vLLM's `/v1/completions` counts it; a chat
  message's content counts without them, plus rack's chat overhead
  (`tokens.CHAT_TOKENS_PER_MESSAGE` per message, `CHAT_REPLY_TOKENS` for the reply).

Each counter also gives the prompt's keys for prefix-block hashes (`block_keys`: token
ids with a model tokenizer; the default keeps rack's text keys, so runs without
`--tokenizer` hash as before), ids for `/tokenize` and text for `/detokenize`, and the
filler of output tokens (`filler`), whose text counts one token per output token in
that tokenizer (so a client that counts the output text counts what was generated).

Errors: `TokenizerError` names the path and what was expected.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from rack.serve import tokens as tk

#: The tokenizer folder shipped with rack (rack's default counter as tokenizer.json).
SHIPPED = Path(__file__).resolve().parent / "data" / "tokenizer"
#: Chat template tokens of the shipped tokenizer: <|start|><|ROLE|><|message|> before
#: each message's content (CHAT_TOKENS_PER_MESSAGE = 3) and <|start|><|assistant|>
#: <|message|> for the reply (CHAT_REPLY_TOKENS = 3).
_START, _MESSAGE = "<|start|>", "<|message|>"
#: Words tried for the output filler of a model tokenizer (each must be one token).
_FILLER_WORDS = (" the", " and", " of", " to", " a", " in", " is", " it", " that", " for", " on", " as",
                 " with", " at", " by", " this")


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used (the message names the path)."""


class DefaultTokenizer:
    """rack's default counter (`rack.serve.tokens`); ids from the shipped vocabulary."""

    name = "rack default (rack/serve/tokens.py)"
    path = str(SHIPPED)

    def count(self, text: str) -> int:
        return tk.count_text_tokens(text)

    def block_keys(self, text: str) -> list:
        return tk.text_token_keys(text)

    @cached_property
    def _vocab(self) -> dict[str, int]:
        data = json.loads((SHIPPED / "tokenizer.json").read_text(encoding="utf-8"))
        return data["model"]["vocab"]

    @cached_property
    def _strings(self) -> dict[int, str]:
        return {i: s for s, i in self._vocab.items()}

    def encode(self, text: str) -> list[int]:
        v = self._vocab
        return [v.get(t, 0) for t in tk.text_chunks(text)]       # 0: the unknown token

    def decode(self, ids: Sequence[int]) -> str:
        s = self._strings
        return "".join(s.get(int(i), "\ufffd") for i in ids)

    def special_id(self, token: str) -> int:
        return self._vocab.get(token, 0)

    def vocab_size(self) -> int:
        return len(self._vocab)

    def filler(self, start: int, n: int) -> str:
        return tk.filler(start, n)


class HFTokenizer:
    """A Hugging Face `tokenizer.json` (module docstring). Raises TokenizerError."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path).expanduser()
        f = p / "tokenizer.json" if p.is_dir() else p
        if not f.is_file():
            raise TokenizerError(f"--tokenizer {path}: expected a tokenizer.json file or a folder holding one "
                                 f"({f} does not exist)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("--tokenizer needs the `tokenizers` library: pip install 'rack-emulator[tokenizer]'") \
                from None
        try:
            self._tok = Tokenizer.from_file(str(f))
        except Exception as exc:  # noqa: BLE001 - the library's parse errors have no common type
            raise TokenizerError(f"--tokenizer {f}: not a Hugging Face tokenizer.json ({exc})") from None
        self.path = str(f)
        self.name = f.parent.name if f.name == "tokenizer.json" else f.name
        self._words = self._filler_words()

    def _ids(self, text: str, special: bool) -> list[int]:
        return self._tok.encode(text, add_special_tokens=special).ids

    def count(self, text: str) -> int:
        return len(self._ids(text, True))

    def content_count(self, text: str) -> int:
        return len(self._ids(text, False))

    def block_keys(self, text: str) -> list:
        return self._ids(text, True)

    def encode(self, text: str) -> list[int]:
        return self._ids(text, True)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def special_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        return 0 if i is None else int(i)

    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def _filler_words(self) -> tuple[str, ...]:
        """The filler words that are one token each, also side by side (checked on a
        run of 4 of each); raises TokenizerError when none is."""
        words = [w for w in _FILLER_WORDS if len(self._ids(w, False)) == 1]
        while words and len(self._ids("".join(words * 4), False)) != 4 * len(words):
            words.pop()
        if not words:
            raise TokenizerError(f"--tokenizer {self.path}: none of the filler words {list(_FILLER_WORDS)} is one "
                                 "token, so output text could not count one token per output token")
        return tuple(words)

    def filler(self, start: int, n: int) -> str:
        w = self._words
        return "".join(w[i % len(w)] for i in range(start, start + n))


def load_tokenizer(path: str | None) -> Any:
    """`HFTokenizer(path)`, or the `DefaultTokenizer` for None. Raises TokenizerError."""
    return DefaultTokenizer() if path is None else HFTokenizer(path)


def client_model_id(tokenizer: Any) -> str:
    """The model id `rack serve` serves first (`/v1/models`): the absolute path of the
    folder holding the tokenizer it counts with (`SHIPPED` for rack's default counter).

    A benchmark client loads a tokenizer named after the served model (GuideLLM's
    processor, AIPerf's `--tokenizer`, inference-perf's `tokenizer`, all default to the
    model id) through `transformers`, which reads a local folder without a hub, as when
    vLLM serves a local model path as the model id. So each client's plain documented
    command counts the tokens rack counts, offline, with no tokenizer flag."""
    p = Path(tokenizer.path).resolve()          # the folder itself, or its tokenizer.json
    return str(p.parent if p.is_file() else p)


def content_count(tokenizer: Any, text: str) -> int:
    """Tokens of a chat message's content (no special tokens; module docstring)."""
    f = getattr(tokenizer, "content_count", None)
    return f(text) if f is not None else tokenizer.count(text)


def chat_ids(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of a chat prompt as rack counts it: per message <|start|><|ROLE|>
    <|message|> and its content's ids, then <|start|><|assistant|><|message|> (ids of
    those special tokens, 0 where the tokenizer has none)."""
    sid = tokenizer.special_id
    out: list[int] = []
    for m in messages:
        text = m.get("content") or ""
        if isinstance(text, list):
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        out += [sid(_START), sid(f"<|{m.get('role')}|>"), sid(_MESSAGE)]
        out += tokenizer._ids(text, False) if isinstance(tokenizer, HFTokenizer) else tokenizer.encode(text)
    return out + [sid(_START), sid("<|assistant|>"), sid(_MESSAGE)]


__all__ = ["DefaultTokenizer", "HFTokenizer", "SHIPPED", "TokenizerError", "chat_ids", "client_model_id", "content_count",
           "load_tokenizer"]
