"""The live front's Ray actor: a `CoreHost` for the gateway core that also runs the
HTTP server (uvicorn, in the actor's own event loop), so that on a cluster the front
sits on whichever node its `[placement] front` resources name.

Messages from the rack reach the gateway core as for any core (`deliver`); after each
call the host wakes the HTTP handlers whose requests changed (`LiveFront.notify`).
The HTTP handlers call the core directly (`call_core`), in this actor's loop, never
during another handler. The driver starts the server with `serve_http(config)`
(binding first, so a port in use is an error there), polls `front_state()`, and stops
it with `stop_http(drain_s)`: new requests get 503, those in flight are given
`drain_s` wall seconds, the rest are ended as failed ("server_shutdown") by the
collector, every response ends and is recorded, then the server exits.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from rack.runtime.ray_host import CoreHost, ray_api

#: Components whose stats `/metrics` reads.
_STATS_KINDS = ("prefill", "decode", "both", "interconnect")


class FrontHost(CoreHost):
    """CoreHost of the gateway core plus the HTTP server (module docstring)."""

    def __init__(self, name: str, registry: str | None = None) -> None:
        super().__init__(name, registry)
        self.front: Any = None
        self._server: Any = None
        self._serve_task: asyncio.Future | None = None
        self._stats_names: list[str] = []

    # ------------------------------------------------------------------ the host's duties
    @property
    def gateway(self) -> Any:
        return self.core

    def wall_of(self, t: float) -> float:
        """Wall instant (s since the Unix epoch) of emulated time `t`."""
        return self._epoch + t * self._dilation

    def call_core(self, method: str, *args: Any) -> None:
        """Run gateway handler `method(now, *args)` now and send what it sends."""
        getattr(self.core, method)(self.now(), *args)
        self._after()

    def send_to(self, dst: str, method: str, args: tuple) -> None:
        """Message core `dst` (e.g. the collector's `end_open`)."""
        self._send(dst, method, args)

    def _after(self) -> None:
        super()._after()
        changed = self.core.changed
        if changed and self.front is not None:
            ids = list(changed)
            changed.clear()
            self.front.notify(ids)

    async def engine_stats(self) -> dict:
        """The stats of every instance and the interconnect (read now, 10 s timeout)."""
        names = [n for n in self._stats_names if n in self.peers]
        refs = [self.peers[n].query.remote("stats") for n in names]
        try:
            out = await asyncio.wait_for(asyncio.gather(*refs), timeout=10.0)
        except Exception:  # noqa: BLE001 - a scrape must not fail with the rack: gauges left out
            return {}
        return dict(zip(names, out))

    # ------------------------------------------------------------------ the server
    async def serve_http(self, config: dict) -> dict:
        """Bind `config["host"]:config["port"]` (0: any free port) and serve the API.

        config: {"host", "port", "front": FrontConfig kwargs, "info": {"scenario",
        "model"}, "stats_names": [component names], "limits": HttpLimits kwargs
        (optional)}. Returns {"host", "port", "url", "node_ip", "pid"}. Raises OSError
        when the address cannot be bound."""
        import os

        import uvicorn

        from rack.serve.app import build_app
        from rack.serve.frontend import FrontConfig, LiveFront
        from rack.serve.limits import HttpLimits, timed_h11

        self.front = LiveFront(self, FrontConfig(**config["front"]))
        self._stats_names = list(config.get("stats_names", []))
        limits = HttpLimits(**config.get("limits", {}))
        app = build_app(self.front, self, config["info"], limits)
        host = config["host"]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
        # sockets whose proto says TCP; with proto 0 a response's body (and each SSE
        # chunk) waited up to 40 ms for the client's delayed ACK of the part before it
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(config["port"])))
        sock.listen(2048)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        uv = uvicorn.Config(app, log_level="warning", access_log=False, loop="none",
                            timeout_graceful_shutdown=5, lifespan="off", http=timed_h11(limits))
        self._server = uvicorn.Server(uv)
        self._serve_task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        for _ in range(200):                      # until uvicorn has started
            if self._server.started or self._serve_task.done():
                break
            await asyncio.sleep(0.01)
        if self._serve_task.done():
            self._serve_task.result()             # raises what stopped it
        shown = f"[{host}]" if ":" in host else host
        return {"host": host, "port": port, "url": f"http://{shown}:{port}",
                "node_ip": ray_api().util.get_node_ip_address(), "pid": os.getpid()}

    async def front_state(self) -> dict:
        """{"state": "serving" | "draining" | "stopped", "in_flight", "recorded", "emulated_s"}."""
        f = self.front
        return {"state": f.state if f is not None else "starting", "in_flight": f.in_flight() if f else 0,
                "recorded": len(f.records) if f else 0, "emulated_s": self.now()}

    async def pacing_window(self) -> dict:
        """The front's pacing lateness since the last call (`LiveFront.pacing_window`)."""
        return self.front.pacing_window() if self.front is not None else {"chunks": 0}

    async def stop_http(self, drain_s: float) -> dict:
        """Drain (module docstring) and stop the server; returns `front_state()`."""
        f = self.front
        if f is not None and f.state == "serving":
            await f.drain(drain_s)
        elif f is not None and f.state == "draining":     # asked again (a second Ctrl-C): now
            f.hurry()
            while f.state == "draining":
                await asyncio.sleep(0.05)
        if self._server is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._serve_task), timeout=15.0)
            except Exception:  # noqa: BLE001 - stopping: the records are what matters
                pass
        return await self.front_state()

    async def front_records(self) -> dict:
        """{"records": the front's row per request, "requests": the Requests opened,
        "counts": the gateway's counters, "http": every answer of the API's endpoints by
        status (also those refused before reaching the rack: bad input, unknown model,
        no key), "http_routes": every route's answers {endpoint: {status: n}}, "runs":
        the per-run figures (`LiveFront.runs_report`),
        "handler_errors": handlers that raised (`rack.serve.limits`)}."""
        from rack.serve.app import API_ENDPOINTS

        f = self.front
        http: dict[str, int] = {}
        routes: dict[str, dict[str, int]] = {}
        for (endpoint, status), n in (f.metrics.http.items() if f else ()):
            routes.setdefault(endpoint, {})[status] = int(n)
            if endpoint in API_ENDPOINTS:
                http[status] = http.get(status, 0) + int(n)
        return {"records": list(f.records) if f else [], "requests": list(f.requests) if f else [],
                "counts": dict(self.core.counts), "http": http, "http_routes": routes, "wall_s": time.time(),
                "handler_errors": sum(f.metrics.handler_errors.values()) if f else 0,
                "runs": f.runs_report() if f else None}


__all__ = ["FrontHost"]
