"""`/metrics` of `rack serve`: Prometheus text through prometheus_client.

Names follow vLLM's (`vllm:` prefix) where vLLM has the metric, so dashboards and
autoscalers built for vLLM read rack; rack's own are `rack:`. A custom
prometheus_client collector builds every family at scrape time from

- the requests that ended (observed once, when the collector's record reaches the
  front): `vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`,
  `vllm:request_time_per_output_token_seconds` (TPOT per request),
  `vllm:inter_token_latency_seconds` and `vllm:time_per_output_token_seconds` (ITL:
  vLLM's older name of the same histogram), `vllm:request_queue_time_seconds`
  (arrival to prefill start), `vllm:request_prefill_time_seconds`,
  `vllm:request_decode_time_seconds` (first token to completion),
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:request_success_total{finished_reason}` and `rack:requests_total{outcome,
  reason}` (every end, rejections and failures included).

  The `vllm:` latencies are in the clients' clock: wall-clock seconds at the server,
  what a client of this endpoint observes, so that a dashboard and a benchmark
  client read the same numbers. For a streamed response TTFT, E2E, TPOT and ITL are
  measured at the front (HTTP receipt to the chunk that carried the first token, to
  the last chunk; one ITL sample per chunk after the first, as vLLM observes one per
  engine iteration), which is the rack's emulated time x dilation plus the pacing
  lateness the front reports; for a non-streamed response, and for the queue,
  prefill and decode phases (which a client does not see), the rack's emulated
  times x dilation. The same quantities in *emulated* seconds (what the emulated
  hardware takes, the figures `rack run` reports) are `rack:emulated_*`:
  `rack:emulated_time_to_first_token_seconds`, `..._e2e_request_latency_seconds`,
  `..._request_time_per_output_token_seconds`, `..._inter_token_latency_seconds`
  (every ITL sample of the rack's record), `..._request_queue_time_seconds`,
  `..._request_prefill_time_seconds`, `..._request_decode_time_seconds`.

  Bucket edges (upper bounds, s), fine enough for sub-millisecond ITLs: geometric,
  40 per decade (steps of 5.9 %, so a quantile interpolated within a bucket, as
  Prometheus' `histogram_quantile` does, is within 3 % of the truth):
  `TOKEN_BUCKETS` (ITL and TPOT) 10^(k/40) for k = -200..40, i.e. 10 us to 10 s;
  `REQUEST_BUCKETS` (TTFT, E2E, phases) 10^(k/40) for k = -160..160, 100 us to 10^4
  s. (vLLM's own edges put every 0.76 ms wafer ITL in one bucket, (0.5 ms, 1 ms], and
  its TTFT edges step 2-4x above 2.5 s.)
- each emulated instance's stats, read when scraped, labelled `instance` and `role`:
  `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  (KV bytes held / KV capacity, 0..1 as vLLM's), `vllm:prefix_cache_queries_total`
  and `vllm:prefix_cache_hits_total` (tokens), `rack:timer_lateness_max_seconds`;
- the interconnect: `rack:kv_link_bytes_total{link}` (logical KV bytes carried),
  `rack:kv_link_shipped_bytes_total{link}`, `rack:kv_link_utilization{link}` (bytes
  carried / (bandwidth x time) since start), `rack:kv_transfers_total{link}`;
- the front: `rack:stream_lateness_seconds` (per response: the latest any of its
  tokens left the front after its emulated time, wall seconds), `rack:dilation`,
  `rack:emulated_time_seconds`, `rack:http_requests_total{endpoint, status}` (every answer of
  every route, `endpoint` the route's template: `rack.serve.app`),
  `rack:http_handler_errors_total{endpoint}` (handlers that raised: `rack.serve.limits`).

Every family carries `model_name` (the served model name), as vLLM's do.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

#: Bucket edges (s, module docstring): geometric, 40 per decade, for per-token
#: latencies (10 us .. 10 s) and per-request ones (100 us .. 10^4 s).
TOKEN_BUCKETS = tuple(float(f"{10 ** (k / 40):.6g}") for k in range(-200, 41))
REQUEST_BUCKETS = tuple(float(f"{10 ** (k / 40):.6g}") for k in range(-160, 161))
LATENESS_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


class Histogram:
    """Bucket counts over fixed edges, filled with numpy (a request's ITL samples in one call)."""

    def __init__(self, edges: Iterable[float]) -> None:
        self.edges = np.asarray(tuple(edges), dtype=np.float64)
        self.counts = np.zeros(self.edges.shape[0] + 1, dtype=np.int64)   # last: above every edge
        self.sum = 0.0

    def observe(self, values) -> None:
        v = np.atleast_1d(np.asarray(values, dtype=np.float64))
        v = v[~np.isnan(v)]
        if v.size:
            self.counts += np.bincount(np.searchsorted(self.edges, v, side="left"),
                                       minlength=self.counts.shape[0])
            self.sum += float(v.sum())

    def family(self, name: str, doc: str, labels: dict[str, str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        cum = np.cumsum(self.counts)
        buckets = [(repr(float(e)), int(c)) for e, c in zip(self.edges, cum[:-1])] + [("+Inf", int(cum[-1]))]
        fam.add_metric(list(labels.values()), buckets, self.sum)
        return fam


#: name: (help, buckets, what it measures: the key of `ServeMetrics.observe_request`'s
#: per-request figures). `vllm:` in wall seconds, `rack:emulated_` in emulated seconds.
_LATENCIES = {
    "time_to_first_token_seconds": ("Time to first token", REQUEST_BUCKETS, "ttft"),
    "e2e_request_latency_seconds": ("End-to-end request latency", REQUEST_BUCKETS, "e2e"),
    "request_time_per_output_token_seconds": ("TPOT per request", TOKEN_BUCKETS, "tpot"),
    "inter_token_latency_seconds": ("Inter-token latency", TOKEN_BUCKETS, "itl"),
    "request_queue_time_seconds": ("Arrival to prefill start", REQUEST_BUCKETS, "queue"),
    "request_prefill_time_seconds": ("Prefill start to end", REQUEST_BUCKETS, "prefill"),
    "request_decode_time_seconds": ("First token to completion", REQUEST_BUCKETS, "decode"),
}
_REQUEST_HISTS = {
    **{f"vllm:{n}": (f"{doc} (wall s at the server: what a client observes).", b, k)
       for n, (doc, b, k) in _LATENCIES.items()},
    "vllm:time_per_output_token_seconds": ("Inter-token latency, vLLM's older name (wall s).", TOKEN_BUCKETS, "itl"),
    **{f"rack:emulated_{n}": (f"{doc} (emulated s).", b, k) for n, (doc, b, k) in _LATENCIES.items()},
}


def _phases(t: dict[str, float], itl_s) -> dict:
    """A completed request's latencies (emulated s) from its lifecycle events."""
    itl = np.asarray(itl_s, dtype=np.float64) if itl_s is not None else np.zeros(0)
    return {"ttft": t["first_token"] - t["arrival"], "e2e": t["completion"] - t["arrival"],
            "queue": t["prefill_start"] - t["arrival"], "prefill": t["prefill_end"] - t["prefill_start"],
            "decode": t["completion"] - t["first_token"], "itl": itl,
            "tpot": float(np.mean(itl)) if itl.size else math.nan}


class ServeMetrics:
    """The front's metrics (module docstring). `observe_request` when a request ends,
    `set_stats` before a scrape, `render()` for the text."""

    def __init__(self, model_name: str, dilation: float) -> None:
        self.model = model_name
        self.dilation = float(dilation)
        self.hist = {name: Histogram(b) for name, (_, b, _) in _REQUEST_HISTS.items()}
        self.lateness = Histogram(LATENESS_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: Counter = Counter()
        self.ends: Counter = Counter()
        self.http: Counter = Counter()
        self.handler_errors: Counter = Counter()
        self.stats: dict[str, dict] = {}
        self.emulated_s = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ------------------------------------------------------------------ updates
    def observe_request(self, *, outcome: str, reason: str | None, finish_reason: str | None,
                        prompt_tokens: int, output_tokens: int, times: dict[str, float],
                        itl_s: np.ndarray | None, lateness_wall_s: float | None,
                        sent_wall: dict | None = None) -> None:
        """One request's end; `times`: its lifecycle events (emulated s, NaN absent);
        `sent_wall`: what its client saw, measured at the front ({"ttft", "e2e" (wall s),
        "itl" (wall s per chunk gap), "tokens"}; None: not streamed, the emulated times x
        dilation stand in)."""
        self.ends[(outcome, reason or "")] += 1
        if lateness_wall_s is not None:
            self.lateness.observe(lateness_wall_s)
        if outcome != "completed":
            return
        self.success[finish_reason or "length"] += 1
        self.prompt_tokens += int(prompt_tokens)
        self.generation_tokens += int(output_tokens)
        emulated = _phases(times, itl_s)
        wall = {k: np.asarray(v) * self.dilation for k, v in emulated.items()}
        if sent_wall is not None:
            n = sent_wall["tokens"]
            wall.update(ttft=sent_wall["ttft"], e2e=sent_wall["e2e"], itl=sent_wall["itl"],
                        tpot=(sent_wall["e2e"] - sent_wall["ttft"]) / (n - 1) if n > 1 else math.nan)
        for name, (_, _, key) in _REQUEST_HISTS.items():
            self.hist[name].observe((emulated if name.startswith("rack:") else wall)[key])

    def count_http(self, endpoint: str, status: int) -> None:
        self.http[(endpoint, str(status))] += 1

    def count_handler_error(self, endpoint: str) -> None:
        """A handler raised (`rack.serve.limits.Guard`): answered 500, or its stream cut."""
        self.handler_errors[(endpoint,)] += 1

    def set_stats(self, stats: dict[str, dict], emulated_s: float) -> None:
        """The instances' and the interconnect's stats (their `stats(now)` dicts)."""
        self.stats = stats
        self.emulated_s = float(emulated_s)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ prometheus_client collector
    def collect(self):
        m = {"model_name": self.model}
        for name, (doc, _, _) in _REQUEST_HISTS.items():
            yield self.hist[name].family(name, doc, m)
        yield self.lateness.family("rack:stream_lateness_seconds",
                                   "Per response: how late its latest token left the front (wall s).", m)
        yield _counter("vllm:prompt_tokens", "Prompt tokens of completed requests.", m, [((), self.prompt_tokens)])
        yield _counter("vllm:generation_tokens", "Output tokens of completed requests.", m,
                       [((), self.generation_tokens)])
        yield _counter("vllm:request_success", "Completed requests by finish reason.", {**m, "finished_reason": ""},
                       [((k,), v) for k, v in sorted(self.success.items())])
        yield _counter("rack:requests", "Requests ended, by outcome and reason.", {**m, "outcome": "", "reason": ""},
                       [(k, v) for k, v in sorted(self.ends.items())])
        yield _counter("rack:http_requests", "HTTP requests answered.", {**m, "endpoint": "", "status": ""},
                       [(k, v) for k, v in sorted(self.http.items())])
        yield _counter("rack:http_handler_errors", "HTTP handlers that raised (logged; answered 500 or the "
                       "stream ended with an error event).", {**m, "endpoint": ""},
                       [(k, v) for k, v in sorted(self.handler_errors.items())])
        yield _gauge("rack:dilation", "Wall seconds per emulated second.", m, [((), self.dilation)])
        yield _gauge("rack:emulated_time_seconds", "Emulated time now (s).", m, [((), self.emulated_s)])
        yield from self._instance_families(m)
        yield from self._link_families(m)

    def _instance_families(self, m: dict):
        inst = {n: s for n, s in self.stats.items() if s.get("role") in ("prefill", "decode", "both")}
        lab = {**m, "instance": "", "role": ""}
        rows: dict[str, list] = {"running": [], "waiting": [], "kv": [], "queries": [], "hits": [], "late": []}
        for name, s in sorted(inst.items()):
            key = (name, s["role"])
            running = s.get("running", 0) + s.get("prefilling", 0)
            waiting = s.get("queue_len", 0) + s.get("ready", 0) + s.get("waiting_reservations", 0)
            mem = s.get("memory", {})
            held = mem.get("held_bytes", {})
            kv_used = mem.get("used_bytes", 0) - held.get("weights", 0) - held.get("workspace", 0)
            cap = s.get("kv_capacity_bytes") or 0
            rows["running"].append((key, running))
            rows["waiting"].append((key, waiting))
            rows["kv"].append((key, kv_used / cap if cap else 0.0))
            pc = s.get("prefix_cache") or {}
            if pc:
                rows["queries"].append((key, pc.get("hit_tokens", 0) + pc.get("miss_tokens", 0)))
                rows["hits"].append((key, pc.get("hit_tokens", 0)))
            rows["late"].append((key, s.get("lateness_max_s", 0.0)))
        yield _gauge("vllm:num_requests_running", "Requests prefilling or decoding, per instance.", lab, rows["running"])
        yield _gauge("vllm:num_requests_waiting", "Requests queued, per instance.", lab, rows["waiting"])
        yield _gauge("vllm:kv_cache_usage_perc", "KV cache usage, 0..1, per instance.", lab, rows["kv"])
        yield _counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", lab, rows["queries"])
        yield _counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", lab, rows["hits"])
        yield _gauge("rack:timer_lateness_max_seconds", "Latest wake-up of an instance past its time (emulated s).",
                     lab, rows["late"])

    def _link_families(self, m: dict):
        links = (self.stats.get("interconnect") or {}).get("links", {})
        lab = {**m, "link": ""}
        items = sorted(links.items())
        yield _counter("rack:kv_link_bytes", "Logical KV bytes carried per link.", lab,
                       [((n,), l.get("bytes_carried", 0)) for n, l in items])
        yield _counter("rack:kv_link_shipped_bytes", "KV payload bytes actually shipped per link.", lab,
                       [((n,), l.get("bytes_shipped", 0)) for n, l in items])
        yield _counter("rack:kv_transfers", "KV transfers completed per link.", lab,
                       [((n,), l.get("transfers", 0)) for n, l in items])
        yield _gauge("rack:kv_link_utilization", "Link utilisation since start, 0..1.", lab,
                     [((n,), l.get("utilisation", 0.0)) for n, l in items])


def _family(cls, name: str, doc: str, labels: dict[str, str], rows: list[tuple[tuple, Any]]):
    fixed = [k for k, v in labels.items() if v]
    free = [k for k, v in labels.items() if not v]
    fam = cls(name, doc, labels=fixed + free)
    for values, x in rows:
        fam.add_metric([labels[k] for k in fixed] + [str(v) for v in values], float(x))
    return fam


def _counter(name, doc, labels, rows):
    return _family(CounterMetricFamily, name, doc, labels, rows)


def _gauge(name, doc, labels, rows):
    return _family(GaugeMetricFamily, name, doc, labels, rows)


__all__ = ["Histogram", "REQUEST_BUCKETS", "ServeMetrics", "TOKEN_BUCKETS"]
