"""Load controls as benchmark users know them (vLLM `bench serve`): request rate and
burstiness, number of prompts, duration, max concurrency; and vLLM's random dataset.

`LoadControls` holds them (validated, picklable); `apply_load` applies them to any
request list (a trace's, a workload file's) in a fixed order:
1. `request_rate` re-times the arrivals (`retime`): a fresh arrival process (Poisson,
   or Gamma with vLLM's `burstiness`; ``inf`` sends everything at 0 s) replaces the
   source's timing; order, ids, lengths, block hashes and labels are kept; with a
   duration, the process's gaps are normalised to fill it with exactly round(rate x
   duration) arrivals (`workloads.arrivals.window_times`, exact: a Poisson process
   conditioned on its count, as vLLM's `bench serve` normalises its gaps), so the
   realised rate is the asked one and not off by the count's sampling error (at 1
   req/s for 120 s that error's sd is 9 %);
2. `duration_s` keeps the arrivals before it;
3. `num_prompts` keeps the first N.
`max_concurrency` (with `think_time_s`) does not change the list: it makes the load a
closed loop (`closed_loop`), which the runtime executes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Sequence

from .bounds import MAX_GAMMA_CV
from .request import Request


@dataclass(frozen=True)
class LoadControls:
    """vLLM-style load controls (None: not set).

    request_rate: req/s of a fresh arrival process, or ``math.inf`` (everything at 0 s).
    burstiness: Gamma shape of the gaps, vLLM's definition (1 = Poisson, < 1 burstier,
      > 1 smoother, inf = constant gaps); CV = 1/sqrt(burstiness).
    num_prompts: keep the first N requests. duration_s: keep arrivals before it (s).
    max_concurrency: at most N requests in the rack (closed loop); think_time_s: mean
      of an exponential think time after each completion (0: none).
    seed: seeds the arrival process (and the think times).
    Raises ValueError on a bad value, naming the option.
    """

    request_rate: float | None = None
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration_s: float | None = None
    max_concurrency: int | None = None
    think_time_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        r = self.request_rate
        if r is not None and not (r > 0 and not math.isnan(r)):
            raise ValueError(f"request rate must be a number of requests/s > 0, or inf; got {r}")
        if not (self.burstiness > 0 and not math.isnan(self.burstiness)):
            raise ValueError(f"burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if self.burstiness < 1.0 / MAX_GAMMA_CV**2:
            raise ValueError(f"burstiness must be at least {1.0 / MAX_GAMMA_CV**2:g} (Gamma gaps of CV "
                             f"<= {MAX_GAMMA_CV:g}: below it numpy's draws underflow to 0), got {self.burstiness:g}")
        if self.burstiness != 1.0 and r is None:
            raise ValueError("burstiness shapes the gaps of --request-rate; give a request rate")
        for name in ("num_prompts", "max_concurrency"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or int(v) != v or v < 1):
                raise ValueError(f"{name.replace('_', '-')} must be an integer >= 1, got {v}")
        d = self.duration_s
        if d is not None and not (math.isfinite(d) and d > 0):
            raise ValueError(f"duration must be a finite number of seconds > 0, got {d}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think time must be a finite number of seconds >= 0, got {self.think_time_s}")
        if self.think_time_s and self.max_concurrency is None:
            raise ValueError("think time applies to a closed loop; give max concurrency")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63) (numpy's SeedSequence, 64-bit), got {self.seed!r}")

    def arrival_process(self):
        """The arrival process of `request_rate` and `burstiness`, or None (not set, or
        inf: every request at 0 s)."""
        from .arrivals import ConstantArrivals, GammaArrivals, PoissonArrivals

        r, b = self.request_rate, self.burstiness
        if r is None or math.isinf(r):
            return None
        if math.isinf(b):
            return ConstantArrivals(r)
        return PoissonArrivals(r) if b == 1.0 else GammaArrivals.from_burstiness(r, b)

    def describe(self) -> dict:
        """JSON-ready (inf written as the string "inf")."""
        return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}


def retime(requests: Sequence[Request], controls: LoadControls) -> list[Request]:
    """`requests` in their order with arrivals from `controls`' request rate (first at
    0 s; all 0 s for inf), up to `controls.duration_s` if set. Ids, lengths, hashes and
    labels are kept. Turns of a session (`Request.turn`) are re-timed as one unit: the
    rate is the rate of new sessions, and every turn takes its session's new start (the
    runtime sends later turns after the previous one ends, not at their arrival).
    Raises ValueError if no request rate is set."""
    if controls.request_rate is None:
        raise ValueError("retime needs a request rate")
    if getattr(requests, "with_arrivals", None) is not None and not requests.has_turns:
        return requests.with_arrivals(_unit_times(len(requests), controls))     # a RequestTable
    # one arrival per unit: a session (all its turns), or a request without a turn
    unit: dict = {}
    of = [unit.setdefault(r.turn.session if r.turn is not None else ("request", i), len(unit))
          for i, r in enumerate(requests)]
    times = _unit_times(len(unit), controls).tolist()
    out = [Request(r.id, times[u], r.prompt_tokens, r.output_tokens, r.block_hashes, r.block_size,
                   r.tenant, r.slo_class, r.reasoning_tokens, r.turn)
           for r, u in zip(requests, of) if u < len(times)]
    # a session's later turns take its (earlier) start: back in arrival order, stable
    return sorted(out, key=lambda r: r.arrival_s) if len(unit) < len(requests) else out


def _unit_times(n: int, controls: LoadControls):
    """Arrival times (s, shape (<= n,)) of `n` units (requests, or sessions) under
    `controls`' request rate: all 0 for inf; with a duration, the exact count that fills
    it (module docstring), at most n."""
    import numpy as np

    from .arrivals import arrival_times, window_times

    process = controls.arrival_process()
    if process is None:
        return np.zeros(n)
    if controls.duration_s is not None:         # exactly round(rate x duration) in it (module docstring)
        return window_times(process, 0.0, controls.duration_s, exact=True, seed=controls.seed)[:n]
    return arrival_times(process, n=n, seed=controls.seed)


def apply_load(requests: Sequence[Request], controls: LoadControls) -> list[Request]:
    """The request list with the open-loop controls applied (see the module docstring);
    the input must be in arrival order. max_concurrency is left to `closed_loop`. A
    `workloads.table.RequestTable` gives a RequestTable (the same requests)."""
    if getattr(requests, "with_arrivals", None) is not None:          # a RequestTable
        if requests.has_turns:          # sessions re-timed as units: the list path's rules
            return _table(apply_load(list(requests), controls))
        out = requests
        if controls.num_prompts is not None:
            out = out[:controls.num_prompts]
        if controls.request_rate is not None:
            out = retime(out, controls)
        if controls.duration_s is not None:
            out = out.where(out.arrivals < controls.duration_s)
        return out
    out = list(requests)
    if controls.num_prompts is not None:
        out = out[:controls.num_prompts]
    if controls.request_rate is not None:
        out = retime(out, controls)
    if controls.duration_s is not None:
        out = [r for r in out if r.arrival_s < controls.duration_s]
    return out


def closed_loop(requests: Sequence[Request], controls: LoadControls):
    """The `ClosedLoop` of `controls.max_concurrency` over `requests`, or None when no
    max concurrency is set."""
    if controls.max_concurrency is None:
        return None
    from .synth import ClosedLoop

    return ClosedLoop(tuple(requests), controls.max_concurrency, controls.think_time_s,
                      seed=controls.seed)


#: vLLM `bench serve`'s defaults for the random dataset (--random-input-len,
#: --random-output-len, --num-prompts).
RANDOM_INPUT_LEN, RANDOM_OUTPUT_LEN, RANDOM_NUM_PROMPTS = 1024, 128, 1000


def random_dataset(controls: LoadControls, *, input_len: int = RANDOM_INPUT_LEN,
                   output_len: int = RANDOM_OUTPUT_LEN, range_ratio: float = 0.0,
                   prefix_len: int = 0, block_size: int = 512, compact: bool = False):
    """vLLM's random dataset: lengths from `random_dataset_lengths`, a common
    `prefix_len`-token prefix added to every prompt (shared blocks have the same
    hashes; without a prefix, requests carry no hashes: random prompts share nothing),
    arrivals from `controls` (request_rate None or inf: all at 0 s, as vLLM's default).

    Count: `num_prompts`, or round(rate x `duration_s`) arrivals filling the duration
    (`retime`), or both (whichever is fewer); neither gives vLLM's default 1000. Ids
    0..n-1. compact: a `workloads.table.RequestTable` (columns drawn as arrays, no
    `Request` made) instead of a list of the same requests. Raises ValueError on bad
    parameters (a duration without a finite request rate).
    """
    from .lengths import random_dataset_lengths
    from .prefix import PrefixHasher
    from .synth import check_generated, synthesize

    from .request import MAX_TOKENS

    if prefix_len < 0 or int(prefix_len) != prefix_len:
        raise ValueError(f"prefix length must be an integer >= 0, got {prefix_len}")
    lengths = random_dataset_lengths(input_len, output_len, range_ratio)
    if prefix_len + lengths.prompt_max > MAX_TOKENS:       # before any prompt is built
        raise ValueError(f"prefix length {prefix_len:,} + prompts of up to {lengths.prompt_max:,} tokens is beyond "
                         f"any model's context (at most {MAX_TOKENS:,} tokens, workloads.request.MAX_TOKENS)")
    process = controls.arrival_process()
    if controls.duration_s is not None and process is None:
        raise ValueError("a duration needs a finite request rate (with an infinite rate "
                         "every request arrives at 0 s)")
    n = controls.num_prompts
    if n is None and controls.duration_s is None:
        n = RANDOM_NUM_PROMPTS
    if n is not None:
        check_generated(n, f"num-prompts {n}")
    else:
        check_generated(process.rate_per_s * controls.duration_s,
                        f"request rate {process.rate_per_s:g} req/s for duration {controls.duration_s:g} s")
    if controls.duration_s is not None:
        count = round(process.rate_per_s * controls.duration_s)
        n = count if n is None else min(n, count)
    if compact:
        return _random_table(process, lengths, n, controls, prefix_len, block_size)
    reqs = synthesize(process, lengths, n=n, seed=controls.seed, block_size=block_size)
    if controls.duration_s is not None:
        reqs = retime(reqs, controls)
    if not prefix_len:
        return reqs
    hasher = PrefixHasher(block_size)
    out = []
    for r in reqs:
        p = r.prompt_tokens + prefix_len
        out.append(Request(r.id, r.arrival_s, p, r.output_tokens,
                           hasher.hashes(p, prefix_len, "prefix", r.id), block_size))
    return out


def _random_table(process, lengths, n: int, controls: LoadControls, prefix_len: int, block_size: int):
    """`random_dataset(compact=True)`: the same requests as a RequestTable."""
    import numpy as np

    from .prefix import PrefixHasher
    from .synth import synthesize_columns
    from .table import RequestTable

    times, prompt, output = synthesize_columns(process, lengths, n=n, seed=controls.seed)
    ids = np.arange(times.size, dtype=np.int64)
    hashes = None
    if prefix_len:
        prompt = prompt + prefix_len
        hasher = PrefixHasher(block_size)
        hashes = [hasher.hashes(p, prefix_len, "prefix", i) for i, p in enumerate(prompt.tolist())]
    table = RequestTable.from_columns(ids, times, prompt, output, block_size=block_size, hashes=hashes)
    return retime(table, controls) if controls.duration_s is not None else table


@dataclass(frozen=True)
class LoadPlan:
    """Where a run's requests come from and how they are loaded: a recipe, small and
    picklable, that rebuilds the same requests anywhere (a sweep's worker process).

    source: ``"trace"`` (`name`: trace NAME or PATH, read with `format`, `mapping`,
      `skip_bad_rows`), ``"random"`` (vLLM's random dataset: `input_len`,
      `output_len`, `range_ratio`, `prefix_len`) or ``"workload"`` (`name`: a workload
      file or shipped name; `workload_seed` None keeps the file's seed).
    window, rate_scale, max_requests, output_scale: the replay controls
      (`workloads.replay`), applied first; then `controls` (`apply_load`).
    A trace without timestamps (a length distribution) is read in file order and needs
    a request rate or a max concurrency to give it arrivals, and no window or rate scale
    (`requests` raises TraceError naming the options).
    """

    source: str = "trace"
    name: str | None = None
    format: str | None = None
    mapping: tuple = ()
    skip_bad_rows: bool = False
    window: tuple | None = None
    rate_scale: float = 1.0
    max_requests: int | None = None
    output_scale: float = 1.0
    input_len: int = RANDOM_INPUT_LEN
    output_len: int = RANDOM_OUTPUT_LEN
    range_ratio: float = 0.0
    prefix_len: int = 0
    workload_seed: int | None = None
    controls: LoadControls = LoadControls()

    def __post_init__(self) -> None:
        if self.source not in ("trace", "random", "workload"):
            raise ValueError(f"load source must be trace, random or workload, got {self.source!r}")
        if self.source != "random" and not self.name:
            raise ValueError(f"a {self.source} source needs a name or path")

    def _replay(self) -> dict:
        return {"window": self.window, "rate_scale": self.rate_scale,
                "max_requests": self.max_requests, "output_scale": self.output_scale}

    def requests(self, compact: bool = False):
        """The requests (a `workloads.RequestList`, arrival order; with `compact`, a
        `workloads.table.RequestTable` of the same requests: numpy columns, read or
        generated without holding a `Request` object each). Raises TraceError,
        WorkloadSpecError or ValueError for bad input, and ValueError when no request
        is left."""
        from .replay import RequestList, load_requests, replay

        c = self.controls
        if self.source == "trace":
            from .reader import open_trace

            reader = open_trace(self.name, format=self.format, mapping=dict(self.mapping) or None,
                                skip_bad_rows=self.skip_bad_rows)
            if not reader.has_timestamps:
                self._check_untimed(reader)
            base = load_requests(reader, seed=c.seed, compact=compact, allow_untimed=True, **self._replay())
        else:
            if self.source == "random":
                drawn = random_dataset(c, input_len=self.input_len, output_len=self.output_len,
                                       range_ratio=self.range_ratio, prefix_len=self.prefix_len,
                                       compact=compact)
                made = drawn.with_meta(name="random", format="random") if compact else \
                    RequestList(drawn, name="random", format="random")
            else:
                from .mixture import generate_workload
                from .workload_spec import load_workload, resolve_workload

                made = generate_workload(load_workload(self.name), seed=self.workload_seed,
                                         duration_s=c.duration_s,
                                         source=str(resolve_workload(self.name)))
            meta = dict(name=made.name, path=made.path, format=made.format, controls=made.controls)
            if not compact:
                base = RequestList(replay(made, **self._replay(), seed=c.seed), **meta)
            elif self._replay() == {"window": None, "rate_scale": 1.0, "max_requests": None, "output_scale": 1.0}:
                base = made.with_meta(**meta) if hasattr(made, "with_meta") else \
                    _table(made, **meta)
            else:
                base = _table(replay(made, **self._replay(), seed=c.seed), **meta)
        if not base:
            why = (f" in the window {self.window}" if self.window is not None else
                   " (its clients' rates x duration_s draw none; raise duration_s or the rates)"
                   if self.source == "workload" else "")
            raise ValueError(f"{self.label()} gives no requests{why}")
        meta = {**base.meta(), "controls": {**base.controls, **self.describe()}}
        loaded = apply_load(base, c)
        out = loaded.with_meta(**meta) if compact else RequestList(loaded, **meta)
        if not out:
            raise ValueError(f"no requests left from {self.label()} after the load controls "
                             f"{c.describe()}")
        return out

    def _check_untimed(self, reader) -> None:
        """A trace without timestamps (a length distribution) is replayed with its rows
        in file order, re-timed by the request rate (inf: all at 0 s, vLLM's default) or
        sent as slots free in a closed loop; raises TraceError naming these options when
        none is set, when --duration would bound arrivals that are all at 0 s, or for
        --window and --rate-scale (trace seconds)."""
        from .errors import TraceError
        from .replay import untimed_problem

        c = self.controls
        if self.window is not None or self.rate_scale != 1.0:
            raise TraceError(str(reader.path), None, None, untimed_problem(reader) + (
                ": --window and --rate-scale act on trace seconds; leave them out (--request-rate sets the "
                "rate, --num-prompts or --duration bound the run)"))
        if c.request_rate is None and c.max_concurrency is None:
            raise TraceError(str(reader.path), None, None, untimed_problem(reader) + (
                ": give it arrivals with --request-rate R (its rows in file order as a Poisson process of "
                "R req/s; --burstiness B for Gamma gaps; inf: every request at 0 s), or send them as slots "
                "free with --max-concurrency N; --num-prompts N keeps the first N"))
        if c.duration_s is not None and c.arrival_process() is None:
            raise TraceError(str(reader.path), None, None, untimed_problem(reader) + (
                ": --duration keeps the arrivals before it, and without a finite --request-rate every "
                "arrival is at 0 s; give a finite --request-rate, or bound it with --num-prompts"))

    def closed_loop(self, requests):
        """The `ClosedLoop` over `requests` when max concurrency is set, else None (a
        fixed think time: the router sends a freed slot's next request exactly
        think_time_s after the completion)."""
        loop = closed_loop(requests, self.controls)
        return None if loop is None else replace(loop, think_time="fixed")

    def run_kwargs(self) -> dict:
        """Keyword arguments for `rack.run.runner.run_scenario` (closed loop or none)."""
        c = self.controls
        if c.max_concurrency is None:
            return {}
        return {"max_concurrency": c.max_concurrency, "think_time_s": c.think_time_s}

    def label(self) -> str:
        """A short human name: the trace or workload, or the random dataset's lengths."""
        if self.source == "random":
            return (f"random dataset ({self.input_len} in / {self.output_len} out tokens"
                    + (f", range ratio {self.range_ratio:g}" if self.range_ratio else "")
                    + (f", {self.prefix_len}-token shared prefix" if self.prefix_len else "") + ")")
        return f"{'workload ' if self.source == 'workload' else ''}{self.name}"

    def describe(self) -> dict:
        """JSON-ready recipe (for a run's provenance)."""
        d = {"source": self.source, "name": self.name, "load": self.controls.describe()}
        if self.source == "random":
            d.update(input_len=self.input_len, output_len=self.output_len,
                     range_ratio=self.range_ratio, prefix_len=self.prefix_len)
        if self.source == "workload":
            d["workload_seed"] = self.workload_seed
        if self.format or self.mapping:
            d.update(format=self.format, mapping=dict(self.mapping))
        return d


def _table(requests, **meta):
    """A `workloads.table.RequestTable` of `requests` (consumed in chunks) with `meta`."""
    from .table import RequestTable

    return RequestTable.from_requests(requests, **meta)
