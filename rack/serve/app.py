"""The HTTP routes of `rack serve` (FastAPI), over a `rack.serve.frontend.LiveFront`.

- `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI's API
  (`rack.serve.openai_api`), streamed as server-sent events when `stream` is true;
- `GET /v1/models`: the served model id (the first served name; the others, aliases,
  are accepted in requests) with `max_model_len`;
- `GET /health`: 200 {"status": "ok", ...} while serving, 503 while shutting down;
- `GET /metrics`: Prometheus text (`rack.serve.metrics`);
- `GET /rack/requests/{id}`: the front's record of a request with the rack's own
  (TTFT, ITL samples, pacing lateness), for comparing a client's measurements; `id`
  is the response id (`chatcmpl-rack-7`, `cmpl-rack-7`) or its number. A request
  still in flight or being recorded is waited for (`?wait=S` wall seconds, default
  `RECORD_WAIT_S`), so a client may ask as soon as its stream's `[DONE]` arrives;
- `GET /version`, `POST /tokenize`, `POST /detokenize`: vLLM's (`rack.serve.vllm_routes`);
- `GET /rack/runs`: throughput and goodput per client run, in wall and emulated
  seconds (`rack.serve.runs`): the idle-separated runs and the windows a user opens
  with `POST /rack/runs` (optional body {"name": ...}) and closes with
  `POST /rack/runs/{id}/close` (which answers the window's figures); `GET
  /rack/runs/{id}` gives one window's figures so far.

Every answer of every route is counted in `rack:http_requests_total{endpoint, status}`,
`endpoint` being the route's template (`/rack/requests/{key}`) or `unmatched`.

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
from starlette.routing import Match

from rack.serve import openai_api as oa
from rack.serve.frontend import LiveFront
from rack.serve.limits import RECEIVED_KEY, Guard, HttpLimits, RequestRefused, parse_json
from rack.serve.vllm_routes import add_vllm_routes

#: The API's endpoints (the requests that reach the rack), as results.json's
#: `serve.http_answered` counts them; `rack:http_requests_total` counts every route.
API_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
#: Wall seconds `/rack/requests/{id}` waits for a request in flight to be recorded.
RECORD_WAIT_S = 30.0


def _error(err: oa.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _unauthorised() -> JSONResponse:
    return _error(oa.ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                              "authentication_error", "invalid_api_key"))


def _window_id(key: str) -> int | None:
    """A `/rack/runs/{id}` key as an int (ASCII digits, a few of them), else None."""
    return int(key) if key.isascii() and key.isdigit() and len(key) < 10 else None


def build_app(front: LiveFront, host: Any, info: dict, limits: HttpLimits | None = None) -> FastAPI:
    """The FastAPI application of a live front. `host` gives `now()` and `await
    engine_stats()`; `info`: {"scenario", "model"} for /health and /v1/models;
    `limits`: the body and nesting limits (default `HttpLimits()`)."""
    cfg = front.config
    limits = limits or HttpLimits()
    app = FastAPI(title="rack serve", version="1", docs_url=None, redoc_url=None)

    def endpoint(scope: dict) -> str:
        """The route's template (after routing; before it, the route the path matches)."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in app.router.routes if r.matches({**scope, "type": "http"})[0] != Match.NONE),
                         None)
        return getattr(route, "path", None) or "unmatched"

    app.add_middleware(Guard, max_body_bytes=limits.max_body_bytes, endpoint=endpoint,
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

    async def generate(kind: str, request: Request):
        if not authorised(request):
            return _unauthorised()
        try:
            plan, rid = await front.open_request(kind, await body_of(request),
                                                  received_wall=request.scope.get(RECEIVED_KEY))
            if not plan.stream:
                out = await front.complete(rid)
                return JSONResponse(out, headers={"x-request-id": str(rid)})
        except oa.ApiError as err:
            return _error(err)
        return StreamingResponse(front.stream(rid), media_type="text/event-stream",
                                 headers={"x-request-id": str(rid), "cache-control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate("completion", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate("chat", request)

    @app.get("/v1/models")
    async def models(request: Request):
        if not authorised(request):
            return _unauthorised()
        # the first name only: clients that pick the served model from this list
        # (GuideLLM, inference-perf) take it without a warning; aliases are accepted
        return {"object": "list", "data": [
            {"id": cfg.served_model_names[0], "object": "model", "created": created, "owned_by": "rack",
             "root": info["model"], "max_model_len": cfg.max_model_len}]}

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
        waited = min(max(wait, 0.0), 300.0)
        rec = await front.wait_record(rid, waited)
        if rec is None:
            return _error(oa.ApiError(404, f"request {key}: not recorded: {front.why_unrecorded(rid, waited)}",
                                      "id", "NotFoundError"))
        return rec

    def no_window(key: str) -> JSONResponse:
        return _error(oa.ApiError(404, f"run window {key[:60]!r}: no such window (POST /rack/runs opens one)", "id",
                                  "NotFoundError"))

    @app.get("/rack/runs")
    async def runs(request: Request):
        return front.runs_report() if authorised(request) else _unauthorised()

    @app.post("/rack/runs")
    async def open_run(request: Request):
        if not authorised(request):
            return _unauthorised()
        raw = await request.body()
        try:
            body = parse_json(raw, limits.max_json_depth) if raw.strip() else {}
        except RequestRefused as exc:
            return _error(oa.ApiError(exc.status, exc.message, exc.param))
        name = body.get("name") if isinstance(body, dict) else None
        if name is not None and not isinstance(name, str):
            return _error(oa.ApiError(400, "name: expected a string", "name"))
        return JSONResponse(front.open_window(None if name is None else name[:200]), status_code=201)

    @app.get("/rack/runs/{key}")
    async def run_window(key: str, request: Request):
        if not authorised(request):
            return _unauthorised()
        out = front.window_figures(wid) if (wid := _window_id(key)) is not None else None
        return out if out is not None else no_window(key)

    @app.post("/rack/runs/{key}/close")
    async def close_run(key: str, request: Request):
        if not authorised(request):
            return _unauthorised()
        out = front.close_window(wid) if (wid := _window_id(key)) is not None else None
        return out if out is not None else no_window(key)

    add_vllm_routes(app, front, limits.max_json_depth)

    return app


__all__ = ["build_app"]
