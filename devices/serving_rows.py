"""Measured serving rows (shared/reference/gpu-calibration.csv) and what they deploy.

A row is one benchmark point: `concurrency` closed-loop users (a user sends its next
request when the previous one ends) send prompts of `isl` tokens asking for `osl`
tokens to a deployment (hardware, GPU count, TP/EP, data-parallel attention, precision,
framework, speculative decoding, disaggregated prefill/decode pools), and the
benchmark reports median TPOT, median TTFT and total tokens/s per GPU.

`load_serving_rows(path)` reads exactly the CSV layout of gpu-calibration.csv (the
column names of `COLUMNS`; extra columns are refused so a misspelt one is not
silently ignored), so anyone can add measured rows. `deployment(row)` turns a row
into plain data the runner builds a scenario from (rack.experiments.validation_runs) and that
`closed_loop_estimate` prices with the cost model alone (a formula-level check, used
to fit the stacks: scripts/fit_gpu_stacks.py). The authoritative figures are the
engine replays of rack.experiments.validation_runs.

Assumptions, each stated where it is used:
- request lengths are drawn uniformly in [0.8, 1.0] x the nominal isl/osl: InferenceX
  runs the SGLang/vLLM `benchmark_serving.py` random dataset with
  --random-range-ratio (RANDOM_RANGE_RATIO in its launch scripts), and the recorded
  latencies imply ~917 output tokens for osl 1024 (gpu-calibration.md), i.e. a mean
  of 0.9 x nominal; outputs run to their drawn length (--ignore-eos);
- "fp4" rows serve FP4 weights with an FP8 KV cache (the NVFP4 / MXFP4 DeepSeek-R1
  checkpoints), "fp8" rows FP8 weights and KV;
- how the benchmark ran the row (prompts per user, the scheduler's receive interval,
  chunked-prefill budget, running-request cap, and for "mtp" rows the draft tokens
  and acceptance rate of DeepSeek's MTP head) comes from the launch script of its
  source and date: `devices.harness` (devices/catalog/serving-harness.toml, each fact
  with its source);
- a disaggregated row's workers are instances: prefill_gpus / prefill_workers GPUs
  each (likewise decode); when that exceeds the row's TP with data-parallel
  attention, the instance runs attention data-parallel over its GPUs and the experts
  expert-parallel over them (SGLang --enable-dp-attention with EP = DP).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import CatalogError
from .costmodel import CostModel, Parallelism, SpeculativeConfig
from .harness import DEFAULT_REQUESTS_PER_USER, harness_for

#: Columns of gpu-calibration.csv, in order (units in the names).
COLUMNS = (
    "id", "hardware", "gpus_total", "tp", "ep", "dp_attention", "prefill_gpus", "prefill_workers",
    "prefill_tp", "prefill_ep", "prefill_dp_attention", "decode_gpus", "decode_workers", "decode_tp",
    "decode_ep", "decode_dp_attention", "model", "precision", "framework", "image_tag", "spec_decoding",
    "disaggregated", "isl_tokens", "osl_tokens", "concurrency_requests", "median_tpot_ms", "median_ttft_ms",
    "tokens_per_s_per_user", "total_tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu",
    "input_tokens_per_s_per_prefill_gpu", "date", "source", "notes",
)
#: Length draws: uniform in [LENGTH_LOW, 1] x nominal (see the module docstring).
LENGTH_LOW = 0.8
#: A prefill instance's token budget per pass when the harness gives none (the
#: scenario pools' default `chunk_tokens`, vLLM's max_num_batched_tokens of 8,192).
DEFAULT_CHUNK_TOKENS = 8192
#: Framework names of the CSV -> catalog stack keys: `devices.borrow.FRAMEWORK_FAMILIES`
#: (a pair without a stack file borrows the nearest calibrated one, `devices.borrow`).


@dataclass(frozen=True)
class ServingRow:
    """One measured row (units in the field names; None where the CSV cell is empty)."""

    id: str
    hardware: str
    gpus_total: int
    model: str
    precision: str
    framework: str
    spec_decoding: str
    disaggregated: bool
    isl_tokens: int
    osl_tokens: int
    concurrency_requests: int
    median_tpot_ms: float
    median_ttft_ms: float
    total_tokens_per_s_per_gpu: float
    tp: int | None = None
    ep: int | None = None
    dp_attention: bool = False
    prefill_gpus: int | None = None
    prefill_workers: int | None = None
    prefill_tp: int | None = None
    prefill_ep: int | None = None
    prefill_dp_attention: bool = False
    decode_gpus: int | None = None
    decode_workers: int | None = None
    decode_tp: int | None = None
    decode_ep: int | None = None
    decode_dp_attention: bool = False
    image_tag: str = ""
    tokens_per_s_per_user: float | None = None
    output_tokens_per_s_per_gpu: float | None = None
    input_tokens_per_s_per_prefill_gpu: float | None = None
    date: str = ""
    source: str = ""
    notes: str = ""

    @property
    def curve(self) -> str:
        """The curve the row belongs to: hardware, framework, precision, parallelism,
        speculation and lengths fixed, concurrency varying (InferenceX's grouping)."""
        par = (f"P{self.prefill_gpus}/D{self.decode_gpus}" if self.disaggregated
               else f"TP{self.tp}" + (f" EP{self.ep}" if (self.ep or 1) > 1 else ""))
        spec = "" if self.spec_decoding in ("", "none") else f" {self.spec_decoding}"
        return (f"{self.hardware} {self.framework} {self.precision} {par}{spec} "
                f"{self.isl_tokens}/{self.osl_tokens}")


_INT = {"gpus_total", "tp", "ep", "prefill_gpus", "prefill_workers", "prefill_tp", "prefill_ep", "decode_gpus",
        "decode_workers", "decode_tp", "decode_ep", "isl_tokens", "osl_tokens", "concurrency_requests"}
_FLOAT = {"median_tpot_ms", "median_ttft_ms", "tokens_per_s_per_user", "total_tokens_per_s_per_gpu",
          "output_tokens_per_s_per_gpu", "input_tokens_per_s_per_prefill_gpu"}
_BOOL = {"dp_attention", "prefill_dp_attention", "decode_dp_attention", "disaggregated"}
_REQUIRED = {"id", "hardware", "gpus_total", "model", "precision", "framework", "disaggregated", "isl_tokens",
             "osl_tokens", "concurrency_requests", "median_tpot_ms", "median_ttft_ms",
             "total_tokens_per_s_per_gpu"}


def _cell(path: Path, line: int, col: str, text: str) -> Any:
    text = text.strip()
    if text == "":
        if col in _REQUIRED:
            raise CatalogError(f"{path}:{line}: column {col!r} is empty (required)")
        return False if col in _BOOL else None
    try:
        if col in _INT:
            v = float(text)
            if not v.is_integer() or v < 1:
                raise ValueError
            return int(v)
        if col in _FLOAT:
            v = float(text)
            if not (math.isfinite(v) and v > 0):
                raise ValueError
            return v
    except ValueError:
        kind = "a positive integer" if col in _INT else "a positive number"
        raise CatalogError(f"{path}:{line}: column {col!r}: expected {kind}, got {text!r}") from None
    if col in _BOOL:
        if text.lower() not in ("true", "false", "yes", "no"):
            raise CatalogError(f"{path}:{line}: column {col!r}: expected true or false, got {text!r}")
        return text.lower() in ("true", "yes")
    return text


def load_serving_rows(path: str | Path) -> list[ServingRow]:
    """The rows of a CSV in gpu-calibration.csv's layout (`COLUMNS`, header required).

    Raises:
        CatalogError: missing file, a missing or unknown column (named), or a cell
            that is empty where required or not of its type (file, line and column).
    """
    path = Path(path)
    try:
        f = open(path, newline="", encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"{path}: cannot read serving rows: {e.strerror or e}") from None
    with f:
        try:
            return _serving_rows(path, f)
        except UnicodeDecodeError as e:
            raise CatalogError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); "
                               "expected a CSV in gpu-calibration.csv's layout") from None


def _serving_rows(path: Path, f) -> list[ServingRow]:
    """`load_serving_rows` on the open file `f`."""
    reader = csv.DictReader(f)
    header = reader.fieldnames or []
    missing = [c for c in COLUMNS if c not in header]
    unknown = [c for c in header if c not in COLUMNS]
    if missing or unknown:
        raise CatalogError(f"{path}: header does not have gpu-calibration.csv's columns: "
                           + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                                  f"unknown {unknown}" if unknown else "") if x))
    rows = []
    for line, raw in enumerate(reader, 2):
        if not any((v or "").strip() for v in raw.values()):
            continue
        rows.append(ServingRow(**{c: _cell(path, line, c, raw[c] or "") for c in COLUMNS}))
    if not rows:
        raise CatalogError(f"{path}: no rows")
    return rows


@dataclass(frozen=True)
class PoolPlan:
    """One pool of a row's deployment: `instances` instances of `parallelism`."""

    role: str                  # "both" | "prefill" | "decode"
    instances: int
    parallelism: Parallelism

    @property
    def gpus(self) -> int:
        return self.instances * self.parallelism.n_devices


@dataclass(frozen=True)
class Deployment:
    """What a row deploys, as the cost model and the runner need it."""

    model: str
    device: str
    stack: str
    weight_dtype: str
    kv_dtype: str
    pools: tuple[PoolPlan, ...]
    speculative: SpeculativeConfig | None
    concurrency: int
    isl: int
    osl: int
    #: how the benchmark ran it (`devices.harness`): prompts per user, the scheduler's
    #: receive interval (decode steps), chunked-prefill tokens and running-request cap
    #: (None: the pool's and the stack's defaults)
    requests_per_user: int = DEFAULT_REQUESTS_PER_USER
    recv_interval: int = 1
    chunk_tokens: int | None = None
    max_num_seqs: int | None = None
    #: TensorRT-LLM's attention-DP balance timeout (iterations), None when off
    adp_timeout_iters: int | None = None
    #: TensorRT-LLM's KV cache share of the memory left after its profiling forward
    #: (`devices.planner.plan_memory` free_fraction), None: the stack's reserve
    kv_free_fraction: float | None = None

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def cost(self, pool: PoolPlan, device=None) -> CostModel:
        """The cost model of one instance of `pool` (`device`: a spec to use instead
        of the catalog's, e.g. while fitting)."""
        from .borrow import resolve_stack

        dev = device if device is not None else resolve_stack(self.device, self.stack)
        return CostModel(self.model, dev, pool.parallelism, weight_dtype=self.weight_dtype,
                         kv_dtype=self.kv_dtype, speculative=self.speculative)


def _pool(row: ServingRow, role: str) -> PoolPlan:
    gpus, workers = getattr(row, f"{role}_gpus"), getattr(row, f"{role}_workers") or 1
    tp, ep = getattr(row, f"{role}_tp") or 1, getattr(row, f"{role}_ep") or 1
    dp = getattr(row, f"{role}_dp_attention")
    if gpus is None or gpus % workers:
        raise CatalogError(f"row {row.id}: {role}_gpus ({gpus}) must be a multiple of {role}_workers ({workers})")
    per = gpus // workers
    if per != tp:
        if not dp:
            raise CatalogError(f"row {row.id}: {per} {role} GPUs per worker but {role}_tp = {tp} without "
                               "data-parallel attention")
        tp, ep = per, per      # attention DP over the worker's GPUs, experts EP over them
    return PoolPlan(role, workers, Parallelism.deployed(tp=tp, ep=ep, dp_attention=bool(dp)))


def deployment(row: ServingRow) -> Deployment:
    """The deployment of a row (see the module docstring for the assumptions).

    Raises:
        CatalogError: an unknown framework, precision or speculative-decoding method,
            or a GPU count the parallelism does not divide.
    """
    from .borrow import FRAMEWORK_FAMILIES, family

    stack = family(row.framework)
    if stack is None:
        raise CatalogError(f"row {row.id}: unknown framework {row.framework!r} "
                           f"(known: {', '.join(sorted(FRAMEWORK_FAMILIES))})")
    if row.precision not in ("fp8", "fp4", "bf16"):
        raise CatalogError(f"row {row.id}: precision must be bf16, fp8 or fp4, got {row.precision!r}")
    harness = harness_for(row)
    spec = None
    if row.spec_decoding not in ("", "none"):
        if row.spec_decoding != "mtp":
            raise CatalogError(f"row {row.id}: spec_decoding {row.spec_decoding!r} is not modelled (mtp or none)")
        if harness.speculative is None:
            raise CatalogError(f"row {row.id}: no speculative configuration in the serving harness "
                               "(devices/catalog/serving-harness.toml) applies to it")
        spec = SpeculativeConfig(harness.speculative["draft_tokens"], harness.speculative["acceptance_rate"], "mtp")
    if row.disaggregated:
        pools = (_pool(row, "prefill"), _pool(row, "decode"))
    else:
        par = Parallelism.deployed(tp=row.tp or row.gpus_total, ep=row.ep or 1, dp_attention=row.dp_attention)
        if row.gpus_total % par.tp:
            raise CatalogError(f"row {row.id}: gpus_total ({row.gpus_total}) is not a multiple of the instance's "
                               f"{par.tp} GPUs (tp, or ep with data-parallel attention)")
        pools = (PoolPlan("both", row.gpus_total // par.tp, par),)
    return Deployment(model=row.model, device=row.hardware, stack=stack, weight_dtype=row.precision,
                      kv_dtype="fp8" if row.precision == "fp4" else row.precision, pools=pools,
                      speculative=spec, concurrency=row.concurrency_requests, isl=row.isl_tokens,
                      osl=row.osl_tokens, requests_per_user=harness.requests_per_user,
                      recv_interval=harness.recv_interval(row.concurrency_requests),
                      chunk_tokens=harness.chunk_tokens, max_num_seqs=harness.max_num_seqs,
                      adp_timeout_iters=harness.attention_dp_timeout_iters,
                      kv_free_fraction=harness.kv_cache_free_memory_fraction)


def mean_lengths(dep: Deployment) -> tuple[float, float]:
    """Mean prompt and output tokens of the row's length draws."""
    f = (1.0 + LENGTH_LOW) / 2
    return dep.isl * f, dep.osl * f


def closed_loop_estimate(dep: Deployment, device=None, iterations: int = 60) -> dict:
    """Steady state of `dep.concurrency` closed-loop users, from the cost model alone.

    Colocated pool (one of its instances gets concurrency / instances users):
      the decode batch B steps in s(B) (cost.decode_step at the mean context); X
      requests/s complete; each new prompt is prefilled in a pass of its own (stacks
      without `mixed_prefill`: k waiting prompts batched per pass, k = max(1, X (s +
      pf(k))) solved by iteration, the pass taking pf(k)); decode runs in the time prefill leaves: TPOT = s /
      tps / (1 - f), f = X / k x pf(k) the prefill share of time; TTFT = s / 2 + pf(k)
      (the step in flight, then the prompt's pass) + f pf / (2 (1 - f)) (the M/D/1 wait
      for a pass in progress). With `mixed_prefill` a share q =
      X t of the iterations fuses one prompt with the decode step (t_mix), the mean
      iteration t = (1 - q) s + q t_mix: TPOT = t / tps, TTFT = t / 2 + t_mix.
      With a scheduler receive interval of N decode steps (`dep.recv_interval`, SGLang
      --scheduler-recv-interval) a prompt waits N s / 2 on average for the next receive
      instead of s / 2, and the prompts that arrived over those N steps are prefilled
      together: k = max(1, X (N s + pf(k))); with mixed prefill the wait is N t / 2.
    Disaggregated: prefill instances serve X prompts/s, those arriving during a pass
      batched into the next (k = max(1, x pf(k)), x an instance's prompts/s): TTFT =
      u pf / 2 (the pass in progress, busy a share u = x pf / k) + pf + the decode
      engine's first step + the stack's `disagg_request_latency_s` (the disaggregated
      front end's routing and prefill-to-decode handoff); decode steps are not
      interrupted. The pool's capacity bounds X: an instance packs its chunk budget
      (`pass_budget`) with k = budget / P waiting prompts per pass, k / pf(k)
      prompts/s; when the users would ask for more, X is that capacity and the closed
      loop's users wait in the prefill queue: TTFT = N / X - (O - 1) x TPOT.
    Closed loop: N = X x (TTFT + (O - 1) x TPOT) users, B = X x (O - 1) x TPOT in
    decode (Little's law); solved by damped fixed-point iteration on B.
    What the benchmark reports of that steady state (`benchmark_run`): its users all
    send at t = 0 and `dep.requests_per_user` prompts each, so its throughput is the
    whole run's (the first wave's burst through the prefill capacity and the last
    prompts' decode included: below the steady state's), and its median TTFT is the
    steady wait (the first wave, 1 / R of the prompts, waits longer, the mean with it).

    Returns {"tpot_s", "ttft_s" (the benchmark's median), "throughput_per_gpu" (input +
    output tokens/s per GPU over the benchmark's run), "batch", "requests_per_s" (over
    the run), "steady_requests_per_s", "ttft_mean_s", "duration_s" (per instance: first
    prompt sent to last token)}, the power terms of `_power`, and for a disaggregated
    deployment "input_per_prefill_gpu" (prompt tokens/s per prefill GPU).
    """
    P, O = mean_lengths(dep)
    by_role = {p.role: p for p in dep.pools}
    if "both" in by_role:
        pool = by_role["both"]
        cost = dep.cost(pool, device)
        n_users = dep.concurrency / pool.instances
        dec_cost, pf_cost = cost, cost
    else:
        pool = by_role["decode"]
        dec_cost = dep.cost(pool, device)
        pf_cost = dep.cost(by_role["prefill"], device)
        n_users = dep.concurrency / pool.instances
    tps = dec_cost.tokens_per_step
    seqs_cap = dep.max_num_seqs or dec_cost.max_num_seqs or 10 ** 9
    ctx = P + O / 2

    rank_budget = pass_budget(dep, pf_cost.parallelism)[1]

    def prefill(k: float) -> float:
        return pf_cost.prefill(*_pass_chunks(max(1.0, k), P, rank_budget)).time_s

    # The running-request cap: the stack's (or the harness's) max_num_seqs and the
    # requests whose KV fits in an instance's memory at their final footprint P + O (the
    # engines' default admission books it, devices.engines.decode "reserve", as
    # TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler does; devices.planner), the
    # cache sized as the launch script's free_gpu_memory_fraction sizes it where the
    # harness gives one (`dep.kv_free_fraction`).
    seqs_cap = min(seqs_cap, _kv_cap(dec_cost, P + O, dep.kv_free_fraction))
    B = min(n_users, seqs_cap)
    N = dep.recv_interval
    k_max = _prompts_per_pass(dep, pf_cost.parallelism, P)
    cap = None                  # prefill capacity of a disaggregated pool (set below)
    X = 0.0
    out: dict = {}
    shares = (0.0, 0.0, 0.0)    # (prefill busy share, its roofline share, decode roofline share)
    for _ in range(iterations):
        sc = dec_cost.decode_step(np.full(max(1, int(round(B))), ctx))
        s = sc.time_s
        if "both" in by_role:
            if cost.device.mixed_prefill:
                # a share q of the iterations carries k_max prompts (fused with the decode step)
                mc = cost.mixed(np.full(int(k_max), P), np.zeros(int(k_max)), np.full(max(1, int(round(B))), ctx))
                t_mix = mc.time_s
                t = s
                for _ in range(20):
                    q = min(1.0, X * t / int(k_max))
                    t = (1 - q) * s + q * t_mix
                tpot = t / tps
                ttft = N * t / 2 + t_mix
                shares = (q * t_mix / t, _roof(mc), _roof(sc))
                cap = int(k_max) / t_mix        # every iteration fused with a full budget of prompts
            else:
                pf = prefill(1.0)
                for _ in range(8):      # the prompts that arrive while a batch of k is served
                    k = max(1.0, X * (N * s + pf))
                    pf = prefill(min(k, k_max))
                # more than a budget's worth waiting: they go in ceil(k / k_max) passes,
                # the mean prompt waiting for half of them
                passes = max(1.0, k / k_max)
                frac = min(0.95, X * passes * pf / k)
                tpot = s / tps / (1.0 - frac)
                # plus the wait for a prefill pass in progress (M/D/1 at the prefill share)
                ttft = N * s / 2 + (passes + 1) / 2 * pf + frac * pf / (2 * (1 - frac))
                shares = (frac, _roof(pf_cost.prefill(np.full(max(1, int(min(k, k_max))), P), 0)), _roof(sc))
            ttft += adp_balance_wait(dep.adp_timeout_iters, cost.parallelism, X, tpot * tps)
        else:
            if cap is None:
                # the prefill pool's capacity: each instance packs the chunk budget with
                # waiting prompts, k of them per pass (requests/s per decode instance)
                cap = by_role["prefill"].instances * k_max / prefill(k_max) / pool.instances
                pf_roof = _roof(pf_cost.prefill(np.full(max(1, int(k_max)), P), 0))
            busy = min(1.0, X / cap) if cap else 0.0
            # The prompts that arrive at a prefill instance during a pass go together in
            # the next one: k = max(1, x pf(k)) (x its prompts/s), the pass busy a share
            # u = x pf / k of the time; a prompt waits for the pass in progress (u pf / 2)
            # and then takes its own. Beyond k_max the pool's capacity binds (below).
            x_pf = X * pool.instances / by_role["prefill"].instances
            pf = prefill(1.0)
            for _ in range(8):
                k = max(1.0, x_pf * pf)
                pf = prefill(min(k, k_max))
            ttft = min(1.0, x_pf * pf / min(k, k_max)) * pf / 2 + pf + s
            tpot = s / tps
            shares = (busy, pf_roof, _roof(sc))
        ttft += pf_cost.device.request_latency_s      # the front end's share of the client's TTFT
        if "prefill" in by_role:                       # and the disaggregated path's routing and handoff
            ttft += pf_cost.device.disagg_request_latency_s
        ttft_free = ttft                               # a prompt that finds no queue for prefill
        e2e = ttft + (O - 1) * tpot
        X_new = n_users / e2e
        # An instance holds a request from admission to its last token: at most
        # seqs_cap / e2e requests/s get through; more users wait for admission.
        limit = seqs_cap / e2e if n_users > seqs_cap else math.inf
        if cap is not None:
            limit = min(limit, cap)
        if X_new > limit:
            # the closed loop's users queue (Little's law: N = X x E2E)
            X_new = limit
            ttft = max(ttft, n_users / limit - (O - 1) * tpot)
        B_new = min(seqs_cap, X_new * (O - 1) * tpot)
        X = X_new if X == 0.0 else 0.5 * (X + X_new)
        B = 0.5 * (B + max(B_new, 1.0))
        out = {"tpot_s": tpot, "ttft_s": ttft, "batch": B, "requests_per_s": X * pool.instances}
    if cap is None:             # a colocated instance's prefill capacity (requests/s): full budgets back to back
        cap = k_max / prefill(k_max)
    run = benchmark_run(out["ttft_s"], out["ttft_s"] + (O - 1) * out["tpot_s"], min(ttft_free, out["ttft_s"]),
                        max(0.0, n_users - 1) / cap, dep.requests_per_user)
    out.update(steady_requests_per_s=out["requests_per_s"], ttft_mean_s=run["ttft_mean_s"],
               ttft_s=run["ttft_median_s"], duration_s=run["duration_s"])
    out["requests_per_s"] *= run["throughput_ratio"]
    out["throughput_per_gpu"] = out["requests_per_s"] * (P + O) / dep.gpus
    if "prefill" in by_role:
        pre = by_role["prefill"]
        out["input_per_prefill_gpu"] = out["requests_per_s"] * P / (pre.instances * pre.parallelism.n_devices)
    out.update(_power(dep, by_role, shares, pf_cost.device, dec_cost.device, out["throughput_per_gpu"]))
    return out


def benchmark_run(ttft_s: float, e2e_s: float, ttft_free_s: float, burst_s: float, requests_per_user: int) -> dict:
    """What the benchmark client measures of a closed loop whose steady state is known.

    The client (benchmark_serving.py, `devices.harness`) runs C users that all send
    their first prompt at t = 0 and R prompts each (R x C in all), and reports total
    tokens over first-sent to last-ended and the median TTFT over all R x C requests.
    Per instance, with the steady state's TTFT W (`ttft_s`: the prefill-queue wait
    included) and cycle E = W + (O - 1) TPOT (`e2e_s`):

    - first wave: the C prompts sent at 0 queue for prefill; the pool admits them at
      its capacity, so the i-th (i = 0 .. C-1) has TTFT W0 + i / cap, W0 the TTFT of
      a prompt that finds no queue (`ttft_free_s`) and (C - 1) / cap the burst
      (`burst_s`): the first wave's TTFTs are uniform on [W0, W0 + burst];
    - later waves: from the second prompt on, a user's prompt finds the steady queue
      (arrivals and prefills both at the loop's rate, the queue ahead of a prompt is
      C minus those in decode, whatever the wave; the last wave too: arrivals go on
      at the steady rate until the last user's last prompt), so their TTFT is W. Its
      spread comes from the output-length draws (decode time uniform over
      [LENGTH_LOW, 1] x nominal: how many are still decoding fluctuates by a few, a
      symmetric spread of a few percent of W), so their median is their mean W;
    - duration: the user sent last in the first wave starts its cycles W0 + burst - W
      later than a steady user would: duration = R E + max(0, W0 + burst - W). When
      prefill is the bottleneck (burst ~ E) that is R C / X + (O - 1) TPOT: the pool
      prefills all R C prompts back to back and the last one still decodes.

    Args (seconds, >= 0; requests_per_user R >= 1): as above.

    Returns {"duration_s", "throughput_ratio" (R E / duration: the benchmark's
    throughput over the steady state's, in (0, 1], tending to 1 from below as R grows),
    "ttft_median_s" (the median of the mixture: 1/R uniform on the first wave's range,
    (R - 1)/R at W), "ttft_mean_s"}.

    Raises:
        ValueError: a negative time, e2e_s <= 0 or requests_per_user < 1.
    """
    if min(ttft_s, ttft_free_s, burst_s) < 0 or e2e_s <= 0 or requests_per_user < 1:
        raise ValueError(f"benchmark_run: times must be >= 0 (e2e > 0) and requests_per_user >= 1, got ttft "
                         f"{ttft_s}, e2e {e2e_s}, ttft_free {ttft_free_s}, burst {burst_s}, R {requests_per_user}")
    R = requests_per_user
    lo, hi = ttft_free_s, ttft_free_s + burst_s
    duration = R * e2e_s + max(0.0, hi - ttft_s)
    w_first, w_rest = 1.0 / R, (R - 1.0) / R
    # The median: below W only the first wave's 1/R counts, uniform on [lo, hi], so a
    # half is reached there only with R <= 2 (at lo + R/2 (hi - lo)); else it is W.
    x = lo + R / 2 * (hi - lo)
    median = x if R == 1 or (R <= 2 and x < ttft_s) else ttft_s
    return {"duration_s": duration, "throughput_ratio": R * e2e_s / duration,
            "ttft_median_s": median, "ttft_mean_s": w_first * (lo + hi) / 2 + w_rest * ttft_s}


def adp_balance_wait(timeout_iters: int | None, par: Parallelism, rate: float, iteration_s: float) -> float:
    """Mean wait (s) of a new prompt for TensorRT-LLM's attention-DP balance to release it.

    With `attention_dp_config: {enable_balance: true, timeout_iters: T,
    batching_wait_iters: 0}` (InferenceX's TensorRT-LLM launch scripts with DP
    attention) the executor schedules no context request while some attention rank
    has none and every rank is generating; it releases them when all ranks hold one
    or after T iterations of waiting, the counter restarting at each release
    (tensorrt_llm/_torch/pyexecutor/py_executor.py `_balance_adp_requests`; NVIDIA's
    "ADP Balance Strategy" blog: "increased TTFT due to strategic waiting"). A
    finished request frees a slot on its own rank, where the router sends the next
    prompt: ranks fill in random order, R H_R prompts on average to cover all R ranks
    (coupon collector, H_R the R-th harmonic number). Releases come every D =
    min(R H_R / rate, T x iteration_s) and a prompt arriving at a uniform phase waits
    D / 2.

    timeout_iters: T, or None (balance off: no wait); par: the instance's parallelism
    (R = its tp ranks with data-parallel attention, else no wait); rate: prompts/s
    arriving at the instance (0: the timeout alone); iteration_s: mean iteration time.
    """
    if not timeout_iters or not par.dp_attention or par.tp < 2:
        return 0.0
    ranks = par.tp
    fill = ranks * sum(1.0 / i for i in range(1, ranks + 1)) / rate if rate > 0 else math.inf
    return min(fill, timeout_iters * iteration_s) / 2


def pass_budget(dep: Deployment, par: Parallelism) -> tuple[float, float | None]:
    """(tokens one prefill pass of an instance carries, tokens each attention rank
    carries with data-parallel attention, else None).

    The harness's chunk (`chunk_tokens`, the launch script's flag), else
    DEFAULT_CHUNK_TOKENS. With data-parallel attention each rank schedules its own
    requests: SGLang divides --chunked-prefill-size by the DP size (server_args.py
    `_handle_data_parallelism`: chunked_prefill_size // dp_size, "to avoid MoE kernel
    issues"), so an SGLang instance's budget is the flag and a rank's its share; other
    stacks' budget (TensorRT-LLM's max_num_tokens) and the default are per rank, the
    instance's the rank's times its tp ranks."""
    ranks = par.tp if par.dp_attention and par.tp > 1 else 1
    if dep.chunk_tokens and dep.stack == "sglang":
        budget = float(dep.chunk_tokens)
    else:
        budget = float(dep.chunk_tokens or DEFAULT_CHUNK_TOKENS) * ranks
    return budget, (budget / ranks if ranks > 1 else None)


def _prompts_per_pass(dep: Deployment, par: Parallelism, prompt: float) -> float:
    """Prompts one prefill pass of an instance can carry: its budget (`pass_budget`)
    over the prompt length, at least one."""
    return max(1.0, pass_budget(dep, par)[0] / prompt)


def _pass_chunks(k: float, prompt: float, rank_budget: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(new tokens, cached tokens) of the chunks of a prefill pass carrying k prompts'
    worth of `prompt`-token prompts (k >= 1; a fraction: part of one more prompt).

    Whole prompts, unless data-parallel attention gives each rank fewer tokens than a
    prompt (`rank_budget` < prompt): a rank then runs its prompt in chunks of its
    budget, each on top of the earlier ones' KV (cached), and a pass holds k prompts'
    worth of such chunks, every chunk position of a prompt alike (the ranks are at
    different points of their prompts)."""
    step = prompt if rank_budget is None or rank_budget >= prompt else rank_budget
    starts = np.arange(0.0, prompt, step)
    one_new, one_cached = np.minimum(step, prompt - starts), starts
    whole = int(k)
    new, cached = [np.tile(one_new, whole)], [np.tile(one_cached, whole)]
    rest = (k - whole) * prompt          # the next prompt's first chunks, up to `rest` tokens
    if rest > 0:
        part = np.minimum(one_new, np.maximum(0.0, rest - one_cached))
        new.append(part[part > 0])
        cached.append(one_cached[part > 0])
    return np.concatenate(new), np.concatenate(cached)


def _roof(c) -> float:
    """The share of an iteration its roofline term takes (compute or memory at the
    stack's achievable rate): the device's load for the power model, in [0, 1]."""
    t = float(np.ravel(c.time_s)[0])
    return min(1.0, max(c.compute_s, c.memory_s) / t) if t > 0 else 0.0


def _kv_cap(cost: CostModel, ctx: float, free_fraction: float | None = None) -> float:
    """Requests whose KV of `ctx` tokens fits in one instance at once (inf when the
    weights leave no room: the planner's error is the engines' to raise); with
    `free_fraction` the cache is sized as TensorRT-LLM sizes it (`plan_memory`)."""
    from .planner import ModelDoesNotFit, plan_memory

    try:
        plan = plan_memory(cost, free_fraction=free_fraction)
    except ModelDoesNotFit:
        return math.inf
    return max(1.0, float(plan.max_batch(int(math.ceil(ctx)))))


def _power(dep: Deployment, by_role: dict, shares: tuple, pf_dev, dec_dev, tput_per_gpu: float) -> dict:
    """Mean GPU-board power per GPU and (input + output) tokens per joule.

    Each GPU draws P = idle_w + (peak_w - idle_w) x u (the linear utilisation model of
    rack.measure.energy), u the share of time its kernels run at the stack's achievable
    roofline: a colocated GPU's prefill share f at the prefill pass's roofline share,
    the rest at the decode step's; a disaggregated prefill GPU busy a share f of the
    time (its rate over the pool's capacity), a decode GPU stepping all the time."""
    f, r_p, r_d = shares
    if "both" in by_role:
        u = f * r_p + (1.0 - f) * r_d
        w = dec_dev.idle_w + (dec_dev.peak_w - dec_dev.idle_w) * u
        out = {"power_w_per_gpu": w, "load": u}
    else:
        n_p, n_d = by_role["prefill"].gpus, by_role["decode"].gpus
        u_p, u_d = f * r_p, r_d
        w_p = pf_dev.idle_w + (pf_dev.peak_w - pf_dev.idle_w) * u_p
        w_d = dec_dev.idle_w + (dec_dev.peak_w - dec_dev.idle_w) * u_d
        w = (n_p * w_p + n_d * w_d) / (n_p + n_d)
        out = {"power_w_per_gpu": w, "load": (n_p * u_p + n_d * u_d) / (n_p + n_d),
               "prefill_power_w": w_p, "decode_power_w": w_d}
    out["tokens_per_joule"] = tput_per_gpu / w
    return out


def measured(row: ServingRow) -> dict:
    """The row's figures in the units of `closed_loop_estimate` (seconds, tokens/s/GPU;
    a disaggregated row's prompt tokens/s per prefill GPU when it gives one)."""
    out = {"tpot_s": row.median_tpot_ms / 1e3, "ttft_s": row.median_ttft_ms / 1e3,
           "throughput_per_gpu": row.total_tokens_per_s_per_gpu}
    if row.disaggregated and row.input_tokens_per_s_per_prefill_gpu:
        out["input_per_prefill_gpu"] = row.input_tokens_per_s_per_prefill_gpu
    return out


__all__ = [
    "COLUMNS", "Deployment", "LENGTH_LOW", "PoolPlan", "adp_balance_wait", "benchmark_run", "pass_budget",
    "ServingRow", "closed_loop_estimate", "deployment", "load_serving_rows", "mean_lengths", "measured",
]
