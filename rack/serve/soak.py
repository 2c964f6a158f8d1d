"""A pacing soak of `rack serve`: batches of concurrent streams, some clients hanging
up part-way, every stream's pacing checked against the rack's own record.

Issue 24 saw, once, 13 of 30 streams receive no token until their 3,000-token decode
had ended (`lateness_s` 22.9-23.3 s in front.csv). This load reproduces that shape:
each batch sends `streams` streaming `/v1/completions` at once (distinct prompts of
`prompt_tokens` token ids, `ignore_eos`, `output_tokens` each), a share
`disconnect_share` of them closing the connection after a random number of tokens;
when the batch is over, each request's record (`/rack/requests/{id}`) gives its
pacing lateness (wall s: the latest any token left the front after its recorded
time) and the wall time its first token was due, which the client compares with the
moment its first token arrived (same host, same wall clock).

- A stream is *held* when its first token reached the client more than half its
  decode late (and more than `stall_s`): the issue's fault, streams that got nothing
  until their decode had ended, whatever the load.
- A stream is *late* when its lateness exceeds `stall_s`: the front did not keep up
  (an overloaded host: every stream of the batch late together, by a share of the
  batch's length that grows with the load, is saturation, not a held stream).

`soak` returns per-batch and overall figures; `scripts/soak_serve.py` runs it against
a `LiveServer` it starts.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Token ids of the soak's prompts are drawn below this (every vocabulary is larger).
VOCAB = 32_000


@dataclass
class StreamResult:
    """One stream as the client saw it and as the front recorded it (wall s)."""

    batch: int
    index: int
    status: int | None = None
    rid: int | None = None
    tokens: int = 0
    hung_up: bool = False
    first_token_s: float = math.nan           # from the send to the first chunk with text
    first_token_wall: float = math.nan        # time.time() when it arrived
    error: str | None = None
    record: dict = field(default_factory=dict)
    dilation: float = 1.0

    @property
    def lateness_s(self) -> float:
        v = self.record.get("lateness_s")
        return math.nan if v is None else float(v)

    def _due(self, event: str) -> float:
        """Wall time of a recorded event (the front's `wall_of`, from its record)."""
        r = self.record
        if not r or r.get(f"t_{event}_s") is None or r.get("intake_s") is None:
            return math.nan
        return r["received_wall_s"] + r["intake_s"] + (r[f"t_{event}_s"] - r["t_arrival_s"]) * self.dilation

    @property
    def first_token_late_s(self) -> float:
        """How late the first token reached the client (wall s) against its recorded time."""
        return self.first_token_wall - self._due("first_token")

    @property
    def decode_wall_s(self) -> float:
        """Wall seconds from the recorded first token to the completion."""
        return self._due("completion") - self._due("first_token")

    def held(self, stall_s: float) -> bool:
        """The first token came more than half the decode late (and more than `stall_s`)."""
        late = self.first_token_late_s
        return bool(late > stall_s and late > 0.5 * self.decode_wall_s)


async def _stream(client: Any, url: str, headers: dict, body: dict, res: StreamResult, hang_up_after: int | None,
                  timeout_s: float) -> None:
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as r:
            res.status = r.status_code
            res.rid = int(r.headers["x-request-id"]) if "x-request-id" in r.headers else None
            if r.status_code != 200:
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    res.error = str(obj["error"].get("message"))
                    return
                text = "".join(ch.get("text") or "" for ch in obj.get("choices") or ())
                if text:
                    if not res.tokens:
                        res.first_token_s = time.perf_counter() - t0
                        res.first_token_wall = time.time()
                    res.tokens += len(text.split())
                    if hang_up_after is not None and res.tokens >= hang_up_after:
                        res.hung_up = True
                        return                       # closing the stream closes the connection
    except Exception as exc:  # noqa: BLE001 - a client error is a result of the soak, not a crash of it
        res.error = f"{type(exc).__name__}: {exc}"


async def _record(client: Any, base: str, headers: dict, rid: int, wait_s: float) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        r = await client.get(f"{base}/rack/requests/{rid}", headers=headers, timeout=30)
        if r.status_code == 200:
            return r.json()
        if time.monotonic() > deadline:
            return {}
        await asyncio.sleep(0.2)


async def soak(base_url: str, *, model: str, dilation: float, api_key: str | None = None, batches: int = 20,
               streams: int = 60, prompt_tokens: int = 1000, output_tokens: int = 1000,
               disconnect_share: float = 0.2, stall_s: float = 1.0, seed: int = 0, timeout_s: float = 900.0,
               on_batch=None) -> dict:
    """Run the soak (module docstring) against `base_url`, a `rack serve` at
    `dilation`; returns {"batches": [per batch figures], "overall": {...}, "streams":
    [StreamResult]}. `on_batch(i, figures)` is called after each batch."""
    import httpx

    rng = np.random.default_rng(seed)
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results: list[StreamResult] = []
    per_batch = []
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        for b in range(batches):
            batch = [StreamResult(b, i, dilation=dilation) for i in range(streams)]
            hang = rng.random(streams) < disconnect_share
            jobs = []
            for i, res in enumerate(batch):
                body = {"model": model, "prompt": rng.integers(1, VOCAB, prompt_tokens).tolist(),
                        "max_tokens": output_tokens, "ignore_eos": True, "stream": True}
                after = int(rng.integers(1, max(2, output_tokens // 2))) if hang[i] else None
                jobs.append(_stream(client, url, headers, body, res, after, timeout_s))
            t0 = time.perf_counter()
            await asyncio.gather(*jobs)
            wall = time.perf_counter() - t0
            # a hung-up stream's request goes on in the rack: its record comes at its end
            records = await asyncio.gather(*(_record(client, base_url.rstrip("/"), headers, r.rid, timeout_s)
                                             for r in batch if r.rid is not None))
            for r, rec in zip([r for r in batch if r.rid is not None], records):
                r.record = rec
            results.extend(batch)
            figures = _figures(batch, stall_s)
            figures["wall_s"] = wall
            per_batch.append(figures)
            if on_batch is not None:
                on_batch(b, figures)
    return {"batches": per_batch, "overall": _figures(results, stall_s), "streams": results}


def _figures(batch: list[StreamResult], stall_s: float) -> dict:
    late = np.array([r.lateness_s for r in batch if not math.isnan(r.lateness_s)])
    first = np.array([r.first_token_late_s for r in batch if not math.isnan(r.first_token_late_s)])
    return {
        "streams": len(batch),
        "answered_200": sum(r.status == 200 for r in batch),
        "rejected_429": sum(r.status == 429 for r in batch),
        "hung_up": sum(r.hung_up for r in batch),
        "errors": sum(r.error is not None for r in batch),
        "completed_in_rack": sum(r.record.get("outcome") == "completed" for r in batch),
        "no_record": sum(r.rid is not None and not r.record for r in batch),
        "held": sum(r.held(stall_s) for r in batch),
        "late": int((late > stall_s).sum()),
        "lateness_p50_s": float(np.percentile(late, 50)) if late.size else None,
        "lateness_p99_s": float(np.percentile(late, 99)) if late.size else None,
        "lateness_max_s": float(late.max()) if late.size else None,
        "first_token_late_max_s": float(first.max()) if first.size else None,
    }


__all__ = ["StreamResult", "soak"]
