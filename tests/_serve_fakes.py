"""A live front without Ray: `InstantRack` hosts the real gateway core and HTTP app,
and its "rack" answers every request at once (admitted, tokens at the arrival time,
the record in), or raises from a handler on request; `serve_in_thread` runs the app on
uvicorn (with `rack.serve.limits`' protocol) on 127.0.0.1 in a background thread, as
`FrontHost.serve_http` does in the actor. Used by the endpoint's robustness tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Iterator

import numpy as np

from rack.serve.app import build_app
from rack.serve.frontend import FrontConfig, LiveFront
from rack.serve.gateway import Gateway
from rack.serve.limits import HttpLimits, timed_h11
from rack.serving.collector import EVENTS

KEY = "fake-key"


class InstantRack:
    """The host of a `LiveFront` (`rack.serve.frontend` lists what a host gives) whose
    rack completes every request the moment it arrives; `fail_on` (a prompt length):
    the gateway's `open` raises for a request of that many prompt tokens (a handler
    error, as a bug would)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.gateway = Gateway(router="router")
        self.front: LiveFront | None = None
        self._epoch = time.time()
        self.fail_on = fail_on

    def now(self) -> float:
        return time.time() - self._epoch

    def wall_of(self, t: float) -> float:
        return self._epoch + t

    def call_core(self, method: str, *args) -> None:
        g = self.gateway
        if method == "open" and self.fail_on is not None and args[0].prompt_tokens == self.fail_on:
            raise RuntimeError("injected handler failure")
        getattr(g, method)(self.now(), *args)
        out, g.outbox[:] = list(g.outbox), []
        for _, m, a in out:
            if m == "submit_live":
                self._complete(a[0])
        ids, _ = list(g.changed), g.changed.clear()
        if self.front is not None:
            self.front.notify(ids)

    def _complete(self, req) -> None:
        now, g, n = self.now(), self.gateway, int(req.output_tokens)
        g.admitted(now, req.id, None, n)
        times = np.full(len(EVENTS), now)
        g.request_ended(now, req.id, "completed", None, now, times, np.zeros(n - 1))

    def send_to(self, dst: str, method: str, args: tuple) -> None:
        pass

    async def engine_stats(self) -> dict:
        return {}


def make_front(max_model_len: int = 4096, api_key: str | None = KEY, fail_on: int | None = None,
               vocab_size: int | None = 163_840) -> tuple[LiveFront, InstantRack]:
    host = InstantRack(fail_on)
    front = LiveFront(host, FrontConfig(("kimi-k2",), max_model_len, 1.0, api_key=api_key,
                                        eos_mean_tokens=8.0, vocab_size=vocab_size))
    host.front = front
    return front, host


@contextlib.contextmanager
def serve_in_thread(limits: HttpLimits | None = None, **front_kw) -> Iterator[dict]:
    """uvicorn serving the app of `make_front(**front_kw)` on 127.0.0.1 (any free port)
    in a daemon thread; yields {"url", "front", "server"}; stops it on exit."""
    import uvicorn

    limits = limits or HttpLimits()
    state: dict = {}
    ready = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        front, host = make_front(**front_kw)
        app = build_app(front, host, {"scenario": "fake", "model": "kimi-k2"}, limits)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        sock.setblocking(False)
        server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False, loop="none",
                                               lifespan="off", http=timed_h11(limits)))
        state.update(url=f"http://127.0.0.1:{sock.getsockname()[1]}", front=front, server=server, loop=loop)

        async def main() -> None:
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            ready.set()
            await task

        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the test server did not start")
    try:
        yield state
    finally:
        state["server"].should_exit = True
        thread.join(30)
