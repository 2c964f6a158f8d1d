"""vLLM's utility routes of `rack serve`, as vLLM's OpenAI server answers them:

- `GET /version`: {"version": rack's version, "server": "rack"};
- `POST /tokenize`: {"model"?, "prompt": text} or {"model"?, "messages": [...]} ->
  {"count", "max_model_len", "tokens", "token_strs"}: the ids the server counts for
  that prompt (`count` equals the `usage.prompt_tokens` of the same prompt sent to
  `/v1/completions` or `/v1/chat/completions`), with the server's tokenizer
  (`rack.serve.tokenizer`: rack's default or `--tokenizer`); `return_token_strs`
  adds each id's text;
- `POST /detokenize`: {"model"?, "tokens": [ids]} -> {"prompt": text}.

Bad input is a 400 naming the field (OpenAI's error JSON), an unknown model a 404.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from rack.serve import openai_api as oa
from rack.serve.limits import MAX_JSON_DEPTH, RequestRefused, parse_json
from rack.serve.tokenizer import chat_ids


class _TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[dict[str, Any]]] = Field(default=None, min_length=1)
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class _DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)      # [true] is no token id
    model: Optional[str] = None
    tokens: oa.TokenIds        # strict ints in [0, MAX_TOKEN_ID]: never an overflow in the tokenizer


def version() -> str:
    """rack's installed version ("unknown" when run from a tree never installed)."""
    try:
        return metadata.version("rack-emulator")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_vllm_routes(app: FastAPI, front: Any, max_json_depth: int = MAX_JSON_DEPTH) -> None:
    """Add /version, /tokenize and /detokenize (module docstring) to `app`; bodies nested
    deeper than `max_json_depth` are refused (`rack.serve.limits`)."""
    cfg = front.config
    served = cfg.served_model_names

    async def parsed(request: Request, model_cls):
        try:
            body = parse_json(await request.body(), max_json_depth)
        except RequestRefused as exc:
            raise oa.ApiError(exc.status, exc.message, exc.param) from None
        if not isinstance(body, dict):
            raise oa.ApiError(400, "the request body must be a JSON object", None)
        try:
            r = model_cls.model_validate(body)
        except ValidationError as exc:
            param, msg = oa._param(exc)
            raise oa.ApiError(400, msg, param) from None
        if r.model is not None and r.model not in served:
            raise oa.ApiError(404, f"The model `{oa._clip(r.model)}` does not exist; served: {list(served)}", "model",
                              "NotFoundError", "model_not_found")
        return r

    def answer(fn):
        async def route(request: Request):
            try:
                out = await fn(request)
            except oa.ApiError as err:
                return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
            return out
        return route

    async def tokenize(request: Request):
        r = await parsed(request, _TokenizeRequest)
        if (r.prompt is None) == (r.messages is None):
            raise oa.ApiError(400, "give either prompt (a string) or messages", "prompt")
        tok = front.tokenizer
        if r.messages is not None:
            # the same checks (roles, text parts) as /v1/chat/completions
            oa._chat_prompt(r.messages, tok)
            ids = chat_ids(tok, r.messages)
        else:
            ids = tok.encode(r.prompt)
        out = {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": None}
        if r.return_token_strs:
            out["token_strs"] = [tok.decode([i]) for i in ids]
        return out

    async def detokenize(request: Request):
        r = await parsed(request, _DetokenizeRequest)
        vocab = front.tokenizer.vocab_size()
        bad = next((i for i in r.tokens if i >= vocab), None)
        if bad is not None:
            raise oa.ApiError(400, f"tokens: token id {bad} is out of the tokenizer's vocabulary ({vocab:,} ids)",
                              "tokens")
        return {"prompt": front.tokenizer.decode(r.tokens)}

    app.add_api_route("/tokenize", answer(tokenize), methods=["POST"])
    app.add_api_route("/detokenize", answer(detokenize), methods=["POST"])

    @app.get("/version")
    async def _version():
        return {"version": version(), "server": "rack"}


__all__ = ["add_vllm_routes", "version"]
