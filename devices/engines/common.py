"""Helpers shared by the serving engines: growable logs, speculative-step arithmetic,
utilisation and lateness meters, the instance's memory ledger from the planner.

Nothing here reads a clock; the engines (cores) own their scheduling.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, NamedTuple

import numpy as np

from devices.memory import HostKVTier, MemoryLedger
from workloads.series import BoundedSeries

#: Slack for float products such as steps * tokens_per_step (e.g. 3 * (1/3 * 3)) so an
#: expected count that is an integer in exact arithmetic is not floored one too low.
_EPS = 1e-9


class GrowingArray:
    """A float64 log with amortised O(1) append and a movable start.

    Indices are global (they keep counting when the head is dropped with
    `drop_before`), so a holder of an index range can read it back later as long as it
    is at or after `base`.
    """

    __slots__ = ("_buf", "_n", "base", "stop")

    def __init__(self, capacity: int = 1024) -> None:
        self._buf = np.empty(max(16, capacity), dtype=np.float64)
        self._n = 0          # live entries in _buf
        self.base = 0        # global index of _buf[0]
        # global length (`len`) as an attribute: a decode engine reads its step count
        # ~20 times per request, and a Python-level __len__ call costs several reads
        self.stop = 0

    def __len__(self) -> int:
        """Global length (index one past the last entry)."""
        return self.stop

    def extend(self, values: np.ndarray) -> None:
        """Append `values` (1-D)."""
        k = values.shape[0]
        need = self._n + k
        if need > self._buf.shape[0]:
            new = np.empty(max(need, 2 * self._buf.shape[0]), dtype=np.float64)
            new[: self._n] = self._buf[: self._n]
            self._buf = new
        self._buf[self._n : need] = values
        self._n = need
        self.stop = self.base + need

    def append(self, value: float) -> None:
        """Append one value (the per-event path: no temporary array)."""
        n = self._n
        if n == self._buf.shape[0]:
            new = np.empty(2 * n, dtype=np.float64)
            new[:n] = self._buf
            self._buf = new
        self._buf[n] = value
        self._n = n + 1
        self.stop += 1

    def at(self, index: int) -> float:
        """Global entry `index` (>= `base`) as a Python float."""
        return float(self._buf[index - self.base])

    def gaps(self, start: int, stop: int) -> np.ndarray:
        """entry[j] - entry[j - 1] for global j in [start, stop) (a new array; start - 1
        must be at or after `base`)."""
        if start - 1 < self.base or stop > self.stop or stop < start:
            raise IndexError(f"GrowingArray: gaps [{start}, {stop}) outside [{self.base + 1}, {self.stop})")
        b, o = self._buf, self.base
        return b[start - o: stop - o] - b[start - 1 - o: stop - 1 - o]

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Copy of global entries [start, stop); raises IndexError below `base`."""
        if start < self.base or stop > self.stop or stop < start:
            raise IndexError(f"GrowingArray: [{start}, {stop}) outside [{self.base}, {self.stop})")
        return self._buf[start - self.base : stop - self.base].copy()

    def drop_before(self, index: int) -> None:
        """Forget entries below global `index` (their memory is reused)."""
        cut = min(max(0, index - self.base), self._n)
        if cut:
            self._buf[: self._n - cut] = self._buf[cut : self._n]
            self._n -= cut
            self.base += cut


class ITLRef(NamedTuple):
    """A completed request's inter-token gaps without a float per token: `head` (its own
    samples, first) then the gaps of steps [start, stop) of the decode engine's step
    log `log` (step j's gap: its end minus step j - 1's end, the same subtraction the
    request's token times give, so the same floats). The engine sends the log's gaps
    to the collector once per run of steps (`itl_steps`), shared by every request of
    the batch: the collector keeps one float per step and per request these four
    fields (`rack.serving.records.ITLSamples`)."""

    head: np.ndarray
    log: str
    start: int
    stop: int


_LOG_SERIAL = itertools.count()


def step_log_key(name: str) -> str:
    """A key for an engine's step log unique to this engine object (a restarted
    instance starts its step count again: its log is another)."""
    return f"{name}#{os.getpid()}.{next(_LOG_SERIAL)}"


def emitted_after(steps, remaining, tokens_per_step: float):
    """Tokens emitted after `steps` verification steps by a request that had `remaining`
    tokens left: min(remaining, floor(steps * tokens_per_step)). Works on ints or arrays.

    Speculative decoding emits a random number of tokens per step; the engine uses the
    expected value `tokens_per_step` (from the cost model) deterministically, so step j
    emits floor(j*tps) - floor((j-1)*tps) >= 1 tokens (tps >= 1).
    """
    if type(steps) is int and type(remaining) is int:
        # one request (the engines' per-request bookkeeping): plain ints, same formula
        if tokens_per_step == 1.0:
            return min(remaining, steps)
        return min(remaining, math.floor(steps * tokens_per_step + _EPS))
    if tokens_per_step == 1.0:
        return np.minimum(remaining, steps)
    return np.minimum(remaining, np.floor(np.asarray(steps) * tokens_per_step + _EPS).astype(np.int64))


def step_token_times(starts: np.ndarray, ends: np.ndarray, done: int, remaining: int,
                     tokens_per_step: float, first_whole: bool = False) -> np.ndarray:
    """Times (emulated s) of the tokens a request emits in a run of steps: step j of the
    run starts at starts[j] and ends at ends[j] (shape (k,)) and is step done + j of a
    stint of `remaining` tokens (`emitted_after`). One token per step at the step's end,
    or with speculative decoding the q tokens of a step spread evenly over it (start +
    i/q * duration, i = 1..q, the last at the end). `first_whole`: the stint's first step
    makes the client's first token, so its tokens all come at its end (no token of a
    verification step exists before it has ended: speculative decoding never brings the
    first token earlier than a plain step would). Shape (tokens emitted in the k
    steps,); the decode engine's token log and a live front's pacing both use it."""
    k = ends.shape[0]
    if tokens_per_step == 1.0:
        return ends[: max(0, min(k, remaining - done))]
    e = emitted_after(done + np.arange(k + 1), remaining, tokens_per_step)
    q = np.diff(e)
    step_of = np.repeat(np.arange(k), q)
    i = np.arange(int(e[0]), int(e[-1])) - np.repeat(e[:-1], q) + 1
    out = starts[step_of] + (i / q[step_of]) * (ends[step_of] - starts[step_of])
    if first_whole and done == 0 and k:
        out[: int(q[0])] = ends[0]
    return out


def steps_for(tokens, tokens_per_step: float):
    """Fewest steps S with emitted_after(S, inf) >= tokens (ints or int arrays; 0 for 0)."""
    one = type(tokens) is int          # one request (an admission): plain ints throughout
    t = tokens if one else np.asarray(tokens, dtype=np.int64)
    if tokens_per_step == 1.0:
        out = t if one else t.copy()
    else:
        out = math.ceil(t / tokens_per_step) if one else np.ceil(t / tokens_per_step).astype(np.int64)
        # Repair the float rounding both ways with emitted_after's own formula.
        out = out + (emitted_after(out, t, tokens_per_step) < t)
        out = out - ((out > 0) & (emitted_after(out - 1, t, tokens_per_step) >= t))
    if one:
        return max(out, 0)
    out = np.maximum(out, 0)
    return int(out) if out.ndim == 0 else out


class Utilisation:
    """Busy time, FLOPs and bytes moved by an engine, for MFU/MBU.

    MFU = FLOPs / (peak FLOP/s x seconds); MBU = bytes / (bandwidth x seconds). Both are
    reported over busy time and over the whole elapsed time. `busy_s` is the time the
    instance runs iterations; `device_busy_s` the time each of its devices works
    (`IterationCost.device_busy_s`: on a pipeline a stage idles while the other stages
    hold the micro-batches), which sets the dynamic power (rack.measure.energy).
    """

    __slots__ = ("busy_s", "flops", "bytes", "iterations", "device_busy_s")

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.flops = 0.0
        self.bytes = 0.0
        self.iterations = 0
        self.device_busy_s = 0.0

    def add(self, seconds: float, flops: float, nbytes: float, iterations: int = 1,
            device_busy_s: float | None = None) -> None:
        """Book `seconds` of iterations; `device_busy_s` defaults to `seconds`."""
        self.busy_s += float(seconds)
        self.flops += float(flops)
        self.bytes += float(nbytes)
        self.iterations += int(iterations)
        self.device_busy_s += float(seconds if device_busy_s is None else device_busy_s)

    def as_dict(self, peak_flops: float, bandwidth: float, elapsed_s: float) -> dict:
        def ratio(x: float, rate: float, s: float) -> float:
            return x / (rate * s) if rate > 0 and s > 0 else 0.0

        return {
            "busy_s": self.busy_s,
            "iterations": self.iterations,
            "flops": self.flops,
            "bytes": self.bytes,
            "peak_flops": peak_flops,
            "memory_bandwidth": bandwidth,
            "elapsed_s": elapsed_s,
            "busy_fraction": self.busy_s / elapsed_s if elapsed_s > 0 else 0.0,
            "device_busy_s": self.device_busy_s,
            "device_busy_fraction": self.device_busy_s / elapsed_s if elapsed_s > 0 else 0.0,
            "mfu": ratio(self.flops, peak_flops, elapsed_s),
            "mbu": ratio(self.bytes, bandwidth, elapsed_s),
            "mfu_busy": ratio(self.flops, peak_flops, self.busy_s),
            "mbu_busy": ratio(self.bytes, bandwidth, self.busy_s),
        }


class Lateness:
    """How far past its deadlines an engine woke (emulated seconds; 0 in virtual time)."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples = GrowingArray(256)

    def note(self, deadline: float, now: float) -> None:
        self.samples.append(max(0.0, now - deadline))

    def as_dict(self) -> dict:
        s = self.samples.slice(self.samples.base, len(self.samples))
        return {
            "lateness_n": int(s.shape[0]),
            "lateness_max_s": float(s.max()) if s.size else 0.0,
            "lateness_mean_s": float(s.mean()) if s.size else 0.0,
            "lateness_p99_s": float(np.percentile(s, 99)) if s.size else 0.0,
            "lateness_s": s,
        }


class TimeSeries:
    """(t, value) samples, appended at events (memory occupancy, batch size); bounded
    (`workloads.series.BoundedSeries`: a long run keeps the last sample of each window).
    enabled=False: nothing is recorded (a run that reads no time series); `as_arrays`
    is then empty."""

    __slots__ = ("_s",)

    def __init__(self, enabled: bool = True) -> None:
        self._s = BoundedSeries(1) if enabled else None

    def add(self, t: float, value: float) -> None:
        if self._s is not None:
            self._s.add(t, float(value))

    def as_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._s.columns() if self._s is not None else (np.zeros(0), np.zeros(0))


class EventSeries:
    """An instance's gauges over time, one row per event that may change them (an
    iteration, a batch boundary, a submission, a handoff), never per token.

    Rows are (t, *values) with the columns `SERIES_COLUMNS`; a row at the same time as
    the last one replaces it, so an instant's several events leave its final state.
    Bounded (`workloads.series.BoundedSeries`): past `MAX_ROWS` rows a long run keeps
    the last row of each window of `resolution_s`. `as_dict()` returns {"t_s": (n,),
    column: (n,)} arrays. enabled=False: nothing is recorded (`record_series` skips
    its work too); `as_dict()` has empty arrays.
    """

    __slots__ = ("_s",)

    def __init__(self, enabled: bool = True) -> None:
        self._s = BoundedSeries(len(SERIES_COLUMNS)) if enabled else None

    def __len__(self) -> int:
        return len(self._s) if self._s is not None else 0

    @property
    def enabled(self) -> bool:
        return self._s is not None

    @property
    def resolution_s(self) -> float:
        return self._s.resolution_s if self._s is not None else 0.0

    def add(self, t: float, queue_depth: int, running: int, kv_bytes: int, prefix_cache_bytes: int,
            prefix_hit_blocks: int, prefix_lookup_blocks: int) -> None:
        if self._s is not None:
            self._s.add(t, queue_depth, running, kv_bytes, prefix_cache_bytes, prefix_hit_blocks,
                        prefix_lookup_blocks)

    def as_dict(self) -> dict[str, np.ndarray]:
        cols = self._s.columns() if self._s is not None else (np.zeros(0),) * (1 + len(SERIES_COLUMNS))
        out = {"t_s": cols[0]}
        out.update(dict(zip(SERIES_COLUMNS, cols[1:])))
        return out


def record_series(engine: Any, t: float, queue_depth: int, running: int) -> None:
    """Append a row to `engine.series` (an `EventSeries`) from its ledger and prefix
    cache (`engine.prefix`, None or absent when it has none); nothing when the series
    is disabled."""
    if not engine.series.enabled:
        return
    led = engine.ledger
    st = getattr(getattr(engine, "prefix", None), "stats", None)
    engine.series.add(t, queue_depth, running, led.held("kv") + led.held("reserved"), led.held("prefix_cache"),
                      st.hit_blocks if st else 0, st.hit_blocks + st.miss_blocks if st else 0)


#: Columns of `EventSeries` (stats key "timeseries"; rack.measure.timeseries):
#: queue_depth: requests waiting (prefill: queued; decode: waiting for memory, reserved
#: awaiting their KV, or ready for the batch; colocated: both); running: requests in the
#: running batch (prefill: being prefilled; decode: decoding; colocated: both); kv_bytes:
#: KV blocks held and reserved (prefix cache excluded); prefix_cache_bytes; and the
#: prefix cache's cumulative hit and looked-up full blocks.
SERIES_COLUMNS = ("queue_depth", "running", "kv_bytes", "prefix_cache_bytes",
                  "prefix_hit_blocks", "prefix_lookup_blocks")


def instance_ledger(cost: Any, name: str, reserve_fraction: float | None,
                    plan: Any = None) -> tuple[MemoryLedger, Any]:
    """The instance's ledger with weights and workspace booked, and the memory plan.

    Capacity, weight and reserve bytes come from `plan` (any object with int-valued
    `capacity_bytes`, `weight_bytes`, `reserve_bytes`) or, when None, from
    `devices.planner.plan_memory(cost)` (which raises ModelDoesNotFit when the weights
    do not fit). What stays free is for KV blocks and the prefix cache.
    """
    if plan is None:
        from devices.planner import plan_memory  # late: the planner imports the cost model

        plan = plan_memory(cost) if reserve_fraction is None else plan_memory(
            cost, reserve_fraction=reserve_fraction)
    ledger = MemoryLedger(int(plan.capacity_bytes), name)
    ledger.alloc("weights", int(plan.weight_bytes))
    ledger.alloc("workspace", int(plan.reserve_bytes))
    return ledger, plan


def memory_label(cost: Any) -> str:
    """"SRAM" for a wafer-scale device, "HBM" otherwise (for ledger names)."""
    return "SRAM" if getattr(getattr(cost, "device", None), "kind", "gpu") == "wafer" else "HBM"


def model_layers(cost: Any) -> int:
    """Number of transformer layers of the cost model's model."""
    model = cost.model
    for attr in ("layers", "n_layers", "num_layers", "num_hidden_layers"):
        v = getattr(model, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    raise AttributeError(f"cannot find the layer count of model {model!r}")


def enqueue_batch(engine: Any, now: float, items, refuse, make_job, held: int = 0) -> bool:
    """Queue several requests at once (one router tick), for any engine core with a
    FCFS `_queue`, `counts`, `queue_peak`, `max_queue` and `collector`; returns whether
    any was queued (the caller then schedules its next iteration). `held`: requests
    waiting on the instance outside `_queue` (they count against `max_queue` too).

    `refuse(req, target)` returns None or (outcome, reason) for a request that must end
    at once; `make_job(req, target)` builds the queue entry. The queued requests'
    `prefill_queued` events go to the collector in one message, then the outcomes of
    the refused ones.
    """
    queued, ends = [], []
    for req, target in items:
        engine.counts["submitted"] += 1
        verdict = refuse(req, target)
        if verdict is None and len(engine._queue) + held >= engine.max_queue:
            verdict = ("rejected", "prefill_queue_full")
        if verdict is not None:
            engine.counts[verdict[0]] += 1
            ends.append((req.id, verdict))
            continue
        engine._queue.append(make_job(req, target))
        queued.append((req.id, "prefill_queued", now))
    if queued:
        engine.queue_peak = max(engine.queue_peak, len(engine._queue) + held)
        engine.send(engine.collector, "events", queued)
    for rid, (outcome, reason) in ends:
        engine.send(engine.collector, "finish", rid, outcome, reason, None, now)
    return bool(queued)


def prefix_lookup(prefix: Any, req: Any) -> tuple[tuple, int, int]:
    """Pin the longest run of `req`'s leading full-block hashes found in `prefix` (a
    `PrefixCache` or None). Returns (hashes looked up, blocks hit, cached tokens); at
    least one prompt token is always left to compute (the first output token needs
    the last position's logits, as in vLLM). Undo with `prefix.release(req.id)`."""
    if prefix is None or not req.block_hashes:
        return (), 0, 0
    hashes = req.block_hashes[: req.prompt_tokens // req.block_size]   # full blocks only
    hit = prefix.acquire(req.id, hashes, req.block_size, count=False)
    return hashes, hit, min(hit * req.block_size, req.prompt_tokens - 1)


def admit_with_prefix(engine: Any, job: Any, hashes: tuple, hit: int, cached: int) -> None:
    """Book an admitted job's prefix-cache hit (counters and `job.cached`; a live front,
    the engine's `stream_to`, is told the cached tokens)."""
    if engine.prefix is not None and hashes:
        engine.prefix.count_lookup(hit, len(hashes), job.req.block_size, job.req.prompt_tokens)
    job.cached = cached
    engine.tokens_cached += cached
    if getattr(engine, "stream_to", None) is not None:      # a live front: usage.cached_tokens
        engine.send(engine.stream_to, "prompt_cached", job.req.id, cached)


#: Energy of moving a byte of KV from host DRAM to a device (J/byte): DRAM read
#: (DDR5 ~15-20 pJ/bit), the host link (PCIe Gen5 SerDes ~5-10 pJ/bit; a wafer's
#: Ethernet NICs and switch ~10-30 pJ/bit) and the device's write (HBM ~4 pJ/bit):
#: ~30 pJ/bit [E] (range 15-60 pJ/bit; Horowitz, ISSCC 2014 keynote, for DRAM and
#: wire energies; PCI-SIG and IEEE 802.3 SerDes figures) = 3.75 nJ per byte.
HOST_KV_JOULES_PER_BYTE = 30e-12 * 8


def attach_host_tier(engine: Any, capacity_bytes: int, bandwidth_Bps: float | None) -> None:
    """Give `engine.prefix` (a `PrefixCache`, or None: nothing to do) a host-memory
    tier of `capacity_bytes` for the prefixes it evicts (`devices.memory.HostKVTier`;
    0: none). bandwidth_Bps None: the instance's host links, each device's
    `weight_load_Bps` (the link its weights load over) times its devices."""
    if engine.prefix is None or int(capacity_bytes) <= 0:
        return
    cost = engine.cost
    if bandwidth_Bps is None:
        bandwidth_Bps = cost.device.weight_load_Bps * cost.parallelism.n_devices
    engine.prefix.host = HostKVTier(int(capacity_bytes), float(bandwidth_Bps), HOST_KV_JOULES_PER_BYTE)


def host_prefix(engine: Any, job: Any, hashes: tuple, hit: int, cached: int) -> int:
    """Prompt tokens of an admitted `job` held in its engine's host tier beyond the
    `hit` blocks (`cached` tokens) the device's prefix cache holds: they are loaded
    back instead of recomputed (their device memory is allocated with the rest of the
    prompt's). Books the load (`HostKVTier.load`) and adds its time to `job.load_s`;
    the iteration that starts the job waits for it (a synchronous load before the
    forward pass, as vLLM's KV connector does). Returns the tokens (0 without a tier)."""
    host = engine.prefix.host if engine.prefix is not None else None
    if host is None or not hashes or hit >= len(hashes):
        return 0
    bs = job.req.block_size
    more = host.run(hashes[hit:], bs)
    tokens = min((hit + more) * bs, job.req.prompt_tokens - 1) - cached if more else 0
    if tokens <= 0:
        return 0
    job.load_s += host.load(tokens * engine.prefix.kv_bytes_per_token)
    return tokens


def host_load_s(plan: list) -> float:
    """Seconds an iteration waits for its newly started jobs' host-tier loads (the
    host link carries them one after another)."""
    return sum(j.load_s for j, _ in plan if not j.started)


def plan_chunk(active: list, queue, budget: int, try_admit, per_job: int | None = None) -> list:
    """One chunked-prefill iteration's (job, new tokens) list, vLLM-style: the jobs
    already prefilling (`active`, in admission order) first, then FCFS admissions from
    the head of `queue` while `budget` tokens and memory last (`try_admit(job)` books
    the job's KV and returns False when it does not fit: head-of-line blocking).
    Admitted jobs move from `queue` to `active`. Jobs have a `remaining` token count.
    `per_job`: at most this many tokens of one job per iteration (vLLM's
    long_prefill_token_threshold; None: no cap), so the budget spreads over several
    prompts.
    """
    plan: list = []
    cap = budget if per_job is None else min(budget, int(per_job))
    for job in active:
        if budget == 0:
            break
        take = min(job.remaining, budget, cap)
        plan.append((job, take))
        budget -= take
    while budget > 0 and queue:
        job = queue[0]
        if not try_admit(job):
            break
        queue.popleft()
        active.append(job)
        take = min(job.remaining, budget, cap)
        plan.append((job, take))
        budget -= take
    return plan


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


__all__ = [
    "HOST_KV_JOULES_PER_BYTE", "attach_host_tier", "host_load_s", "host_prefix",
    "EventSeries", "ITLRef", "SERIES_COLUMNS", "GrowingArray", "step_log_key", "record_series", "Lateness", "TimeSeries", "Utilisation", "ceil_div", "emitted_after",
    "enqueue_batch", "instance_ledger", "memory_label", "model_layers", "step_token_times", "steps_for",
]
