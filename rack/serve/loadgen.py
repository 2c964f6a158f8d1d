"""Load generator: replay requests against any OpenAI-compatible endpoint and measure
them at the client, into the same results.json sections as `rack run`.

Each request (`workloads.Request`) is sent at `arrival_s x time_scale` wall seconds
after the start (open loop; `max_concurrency`: at most that many in flight, the next
one sent when one ends, as vLLM's `bench serve --max-concurrency`), as a streaming
`/v1/completions` (or `/v1/chat/completions`) call with an async HTTP client (httpx):

- the prompt is `prompt_tokens` token ids; a request with prefix-block hashes gets
  ids derived from its hashes (block k's ids from hash k), so requests that share a
  prefix send the same leading ids, and the hashes themselves go in `rack_block_hashes`
  / `rack_block_size` (`rack_fields`; other servers ignore unknown fields);
- `max_tokens` = output_tokens, `ignore_eos` true, `stream_options.include_usage`.

Measured at the client (wall seconds divided by `time_scale`, so that against `rack
serve` at dilation D with time_scale D the numbers are emulated seconds, comparable
with `rack run`): arrival = when the request was sent, first token = the first chunk
with text, completion = the last chunk with text; ITL samples are the gaps between
chunks with text (one chunk per token from `rack serve` and from vLLM). Outcomes:
completed (HTTP 200 and a finished stream), rejected (HTTP 429: reason `http_429`),
failed (any other status, an error event in the stream, a dropped connection or a
timeout: reason `http_<status>`, `stream_error`, `connection_error`, `timeout`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rack.serving.collector import EVENTS, OUTCOMES

_COL = {n: i for i, n in enumerate(EVENTS)}
#: Token ids of derived prompts are taken below this (a 32 k vocabulary fits every model).
VOCAB = 32_000


@dataclass
class ClientRecord:
    """One request as the client saw it (wall seconds since the replay's start)."""

    id: int
    sent: float = math.nan
    first: float = math.nan
    last: float = math.nan
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    outcome: str = "failed"
    reason: str | None = None
    status: int | None = None


def prompt_ids(req: Any) -> list[int]:
    """`req.prompt_tokens` token ids: from its block hashes (block k's ids from hash k,
    so shared prefixes send shared ids), else from its id."""
    n = int(req.prompt_tokens)
    if req.block_hashes:
        out: list[int] = []
        for h in req.block_hashes:
            rng = np.random.default_rng(int(h) & 0xFFFFFFFFFFFFFFFF)
            out.extend(rng.integers(1, VOCAB, req.block_size).tolist())
            if len(out) >= n:
                break
        if len(out) >= n:
            return out[:n]
    return np.random.default_rng(int(req.id)).integers(1, VOCAB, n).tolist()


def request_body(req: Any, model: str, chat: bool, rack_fields: bool) -> dict:
    """The JSON body of `req` (module docstring)."""
    ids = prompt_ids(req)
    body: dict[str, Any] = {"model": model, "max_tokens": int(req.output_tokens), "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        # a chat prompt is text: one filler word per token id (the server estimates its length)
        body["messages"] = [{"role": "user", "content": " ".join("w" for _ in ids)}]
    else:
        body["prompt"] = ids
    if rack_fields and req.block_hashes and not chat:
        body["rack_block_hashes"] = [int(h) for h in req.block_hashes]
        body["rack_block_size"] = int(req.block_size)
    return body


async def _one(client, url: str, headers: dict, req: Any, body: dict, t0: float, timeout_s: float) -> ClientRecord:
    rec = ClientRecord(req.id)
    rec.sent = time.perf_counter() - t0
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                rec.outcome = "rejected" if resp.status_code == 429 else "failed"
                rec.reason = f"http_{resp.status_code}"
                return rec
            finished = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    rec.reason = "stream_error"
                    return rec
                for ch in obj.get("choices") or []:
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if text:
                        t = time.perf_counter() - t0
                        rec.chunk_times.append(t)
                if obj.get("usage"):
                    rec.tokens = int(obj["usage"].get("completion_tokens") or 0)
            if finished and rec.chunk_times:
                rec.outcome, rec.reason = "completed", None
                rec.first, rec.last = rec.chunk_times[0], rec.chunk_times[-1]
                rec.tokens = rec.tokens or len(rec.chunk_times)
            else:
                rec.reason = "stream_incomplete"
    except asyncio.TimeoutError:
        rec.reason = "timeout"
    except Exception as exc:  # noqa: BLE001 - httpx errors: the request failed, the replay goes on
        import httpx

        rec.reason = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
    return rec


async def replay_http(requests: Sequence[Any], base_url: str, *, model: str, chat: bool = False,
                      time_scale: float = 1.0, api_key: str | None = None, rack_fields: bool = True,
                      timeout_s: float = 600.0, max_concurrency: int | None = None,
                      on_done=None) -> list[ClientRecord]:
    """Send every request at its arrival time (module docstring); one ClientRecord each,
    in the order of `requests`. `on_done(n_done, n_total)` is called as they end."""
    import httpx

    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    bodies = [request_body(r, model, chat, rack_fields) for r in reqs]
    limits = httpx.Limits(max_connections=max_concurrency or 10_000, max_keepalive_connections=100)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    done = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        t0 = time.perf_counter()

        async def run(req, body):
            nonlocal done
            delay = req.arrival_s * time_scale - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is not None:
                async with sem:
                    rec = await _one(client, url, headers, req, body, t0, timeout_s)
            else:
                rec = await _one(client, url, headers, req, body, t0, timeout_s)
            done += 1
            if on_done is not None:
                on_done(done, len(reqs))
            return rec

        return list(await asyncio.gather(*(run(r, b) for r, b in zip(reqs, bodies))))


def client_snapshot(records: Sequence[ClientRecord], time_scale: float) -> dict:
    """The client's measurements as a collector snapshot (`rack.measure.metrics`
    reads it as it reads the rack's): times in seconds / time_scale."""
    n = len(records)
    times = np.full((n, len(EVENTS)), np.nan)
    outcome = np.zeros(n, dtype=np.int8)
    reason, itl, served = {}, {}, {}
    for i, r in enumerate(records):
        times[i, _COL["arrival"]] = r.sent / time_scale
        outcome[i] = OUTCOMES.index(r.outcome) + 1
        if r.outcome == "completed":
            times[i, _COL["first_token"]] = r.first / time_scale
            times[i, _COL["completion"]] = r.last / time_scale
            itl[r.id] = np.diff(np.asarray(r.chunk_times)) / time_scale
            served[r.id] = r.tokens
        elif r.reason:
            reason[r.id] = r.reason
    order = sorted(itl)
    return {"ids": np.array([r.id for r in records], dtype=np.int64), "times": times, "events": list(EVENTS),
            "outcome": outcome, "outcomes": list(OUTCOMES), "reason": reason,
            "preemptions": np.zeros(n, dtype=np.int32), "itl_ids": np.array(order, dtype=np.int64),
            "itl_lengths": np.array([len(itl[k]) for k in order], dtype=np.int64),
            "itl_flat": np.concatenate([itl[k] for k in order]) if order else np.zeros(0),
            "violations": [], "unknown_events": {}, "faults": [],
            "end_s": np.where(outcome == 1, times[:, _COL["completion"]], times[:, _COL["arrival"]]),
            "output_tokens_served": served, "recoveries": []}


def client_results(records: Sequence[ClientRecord], requests: Sequence[Any], *, time_scale: float,
                   slo_ttft_s: float, slo_tpot_s: float, provenance: dict) -> tuple[dict, dict]:
    """(results.json dict, per-request columns) of a client-side replay: the request,
    latency, throughput and goodput sections of `rack run` (`rack.measure.metrics`),
    a `client` section and the provenance; sections only the rack can measure (memory,
    energy, KV transfer) are absent."""
    from rack.measure import metrics

    by_id = {r.id: r for r in requests}
    snap = client_snapshot(records, time_scale)
    results, cols = metrics.compute(snap, [by_id[r.id] for r in records], slo_ttft_s, slo_tpot_s)
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    results = {"status": "complete", **results,
               "client": {"time_scale": time_scale, "http_status": statuses,
                          "note": "measured at the client: wall seconds / time_scale"},
               "provenance": provenance}
    return results, cols


__all__ = ["ClientRecord", "client_results", "client_snapshot", "prompt_ids", "replay_http", "request_body"]
