"""The HTTP routes of `rack serve` (FastAPI), over a `rack.serve.frontend.LiveFront`.

- `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI's API
  (`rack.serve.openai_api`), streamed as server-sent events when `stream` is true;
- `GET /v1/models`: the served model name(s) with `max_model_len`;
- `GET /health`: 200 {"status": "ok", ...} while serving, 503 while shutting down;
- `GET /metrics`: Prometheus text (`rack.serve.metrics`);
- `GET /rack/requests/{id}`: the front's record of a request with the rack's own
  (TTFT, ITL samples, pacing lateness), for comparing a client's measurements; `id`
  is the response id (`chatcmpl-rack-7`, `cmpl-rack-7`) or its number. A request
  still in flight or being recorded is waited for (`?wait=S` wall seconds, default
  `RECORD_WAIT_S`), so a client may ask as soon as its stream's `[DONE]` arrives;
- `GET /version`, `POST /tokenize`, `POST /detokenize`: vLLM's (`rack.serve.vllm_routes`).

With an API key, the `/v1` and `/rack` routes need `Authorization: Bearer KEY` (401
otherwise), as vLLM's `--api-key` does for `/v1`; `/health` and `/metrics` stay open
for probes and scrapers. The body's size and nesting, slow clients and handler errors
are bounded and answered by `rack.serve.limits` (never a plain 500 that drops the
connection).
"""

from __future__ import annotations

import hmac
import math
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rack.serve import openai_api as oa
from rack.serve.frontend import LiveFront
from rack.serve.limits import Guard, HttpLimits, RequestRefused, parse_json
from rack.serve.vllm_routes import add_vllm_routes

#: Endpoints counted in `rack:http_requests_total` (the API's; probes are not counted).
COUNTED = ("/v1/completions", "/v1/chat/completions")
#: Wall seconds `/rack/requests/{id}` waits for a request in flight to be recorded.
RECORD_WAIT_S = 30.0


def _error(err: oa.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _unauthorised() -> JSONResponse:
    return _error(oa.ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                              "authentication_error", "invalid_api_key"))


def build_app(front: LiveFront, host: Any, info: dict, limits: HttpLimits | None = None) -> FastAPI:
    """The FastAPI application of a live front. `host` gives `now()` and `await
    engine_stats()`; `info`: {"scenario", "model"} for /health and /v1/models;
    `limits`: the body and nesting limits (default `HttpLimits()`)."""
    cfg = front.config
    limits = limits or HttpLimits()
    app = FastAPI(title="rack serve", version="1", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, max_body_bytes=limits.max_body_bytes,
                       endpoint=lambda path: path if path in COUNTED else None,
                       on_answer=front.metrics.count_http, on_error=front.metrics.count_handler_error)
    created = int(time.time())
    expected = f"Bearer {cfg.api_key}".encode() if cfg.api_key is not None else None

    def authorised(request: Request) -> bool:
        if expected is None:
            return True
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(given, expected)

    async def body_of(request: Request) -> Any:
        try:
            return parse_json(await request.body(), limits.max_json_depth)
        except RequestRefused as exc:
            raise oa.ApiError(exc.status, exc.message, exc.param) from None

    async def generate(kind: str, endpoint: str, request: Request):
        if not authorised(request):
            front.metrics.count_http(endpoint, 401)
            return _unauthorised()
        try:
            plan, rid = await front.open_request(kind, await body_of(request))
            if not plan.stream:
                out = await front.complete(rid)
                front.metrics.count_http(endpoint, 200)
                return JSONResponse(out, headers={"x-request-id": str(rid)})
        except oa.ApiError as err:
            front.metrics.count_http(endpoint, err.status)
            return _error(err)
        front.metrics.count_http(endpoint, 200)
        return StreamingResponse(front.stream(rid), media_type="text/event-stream",
                                 headers={"x-request-id": str(rid), "cache-control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate("completion", "/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate("chat", "/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models(request: Request):
        if not authorised(request):
            return _unauthorised()
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "rack", "root": info["model"],
             "max_model_len": cfg.max_model_len} for name in cfg.served_model_names]}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if front.state == "serving" else front.state, "scenario": info["scenario"],
                "model": info["model"], "dilation": cfg.dilation, "emulated_s": host.now(),
                "in_flight": front.in_flight()}
        return JSONResponse(body, status_code=200 if front.state == "serving" else 503)

    @app.get("/metrics")
    async def metrics():
        front.metrics.set_stats(await host.engine_stats(), host.now())
        return Response(front.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/rack/requests/{key}")
    async def request_record(key: str, request: Request, wait: float = RECORD_WAIT_S):
        if not authorised(request):
            return _unauthorised()
        rid = front.request_number(key)
        if rid is None:
            return _error(oa.ApiError(400, f"request {key[:60]!r}: expected a response id (chatcmpl-rack-N, "
                                      "cmpl-rack-N) or a number", "id"))
        if not math.isfinite(wait):
            return _error(oa.ApiError(400, f"wait: expected a finite number of seconds, got {wait}", "wait"))
        rec = await front.wait_record(rid, min(max(wait, 0.0), 300.0))
        if rec is None:
            return _error(oa.ApiError(404, f"request {key}: not recorded (never received, or still in flight "
                                      f"after {wait:g} s)", "id", "NotFoundError"))
        return rec

    add_vllm_routes(app, front, limits.max_json_depth)

    return app


__all__ = ["build_app"]
