"""The OpenAI-compatible request and response shapes of `rack serve` (pure: no I/O).

Requests (`parse_request`): `/v1/completions` (`prompt`: a string, a list of token
ids, or a list holding one of either; or the extra field `prompt_token_ids`) and
`/v1/chat/completions` (`messages` with string or text-part contents). Lengths:
`rack.serve.tokens`. Output length:

- `max_tokens` (chat: `max_completion_tokens`, else `max_tokens`) bounds it; absent,
  the bound is the context left (`max_model_len` - prompt), as vLLM does;
- `ignore_eos: true` (vLLM's extra field, which benchmark clients set): exactly the
  bound, finish_reason "length";
- otherwise the emulator has no model to emit an end-of-sequence token, so the length
  is drawn from a geometric distribution (a constant stop probability per token, mean
  `eos_mean_tokens`, seeded by the request's `seed` or its id), at least
  `min_tokens`, at most the bound; finish_reason "stop" when it ends before the bound.

Extra fields: `rack_block_hashes` (list of 64-bit ints, one per prompt block) and
`rack_block_size` (tokens per block, default 512 as in Mooncake traces) carry the
prefix-cache identity of a prompt that a trace replay knows; absent, hashes are
derived from the prompt (`tokens.block_hashes`). Unknown fields are ignored, and
sampling parameters change no timing: `temperature`, `top_p`, the penalties and `stop`
are only checked for type and range as OpenAI's API checks them (`stop` is accepted
but never ends an output: the text is filler, the length is set as above). Refused
with 400 and the field named: `n` > 1, `best_of` > 1, `echo`, `logprobs`, several
prompts, non-text message parts, an unknown message role, a negative token id, a
`stream` that is not a JSON boolean, and any value of the wrong type or range.

Types are strict (pydantic strict mode): a count is a JSON integer (not "5", not
true), token ids are integers (not booleans), flags are booleans; a JSON integer is
still a valid number where a float goes. Every integer is bounded before anything is
built from it: token ids in [0, MAX_TOKEN_ID] (and below the model's vocabulary size
when it is known), token counts (`max_tokens`, `min_tokens`, a prompt's length,
`rack_block_size`) at most MAX_COUNT, `seed` in [0, 2^63 - 1], block hashes 64-bit.
The body's size and nesting are bounded before it is parsed (`rack.serve.limits`).

Errors are OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from rack.serve import tokens as tk
from rack.serve.tokenizer import DefaultTokenizer, content_count
from workloads.request import MAX_TOKENS

_DEFAULT_TOKENIZER = DefaultTokenizer()


class ApiError(Exception):
    """An HTTP error answered as OpenAI's error JSON (`body()`)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code if self.code is not None else self.status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False      # vLLM's: usage (tokens so far) in every chunk


#: Largest token id accepted (a vocabulary index): 2^31 - 1, far above any vocabulary
#: (the largest published ones hold ~256 k entries), so ids stay in int32/int64 arithmetic;
#: a model with a known vocabulary refuses ids at or above its size (`parse_request`).
MAX_TOKEN_ID = 2**31 - 1
#: Bounds of the other integers a client sends: counts of tokens at most
#: `workloads.request.MAX_TOKENS` (10^8, 10x the longest published context), seeds and
#: block hashes 64-bit (a hash may be written signed or unsigned).
MAX_COUNT = MAX_TOKENS
MAX_SEED = 2**63 - 1
HASH_MIN, HASH_MAX = -(2**63), 2**64 - 1
#: Token ids are non-negative (a vocabulary index).
TokenIds = list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]]

#: Message roles of OpenAI's chat API (and vLLM's).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class _Common(BaseModel):
    # strict: "5" or true is not a token count, [true, false] no token ids (JSON's
    # integers are still valid numbers where a float goes)
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_COUNT)
    min_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: StrictBool = False
    # Sampling parameters change no timing; they are checked as OpenAI's API does
    # (temperature in [0, 2], top_p in (0, 1], penalties in [-2, 2], at most 4 stops).
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    stop: Union[str, Annotated[list[str], Field(max_length=4)], None] = None
    n: int = Field(default=1, ge=1, le=MAX_COUNT)
    best_of: Optional[int] = Field(default=None, ge=1, le=MAX_COUNT)
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED)
    rack_block_hashes: Optional[list[Annotated[int, Field(ge=HASH_MIN, le=HASH_MAX)]]] = None
    rack_block_size: int = Field(default=512, ge=1, le=MAX_COUNT)
    # Fields that change no timing, typed as OpenAI's API types them (any JSON value
    # used to pass): an end-user id; token id (as a string key) -> bias in [-100, 100];
    # the output's format, an object such as {"type": "json_object"}.
    user: Optional[str] = None
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]] = None
    response_format: Optional[dict[str, Any]] = None


class CompletionRequest(_Common):
    suffix: Optional[str] = None      # text after the completion (OpenAI's legacy completions)
    prompt: Union[str, TokenIds, list[str], list[TokenIds], None] = None
    prompt_token_ids: Optional[TokenIds] = None
    echo: bool = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_COUNT)


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: Optional[list[dict[str, Any]]] = None      # function definitions (objects)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_COUNT)
    logprobs: Optional[bool] = None


@dataclass
class Plan:
    """What one HTTP request asks of the rack: `kind` "completion" | "chat", lengths,
    prefix hashes, output bound and whether the output stops early ("stop")."""

    kind: str
    model: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    block_hashes: tuple[int, ...] | None
    block_size: int
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    cached_tokens: int = 0         # prompt tokens the prefix cache served (set by the front)


_UNION_TAGS = ("str", "int", "float", "bool", "none")


def _param(err: ValidationError) -> tuple[str, str]:
    """(field path, message) of a validation error. Of a union's errors (one per member
    type) the one that got deepest into the value names the field best: a negative id
    in a token list, not "not a string"."""
    e = max(err.errors(), key=lambda x: (len(x["loc"]), str(x["loc"][-1]) not in _UNION_TAGS))
    loc = ".".join(str(x) for x in e["loc"]
                   if not (str(x) in _UNION_TAGS or str(x).startswith(("list[", "function-"))))
    return loc or "body", f"{loc or 'body'}: {e['msg']}"


def _chat_prompt(messages: list[dict[str, Any]], tok: Any) -> tuple[int, list]:
    total, keys = tk.CHAT_REPLY_TOKENS, []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ApiError(400, f"messages[{i}]: expected an object with 'role' and 'content'", f"messages.{i}")
        if not isinstance(m["role"], str) or m["role"] not in ROLES:
            raise ApiError(400, f"messages[{i}].role: expected one of {', '.join(ROLES)}, got "
                           f"{_short(m['role'])}", f"messages.{i}.role")
        content = m.get("content") or ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content[{j}]: only text parts are emulated",
                                   f"messages.{i}.content.{j}")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: expected a string or a list of text parts",
                           f"messages.{i}.content")
        text = f"{m['role']}\n{content}"
        total += tk.CHAT_TOKENS_PER_MESSAGE + content_count(tok, content)
        keys.extend(tok.block_keys(text))
    return total, keys


#: str.translate table deleting every character `str.isspace` calls whitespace (29 of them).
_DROP_SPACE = dict.fromkeys(c for c in range(0x3001) if chr(c).isspace())


def _check_prompt_size(kind: str, body: dict, max_model_len: int | None, six_per_token: bool) -> None:
    """Refuse a prompt that cannot fit the context before its tokens are validated or
    counted: a token-id list longer than the context, or (`six_per_token`: rack's default
    counter, whose tokens hold at most 6 non-blank characters, `rack.serve.tokens`) text
    with more non-blank characters than 6 x the context. Validating a million ids or
    cutting 7 MB of text took 1-8 s of the front's event loop, during which no stream
    was paced. Raises ApiError (400)."""
    limit = (max_model_len - 1) if max_model_len is not None else MAX_TOKENS
    if kind == "chat":
        items = [(f"messages.{i}.content", m.get("content")) for i, m in enumerate(body.get("messages") or ())
                 if isinstance(m, dict)] if isinstance(body.get("messages"), list) else []
        texts = [c for _, c in items if isinstance(c, str)]
        texts += [p.get("text") for _, c in items if isinstance(c, list) for p in c
                  if isinstance(p, dict) and isinstance(p.get("text"), str)]
        param, ids = "messages", None
    else:
        param = "prompt_token_ids" if body.get("prompt_token_ids") is not None else "prompt"
        p = body.get(param)
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (list, str)):
            p = p[0]
        ids = p if isinstance(p, list) else None
        texts = [p] if isinstance(p, str) else []
    if ids is not None and len(ids) > limit:
        raise ApiError(400, f"{param}: {len(ids):,} token ids, more than the context allows ({limit:,} with "
                       "room for one output token)", param)
    if not six_per_token:
        return
    chars = sum(len(t.translate(_DROP_SPACE)) for t in texts) if sum(len(t) for t in texts) > 6 * limit else 0
    if chars > 6 * limit:
        raise ApiError(400, f"{param}: at least {-(-chars // 6):,} tokens of text, more than the context "
                       f"allows ({limit:,} with room for one output token)", param)


def _clip(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters (a client's value quoted in a message)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: Any) -> str:
    return _clip(repr(value))


def _completion_prompt(r: CompletionRequest, tok: Any, vocab_size: int | None) -> tuple[int, list]:
    field = "prompt_token_ids" if r.prompt_token_ids is not None else "prompt"
    p: Any = r.prompt_token_ids if r.prompt_token_ids is not None else r.prompt
    if p is None:
        raise ApiError(400, "prompt: required (a string or a list of token ids)", "prompt")
    if isinstance(p, list) and p and isinstance(p[0], (list, str)):
        if len(p) != 1:
            raise ApiError(400, f"prompt: one prompt per request is emulated, got {len(p)}", "prompt")
        p = p[0]
    if isinstance(p, str):
        return tok.count(p), tok.block_keys(p)
    if vocab_size is not None and p and max(p) >= vocab_size:
        j = next(i for i, x in enumerate(p) if x >= vocab_size)
        raise ApiError(400, f"{field}: token id {p[j]} is out of vocabulary (the model has {vocab_size:,} "
                       "token ids)", field)
    return len(p), list(p)


def parse_request(kind: Literal["completion", "chat"], body: Any, *, served: tuple[str, ...],
                  max_model_len: int | None, eos_mean_tokens: float, request_id: int,
                  vocab_size: int | None = None, tokenizer: Any = None) -> Plan:
    """The `Plan` of one request body (module docstring). `vocab_size`: token ids must
    be below it (None: below MAX_TOKEN_ID + 1); `tokenizer` counts text
    (`rack.serve.tokenizer`; None: rack's default). Raises ApiError: 400 for bad input
    (naming the field), 404 for an unknown model."""
    tok = tokenizer if tokenizer is not None else _DEFAULT_TOKENIZER
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None)
    _check_prompt_size(kind, body, max_model_len, isinstance(tok, DefaultTokenizer))
    try:
        r = (ChatRequest if kind == "chat" else CompletionRequest).model_validate(body)
    except ValidationError as exc:
        param, msg = _param(exc)
        raise ApiError(400, msg, param) from None
    if r.model not in served:
        raise ApiError(404, f"The model `{_clip(r.model)}` does not exist; served: {list(served)}", "model",
                       "NotFoundError", "model_not_found")
    for field, bad in (("n", r.n > 1), ("best_of", (r.best_of or 1) > 1),
                       ("echo", getattr(r, "echo", False)), ("logprobs", bool(r.logprobs))):
        if bad:
            raise ApiError(400, f"{field}: not supported by the emulator (one choice, no logprobs, no echo)", field)
    if kind == "chat":
        n_prompt, keys = _chat_prompt(r.messages, tok)
        bound = r.max_completion_tokens or r.max_tokens
    else:
        n_prompt, keys = _completion_prompt(r, tok, vocab_size)
        bound = r.max_tokens
    prompt_param = "messages" if kind == "chat" else "prompt"
    if n_prompt < 1:
        raise ApiError(400, "prompt: empty (at least one token is needed)", prompt_param)
    if n_prompt > MAX_TOKENS:
        raise ApiError(400, f"{prompt_param}: {n_prompt:,} tokens is beyond any model's context (at most "
                       f"{MAX_TOKENS:,})", prompt_param)
    if max_model_len is not None:
        if n_prompt >= max_model_len:
            raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                           f"prompt has {n_prompt} tokens, which leaves no room for output.", prompt_param)
        room = max_model_len - n_prompt
        if bound is not None and bound > room:
            field = "max_completion_tokens" if kind == "chat" and r.max_completion_tokens else "max_tokens"
            raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                           f"requested {n_prompt + bound} tokens ({n_prompt} in the {prompt_param}, {bound} in "
                           "the completion). Please reduce the length of the prompt or completion.", field)
        bound = room if bound is None else bound
    if bound is None:
        raise ApiError(400, "max_tokens: required when the model has no context limit", "max_tokens")
    if r.min_tokens > bound:
        raise ApiError(400, f"min_tokens ({r.min_tokens}) must be <= max_tokens ({bound})", "min_tokens")
    n_out, reason = bound, "length"
    if not r.ignore_eos:
        drawn = stop_length(eos_mean_tokens, r.seed if r.seed is not None else request_id)
        n_out = max(r.min_tokens, 1, min(bound, drawn))
        reason = "length" if n_out >= bound else "stop"
    if r.rack_block_hashes is not None:
        hashes, bs = tuple(int(h) for h in r.rack_block_hashes), r.rack_block_size
        if len(hashes) != -(-n_prompt // bs):
            raise ApiError(400, f"rack_block_hashes: {len(hashes)} hashes for a {n_prompt}-token prompt in "
                           f"blocks of {bs} (expected {-(-n_prompt // bs)})", "rack_block_hashes")
    else:
        bs = tk.DERIVED_BLOCK_SIZE
        hashes = tk.block_hashes(keys, bs)
    stream_usage = bool(r.stream_options and r.stream_options.include_usage)
    if r.stream_options is not None and not r.stream:
        raise ApiError(400, "stream_options: only allowed when stream is true", "stream_options")
    continuous = bool(r.stream_options and r.stream_options.continuous_usage_stats)
    return Plan(kind, r.model, n_prompt, int(n_out), reason, hashes, bs, r.stream, stream_usage, continuous)


def stop_length(mean_tokens: float, seed: int) -> int:
    """Tokens until an emulated end of sequence: geometric with mean `mean_tokens`
    (stop probability 1 / mean per token), >= 1, from `seed`."""
    p = 1.0 / max(1.0, float(mean_tokens))
    return int(np.random.default_rng(abs(int(seed))).geometric(p))


# ---------------------------------------------------------------------------------------
# responses


def response_id(plan: Plan, request_id: int) -> str:
    return f"{'chatcmpl' if plan.kind == 'chat' else 'cmpl'}-rack-{request_id}"


def usage(plan: Plan, completion_tokens: int) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` is the prompt
    tokens the emulated prefix cache served (`plan.cached_tokens`)."""
    return {"prompt_tokens": plan.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": plan.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": int(plan.cached_tokens)}}


def full_response(plan: Plan, request_id: int, text: str, n_tokens: int, finish_reason: str,
                  created: int | None = None) -> dict:
    """A non-streaming completion / chat completion."""
    created = int(time.time()) if created is None else created
    if plan.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": response_id(plan, request_id), "object": obj, "created": created, "model": plan.model,
            "choices": [choice], "usage": usage(plan, n_tokens)}


def chunk(plan: Plan, request_id: int, created: int, text: str | None, finish_reason: str | None = None,
          role: bool = False, tokens_so_far: int = 0) -> dict:
    """One streamed chunk. Its `usage` is null when usage is asked for (as OpenAI's),
    or, with `continuous_usage_stats`, the usage of the `tokens_so_far` sent (vLLM's)."""
    if plan.kind == "chat":
        delta: dict = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    out = {"id": response_id(plan, request_id), "object": obj, "created": created, "model": plan.model,
           "choices": [choice]}
    if plan.continuous_usage:
        out["usage"] = usage(plan, tokens_so_far)
    elif plan.include_usage:
        out["usage"] = None
    return out


def usage_chunk(plan: Plan, request_id: int, created: int, n_tokens: int) -> dict:
    """The last chunk of `stream_options.include_usage`: no choices, the usage."""
    return {"id": response_id(plan, request_id),
            "object": "chat.completion.chunk" if plan.kind == "chat" else "text_completion",
            "created": created, "model": plan.model, "choices": [], "usage": usage(plan, n_tokens)}


#: Router / engine rejection reasons -> HTTP status (429: try later; 400: never fits).
REJECTION_STATUS = {"router_queue_full": 429, "prefill_queue_full": 429, "decode_queue_full": 429,
                    "prompt_exceeds_context": 400, "exceeds_context": 400,
                    "prompt_exceeds_kv_capacity": 400, "exceeds_decode_kv_capacity": 400}


def rejection_error(reason: str, retry_after_s: float) -> ApiError:
    """The HTTP error of a request the rack refused with `reason`."""
    status = REJECTION_STATUS.get(reason, 503)
    if status == 429:
        return ApiError(429, f"the emulated rack is full ({reason}); retry later", None, "rate_limit_exceeded",
                        reason, {"Retry-After": str(max(1, math.ceil(retry_after_s)))})
    if status == 400:
        return ApiError(400, f"the request can never be served by this rack ({reason})", "prompt",
                        "invalid_request_error", reason)
    return ApiError(503, f"the request was not served ({reason})", None, "server_error", reason)


def ended_error(outcome: str, reason: str | None) -> ApiError:
    """The HTTP error of a request that ended in the rack without completing: 503 (the
    service is unavailable, retry elsewhere or later) when the server's shutdown ended
    it ("server_shutdown": it was fine, the server went away), else 500."""
    if reason == "server_shutdown":
        return ApiError(503, "the server shut down before the request ended (server_shutdown); retry",
                        None, "server_error", reason)
    return ApiError(500, f"the request ended in the emulated rack: {outcome} ({reason})", None,
                    "server_error", reason)


__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Plan", "REJECTION_STATUS", "chunk", "ended_error",
           "full_response", "parse_request", "rejection_error", "response_id", "stop_length",
           "usage", "usage_chunk"]
