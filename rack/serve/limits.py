"""What a client cannot do to the HTTP front: the limits and guards of `rack serve`.

- **Body size** (`HttpLimits.max_body_bytes`, default 8 MiB): a declared
  `Content-Length` above it is answered 413 before the body is read; a chunked body
  is counted as it arrives and answered 413 the moment it passes the limit. 8 MiB
  holds a full context of 1 M token ids of up to 6 digits (8 bytes each with the
  separator): no legitimate request of a 131,072-token model comes near it.
- **JSON nesting** (`max_json_depth`, default 64): the depth of `[`/`{` outside
  strings is measured on the raw bytes before parsing (`workloads.jsontext`), so a
  body nested 100,000 deep is a 400, never a `RecursionError`. OpenAI's requests nest 5-6 levels
  (body, messages, message, content parts, part); tool schemas a few more.
- **Slow clients** (`header_timeout_s`, default 10 s; `read_timeout_s`, 30 s): a
  connection must complete each request's head within the header timeout of its first
  byte (or of the connection's opening), and a body may pause at most the read
  timeout between two reads, as nginx's `client_header_timeout` and
  `client_body_timeout` (default 60 s there); otherwise the connection is closed (408
  when nothing was answered yet). uvicorn has no such timeout: half-open connections
  were held for as long as their clients liked (`timed_h11`). Idle keep-alive
  connections are closed by uvicorn's own `timeout_keep_alive` (5 s).
- **A handler that raises** (a bug, or an input no check foresaw): `Guard` logs the
  exception with its traceback (logger `rack.serve`), answers 500 in OpenAI's error
  JSON on the same keep-alive connection (Starlette's own handler answers a plain-text
  500 and uvicorn then closes the connection, so the client's next request on it
  failed), and counts it (`on_error`). A streamed response that breaks after its 200
  ends with an error event and `[DONE]`, still on a live connection.

Every answer, of every route, is counted by the `on_answer(endpoint, status)` callback
the app passes (`rack:http_requests_total`), the refusals above included.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from workloads.jsontext import json_depth

log = logging.getLogger("rack.serve")

#: Defaults (module docstring gives the reasons).
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_JSON_DEPTH = 64
HEADER_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
#: The ASGI scope's key of a request's receipt (wall s, `time.time()`), set by `Guard`.
RECEIVED_KEY = "rack.received_wall"


@dataclass(frozen=True)
class HttpLimits:
    """The front's limits (module docstring): body bytes, JSON depth, and the header
    and read timeouts in wall seconds. Raises ValueError for a value out of range."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH
    header_timeout_s: float = HEADER_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        for name in ("header_timeout_s", "read_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: expected a finite number of seconds > 0, got {v!r}")


class RequestRefused(Exception):
    """A request refused before its handler could parse it: `status` and OpenAI's
    error fields (`message`, `param`)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


# ----------------------------------------------------------------------------- JSON
def parse_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of a request body. Raises RequestRefused (400) for a body that is
    not UTF-8 JSON or nests deeper than `max_depth`."""
    depth = json_depth(body)
    if depth > max_depth:
        raise RequestRefused(400, f"the request body nests {depth} levels deep (at most {max_depth} are "
                             "accepted)")
    try:
        # JSON exchanged between systems is UTF-8 (RFC 8259, 8.1); json.loads would
        # take UTF-16 and UTF-32 bytes too, guessing the encoding
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestRefused(400, f"the request body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset "
                             f"{exc.start}); JSON bodies must be UTF-8 (RFC 8259)") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        what = (getattr(exc, "msg", None) or type(exc).__name__).removesuffix(" at")   # json appends the place
        pos = getattr(exc, "pos", None)
        raise RequestRefused(400, f"the request body is not valid JSON ({what}"
                             + (f" at character {pos})" if pos is not None else ")")) from None


# ----------------------------------------------------------------------------- ASGI guard
class _BodyTooLarge(Exception):
    pass


def _error_body(status: int, message: str, param: str | None = None) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}},
                      separators=(",", ":")).encode()


class Guard:
    """ASGI middleware of the front (module docstring): the body size limit and the
    handler-error path, and the count of every answer. `endpoint(scope)` names a
    request's endpoint for the counts (a route's template, so ids do not multiply the
    label's values); `on_answer(endpoint, status)` counts each answer as its status
    leaves (the handler's, or the 413 or 500 this answers); `on_error(endpoint)` counts
    a handler error (also one after a stream started)."""

    def __init__(self, app: Any, *, max_body_bytes: int, endpoint: Callable[[dict], str],
                 on_answer: Callable[[str, int], None], on_error: Callable[[str], None]) -> None:
        self.app, self.max_body_bytes = app, int(max_body_bytes)
        self.endpoint, self.on_answer, self.on_error = endpoint, on_answer, on_error

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # the request's receipt (wall s), before its body is read and parsed: the
        # front's intake (`LiveFront.open_request`) starts here, not after its own work
        scope[RECEIVED_KEY] = time.time()
        where = self.endpoint(scope)
        limit = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._answer(send, where, 413, f"the request body is {declared:,} bytes; at most {limit:,} "
                               "are accepted", close=True)
            return
        state = {"started": False, "ended": False, "sse": False, "read": 0}

        async def counted_receive() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                # the route is known once the router matched it
                self.on_answer(self.endpoint(scope), int(message["status"]))
                state["sse"] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                   for k, v in message.get("headers", ()))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["ended"] = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if not state["started"]:
                await self._answer(send, self.endpoint(scope), 413, f"the request body is over {limit:,} bytes (at most "
                                   f"{limit:,} are accepted)", close=True)
        except Exception as exc:  # noqa: BLE001 - the one place a handler's failure is answered
            if type(exc).__name__ == "ClientDisconnect":     # starlette's: nobody to answer
                return
            log.error("rack serve: %s %s raised %s: %s", scope.get("method"), scope.get("path"),
                      type(exc).__name__, exc, exc_info=exc)
            self.on_error(self.endpoint(scope))
            message = f"internal error handling the request ({type(exc).__name__}); it is logged"
            if not state["started"]:
                await self._answer(send, self.endpoint(scope), 500, message)
            elif not state["ended"]:
                tail = b""
                if state["sse"]:
                    tail = b"data: " + _error_body(500, message) + b"\n\ndata: [DONE]\n\n"
                await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _answer(self, send, where: str, status: int, message: str, close: bool = False) -> None:
        body = _error_body(status, message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:       # the rest of an oversized body is not worth reading
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self.on_answer(where, status)


def _content_length(scope: dict) -> int | None:
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v) if v.isdigit() else None
            except ValueError:
                return None
    return None


# ----------------------------------------------------------------------------- timeouts
def timed_h11(limits: HttpLimits) -> type:
    """uvicorn's h11 protocol with the header and read timeouts of `limits` (module
    docstring); pass it as `uvicorn.Config(http=...)`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        header_timeout_s = float(limits.header_timeout_s)
        read_timeout_s = float(limits.read_timeout_s)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._rack_timer = None
            self._rack_arm(self.header_timeout_s, "header")

        def connection_lost(self, exc) -> None:
            self._rack_cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._rack_timer is None and self.conn.trailing_data[0]:
                    self._rack_arm(self.header_timeout_s, "header")      # a new head began
            elif state is h11.SEND_BODY:
                self._rack_arm(self.read_timeout_s, "read")              # from this read
            else:
                self._rack_cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                self._rack_cancel()          # idle: uvicorn's keep-alive timeout applies

        def _rack_arm(self, delay: float, what: str) -> None:
            self._rack_cancel()
            self._rack_timer = self.loop.call_later(delay, self._rack_expired, what)

        def _rack_cancel(self) -> None:
            if getattr(self, "_rack_timer", None) is not None:
                self._rack_timer.cancel()
                self._rack_timer = None

        def _rack_expired(self, what: str) -> None:
            self._rack_timer = None
            if self.transport.is_closing():
                return
            if what == "read" and self.flow.read_paused:      # the app is behind, not the client
                self._rack_arm(self.read_timeout_s, what)
                return
            # no response begun (h11's SEND_RESPONSE: a request's head came, its body
            # stalled, the handler still waits for it): the client hears why
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                     b"content-length: 0\r\nconnection: close\r\n\r\n")
            log.info("rack serve: closed a connection from %s: no complete request %s within %g s",
                     self.client, "head" if what == "header" else "body read",
                     self.header_timeout_s if what == "header" else self.read_timeout_s)
            self.transport.close()

    return TimedH11Protocol


__all__ = ["Guard", "HEADER_TIMEOUT_S", "HttpLimits", "MAX_BODY_BYTES", "MAX_JSON_DEPTH", "READ_TIMEOUT_S",
           "RECEIVED_KEY",
           "RequestRefused", "json_depth", "parse_json", "timed_h11"]
