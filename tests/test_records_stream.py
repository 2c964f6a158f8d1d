"""Per-request records streamed to disk in chunks give exactly the in-memory results;
exact percentiles of chunked samples equal numpy's; the collector holds rows only while
their requests are in the rack; KV payloads are not held per request."""

from __future__ import annotations

import json
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import rack.serving.collector as collector_mod
from rack.measure import quantiles
from rack.measure.metrics import summarize
from rack.measure.results import to_json
from rack.serving.collector import Collector
from rack.serving.records import DiskRecordSet, ITLSamples, MemoryRecords, SampleChunks
from rack.wiring.faults import parse_fault_option
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import load_requests


# ----------------------------------------------------------------- exact percentiles
class _Chunks:
    """Re-iterable chunks of an array, cut at random places."""

    def __init__(self, v: np.ndarray, rng: np.random.Generator) -> None:
        cuts = np.sort(rng.integers(0, len(v) + 1, size=rng.integers(0, 6)))
        self.parts = np.split(v, cuts)

    def chunks(self, keys):
        for p in self.parts:
            yield {"itl_s": p}


@pytest.mark.parametrize("seed", range(6))
def test_chunked_summary_equals_numpy_bit_for_bit(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    # small groups force several radix passes before the final in-memory selection
    monkeypatch.setattr(quantiles, "COLLECT_MAX", int(rng.choice([1, 7, 1 << 20])))
    n = int(rng.choice([1, 2, 3, 10, 101, 5000]))
    kind = seed % 3
    if kind == 0:       # latency-like: clustered positives with ties
        v = np.round(rng.lognormal(-7, 0.05, n), 9)
    elif kind == 1:     # signed, zeros, -0.0 and repeated values
        v = rng.choice([-2.5, -0.0, 0.0, 1e-300, 3.0, 7.25], n) * rng.choice([1.0, 1.0 + 2**-52], n)
    else:
        v = rng.standard_normal(n) * 1e3
    rng.shuffle(v)
    want = summarize(v)
    got = summarize(SampleChunks(_Chunks(v, rng)))
    assert got == want
    assert want["p50"] == float(np.percentile(v, 50))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6, allow_nan=False), st.integers(1, 3000)), min_size=1, max_size=60),
       st.integers(0, 4), st.sampled_from([1, 5, 1 << 20]))
def test_runs_summarize_as_their_expanded_samples_bit_for_bit(pairs, cut, collect_max):
    """A (value, count) run stands for count equal samples (`ITLSamples`' step gaps): its
    percentiles (numpy's linear method), correctly rounded mean, extremes and count are
    those of the expanded samples, to the last bit, with explicit samples alongside and
    however the runs are cut into chunks (counts above 1024 take the Python-int sum)."""
    v = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs], np.int64)
    k = len(v) * cut // 4
    explicit = v[::3]
    chunks = [explicit, (v[:k], c[:k]), (v[k:], c[k:])]
    expanded = np.concatenate([explicit, np.repeat(v, c)])

    class _Runs(SampleChunks):
        def __init__(self):
            self.size = quantiles.sample_count(chunks)

        def __iter__(self):
            return iter([x for x in chunks if len(x) and (type(x) is not tuple or len(x[0]))])

    old = quantiles.COLLECT_MAX
    quantiles.COLLECT_MAX = collect_max             # small: several radix passes first
    try:
        got = summarize(_Runs())
    finally:
        quantiles.COLLECT_MAX = old
    want = summarize(expanded)
    assert {k: float(x).hex() for k, x in got.items()} == {k: float(x).hex() for k, x in want.items()}


def test_run_summaries_by_hand():
    """Explicit cases: two runs and one sample, against the expanded samples."""
    runs = [(np.array([0.002, 0.001]), np.array([3, 2])), np.array([0.004])]

    class _Runs(SampleChunks):
        def __init__(self):
            self.size = 6

        def __iter__(self):
            return iter(runs)

    got = summarize(_Runs())
    samples = [0.002] * 3 + [0.001] * 2 + [0.004]
    assert got == summarize(np.array(samples))
    assert got["p50"] == 0.002 and got["min"] == 0.001 and got["max"] == 0.004 and got["n"] == 6


def test_empty_chunks_summarize_to_nulls():
    assert summarize(SampleChunks(MemoryRecords()))["n"] == 0
    assert summarize(SampleChunks(MemoryRecords()))["p99"] is None


def test_order_statistics_checks_ranks():
    with pytest.raises(IndexError):
        quantiles.order_statistics([np.arange(3.0)], [3])


# ----------------------------------------------------------------- streamed vs in memory
def _runs(scenario, reqs, tmp_path, monkeypatch):
    # tiny chunks: many parts, rows leaving the collector mid-run, late events possible
    monkeypatch.setattr(collector_mod.records, "CHUNK_ROWS", 7)
    monkeypatch.setattr(collector_mod.records, "CHUNK_SAMPLES", 500)
    mem = run_scenario(scenario, reqs, runtime="virtual")
    disk = run_scenario(scenario, reqs, runtime="virtual", records_dir=str(tmp_path / "records"))
    return mem, disk


@pytest.mark.parametrize("name,faults", [
    ("helios-cs3-kimi-k2", ["decode_crash:decode@20", "prefill_crash:prefill@30", "frame_corrupt:*@0,count=3"]),
    ("a100-llama2-70b", []),
])
def test_streamed_records_give_the_in_memory_results(name, faults, tmp_path, monkeypatch):
    sc = load_scenario(name)
    if faults:
        sc = sc.with_overrides(faults=[parse_fault_option(f) for f in faults])
    reqs = load_requests("mooncake-excerpt")
    mem, disk = _runs(sc, reqs, tmp_path, monkeypatch)
    assert mem.results["emulation"]["records"] == "memory" and disk.results["emulation"]["records"] == "disk"
    assert list(mem.columns) == list(disk.columns)
    for key, a in mem.columns.items():
        b = disk.columns[key]
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b, err_msg=key)       # NaN where NaN, bit for bit
        else:
            assert a.tolist() == b.tolist(), key
    ja, jb = json.loads(to_json(mem.results)), json.loads(to_json(disk.results))
    for part in (ja, jb):
        part["emulation"].pop("wall_s")
        part["emulation"].pop("records")
    assert ja == jb
    assert ja["latency"]["itl_s"]["n"] > 1000
    # what the folder holds: every request once, the ITL samples in chunks (explicit ones
    # and step ranges over the decode engines' step logs), which expand to the in-memory ones
    rec = DiskRecordSet(tmp_path / "records")
    assert rec.meta["parts"] >= len(reqs) // 7
    assert sum(len(c["id"]) for c in rec.chunks(("id",))) == len(reqs)
    on_disk = ITLSamples(rec)
    assert len(on_disk) == ja["latency"]["itl_s"]["n"] == on_disk.per_request()["itl_flat"].size
    for key, a in mem.snapshot["itl"].per_request().items():
        np.testing.assert_array_equal(a, on_disk.per_request()[key], err_msg=key)


def test_in_memory_snapshot_keeps_its_arrays(monkeypatch):
    monkeypatch.setattr(collector_mod.records, "CHUNK_ROWS", 5)
    reqs = load_requests("mooncake-excerpt")[:40]
    out = run_scenario(load_scenario(), reqs, runtime="virtual")
    snap = out.snapshot
    assert snap["times"].shape == (40, len(snap["events"]))
    per = snap["itl"].per_request()
    assert per["itl_ids"].tolist() == sorted(per["itl_ids"].tolist())
    assert int(per["itl_lengths"].sum()) == per["itl_flat"].size == out.results["latency"]["itl_s"]["n"]


# ----------------------------------------------------------------- the collector's rows
def test_collector_holds_rows_only_until_their_chunk_leaves(tmp_path):
    c = Collector(request_ids=[10, 11, 12, 13], chunk_rows=2, records_dir=str(tmp_path / "r"))
    for rid in (10, 11, 12):
        c.event(0.0, rid, "arrival", 0.0)
    c.finish(1.0, 10, "completed", itl_s=np.array([0.1, 0.2]))
    c.finish(1.0, 11, "rejected", "router_queue_full")
    assert len(c._slot) == 1                        # 10 and 11 left with the first chunk
    c.event(2.0, 10, "completion", 2.0)             # too late: counted, not recorded
    c.finish(2.0, 10, "failed", "x")                # a second end is still caught
    c.event(2.0, 99, "arrival", 2.0)                # unknown
    snap = c.snapshot()
    assert snap["late_events"] == {"completion": 1}
    assert any("ended twice" in v for v in snap["violations"])
    assert any("unknown request 99" in v for v in snap["violations"])
    assert c.open_requests() == [12, 13]
    assert c.still_open([10, 12, 99]) == [12]
    assert c.open_examples() == [(12, "arrival"), (13, None)]
    c.finish(3.0, 12, "completed", itl_s=np.array([0.3]))
    c.finish(3.0, 13, "failed", "decode_unavailable")
    assert c.all_ended() and not c._slot
    snap = c.snapshot()                             # a second snapshot sees the new ends
    meta = json.loads((tmp_path / "r" / "records.json").read_text())
    assert meta["open"] == 0 and meta["requests"] == 4


def test_collector_refuses_duplicate_ids():
    with pytest.raises(ValueError, match="duplicate request ids"):
        Collector(request_ids=[1, 2, 1])


# ----------------------------------------------------------------- KV payloads
def test_kv_payloads_are_not_held_per_request(monkeypatch):
    """At most the payloads in flight exist at once (measured: one at a time on the
    excerpt), whatever the number of requests; a payload is freed once verified."""
    import devices.engines.prefill as prefill_mod

    live: dict[int, weakref.ref] = {}
    peak = [0]
    make = prefill_mod.make_kv_frames

    def tracked(*args, **kwargs):
        frames = make(*args, **kwargs)
        key = id(frames._base)
        live[key] = weakref.ref(frames._base, lambda _r, k=key: live.pop(k, None))
        peak[0] = max(peak[0], len(live))
        return frames

    monkeypatch.setattr(prefill_mod, "make_kv_frames", tracked)
    reqs = load_requests("mooncake-excerpt")
    out = run_scenario(load_scenario().with_overrides(payload_scale=0.01), reqs, runtime="virtual")
    assert out.results["kv_transfer"]["transfers"] == len(reqs)
    assert 1 <= peak[0] <= 4
    assert not live


def test_exact_fsum_is_math_fsum():
    """`exact_fsum` (numpy, integer arithmetic) gives math.fsum's correctly rounded sum,
    signed zeros, infinities and NaN included, over chunks of any size."""
    import math

    import numpy as np

    from rack.measure.quantiles import BLOCK, exact_fsum

    rng = np.random.default_rng(3)
    cases = [rng.exponential(0.01, 3 * BLOCK + 17), rng.normal(0, 1, 500) * 10.0 ** rng.integers(-300, 300, 500),
             np.concatenate([rng.normal(0, 1, 300), -rng.normal(0, 1, 300)]), rng.normal(0, 1e-310, 200),
             np.array([-0.0, -0.0]), np.array([0.0, -0.0]), np.array([5e-324, -5e-324, 1.0]), np.zeros(0),
             np.array([np.inf, 1.0]), np.array([np.nan, 2.0]), np.array([1, 2, 3])]
    for x in cases:
        want = math.fsum(x.tolist())
        got = exact_fsum([x[: len(x) // 3], x[len(x) // 3:]])
        assert (got == want or (math.isnan(got) and math.isnan(want))) and \
            math.copysign(1.0, got) == math.copysign(1.0, want)
    try:
        exact_fsum([np.array([np.inf]), np.array([-np.inf])])
    except ValueError:
        pass
    else:
        raise AssertionError("inf + -inf must raise as math.fsum does")
