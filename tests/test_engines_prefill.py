"""PrefillEngine (and the prefill -> interconnect -> decode path) on the virtual-time
loop with real cost models: chunking, prefix cache, rejection, memory limits, physics
bounds, handoff, exactly-once outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from devices.catalog import get_device
from devices.costmodel import CostModel, Parallelism
from devices.engines.decode import DecodeEngine
from devices.engines.prefill import PrefillEngine
from _engine_fakes import Client, DirectInterconnect, FakeCollector, plan, run_cores, submissions
from workloads.core import Core
from workloads.request import Request

SCALE = 1e-5     # payload_scale: ship 10 ppm of the KV bytes (logical sizes stay exact)


class Recording:
    """Wraps a CostModel, recording every prefill call (new, cached)."""

    def __init__(self, cost):
        self._cost = cost
        self.prefill_calls: list[tuple[list, list]] = []

    def __getattr__(self, name):
        return getattr(self._cost, name)

    def prefill(self, new_tokens, cached_tokens):
        self.prefill_calls.append((list(map(int, new_tokens)), list(map(int, cached_tokens))))
        return self._cost.prefill(new_tokens, cached_tokens)


def llama_h100():
    return CostModel("llama-3.1-8b", "h100", weight_dtype="bf16", kv_dtype="bf16")


def llama_cs3():
    return CostModel("llama-3.1-8b", "cs3", weight_dtype="bf16", kv_dtype="bf16")


def _system(pcost, dcost, *, prefill_kw=None, decode_kw=None, link_kw=None):
    col = FakeCollector()
    decode = DecodeEngine(name="wafer0", cost=dcost, collector=col.name,
                          **{"max_batch": 64, **(decode_kw or {})})
    ic = DirectInterconnect(**(link_kw or {}))
    prefill = PrefillEngine(name="gpu0", cost=pcost, collector=col.name,
                            interconnect=ic.name, decode=["wafer0"],
                            **{"chunk_tokens": 8192, "max_queue": 1000, "payload_scale": SCALE,
                               **(prefill_kw or {})})
    return col, prefill, decode, ic


def _replay(requests, pcost, dcost, **kw):
    """Submit `requests` at their arrival times, run until idle, return results."""
    col, prefill, decode, ic = _system(pcost, dcost, **kw)
    drv = run_cores([col, Client(submissions(requests, "gpu0", "wafer0", col.name)), prefill, ic, decode])
    return dict(col=col, prefill=prefill, decode=decode, ic=ic,
                pstats=prefill.stats(drv.now), dstats=decode.stats(drv.now))


def _poisson(n, rate, prompt_range, output_range, seed=0, hashes=False, bs=512):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    reqs = []
    for i in range(n):
        p = int(rng.integers(*prompt_range))
        h = None
        if hashes:  # requests share a system prompt of 4 blocks, then their own blocks
            own = math.ceil(p / bs) - 4
            h = tuple([1, 2, 3, 4][: math.ceil(p / bs)]) + tuple(1000 * (i + 1) + k for k in range(max(0, own)))
        reqs.append(Request(id=i, arrival_s=float(t[i]), prompt_tokens=p,
                            output_tokens=int(rng.integers(*output_range)), block_hashes=h,
                            block_size=bs))
    return reqs


def _check_exactly_once_and_memory(out, requests):
    col = out["col"]
    assert set(col.outcomes) == {r.id for r in requests}
    for s in (out["pstats"], out["dstats"]):
        m = s["memory"]
        assert m["peak_bytes"] <= m["capacity_bytes"]
        assert m["held_bytes"]["kv"] == 0 and m["held_bytes"]["reserved"] == 0
    assert out["pstats"]["handoffs_in_flight"] == 0 and out["pstats"]["queue_len"] == 0


def test_chunked_prefill_splits_a_long_prompt():
    pcost = Recording(llama_h100())
    req = Request(id=0, arrival_s=0.0, prompt_tokens=20_000, output_tokens=3)
    out = _replay([req], pcost, llama_cs3())
    assert pcost.prefill_calls == [([8192], [0]), ([8192], [8192]), ([3616], [16384])]
    assert out["pstats"]["iterations"] == math.ceil(20_000 / 8192)
    assert out["pstats"]["tokens_computed"] == 20_000
    # TTFT >= the compute bound of the prompt's linear layers: 2 x params x tokens / peak
    ttft = out["col"].times("first_token")[0]
    bound = 2 * pcost.model.active_linear_params * 20_000 / pcost.peak_flops
    assert ttft >= bound
    assert ttft == pytest.approx(sum(pcost._cost.prefill([n], [c]).time_s
                                     for (n,), (c,) in pcost.prefill_calls))


def test_chunk_budget_is_shared_fcfs_with_continuing_requests_first():
    pcost = Recording(llama_h100())
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=10_000, output_tokens=2),
            Request(id=1, arrival_s=0.0, prompt_tokens=5_000, output_tokens=2),
            Request(id=2, arrival_s=0.0, prompt_tokens=3_000, output_tokens=2)]
    _replay(reqs, pcost, llama_cs3())
    assert pcost.prefill_calls[0] == ([8192], [0])
    assert pcost.prefill_calls[1] == ([1808, 5000, 1384], [8192, 0, 0])
    assert pcost.prefill_calls[2] == ([1616], [1384])


def test_prefix_cache_hits_skip_computation():
    pcost = Recording(llama_h100())
    bs = 512
    shared = (11, 12, 13)
    a = Request(id=0, arrival_s=0.0, prompt_tokens=4 * bs + 100, output_tokens=2,
                block_hashes=shared + (14, 15), block_size=bs)
    b = Request(id=1, arrival_s=1.0, prompt_tokens=3 * bs + 300, output_tokens=2,
                block_hashes=shared + (99,), block_size=bs)
    c = Request(id=2, arrival_s=2.0, prompt_tokens=3 * bs, output_tokens=2,   # full hit
                block_hashes=shared, block_size=bs)
    out = _replay([a, b, c], pcost, llama_cs3())
    assert pcost.prefill_calls == [([4 * bs + 100], [0]), ([300], [3 * bs]), ([1], [3 * bs - 1])]
    ps = out["pstats"]
    assert ps["tokens_cached"] == 3 * bs + 3 * bs - 1
    assert ps["tokens_computed"] == 4 * bs + 100 + 300 + 1
    pc = ps["prefix_cache"]
    assert pc["hit_blocks"] == 6 and pc["miss_blocks"] == 4      # a: 4 misses (full blocks)
    ttft = {r: out["col"].times("first_token")[r] - t for r, t in ((0, 0.0), (1, 1.0), (2, 2.0))}
    assert ttft[1] < ttft[0] and ttft[2] < ttft[1]
    # the transfer still carries the whole prompt's KV (the cached part included)
    assert [t[0] for t in out["ic"].transfers] == [0, 1, 2]


class _LoadRecorder(Core):
    """A router stand-in: records the `load` reports and takes the `kv_events`."""

    def __init__(self, name: str = "router") -> None:
        super().__init__(name)
        self.loads: list[int] = []

    def load(self, now, instance, outstanding_tokens):
        self.loads.append(outstanding_tokens)

    def kv_events(self, now, instance, events):
        pass


class _CheckedPrefill(PrefillEngine):
    """Checks at every report that the running total the router is told equals its
    definition: the remaining tokens of the running prompts plus the queued prompts
    net of the prefix their cache held at submission."""

    checks = 0

    def _report_load(self):
        want = (sum(j.remaining for j in self._running)
                + sum(j.req.prompt_tokens - j.expect for j in self._queue))
        assert self.outstanding_tokens() == want
        _CheckedPrefill.checks += 1
        super()._report_load()


@pytest.mark.parametrize("kv_events", [False, True])
def test_outstanding_tokens_is_the_queued_and_running_work(kv_events):
    reqs = _poisson(60, 40.0, (200, 20000), (2, 6), seed=3, hashes=True)
    col = FakeCollector()
    router = _LoadRecorder()
    decode = DecodeEngine(name="wafer0", cost=llama_cs3(), collector=col.name, max_batch=64)
    ic = DirectInterconnect()
    prefill = _CheckedPrefill(name="gpu0", cost=llama_h100(), collector=col.name, interconnect=ic.name,
                              decode=["wafer0"], router=router.name, chunk_tokens=4096, payload_scale=SCALE,
                              kv_events=kv_events)
    _CheckedPrefill.checks = 0
    run_cores([col, router, Client(submissions(reqs, "gpu0", "wafer0", col.name)), prefill, ic, decode])
    assert _CheckedPrefill.checks > 2 * len(reqs)
    assert router.loads[-1] == 0 and max(router.loads) > 20000
    assert set(col.outcomes) == {r.id for r in reqs}


def test_prefix_cache_off_computes_everything():
    pcost = Recording(llama_h100())
    reqs = [Request(id=i, arrival_s=float(i), prompt_tokens=2048, output_tokens=2,
                    block_hashes=(1, 2, 3, 4), block_size=512) for i in range(3)]
    out = _replay(reqs, pcost, llama_cs3(), prefill_kw={"prefix_cache": False})
    assert out["pstats"]["tokens_computed"] == 3 * 2048 and out["pstats"]["prefix_cache"] is None


def test_queue_full_rejects_and_every_request_ends_once():
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=4000, output_tokens=4) for i in range(6)]
    out = _replay(reqs, llama_h100(), llama_cs3(), prefill_kw={"max_queue": 2})
    col = out["col"]
    rejected = {r for r, o in col.outcomes.items() if o["outcome"] == "rejected"}
    assert len(rejected) == 4
    assert all(col.outcomes[r]["reason"] == "prefill_queue_full" for r in rejected)
    assert out["pstats"]["rejected"] == 4 and out["pstats"]["queue_peak"] == 2
    _check_exactly_once_and_memory(out, reqs)


def test_prompt_exceeding_kv_capacity_fails():
    pcost = llama_h100()
    kv_block = 16 * pcost.kv_bytes_per_token
    small = plan(pcost.weight_bytes + 100 * kv_block, pcost.weight_bytes)
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=1601, output_tokens=4),
            Request(id=1, arrival_s=0.0, prompt_tokens=1600, output_tokens=4)]
    out = _replay(reqs, pcost, llama_cs3(), prefill_kw={"memory_plan": small})
    assert out["col"].outcomes[0] == {"outcome": "failed", "reason": "prompt_exceeds_kv_capacity",
                                      "itl_s": None, "t": 0.0}
    assert out["col"].outcomes[1]["outcome"] == "completed"


def test_single_output_token_completes_at_first_token_without_transfer():
    req = Request(id=0, arrival_s=0.5, prompt_tokens=3000, output_tokens=1)
    out = _replay([req], llama_h100(), llama_cs3())
    o = out["col"].outcomes[0]
    assert o["outcome"] == "completed" and o["itl_s"].size == 0
    assert o["t"] == out["col"].times("first_token")[0]
    assert out["ic"].transfers == [] and out["dstats"]["reserved"] == 0


def test_end_to_end_split_llama_h100_to_cs3():
    reqs = _poisson(60, rate=20.0, prompt_range=(200, 12_000), output_range=(2, 400), seed=1)
    out = _replay(reqs, llama_h100(), llama_cs3())
    _check_exactly_once_and_memory(out, reqs)
    col, dcost = out["col"], llama_cs3()
    first, admit = col.times("first_token"), col.times("decode_admit")
    wb_bound = (dcost.weight_bytes - 2 * dcost.model.embedding_params) / dcost.memory_bandwidth
    for r in reqs:
        o = col.outcomes[r.id]
        assert o["outcome"] == "completed"
        ttft = first[r.id] - r.arrival_s
        e2e = o["t"] - r.arrival_s
        assert ttft >= 2 * dcost.model.active_linear_params * r.prompt_tokens / llama_h100().peak_flops
        itl = o["itl_s"]
        assert itl.shape == (r.output_tokens - 1,)
        assert np.mean(itl) == pytest.approx((e2e - ttft) / (r.output_tokens - 1), rel=1e-9)
        assert admit[r.id] >= first[r.id]
        # the first ITL sample spans transfer + admission + one step; later ones are steps
        if r.output_tokens > 2:
            assert np.min(itl[1:]) >= wb_bound
    assert out["dstats"]["mbu_busy"] <= 1.0 and out["pstats"]["mfu_busy"] <= 1.0
    assert out["pstats"]["mfu"] > 0 and out["dstats"]["batch_peak"] > 1
    # events, not tokens: far fewer decode wake-ups than generated tokens
    assert out["dstats"]["wakeups"] <= 3 * len(reqs)
    assert out["dstats"]["tokens_generated"] > 10 * out["dstats"]["wakeups"]


def test_kv_held_in_prefill_memory_until_decode_reserves():
    """Tiny decode memory: finished prefills wait for reservations while their KV stays
    in prefill HBM, which then stops admitting new prompts (backpressure)."""
    pcost, dcost = llama_h100(), llama_cs3()
    kv_block = 16 * pcost.kv_bytes_per_token
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=3200, output_tokens=200) for i in range(8)]
    out = _replay(reqs, pcost, dcost,
                  prefill_kw={"memory_plan": plan(pcost.weight_bytes + 600 * kv_block, pcost.weight_bytes),
                              "prefix_cache": False},
                  decode_kw={"memory_plan": plan(dcost.weight_bytes + 450 * kv_block, dcost.weight_bytes)})
    _check_exactly_once_and_memory(out, reqs)
    col = out["col"]
    assert all(o["outcome"] == "completed" for o in col.outcomes.values())
    # decode holds 2 final footprints (213 blocks each); prefill holds 3 prompts (200 each)
    assert out["dstats"]["batch_peak"] == 2
    assert out["pstats"]["memory"]["peak_held_bytes"]["kv"] == 3 * 200 * kv_block
    starts = sorted(col.times("prefill_start").values())
    reserved = sorted(col.times("kv_reserved").values())
    assert starts[3] >= reserved[0]       # the 4th prefill waited for a handoff to free HBM


def test_resend_after_bad_frames_then_failure():
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=1000, output_tokens=5) for i in range(3)]
    out = _replay(reqs, llama_h100(), llama_cs3(),
                  link_kw={"corrupt_first": {0}, "corrupt_always": {1}})
    col = out["col"]
    assert col.outcomes[0]["outcome"] == "completed" and out["ic"].attempts[0] == 2
    assert col.outcomes[1] == {"outcome": "failed", "reason": "kv_checksum", "itl_s": None,
                               "t": col.outcomes[1]["t"]}
    assert col.outcomes[2]["outcome"] == "completed"
    assert out["pstats"]["resends"] == 2 and out["pstats"]["transfer_failed"] == 1
    assert out["dstats"]["bad_frames"] == 3
    _check_exactly_once_and_memory(out, reqs)


def test_kimi_k2_mi455x_prefill_to_cs3_decode_with_preemption():
    # fast prefill (the hardware's roofline) into the slower August 2024 wafer stack, so
    # that decode memory fills and preemption runs
    pcost = CostModel("kimi-k2", get_device("mi455x", stack="roofline"), Parallelism(tp=8, ep=8),
                      weight_dtype="fp8", kv_dtype="fp8")
    dcost = CostModel("kimi-k2", "cs3-2024-08", Parallelism(pp=24), weight_dtype="fp8", kv_dtype="fp8")
    reqs = _poisson(40, rate=8.0, prompt_range=(2000, 30_000), output_range=(50, 3000), seed=3,
                    hashes=True)
    kv_block = 16 * dcost.kv_bytes_per_token
    dplan = plan(dcost.weight_bytes + 9000 * kv_block, dcost.weight_bytes)  # ~144k tokens
    out = _replay(reqs, pcost, dcost, decode_kw={"admission_policy": "preempt", "memory_plan": dplan})
    _check_exactly_once_and_memory(out, reqs)
    col = out["col"]
    assert all(o["outcome"] == "completed" for o in col.outcomes.values())
    assert out["dstats"]["preemptions"] > 0 and out["dstats"]["recompute_tokens"] > 0
    assert out["pstats"]["prefix_cache"]["hit_blocks"] > 0
    first = col.times("first_token")
    for r in reqs:
        o = col.outcomes[r.id]
        n = r.output_tokens
        assert np.mean(o["itl_s"]) == pytest.approx((o["t"] - first[r.id]) / (n - 1), rel=1e-9)


def test_with_the_real_interconnect_component():
    from interconnect.component import Interconnect
    from interconnect.link import LinkSpec

    pcost, dcost = llama_h100(), llama_cs3()
    reqs = _poisson(20, rate=50.0, prompt_range=(1000, 8000), output_range=(2, 50), seed=5)
    col = FakeCollector()
    decode = DecodeEngine(name="wafer0", cost=dcost, collector=col.name, max_batch=64)
    ic = Interconnect(links=[LinkSpec(name="kv0", bandwidth_GBps=10.0)],
                      routes={("gpu0", "wafer0"): ["kv0"]}, receivers=["wafer0"], payload_scale=SCALE)
    prefill = PrefillEngine(name="gpu0", cost=pcost, collector=col.name, interconnect=ic.name,
                            decode=["wafer0"], payload_scale=SCALE)
    drv = run_cores([col, Client(submissions(reqs, "gpu0", "wafer0")), prefill, ic, decode])
    out = dict(col=col, ic=ic.stats(drv.now), pstats=prefill.stats(drv.now), dstats=decode.stats(drv.now))
    col = out["col"]
    _check_exactly_once_and_memory(out, reqs)
    assert out["ic"]["transfers"] == len(reqs)
    assert out["ic"]["bytes_logical"] == sum(r.prompt_tokens for r in reqs) * pcost.kv_bytes_per_token
    start, end = col.times("transfer_start"), col.times("transfer_end")
    reserved, admit = col.times("kv_reserved"), col.times("decode_admit")
    for r in reqs:
        wire = r.prompt_tokens * pcost.kv_bytes_per_token / 10e9
        assert end[r.id] - start[r.id] >= wire                   # the link's bandwidth bound
        assert reserved[r.id] <= start[r.id] <= end[r.id] <= admit[r.id]
        assert col.outcomes[r.id]["outcome"] == "completed"
