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

With an API key, the `/v1` routes need `Authorization: Bearer KEY` (401 otherwise), as
vLLM's `--api-key` does; the other routes stay open for probes and scrapers.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rack.serve import openai_api as oa
from rack.serve.frontend import LiveFront
from rack.serve.vllm_routes import add_vllm_routes

#: Wall seconds `/rack/requests/{id}` waits for a request in flight to be recorded.
RECORD_WAIT_S = 30.0


def _error(err: oa.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def build_app(front: LiveFront, host: Any, info: dict) -> FastAPI:
    """The FastAPI application of a live front. `host` gives `now()` and `await
    engine_stats()`; `info`: {"scenario", "model"} for /health and /v1/models."""
    cfg = front.config
    app = FastAPI(title="rack serve", version="1", docs_url=None, redoc_url=None)
    created = int(time.time())

    def authorised(request: Request) -> bool:
        if cfg.api_key is None:
            return True
        return request.headers.get("authorization", "") == f"Bearer {cfg.api_key}"

    async def body_of(request: Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            raise oa.ApiError(400, "the request body is not valid JSON", None) from None

    async def generate(kind: str, endpoint: str, request: Request):
        if not authorised(request):
            front.metrics.count_http(endpoint, 401)
            return _error(oa.ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                                      "authentication_error", "invalid_api_key"))
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
            return _error(oa.ApiError(401, "missing or wrong API key", None, "authentication_error",
                                      "invalid_api_key"))
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
    async def request_record(key: str, wait: float = RECORD_WAIT_S):
        rid = front.request_number(key)
        if rid is None:
            return _error(oa.ApiError(400, f"request {key!r}: expected a response id (chatcmpl-rack-N, "
                                      "cmpl-rack-N) or a number", "id"))
        rec = await front.wait_record(rid, min(max(wait, 0.0), 300.0))
        if rec is None:
            return _error(oa.ApiError(404, f"request {key}: not recorded (never received, or still in flight "
                                      f"after {wait:g} s)", "id", "NotFoundError"))
        return rec

    add_vllm_routes(app, front)

    return app


__all__ = ["build_app"]
