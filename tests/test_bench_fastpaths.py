"""The speed-ups behind `rack bench` change no result: every fast path gives, bit for
bit, what the general path gives (cost model scalar paths, codec header cache and
single-buffer frames, the virtual driver's order of messages and wake-ups)."""

from __future__ import annotations

import math
import pickle
from collections import deque

import numpy as np
import pytest

from devices.costmodel import CostModel, Parallelism, SpeculativeConfig
from devices.engines.decode import _count_bad_frames
from interconnect.codec import (FrameError, FrameHeader, KVFrames, _LAYOUTS, scan_kv_frames, corrupt_frame,
                                decode_frame, encode_frame, make_kv_frames, peek_header, verify_kv_frames)
from rack.runtime.virtual import VirtualDriver
from workloads.core import BROADCAST, Core

MODELS = [("llama-2-70b", "a100", Parallelism(tp=2)), ("kimi-k2", "mi455x", Parallelism(tp=8, ep=8)),
          ("kimi-k2", "cs3", Parallelism(pp=28)), ("gpt-oss-120b", "h100", Parallelism(tp=2)),
          ("llama-3.1-8b", "h100", Parallelism())]


@pytest.mark.parametrize("model,device,par", MODELS)
def test_cost_model_scalar_paths_equal_array_paths(model, device, par):
    rng = np.random.default_rng(1)
    for spec in (None, SpeculativeConfig(2, 0.7)):
        cm = CostModel(model, device, par, "fp8", "fp8", speculative=spec)
        for _ in range(20):
            n = rng.integers(1, 4000, int(rng.integers(1, 5)))
            c = rng.integers(0, 20_000, n.size)
            small = cm.prefill(n, c)                       # < 8 requests: Python floats
            pad = np.zeros(8, np.int64)
            big = cm.prefill(np.concatenate([n, pad]), np.concatenate([c, pad]))   # numpy path
            assert small == big
            ctx = rng.integers(1, 30_000, int(rng.integers(1, 40)))
            if spec is None:
                # a mixed iteration with no prefill tokens is one decode step (scalar
                # pass vs the array pass of decode_step)
                m, d = cm.mixed(np.zeros(1, np.int64), np.zeros(1, np.int64), ctx), cm.decode_step(ctx)
                assert (m.time_s, m.flops, m.bytes, m.comm_s, m.bound) == (d.time_s, d.flops, d.bytes, d.comm_s,
                                                                           d.bound)
            shift = np.arange(int(rng.integers(1, 300)), dtype=float) * cm.tokens_per_step
            lean = cm._decode_dict(ctx.astype(float), shift, lean=True)
            full = cm._decode_dict(ctx.astype(float), shift)
            for key in ("time", "flops", "bytes", "comm"):
                np.testing.assert_array_equal(np.broadcast_to(lean[key], shift.shape),
                                              np.broadcast_to(full[key], shift.shape))
            assert cm._bound(lean) == cm._bound(full)


def test_recorded_headers_return_what_parsing_returns():
    frames = make_kv_frames(77, 3000, 35_136, 61, 8, 1e-3, seed=3)
    recorded = scan_kv_frames(frames, True)                # from make_kv_frames' header records
    parsed = [peek_header(f) for f in frames]              # parsed afresh
    assert recorded == [_entry(h) for h in parsed] == scan_kv_frames(list(frames), True)
    assert [decode_frame(f)[0] for f in frames] == parsed
    # a frame built by encode_frame (no header record) parses to its header
    h = FrameHeader(request_id=5, layer_start=0, layer_end=8, token_start=0, token_end=10, dtype="bf16",
                    shape=(8, 10, 4), logical_bytes=640)
    got, body = decode_frame(encode_frame(h, np.arange(64, dtype=np.uint8)))
    assert (got.request_id, got.layer_range, got.payload_bytes) == (5, (0, 8), 64) and body.nbytes == 64


def test_corrupted_frames_are_still_caught():
    frames = make_kv_frames(9, 2000, 35_136, 61, 8, 1e-3)
    bad = list(frames)
    bad[3] = corrupt_frame(bad[3])
    assert verify_kv_frames(bad)[:2] == (7, 1)
    hdr = frames[5].copy()
    hdr[3] ^= 0xFF                                          # header bytes: no stale cache hit
    with pytest.raises(Exception):
        decode_frame(hdr)


def test_kv_frames_pickle_as_one_buffer_and_fall_back_when_changed():
    frames = make_kv_frames(1, 4000, 35_136, 61, 8, 0.01)
    assert isinstance(frames, KVFrames) and isinstance(frames, list)
    bufs: list = []
    data = pickle.dumps(frames, protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 1 and memoryview(bufs[0]).nbytes == sum(f.nbytes for f in frames)
    back = pickle.loads(data, buffers=bufs)
    assert all(np.array_equal(a, b) for a, b in zip(frames, back)) and verify_kv_frames(back)[1] == 0
    frames[2] = corrupt_frame(frames[2])                    # no longer the views of one buffer
    again = pickle.loads(pickle.dumps(frames))
    assert type(again) is list and verify_kv_frames(again)[:2] == (7, 1)


class _Tracer(Core):
    """A core of a random program: every call is logged; then, drawn from its own
    generator, it may send a message to a random core and asks to wake at once (after
    this instant's messages), a little later on a coarse grid (ties are frequent), or
    leaves its request as it was; a message may also cancel its request (a superseded
    heap entry). The program ends when its budget of calls is spent."""

    def __init__(self, name, peers, log, budget, seed):
        super().__init__(name)
        self.peers, self.log, self.budget = peers, log, budget
        self.rng = np.random.default_rng(seed)
        self.wake_at = float(self.rng.integers(0, 3)) * 0.25

    def _act(self, now, what, choices):
        self.log.append((now, self.name, what))
        self.budget[0] -= 1
        if self.budget[0] <= 0:
            self.wake_at = math.inf
            return
        if self.rng.integers(0, 2):
            self.send(self.peers[int(self.rng.integers(len(self.peers)))], "poke", (self.name, len(self.log)))
        choice = choices[int(self.rng.integers(0, len(choices)))]
        if choice == "now":
            self.wake_at = now
        elif choice == "later":
            self.wake_at = now + float(self.rng.integers(1, 3)) * 0.25
        elif choice == "cancel":
            self.wake_at = math.inf

    def poke(self, now, what):
        self._act(now, what, ("now", "later", "later", "keep", "cancel"))

    def on_wake(self, now):
        self._act(now, "wake", ("now", "later", "later", "later", "keep"))


def _program(seed, n=5, budget=1000):
    log: list = []
    names = [f"c{i}" for i in range(n)]
    left = [budget]                 # calls left, shared by the cores
    cores = {nm: _Tracer(nm, names, log, left, seed * 100 + i) for i, nm in enumerate(names)}
    return cores, log


def _reference_run(cores) -> tuple[float, int, int]:
    """The virtual driver's order (rack.runtime.virtual), written as plainly as possible
    with a sorted list for its heap: messages first in, first out, each core's sent
    after its call returns; then the earliest wake request, ties to the one made first.
    A core's request stands until it asks for another time; a request replaced since is
    dropped (a core that asks anew, even for a time it had asked for before, takes a new
    place in line); a wake-up never moves time back. Returns (time reached, messages,
    wake-ups)."""
    now, seq, queue, line = 0.0, 0, deque(), []
    asked = {nm: (math.inf, -1) for nm in cores}
    n_msg = n_wake = 0

    def after(nm):
        nonlocal seq
        for dst, method, args in cores[nm].outbox:
            if dst.startswith(BROADCAST):                  # every core but the sender that handles it
                queue.extend((other, method, args) for other in cores
                             if other != nm and hasattr(cores[other], method))
            else:
                queue.append((dst, method, args))
        cores[nm].outbox.clear()
        if cores[nm].wake_at != asked[nm][0]:
            asked[nm] = (cores[nm].wake_at, seq)
            if asked[nm][0] < math.inf:
                line.append((asked[nm][0], seq, nm))
            seq += 1

    for nm in cores:
        after(nm)
    while True:
        while queue:
            dst, method, args = queue.popleft()
            n_msg += 1
            getattr(cores[dst], method)(now, *args)
            after(dst)
        line.sort()
        while line and asked[line[0][2]][1] != line[0][1]:
            line.pop(0)                                    # replaced since
        if not line:
            return now, n_msg, n_wake
        t, _, nm = line.pop(0)
        asked[nm] = (math.inf, -1)
        now = max(now, t)
        n_wake += 1
        cores[nm].on_wake(now)
        after(nm)


@pytest.mark.parametrize("seed", range(6))
def test_virtual_driver_runs_in_the_documented_order(seed):
    """The driver's loop (a heap with superseded entries left in place, handlers looked
    up once) delivers and wakes in the order its docstring states, call for call."""
    cores, log = _program(seed)
    drv = VirtualDriver(cores)
    drv.run(lambda: False)
    ref_cores, ref_log = _program(seed)
    now, n_msg, n_wake = _reference_run(ref_cores)
    assert len(log) >= 1000 and len({t for t, _, _ in log}) > 10
    assert log == ref_log
    assert (drv.now, drv.messages, drv.wakeups) == (now, n_msg, n_wake)


class _Ear(Core):
    def __init__(self, name, log, wake):
        super().__init__(name)
        self.log, self.wake_at = log, wake

    def hear(self, now, what):
        self.log.append((now, self.name, what))

    def on_wake(self, now):
        self.log.append((now, self.name, "wake"))
        self.wake_at = math.inf


class _Mouth(Core):
    """Speaks once at t=1 (to e2, then to everyone) and asks to wake again at once."""

    def __init__(self, log):
        super().__init__("m")
        self.log, self.wake_at = log, 1.0

    def on_wake(self, now):
        self.log.append((now, self.name, "wake"))
        spoke = sum(1 for _, nm, _ in self.log if nm == "m") > 1
        self.wake_at = math.inf if spoke else now        # again at this instant, after its messages
        if not spoke:
            self.send("e2", "hear", "direct")
            self.send(BROADCAST, "hear", "all")


def test_virtual_driver_order_by_hand():
    """Messages come before wake-ups of the same instant; a broadcast reaches the other
    cores that handle it in topology order; equal wake times go to the one requested
    first."""
    log: list = []
    cores = {"m": _Mouth(log), "e1": _Ear("e1", log, 1.0), "e2": _Ear("e2", log, 0.5)}
    VirtualDriver(cores).run(lambda: False)
    assert log == [(0.5, "e2", "wake"), (1.0, "m", "wake"), (1.0, "e2", "direct"), (1.0, "e1", "all"),
                   (1.0, "e2", "all"), (1.0, "e1", "wake"), (1.0, "m", "wake")]


@pytest.mark.parametrize("model,device,par", MODELS)
def test_decode_steps_affine_path_equals_the_general_pass(model, device, par):
    """`decode_steps` without speculation prices steps from cached per-batch-size lines;
    they must give what the general `_pass` gives, step by step, and the same bound."""
    rng = np.random.default_rng(2)
    cm = CostModel(model, device, par, "fp8", "fp8")
    assert cm.speculative is None
    for _ in range(15):
        ctx = rng.integers(1, 60_000, int(rng.integers(1, 600)))
        n = int(rng.integers(1, 400))
        fast = cm.decode_steps(ctx, n)
        full = cm._decode_dict(ctx.astype(float), np.arange(n, dtype=float), lean=True)
        for got, key in ((fast.time_s, "time"), (fast.flops, "flops"), (fast.bytes, "bytes"),
                         (fast.comm_s, "comm")):
            np.testing.assert_allclose(got, np.broadcast_to(full[key], (n,)), rtol=1e-12, atol=0)
        if not cm._t.n_slide:
            assert fast.bound == cm._bound(full)
        for m in (0, 1, n // 2, n):
            np.testing.assert_allclose(fast.work(m), (fast.flops[:m].sum(), fast.bytes[:m].sum()), rtol=1e-12)
        # priced from the contexts' sum alone (a decode engine's runs): the same, bit for bit
        by_sum = cm.decode_steps_of_sum(ctx.size, int(ctx.sum()), n)
        if cm._t.n_slide:           # sliding windows: a step's cost needs every context
            assert by_sum is None
            continue
        np.testing.assert_array_equal(by_sum.time_s, fast.time_s)
        assert by_sum.bound == fast.bound and by_sum.work(n) == fast.work(n) and by_sum.busy(n) == fast.busy(n)


def test_decode_steps_when_the_compute_and_memory_lines_cross():
    """A large batch of short contexts starts compute-bound and becomes memory-bound
    (KV reads grow faster than attention FLOPs): `decode_steps` takes the larger line
    step by step, as the general pass does."""
    cm = CostModel("llama-2-70b", "a100", Parallelism(tp=2), "fp8", "fp8")
    ctx = np.random.default_rng(4).integers(1, 64, 200)
    n = 30_000
    full = cm._decode_dict(ctx.astype(float), np.arange(n, dtype=float))
    assert full["compute"][0] > full["memory"][0] and full["compute"][-1] < full["memory"][-1]
    fast = cm.decode_steps(ctx, n)
    np.testing.assert_allclose(fast.time_s, full["time"], rtol=1e-12, atol=0)
    assert fast.bound == "compute"


@pytest.mark.parametrize("model,device,par", MODELS)
def test_memoized_pass_terms_give_what_fresh_terms_give(model, device, par):
    """Prefill, mixed and decode iterations priced by a model that has seen other
    iterations (its terms per token count memoized) equal those of a fresh model."""
    rng = np.random.default_rng(5)
    for spec in (None, SpeculativeConfig(2, 0.7)):
        seasoned = CostModel(model, device, par, "fp8", "fp8", speculative=spec)
        for _ in range(12):
            n = rng.integers(1, 3000, int(rng.integers(1, 4)))
            n[0] = 8192 if rng.random() < 0.5 else n[0]        # repeated token counts: memo hits
            c = rng.integers(0, 20_000, n.size)
            ctx = rng.integers(1, 30_000, int(rng.integers(1, 20)))
            for call in (lambda m: m.prefill(n, c), lambda m: m.mixed(n, c, ctx), lambda m: m.decode_step(ctx)):
                call(seasoned)
                assert call(seasoned) == call(CostModel(model, device, par, "fp8", "fp8", speculative=spec))


def _entry(h: FrameHeader) -> tuple:
    return (h.request_id, h.layer_start, h.layer_end, h.token_start, h.token_end, h.dtype, h.shape,
            h.logical_bytes, h.payload_bytes)


def _one_by_one(frames, verify: bool) -> list:
    """What `scan_kv_frames` must return, from the per-frame public functions."""
    out = []
    for f in frames:
        try:
            out.append(_entry(decode_frame(f)[0] if verify else peek_header(f)))
        except FrameError:
            out.append(None)
            if not verify:
                break
    return out


def test_batched_frame_scan_equals_per_frame_decoding():
    frames = make_kv_frames(300, 700, 35_136, 61, 8, 1e-3, seed=4)
    f = frames[2]
    hend = bytes(f[:200]).find(b"\xa4xxh3\xcf") + 6
    variants = [f, bytes(f), bytearray(f), memoryview(bytes(f)), corrupt_frame(f, 1), f[:-1].copy(),
                np.concatenate([f, f[:1]]), f[::2], f.astype(np.int8), f.astype(object), np.stack([f, f]),
                np.zeros(0, np.uint8), None, "frame"]
    for pos in range(hend + 13):                        # every header, checksum and bin-length byte
        g = f.copy()
        g[pos] ^= 0x41
        variants.append(g)
    for v in variants:
        payload = [frames[0], v, frames[3]]
        assert scan_kv_frames(payload, True) == _one_by_one(payload, True)
        assert scan_kv_frames(payload, False) == _one_by_one(payload, False)
    # the same byte flips in place, in an intact payload read through its header records
    for pos in range(hend + 13):
        payload = make_kv_frames(300, 700, 35_136, 61, 8, 1e-3, seed=4)
        payload[2][pos] ^= 0x41
        assert payload.intact()
        assert scan_kv_frames(payload, True) == _one_by_one(list(payload), True)
        assert scan_kv_frames(payload, False) == _one_by_one(list(payload), False)


def test_every_corrupted_body_byte_is_caught():
    frames = make_kv_frames(21, 40, 35_136, 61, 8, 1e-3)   # ~180-byte bodies
    for i, f in enumerate(frames):
        h, body = decode_frame(f)
        off = f.nbytes - body.nbytes
        for pos in range(off, f.nbytes):
            g = f.copy()
            g[pos] ^= 0x10
            payload = list(frames)
            payload[i] = g
            assert verify_kv_frames(payload)[:2] == (7, 1)
            assert _count_bad_frames(21, 40, 61, payload) == 1
    assert _count_bad_frames(21, 40, 61, frames) == 0 and _count_bad_frames(22, 40, 61, frames) == 8
    assert _count_bad_frames(21, 41, 61, frames) == 8 and _count_bad_frames(21, 40, 62, frames) == 1
    assert _count_bad_frames(21, 40, 61, frames[1:]) == 1   # layers [0, 8) missing


def test_cached_layouts_give_the_frames_a_fresh_layout_gives():
    _LAYOUTS.clear()
    first = [bytes(f) for f in make_kv_frames(5, 1234, 35_136, 61, 8, 1e-3, seed=1)]   # layout built
    again = [bytes(f) for f in make_kv_frames(5, 1234, 35_136, 61, 8, 1e-3, seed=1)]   # from the cache
    other = make_kv_frames(2**40, 1234, 35_136, 61, 8, 1e-3, seed=1)                  # longer request id
    assert first == again
    assert verify_kv_frames(other)[1] == 0
    fields = [_entry(peek_header(f))[1:] for f in first]
    assert [_entry(peek_header(f)) for f in other] == [(2**40, *rest) for rest in fields]


def _mixed_steps_and_each(cm, rng, B: int, max_n: int):
    """A random fixed batch of B contexts and a prompt's chunk: `mixed_steps` over n
    iterations and `mixed` for each of them (the prompt j chunks further, every context
    j tokens longer)."""
    ctx = rng.integers(1, 30_000, B)
    new, cached, n = int(rng.integers(1, 2048)), int(rng.integers(0, 20_000)), int(rng.integers(2, max_n))
    one = [cm.mixed(np.array([new]), np.array([cached + j * new]), ctx + j * cm.tokens_per_step) for j in range(n)]
    return cm.mixed_steps(new, cached, ctx, n), one, n


@pytest.mark.parametrize("model,device,par", MODELS)
def test_mixed_steps_equal_one_mixed_iteration_at_a_time(model, device, par):
    """`mixed_steps` (a long prompt's chunks fused with decode steps of a fixed batch)
    prices iteration j as `mixed` does with the prompt j chunks further and every
    context j tokens longer; lines where the model allows them, a loop otherwise."""
    rng = np.random.default_rng(3)
    for spec in (None, SpeculativeConfig(2, 0.7)):
        cm = CostModel(model, device, par, "fp8", "fp8", speculative=spec)
        for B in (0, 1, 40):
            fast, one, n = _mixed_steps_and_each(cm, rng, B, 60)
            for got, key in ((fast.time_s, "time_s"), (fast.flops, "flops"), (fast.bytes, "bytes"),
                             (fast.comm_s, "comm_s")):
                np.testing.assert_allclose(got, [getattr(c, key) for c in one], rtol=1e-12, atol=0)
            assert fast.bound == one[0].bound
            for m in (1, n // 2, n):
                np.testing.assert_allclose(fast.work(m), (sum(c.flops for c in one[:m]),
                                                          sum(c.bytes for c in one[:m])), rtol=1e-12)
    with pytest.raises(ValueError, match="mixed_steps"):
        cm.mixed_steps(0, 0, [], 3)


@pytest.mark.parametrize("device,spec", [("mi455x-sglang", None), ("mi455x", SpeculativeConfig(2, 0.7))])
def test_mixed_steps_priced_one_at_a_time_are_mixed_bit_for_bit(device, spec):
    """Where `mixed_steps` prices iteration by iteration (an unfused stack, speculative
    decoding) it gives `mixed`'s floats exactly; the IterationCost the cost model builds
    (without the frozen dataclass's __init__) is the one the dataclass builds."""
    import dataclasses

    from devices.costmodel import IterationCost
    rng = np.random.default_rng(5)
    cm = CostModel("kimi-k2", device, Parallelism(tp=8, ep=8), "fp8", "fp8", speculative=spec)
    for B in (0, 1, 9):
        fast, one, n = _mixed_steps_and_each(cm, rng, B, 9)
        for got, key in ((fast.time_s, "time_s"), (fast.flops, "flops"), (fast.bytes, "bytes"),
                         (fast.comm_s, "comm_s")):
            assert got.tolist() == [getattr(c, key) for c in one]
        assert fast.busy(n) == float(np.add.reduce(np.array([c.device_busy_s for c in one])))
        c = one[-1]
        d = IterationCost(**c.__dict__)
        assert c == d and hash(c) == hash(d) and repr(c) == repr(d) and list(vars(c)) == list(vars(d))
        assert pickle.loads(pickle.dumps(c)) == c
        with pytest.raises(dataclasses.FrozenInstanceError):
            c.time_s = 0.0


def test_fused_mixed_iterations_give_the_one_at_a_time_results(monkeypatch):
    """A long prompt's chunks over a running batch are priced in runs; per-request
    timings, counters and memory are those of running one mixed iteration per wake-up,
    with far fewer wake-ups, also when arrivals and completions cut the runs."""
    from devices.engines.colocated import ColocatedEngine
    from test_engines_colocated import _poisson, _run, llama

    cost = llama("h100")
    reqs = _poisson(40, rate=4.0, seed=9, prompt=(200, 40_000), output=(2, 400))
    for policy in ("reserve", "preempt"):
        fused = _run(reqs, cost, chunk_tokens=1024, admission_policy=policy, prefix_cache=False)
        with monkeypatch.context() as m:
            m.setattr(ColocatedEngine, "_fusable", lambda self, budget: 1)
            single = _run(reqs, cost, chunk_tokens=1024, admission_policy=policy, prefix_cache=False)
        (col_f, _, st_f), (col_s, _, st_s) = fused, single
        for key in ("mixed_iterations", "tokens_computed", "tokens_generated", "completed", "steps"):
            assert st_f[key] == st_s[key], key
        assert st_f["wakeups"] < st_s["wakeups"] / 2
        for ev in ("prefill_start", "first_token", "decode_admit", "completion"):
            a, b = col_f.times(ev), col_s.times(ev)
            assert a.keys() == b.keys()
            np.testing.assert_allclose([a[i] for i in a], [b[i] for i in a], rtol=1e-12, atol=1e-12)
        for rid, o in col_s.outcomes.items():
            np.testing.assert_allclose(col_f.outcomes[rid]["itl_s"], o["itl_s"], rtol=1e-9, atol=1e-12)
        assert st_f["memory"]["peak_bytes"] == st_s["memory"]["peak_bytes"]
