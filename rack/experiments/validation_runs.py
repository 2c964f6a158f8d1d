"""Measured serving rows reproduced the way they were measured: closed-loop users
through the engines on the virtual runtime.

For a row of gpu-calibration.csv's layout (`devices.serving_rows`), `row_scenario`
builds the deployment as a scenario (one colocated pool, or prefill and decode pools
joined by a KV link for disaggregated rows; the row's device, stack, parallelism,
dtypes and MTP speculation, and the launch script's scheduler settings from the
serving harness, `devices.harness`), `row_requests` draws its requests (`concurrency`
x the harness's prompts per user, lengths uniform in [0.8, 1] x the nominal isl/osl,
seeded), and `replay_row` runs them with `max_concurrency = concurrency` (a user sends
its next request when its previous one ends, as InferenceX's benchmark_serving.py
--max-concurrency does) and reads what the benchmark reports: median TPOT, median
TTFT (at the client) and total (input + output) tokens/s per GPU over the run (first
request sent to last completion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from devices.borrow import resolve_stack
from devices.serving_rows import LENGTH_LOW, Deployment, ServingRow, deployment, measured, pass_budget
from rack.wiring.scenario import Scenario, parse_scenario
from workloads import Request

#: KV link of disaggregated rows: the prefill and decode nodes' RDMA NICs, 8 x 400 Gb/s
#: per 8-GPU node (DGX H200 / HGX B200 class) = 400 GB/s [E]; GB200 NVL72 rows move KV
#: over NVLink (900 GB/s per GPU per direction [V]). A few us per message [E].
KV_LINK_GBPS = {"default": 400.0, "gb200": 900.0, "gb300": 900.0}
#: Metric keys of a replay, as in `devices.serving_rows.measured`.
METRICS = ("tpot_s", "ttft_s", "throughput_per_gpu")


def row_scenario(row: ServingRow, dep: Deployment | None = None) -> Scenario:
    """The row's deployment as a scenario (validated; ScenarioError on a bad row)."""
    dep = dep or deployment(row)
    pools = []
    for p in dep.pools:
        par = p.parallelism
        pool = {"name": {"both": "gpu"}.get(p.role, p.role), "device": dep.device, "stack": dep.stack,
                "role": p.role, "instances": p.instances, "tp": par.tp, "ep": par.ep,
                "dp_attention": par.dp_attention, "prefix_cache": False,        # InferenceX: --disable-radix-cache
                "max_queue": 10 ** 6}
        if p.role == "both":
            pool["scheduler_recv_interval"] = dep.recv_interval
        if dep.chunk_tokens is not None:
            # the pool's chunk_tokens is per attention rank: SGLang's flag is the instance's
            instance, per_rank = pass_budget(dep, par)
            pool["chunk_tokens"] = int(per_rank or instance)
        if dep.max_num_seqs is not None and p.role != "prefill":
            pool["max_num_seqs"] = dep.max_num_seqs
        if dep.speculative is not None and p.role != "prefill":
            s = dep.speculative
            pool["speculative"] = {"draft_tokens": s.draft_tokens, "acceptance_rate": s.acceptance_rate,
                                   "method": s.method}
        pools.append(pool)
    data = {"name": f"row-{row.id}", "description": f"{row.id}: {row.curve}, {row.concurrency_requests} users",
            "model": dep.model, "weight_dtype": dep.weight_dtype, "kv_dtype": dep.kv_dtype, "pools": pools,
            "slo": {"ttft_ms": 2000.0, "tpot_ms": 80.0}, "seed": 0,
            # the benchmark client keeps at most `concurrency` prompts outstanding and the
            # serving front end queues them all (none is refused): the router's queue
            # limit is set above what the client can ever have waiting
            "router": {"max_outstanding_tokens": max(4_000_000, dep.concurrency * dep.isl + 1)}}
    spec = resolve_stack(dep.device, dep.stack)
    # the serving front end's time in the client's TTFT (HardwareSpec.request_latency_s),
    # with a disaggregated deployment's routing and handoff (disagg_request_latency_s)
    front = spec.request_latency_s + (spec.disagg_request_latency_s if len(pools) == 2 else 0.0)
    if front > 0:
        data["fixed_stages"] = [{"name": "api_server", "latency_ms": front * 1e3, "where": "before"}]
    if len(pools) == 2:
        bw = KV_LINK_GBPS.get(dep.device, KV_LINK_GBPS["default"])
        data["links"] = [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": bw,
                          "latency_us": 5.0, "per_message_us": 10.0}]
    return parse_scenario(data, f"row {row.id}")


def row_requests(dep: Deployment, per_user: int | None = None, seed: int = 0) -> list[Request]:
    """concurrency x per_user requests (default: the harness's `dep.requests_per_user`),
    all arriving at 0 (the closed loop paces them), with lengths uniform in
    [LENGTH_LOW, 1] x nominal (benchmark_serving's random dataset with
    --random-range-ratio; see devices.serving_rows)."""
    rng = np.random.default_rng(seed)
    n = dep.concurrency * (dep.requests_per_user if per_user is None else per_user)

    def lengths(nominal: int) -> np.ndarray:
        return np.maximum(1, rng.integers(math.ceil(LENGTH_LOW * nominal), nominal + 1, size=n))

    prompts, outputs = lengths(dep.isl), lengths(dep.osl)
    return [Request(id=i, arrival_s=0.0, prompt_tokens=int(p), output_tokens=int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs))]


def ttft_by_wave(cols: dict, concurrency: int) -> list[float]:
    """Median TTFT (s) of each wave of `concurrency` requests in the order the client
    sent them (`cols`: a run's per-request columns, "t_arrival" and "ttft_s"). The
    first wave is the users' synchronized start (every user sends at 0, their prompts
    queue for prefill behind one another); later waves show whether the users stayed
    bunched or spread out."""
    order = np.argsort(cols["t_arrival"], kind="stable")
    ttft = np.asarray(cols["ttft_s"], float)[order]
    return [float(np.median(ttft[i:i + concurrency])) for i in range(0, ttft.size, concurrency)]


@dataclass
class RowReplay:
    """A row replayed: `predicted` and `measured` {metric: value} (METRICS), with the
    relative errors and what the run did."""

    row: ServingRow
    predicted: dict
    measured: dict
    details: dict = field(default_factory=dict)

    @property
    def errors(self) -> dict:
        return {k: self.predicted[k] / self.measured[k] - 1.0 for k in METRICS}


def replay_row(row: ServingRow, per_user: int | None = None) -> RowReplay:
    """Run the row's closed loop through the engines (virtual runtime) and read its
    median TPOT, median TTFT and total tokens/s per GPU.

    Raises:
        CatalogError / ScenarioError: a row the catalog cannot deploy (named).
        RuntimeError: requests that did not complete (the row cannot be read).
    """
    from rack.run.runner import run_scenario

    dep = deployment(row)
    scenario = row_scenario(row, dep)
    requests = row_requests(dep, per_user)
    out = run_scenario(scenario, requests, runtime="virtual", max_concurrency=dep.concurrency)
    res, cols = out.results, out.columns
    done = cols["outcome"] == "completed"
    if not done.all():
        bad = dict(zip(*np.unique(cols["outcome"][~done], return_counts=True)))
        raise RuntimeError(f"row {row.id}: {int((~done).sum())} of {done.size} requests did not complete ({bad})")
    tokens = float(cols["prompt_tokens"].sum() + cols["output_tokens"].sum())
    span = float(np.max(cols["t_end"]) - np.min(cols["t_arrival"]))     # first sent to last ended
    predicted = {"tpot_s": res["latency"]["tpot_s"]["p50"], "ttft_s": res["latency"]["ttft_s"]["p50"],
                 "throughput_per_gpu": tokens / span / dep.gpus}
    details = {"requests": int(done.size), "gpus": dep.gpus, "duration_s": span,
               "ttft_by_wave_s": ttft_by_wave(cols, dep.concurrency),
               "stack": {p: u.get("stack") for p, u in res["utilization"].items()},
               "batch_mean": {n: s.get("batch_mean_busy") for n, s in out.stats.items() if "batch_mean_busy" in s}}
    return RowReplay(row, predicted, measured(row), details)


__all__ = ["KV_LINK_GBPS", "METRICS", "RowReplay", "replay_row", "row_requests",
           "row_scenario", "ttft_by_wave"]
