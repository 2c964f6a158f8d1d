"""The live front's request handling (asyncio; no HTTP, no Ray): from a parsed request
to the rack and back, paced, recorded and counted.

`LiveFront` is given a *host* (`rack.serve.ray_front.FrontHost`) that owns the
gateway core (`rack.serve.gateway.Gateway`) and the emulated clock:
`host.call_core(method, *args)` runs a gateway handler now, `host.now()` is emulated
time, `host.wall_of(t)` the wall instant of emulated `t`, `host.send_to(core, method,
args)` messages another core, `await host.engine_stats()` reads the instances' stats.
The host calls `notify(ids)` after each call into the core with the requests whose
state changed, which wakes their handlers.

Per request (`open_request`): the request enters the rack through the router
(`Gateway.open`); the front waits for the router's verdict (a rejection is an HTTP
error: 429 with Retry-After for a full queue), then either waits for the request's
end (non-streaming) or streams its tokens at their emulated times (`rack.serve.pacing`).
A request stays in the rack when its client goes away: its end is still recorded.
When the collector's record is in and the response is over, the front keeps one row
per request (`records`): HTTP status, whether it streamed, chunks, tokens sent, the
client's disconnect, and the pacing lateness (wall s): for each token the wall time it
left the front minus the wall time of its recorded emulated time; `lateness_s` is
the largest, `early_s` the largest negative one (a token sent before a run was cut
that moved it later; 0 when none).

`record_of(id)` answers by the front's integer id or by the response id
(`chatcmpl-rack-7`, `cmpl-rack-7`); `wait_record` waits for a request that is still
being recorded (the collector's record reaches the front a moment after the last
token is due), so a client may ask as soon as its stream's `[DONE]` arrives.
`pacing_window()` gives the pacing lateness of the tokens streamed since its last
call (what `rack serve` prints while it runs, `rack.serve.pacing.lateness_line`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np

from rack.serve import openai_api as oa
from rack.serve.metrics import ServeMetrics
from rack.serve.pacing import next_chunk
from rack.serve.runs import IDLE_GAP_S, client_agreement, run_figures, split_runs
from rack.serve.tokenizer import load_tokenizer
from rack.serving.collector import EVENTS
from workloads.request import Request

#: Wall seconds a request waits for the router's verdict before a 503 (the rack is
#: stalled or gone: never reached in a healthy run, where it takes milliseconds).
ADMISSION_TIMEOUT_S = 30.0
#: Wall seconds between liveness checks while a stream waits for planned tokens.
WAIT_POLL_S = 1.0
#: Retry-After of a 429 before any request completed (s).
DEFAULT_RETRY_AFTER_S = 1.0
#: Requests whose ITL samples `record_of` can still return.
KEEP_ITL = 1000


@dataclass
class FrontConfig:
    """Settings of the live front (see `rack serve --help`)."""

    served_model_names: tuple[str, ...]
    max_model_len: int | None
    dilation: float
    pacing_quantum_s: float = 0.001      # wall seconds
    eos_mean_tokens: float = 256.0
    api_key: str | None = None
    vocab_size: int | None = None        # token ids must be below it (None: unchecked)
    tokenizer: str | None = None         # a tokenizer.json (or folder); None: rack's default counter
    slo_ttft_s: float = math.inf         # the scenario's SLO (emulated s), for per-run goodput
    slo_tpot_s: float = math.inf


@dataclass
class _Response:
    """The front's side of one request while it is served."""

    rid: int
    plan: oa.Plan
    received_wall: float
    status: int = 200
    chunk_end: list[int] = field(default_factory=list)      # tokens sent after each chunk
    chunk_wall: list[float] = field(default_factory=list)   # when each chunk left
    disconnected: bool = False
    ended_wall: float | None = None                         # when the HTTP response ended
    done: asyncio.Event = field(default_factory=asyncio.Event)


class LiveFront:
    """Request handling of the live front (module docstring)."""

    def __init__(self, host: Any, config: FrontConfig) -> None:
        self.host = host
        self.config = config
        self.tokenizer = load_tokenizer(config.tokenizer)
        self.metrics = ServeMetrics(config.served_model_names[0], config.dilation)
        self._late: list[np.ndarray] = []        # per-chunk lateness (wall s) since `pacing_window`
        self._window_row = 0                      # first row of `records` since `pacing_window`
        self.windows: list[dict] = []             # `/rack/runs` windows (`open_window`)
        self.records: list[dict] = []
        self.requests: list[Request] = []
        self.state = "serving"
        self._issued = 0                          # request ids given out so far (the next id)
        self._events: dict[int, asyncio.Event] = {}
        self._active: dict[int, _Response] = {}
        self._ttft_ewma: float | None = None      # emulated s, for Retry-After
        self._itl: dict[int, np.ndarray] = {}     # the last KEEP_ITL requests' ITL samples
        self._drain_deadline = math.inf

    # ------------------------------------------------------------------ host side
    def notify(self, ids) -> None:
        """The gateway's state of these requests changed: wake their handlers."""
        for rid in ids:
            ev = self._events.get(rid)
            if ev is not None:
                ev.set()

    def retry_after_s(self) -> float:
        """Retry-After of a 429 (wall s): about one recent TTFT (an EWMA of the
        completed requests' TTFT, times the dilation), >= 1 s."""
        if self._ttft_ewma is None:
            return DEFAULT_RETRY_AFTER_S
        return max(1.0, self._ttft_ewma * self.config.dilation)

    def in_flight(self) -> int:
        return len(self._active)

    # ------------------------------------------------------------------ requests
    async def open_request(self, kind: str, body: Any, received_wall: float | None = None) -> tuple[oa.Plan, int]:
        """Parse, send to the rack and wait for the router's verdict: (plan, request id).
        `received_wall`: the request's HTTP receipt (wall s, `time.time()`; default now),
        where its intake starts, so the record's `intake_s` holds the front's own work
        (body, parse, tokens) before the router's arrival; no earlier than the rack's
        emulated time 0 (a request sent while the server starts waits for it).
        Raises ApiError (400/404 bad input, 429/400/503 refused by the rack, 503 draining)."""
        received_wall = time.time() if received_wall is None else received_wall
        if self.state != "serving":
            raise oa.ApiError(503, "the server is shutting down", None, "server_error", "shutting_down")
        rid = self._issued
        self._issued += 1
        plan = oa.parse_request(kind, body, served=self.config.served_model_names,
                                max_model_len=self.config.max_model_len,
                                eos_mean_tokens=self.config.eos_mean_tokens, request_id=rid,
                                vocab_size=self.config.vocab_size, tokenizer=self.tokenizer)
        wait = self.host.wall_of(0.0) - time.time()
        if wait > 0:                                  # before emulated time 0
            await asyncio.sleep(wait)
        # a request sent before the rack's clock started is received when it starts: the
        # server's start-up is not the front's intake (nor a token's lateness)
        received_wall = max(received_wall, self.host.wall_of(0.0))
        req = Request(id=rid, arrival_s=max(0.0, self.host.now()), prompt_tokens=plan.prompt_tokens,
                      output_tokens=plan.output_tokens, block_hashes=plan.block_hashes,
                      block_size=plan.block_size)
        resp = _Response(rid, plan, received_wall)
        self._active[rid] = resp
        ev = self._events[rid] = asyncio.Event()
        try:
            self.host.call_core("open", req)
        except BaseException:
            # the gateway never took it (a handler error, answered 500 by
            # rack.serve.limits.Guard): nothing of it is left to wait for or record
            self._active.pop(rid, None)
            self._events.pop(rid, None)
            raise
        self.requests.append(req)
        asyncio.ensure_future(self._record_when_ended(resp))
        deadline = time.time() + ADMISSION_TIMEOUT_S
        while True:
            lr = self.host.gateway.live(rid)
            if lr.status != "pending":
                break
            ev.clear()
            if time.time() > deadline:
                self._end_response(resp, 503)
                raise oa.ApiError(503, "the emulated rack did not answer in time", None, "server_error")
            try:
                await asyncio.wait_for(ev.wait(), timeout=max(0.01, deadline - time.time()))
            except asyncio.TimeoutError:
                pass
        if lr.status == "rejected":
            err = oa.rejection_error(lr.reason, self.retry_after_s())
            err.headers["x-request-id"] = str(rid)
            self._end_response(resp, err.status)
            raise err
        if lr.n_out < plan.output_tokens:            # the context limit truncated it
            plan.output_tokens, plan.finish_reason = lr.n_out, "length"
        return plan, rid

    async def complete(self, rid: int) -> dict:
        """A non-streaming response: when the request ends (its last token's time)."""
        resp = self._active[rid]
        try:
            lr = await self._until(rid, lambda lr: lr.ended)
            if lr.outcome != "completed":
                err = oa.rejection_error(lr.reason or "failed", self.retry_after_s()) \
                    if lr.reason in oa.REJECTION_STATUS else oa.ended_error(lr.outcome, lr.reason)
                resp.status = err.status
                raise err
            n = lr.n_out
            resp.chunk_end.append(n)
            resp.chunk_wall.append(time.time())
            resp.plan.cached_tokens = lr.extra.get("cached_tokens", 0)
            return oa.full_response(resp.plan, rid, self.tokenizer.filler(0, n), n, resp.plan.finish_reason)
        finally:
            self._end_response(resp, resp.status)

    async def stream(self, rid: int) -> AsyncIterator[str]:
        """Server-sent events of a streaming response (module docstring)."""
        resp = self._active[rid]
        plan = resp.plan
        created = int(time.time())
        quantum = self.config.pacing_quantum_s / self.config.dilation
        sent = 0
        try:
            if plan.kind == "chat":
                yield _sse(oa.chunk(plan, rid, created, None, role=True))
            while True:
                lr = self.host.gateway.live(rid)
                n = lr.n_out
                plan.cached_tokens = lr.extra.get("cached_tokens", 0)
                if sent < n:
                    end, wait = next_chunk(lr.times, sent, self.host.now(), quantum)
                    if end > sent:
                        last = end == n
                        data = _sse(oa.chunk(plan, rid, created, self.tokenizer.filler(sent, end - sent),
                                             plan.finish_reason if last else None, tokens_so_far=end))
                        resp.chunk_end.append(end)
                        resp.chunk_wall.append(time.time())
                        sent = end
                        yield data
                        # resumed once the server handed the chunk to the socket: that
                        # is when it left (a busy loop's delay in the write is lateness)
                        resp.chunk_wall[-1] = time.time()
                        continue
                if sent >= n:
                    if plan.include_usage:
                        yield _sse(oa.usage_chunk(plan, rid, created, n))
                    yield "data: [DONE]\n\n"
                    return
                if lr.ended and lr.outcome != "completed":
                    err = oa.ended_error(lr.outcome, lr.reason)
                    resp.status = 200
                    yield _sse(err.body())
                    yield "data: [DONE]\n\n"
                    return
                await self._wait(rid, wait)
        except (asyncio.CancelledError, GeneratorExit):
            resp.disconnected = True
            raise
        finally:
            self._end_response(resp, resp.status)

    # ------------------------------------------------------------------ shutdown
    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests; wait up to `timeout_s` (wall) for those in flight, then
        end the rest as failed ("server_shutdown") in the collector, and wait until every
        response is over and recorded."""
        self.state = "draining"
        self._drain_deadline = time.time() + max(0.0, timeout_s)
        while self._active and time.time() < self._drain_deadline:
            await asyncio.sleep(0.05)
        if self._active or self.host.gateway.open_count():
            self.host.send_to("collector", "end_open", ("server_shutdown",))
        deadline = time.time() + 30.0
        while self._active and time.time() < deadline:
            await asyncio.sleep(0.05)
        self.state = "stopped"

    def hurry(self) -> None:
        """A drain in progress stops waiting for the requests in flight (they end as
        failed "server_shutdown")."""
        self._drain_deadline = 0.0

    # ------------------------------------------------------------------ internals
    async def _wait(self, rid: int, until_emulated: float) -> None:
        """Until emulated time `until_emulated` (inf: until the request's state changes,
        polled every WAIT_POLL_S)."""
        ev = self._events[rid]
        ev.clear()
        if until_emulated == math.inf:
            try:
                await asyncio.wait_for(ev.wait(), timeout=WAIT_POLL_S)
            except asyncio.TimeoutError:
                pass
            return
        delay = self.host.wall_of(until_emulated) - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)

    async def _until(self, rid: int, cond) -> Any:
        while True:
            lr = self.host.gateway.live(rid)
            if cond(lr):
                return lr
            await self._wait(rid, math.inf)

    def _end_response(self, resp: _Response, status: int) -> None:
        resp.status = status
        resp.ended_wall = time.time()
        resp.done.set()

    async def _record_when_ended(self, resp: _Response) -> None:
        """Once the response is over and the rack's record is in: one row in `records`,
        the metrics, and the gateway forgets the request."""
        rid = resp.rid
        await resp.done.wait()
        lr = await self._until(rid, lambda lr: lr.ended)
        lateness = early = None
        if resp.chunk_end and lr.outcome == "completed":
            truth = np.array([self.host.wall_of(t) for t in lr.times])
            ends = np.minimum(np.asarray(resp.chunk_end), truth.shape[0])
            walls = np.asarray(resp.chunk_wall)
            # A chunk is due when its last token is: a non-streamed response (one chunk
            # of every token) is on time when sent at the last token's time, not late
            # by E2E - TTFT.
            diff = walls - truth[ends - 1]
            lateness, early = float(diff.max()), float(max(0.0, -diff.min()))
            if resp.plan.stream:
                self._late.append(diff)
        times = {}
        if lr.record_times is not None:
            times = {name: float(t) for name, t in zip(EVENTS, lr.record_times)}
        sent = _sent_wall(resp) if lr.outcome == "completed" else None
        if lr.outcome == "completed" and times:
            ttft = times["first_token"] - times["arrival"]
            self._ttft_ewma = ttft if self._ttft_ewma is None else 0.8 * self._ttft_ewma + 0.2 * ttft
        self.metrics.observe_request(
            outcome=lr.outcome or "failed", reason=lr.reason, finish_reason=resp.plan.finish_reason,
            prompt_tokens=resp.plan.prompt_tokens, output_tokens=lr.n_out, times=times or
            {k: math.nan for k in EVENTS}, itl_s=lr.itl_s, lateness_wall_s=lateness,
            sent_wall=sent)
        self.records.append({
            "id": rid, "endpoint": resp.plan.kind, "stream": resp.plan.stream, "http_status": resp.status,
            "outcome": lr.outcome, "reason": lr.reason, "output_tokens": lr.n_out,
            "tokens_sent": int(resp.chunk_end[-1]) if resp.chunk_end else 0, "chunks": len(resp.chunk_end),
            "client_disconnected": resp.disconnected, "received_wall_s": resp.received_wall,
            "ended_wall_s": resp.ended_wall,
            # what the client saw of a stream: its first and last chunk's send time (wall s)
            "first_chunk_wall_s": resp.chunk_wall[0] if resp.plan.stream and resp.chunk_wall else None,
            "last_chunk_wall_s": resp.chunk_wall[-1] if resp.plan.stream and resp.chunk_wall else None,
            "response_id": oa.response_id(resp.plan, rid), "prompt_tokens": resp.plan.prompt_tokens,
            "cached_tokens": int(lr.extra.get("cached_tokens", 0)),
            "lateness_s": lateness, "early_s": early,
            # HTTP receipt to the router's arrival (wall s): the front's own delay before TTFT starts
            "intake_s": _finite(self.host.wall_of(times["arrival"]) - resp.received_wall) if times else None,
            **{f"t_{k}_s": _finite(times.get(k)) for k in ("arrival", "first_token", "completion")}})
        if lr.itl_s is not None:
            self._itl[rid] = np.asarray(lr.itl_s)
            while len(self._itl) > KEEP_ITL:
                self._itl.pop(next(iter(self._itl)))
        self._active.pop(rid, None)
        self._events.pop(rid, None)
        self.host.call_core("forget", rid)

    def pacing_window(self) -> dict:
        """What the clients of the streamed responses recorded since the last call
        could observe, against rack's records: {"chunks", "responses", "p50_s", "p99_s",
        "max_s" (the chunks' pacing lateness, wall s), and `rack.serve.runs.client_agreement`'s
        "compared", "ttft_dev", "tpot_dev", "tpot_wall_s"}; the window then starts again."""
        late = np.concatenate(self._late) if self._late else np.zeros(0)
        out = {"chunks": int(late.size), "responses": len(self._late),
               **({f"p{q}_s": float(np.percentile(late, q)) for q in (50, 99)} if late.size else
                  {"p50_s": None, "p99_s": None}),
               "max_s": float(late.max()) if late.size else None,
               **client_agreement(self.records[self._window_row:], self.config.dilation)}
        self._late, self._window_row = [], len(self.records)
        return out

    # ------------------------------------------------------------------ runs
    def open_window(self, name: str | None = None) -> dict:
        """Open a `/rack/runs` window: the requests received from now until it is
        closed form one run (`rack.serve.runs`). Returns its description."""
        w = {"id": len(self.windows), "name": name, "opened_wall_s": time.time(), "closed_wall_s": None}
        self.windows.append(w)
        return dict(w)

    def close_window(self, wid: int) -> dict | None:
        """Close window `wid` (closing twice keeps the first close); its figures, or
        None for an unknown id."""
        if not 0 <= wid < len(self.windows):
            return None
        w = self.windows[wid]
        if w["closed_wall_s"] is None:
            w["closed_wall_s"] = time.time()
        return self.window_figures(wid)

    def window_figures(self, wid: int) -> dict | None:
        """Window `wid` with the figures of the requests recorded in it so far
        (`rack.serve.runs.run_figures`); None for an unknown id."""
        if not 0 <= wid < len(self.windows):
            return None
        w = self.windows[wid]
        end = math.inf if w["closed_wall_s"] is None else w["closed_wall_s"]
        rows = [r for r in self.records if w["opened_wall_s"] <= r["received_wall_s"] <= end]
        return {**w, "open": w["closed_wall_s"] is None, **self._figures(rows)}

    def runs_report(self) -> dict:
        """{"idle_gap_s", "runs": the idle-separated runs' figures, "windows": every
        window's} (`rack.serve.runs`)."""
        return {"idle_gap_s": IDLE_GAP_S,
                "runs": [{"run": i, "first_received_wall_s": rows[0]["received_wall_s"], **self._figures(rows)}
                         for i, rows in enumerate(split_runs(self.records))],
                "windows": [self.window_figures(i) for i in range(len(self.windows))]}

    def _figures(self, rows) -> dict:
        c = self.config
        return run_figures(rows, c.dilation, c.slo_ttft_s, c.slo_tpot_s)

    def request_number(self, key: int | str) -> int | None:
        """The front's id of `key`: an int, its decimal string, or a response id
        (`chatcmpl-rack-7`, `cmpl-rack-7`); None for anything else."""
        text = str(key)
        for prefix in ("chatcmpl-rack-", "cmpl-rack-"):
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        # ASCII digits only, and few of them: int() reads other scripts' digits, and
        # refuses strings of more than 4,300 digits with a ValueError
        return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None

    async def wait_record(self, rid: int, timeout_s: float) -> dict | None:
        """`record_of(rid)`, waiting up to `timeout_s` (wall) while the request is still
        in flight or being recorded; None for a request never opened or not recorded
        in time."""
        deadline = time.time() + max(0.0, timeout_s)
        while True:
            rec = self.record_of(rid)
            if rec is not None or rid not in self._active or time.time() >= deadline:
                return rec
            await asyncio.sleep(0.01)

    def why_unrecorded(self, rid: int, waited_s: float) -> str:
        """Why request `rid` has no record (for `/rack/requests/{id}`'s 404): never
        received, still in flight after `waited_s` wall s, or answered with an error
        before it reached the rack (a refused request keeps its id but has no record)."""
        if rid >= self._issued:
            return f"no request with this id was received (ids so far: 0-{self._issued - 1})" if self._issued \
                else "no request was received yet"
        if rid in self._active:
            return f"still in flight after {waited_s:g} s (ask again, or with ?wait=S)"
        return "answered with an error before it reached the rack (e.g. a 400 for a bad request): never recorded"

    def record_of(self, rid: int) -> dict | None:
        """The front's row of request `rid` with the rack's ITL samples (emulated s; kept
        for the last KEEP_ITL requests) under "itl_s"; None until it is recorded."""
        for r in reversed(self.records):
            if r["id"] == rid:
                itl = self._itl.get(rid)
                row = {k: _finite(v) if isinstance(v, float) else v for k, v in r.items()}
                return {**row, "itl_s": None if itl is None else itl.tolist()}
        return None


def _sent_wall(resp: _Response) -> dict | None:
    """What the client of a streamed response saw, measured at the front (wall s):
    TTFT (HTTP receipt to the first token's chunk), E2E (to the last chunk) and the
    gaps between chunks (one ITL sample per chunk after the first, as vLLM observes one
    per iteration); None for a non-streamed response (its tokens leave together)."""
    if not resp.plan.stream or not resp.chunk_wall:
        return None
    walls = np.asarray(resp.chunk_wall)
    return {"ttft": float(walls[0] - resp.received_wall), "e2e": float(walls[-1] - resp.received_wall),
            "itl": np.diff(walls), "tokens": int(resp.chunk_end[-1])}


def _finite(x: float | None) -> float | None:
    """x, or None for NaN / absent (JSON has no NaN)."""
    return None if x is None or not math.isfinite(x) else float(x)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


__all__ = ["FrontConfig", "LiveFront"]
