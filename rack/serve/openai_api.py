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
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False      # vLLM's: usage (tokens so far) in every chunk


#: Token ids are non-negative (a vocabulary index).
TokenIds = list[Annotated[int, Field(ge=0)]]

#: Message roles of OpenAI's chat API (and vLLM's).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)
    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
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
    n: int = Field(default=1, ge=1)
    best_of: Optional[int] = Field(default=None, ge=1)
    seed: Optional[int] = None
    rack_block_hashes: Optional[list[int]] = None  # 64-bit hashes: any sign
    rack_block_size: int = Field(default=512, ge=1)


class CompletionRequest(_Common):
    prompt: Union[str, TokenIds, list[str], list[TokenIds], None] = None
    prompt_token_ids: Optional[TokenIds] = None
    echo: bool = False
    logprobs: Optional[int] = None


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
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
        if m["role"] not in ROLES:
            raise ApiError(400, f"messages[{i}].role: expected one of {', '.join(ROLES)}, got {m['role']!r}",
                           f"messages.{i}.role")
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


def _completion_prompt(r: CompletionRequest, tok: Any) -> tuple[int, list]:
    p: Any = r.prompt_token_ids if r.prompt_token_ids is not None else r.prompt
    if p is None:
        raise ApiError(400, "prompt: required (a string or a list of token ids)", "prompt")
    if isinstance(p, list) and p and isinstance(p[0], (list, str)):
        if len(p) != 1:
            raise ApiError(400, f"prompt: one prompt per request is emulated, got {len(p)}", "prompt")
        p = p[0]
    if isinstance(p, str):
        return tok.count(p), tok.block_keys(p)
    return len(p), list(p)


def parse_request(kind: Literal["completion", "chat"], body: Any, *, served: tuple[str, ...],
                  max_model_len: int | None, eos_mean_tokens: float, request_id: int,
                  tokenizer: Any = None) -> Plan:
    """The `Plan` of one request body (module docstring). `tokenizer` counts text
    (`rack.serve.tokenizer`; None: rack's default). Raises ApiError: 400 for bad
    input (naming the field), 404 for an unknown model."""
    tok = tokenizer if tokenizer is not None else _DEFAULT_TOKENIZER
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None)
    try:
        r = (ChatRequest if kind == "chat" else CompletionRequest).model_validate(body)
    except ValidationError as exc:
        param, msg = _param(exc)
        raise ApiError(400, msg, param) from None
    if r.model not in served:
        raise ApiError(404, f"The model `{r.model}` does not exist; served: {list(served)}", "model",
                       "NotFoundError", "model_not_found")
    for field, bad in (("n", r.n > 1), ("best_of", (r.best_of or 1) > 1),
                       ("echo", getattr(r, "echo", False)), ("logprobs", bool(r.logprobs))):
        if bad:
            raise ApiError(400, f"{field}: not supported by the emulator (one choice, no logprobs, no echo)", field)
    if kind == "chat":
        n_prompt, keys = _chat_prompt(r.messages, tok)
        bound = r.max_completion_tokens or r.max_tokens
    else:
        n_prompt, keys = _completion_prompt(r, tok)
        bound = r.max_tokens
    if n_prompt < 1:
        raise ApiError(400, "prompt: empty (at least one token is needed)", "messages" if kind == "chat" else "prompt")
    prompt_param = "messages" if kind == "chat" else "prompt"
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


__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Plan", "REJECTION_STATUS", "chunk",
           "full_response", "parse_request", "rejection_error", "response_id", "stop_length",
           "usage", "usage_chunk"]
