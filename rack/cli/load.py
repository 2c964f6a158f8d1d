"""Load options shared by every command that replays requests (`rack run`,
`rack compare`, `rack sweep rate|bandwidth`): where the requests come from and how
they are loaded, named as vLLM's `bench serve` names them where it has a name.

- source: `--trace` (the command's own option), `--dataset random` with
  `--input-len/--output-len/--range-ratio/--prefix-len`, or `--workload FILE|NAME`;
- reading a trace: `--format`, `--map FIELD=COLUMN`, `--time-unit`, `--block-size`
  (as `rack trace stats`);
- load: `--request-rate` (inf: all at once), `--burstiness`, `--num-prompts`,
  `--duration`, `--max-concurrency`, `--think-time`, `--seed`.

`load_options` adds these options to a typer command and hands it one `LoadOptions`
(parameter `load`); `LoadOptions.plan(...)` turns them, with the command's trace and
replay controls, into a `workloads.load.LoadPlan`, and `LoadOptions.load(...)`
reads it into a `Loaded` (requests, provenance, run_scenario keyword arguments).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional

import typer

# Options reused by `rack trace stats` (one definition of each).
FORMAT_OPTION = typer.Option(None, "--format", help="trace format: mooncake, azure, burstgpt, vidur, "
                             "csv or jsonl (default: detected from the first line)")
MAP_OPTION = typer.Option([], "--map", metavar="FIELD=COLUMN",
                          help="column mapping for a generic trace (repeat): timestamp, prompt_tokens, "
                          "output_tokens, block_hashes, tenant, slo_class")
TIME_UNIT_OPTION = typer.Option(None, "--time-unit",
                                help="unit of a generic timestamp column: s, ms, us, ns, datetime")
BLOCK_SIZE_OPTION = typer.Option(None, "--block-size", help="tokens per hash block of the trace (default 512)")


def parse_mapping(items: List[str], time_unit: Optional[str],
                  block_size: Optional[int]) -> dict[str, Any] | None:
    """`--map FIELD=COLUMN` items (+ --time-unit, --block-size) as a reader mapping, or
    None. Raises typer.BadParameter for an item that is not FIELD=COLUMN."""
    mapping: dict[str, Any] = {}
    for item in items:
        key, sep, column = item.partition("=")
        if not sep or not key.strip() or not column:
            raise typer.BadParameter(f"expected FIELD=COLUMN, got {item!r}", param_hint="--map")
        mapping[key.strip()] = column
    if time_unit is not None:
        mapping["time_unit"] = time_unit
    if block_size is not None:
        mapping["block_size"] = block_size
    return mapping or None


_OPTIONS: dict[str, tuple[Any, Any]] = {
    # name: (annotation, typer.Option)
    "dataset": (Optional[str], typer.Option(None, "--dataset", "--dataset-name", help="synthetic dataset instead of the trace: random (vLLM's random dataset)")),
    "input_len": (Optional[int], typer.Option(None, "--input-len", "--random-input-len", help="--dataset random: prompt tokens [default: 1024]")),
    "output_len": (Optional[int], typer.Option(None, "--output-len", "--random-output-len", help="--dataset random: output tokens [default: 128]")),
    "range_ratio": (Optional[float], typer.Option(None, "--range-ratio", "--random-range-ratio", help="--dataset random: lengths uniform in [L(1-X), L(1+X)], 0 <= X < 1 [default: 0]")),
    "prefix_len": (Optional[int], typer.Option(None, "--prefix-len", "--random-prefix-len", help="--dataset random: tokens of a prefix shared by every prompt [default: 0]")),
    "workload": (Optional[str], typer.Option(None, "--workload", help="workload file (TOML: clients, rate schedules, lengths, sessions; docs/workloads.md) or a shipped name")),
    "request_rate": (Optional[float], typer.Option(None, "--request-rate", help="re-time arrivals as a Poisson process of R req/s (inf: all at once) [default: the source's timing; --dataset random: inf]")),
    "burstiness": (float, typer.Option(1.0, "--burstiness", help="with --request-rate: Gamma gaps of shape B, CV 1/sqrt(B) (vLLM's; 1 = Poisson, < 1 burstier)")),
    "num_prompts": (Optional[int], typer.Option(None, "--num-prompts", help="keep the first N requests [--dataset random: default 1000]")),
    "duration": (Optional[float], typer.Option(None, "--duration", help="keep arrivals in the first S seconds (a workload file: generate S seconds)")),
    "max_concurrency": (Optional[int], typer.Option(None, "--max-concurrency", help="closed loop: at most N requests in the rack; the next is sent when one ends")),
    "think_time": (float, typer.Option(0.0, "--think-time", help="with --max-concurrency: seconds between a request's end and the next one on its slot")),
    "seed": (Optional[int], typer.Option(None, "--seed", help="seed of generated arrivals and lengths [default: 0; a workload file's own]")),
    "format": (Optional[str], FORMAT_OPTION),
    "map": (List[str], MAP_OPTION),
    "time_unit": (Optional[str], TIME_UNIT_OPTION),
    "block_size": (Optional[int], BLOCK_SIZE_OPTION),
}


@dataclass
class Loaded:
    """What `LoadOptions.load` returns: the requests (a `RequestList`), the provenance
    for `run_scenario(trace_info=...)`, the keyword arguments that make the run a
    closed loop (`run_kwargs`), a label for messages, and the plan."""

    requests: Any
    info: dict
    run_kwargs: dict
    label: str
    plan: Any = None


@dataclass
class LoadOptions:
    """The values of the shared load options (see the module docstring)."""

    dataset: Optional[str] = None
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    range_ratio: Optional[float] = None
    prefix_len: Optional[int] = None
    workload: Optional[str] = None
    request_rate: Optional[float] = None
    burstiness: float = 1.0
    num_prompts: Optional[int] = None
    duration: Optional[float] = None
    max_concurrency: Optional[int] = None
    think_time: float = 0.0
    seed: Optional[int] = None
    format: Optional[str] = None
    map: List[str] = field(default_factory=list)
    time_unit: Optional[str] = None
    block_size: Optional[int] = None
    #: --trace was given on the command line (even as the default trace's name)
    trace_given: bool = False

    def plan(self, trace: str, *, default_trace: str, window: Optional[str] = None,
             rate_scale: float = 1.0, max_requests: Optional[int] = None,
             output_scale: float = 1.0, skip_bad_rows: bool = False):
        """The `LoadPlan` of these options with the command's trace and replay controls.
        Raises ValueError (naming the option) for a bad or contradictory combination."""
        from workloads import parse_window
        from workloads.load import LoadControls, LoadPlan

        for flag, value in (("--trace", trace), ("--dataset", self.dataset), ("--workload", self.workload),
                            ("--format", self.format), ("--time-unit", self.time_unit), ("--window", window)):
            if value is not None and not value.strip():      # "" is not "not given"
                raise ValueError(f"{flag}: empty; give a value or leave the option out")
        random_opts = {k: getattr(self, k) for k in ("input_len", "output_len", "range_ratio", "prefix_len")
                       if getattr(self, k) is not None}
        if self.dataset is not None and self.dataset.lower() != "random":
            raise ValueError(f"--dataset: expected random, got {self.dataset!r} (a trace: --trace; "
                             "a workload file: --workload)")
        if self.dataset and self.workload:
            raise ValueError("give --dataset random or --workload, not both")
        if random_opts and not self.dataset:
            raise ValueError(f"--{next(iter(random_opts)).replace('_', '-')} applies to --dataset random")
        synthetic = bool(self.dataset or self.workload)
        reading = self.format or self.map or self.time_unit or self.block_size is not None
        if synthetic and (trace != default_trace or self.trace_given):
            raise ValueError(f"--trace {trace} and {'--dataset' if self.dataset else '--workload'}: "
                             "give one source of requests")
        if synthetic and reading:
            raise ValueError("--format, --map, --time-unit and --block-size read a trace; "
                             "they do not apply to --dataset or --workload")
        try:
            controls = LoadControls(self.request_rate, self.burstiness, self.num_prompts, self.duration,
                                    self.max_concurrency, self.think_time,
                                    0 if self.seed is None else self.seed)
        except ValueError as exc:
            raise ValueError(_flag_message(str(exc))) from None
        try:
            window_s = parse_window(window) if window is not None else None
        except ValueError as exc:
            raise ValueError(f"--window: {exc}") from None
        common = dict(window=window_s, rate_scale=rate_scale,
                      max_requests=max_requests, output_scale=output_scale, controls=controls)
        if self.dataset:
            return LoadPlan("random", **common, **random_opts)
        if self.workload:
            return LoadPlan("workload", self.workload, workload_seed=self.seed, **common)
        mapping = parse_mapping(self.map, self.time_unit, self.block_size)
        return LoadPlan("trace", trace, format=self.format, mapping=tuple((mapping or {}).items()),
                        skip_bad_rows=skip_bad_rows, **common)

    def load(self, trace: str, *, compact: bool = False, **kwargs) -> Loaded:
        """Plan (see `plan`) and read the requests (with `compact`, as a
        `workloads.RequestTable`: columns, for a long virtual replay). Raises ValueError,
        TraceError or WorkloadSpecError for bad input."""
        from rack.run.runner import trace_info

        plan = self.plan(trace, **kwargs)
        try:
            reqs = plan.requests(compact=compact)
        except ValueError as exc:
            if type(exc) is not ValueError:       # TraceError, WorkloadSpecError: they name their file
                raise
            raise ValueError(_flag_message(str(exc))) from None
        if plan.source == "random":
            info = {"path": None, "sha256": None, "controls": plan.describe(), "reader": reqs.summary()}
        else:
            info = trace_info(reqs.path, reqs.summary(), **plan.describe())
        return Loaded(reqs, info, plan.run_kwargs(), plan.label(), plan)


def rate_line(requests, load: "LoadOptions", rate_scale: float = 1.0) -> str:
    """The realised arrival rate of `requests` beside the asked one (what `rack run` and
    `rack compare` print): "arrivals: N over S s (first to last), R req/s realised
    (asked: ...)". Realised = N / --duration when one is set, else (N - 1) / S (the
    rate the gaps realise). Under a closed loop (--max-concurrency) the run sends each
    request as a slot frees: the line gives the source's schedule and says so, with no
    realised rate."""
    from rack.experiments.sweep import arrival_summary

    a = arrival_summary(requests)
    if load.duration and a["arrivals"]:
        a["realised_rps"] = a["arrivals"] / load.duration
    r = load.request_rate
    asked = ("--request-rate inf: every request at 0 s" if r is not None and r == float("inf") else
             f"--request-rate {r:g}" + (f" for --duration {load.duration:g} s" if load.duration else "")
             if r is not None else "the source's own timing"
             + (f" x --rate-scale {rate_scale:g}" if rate_scale != 1.0 else ""))
    if load.max_concurrency is not None:
        # a closed loop sends a request when a slot frees: the run sets when they are
        # sent, so the requests' own times are a schedule, not a realised rate
        return (f"arrivals: {a['arrivals']} over {a['arrival_span_s']:.4g} s in the source's schedule "
                f"(asked: {asked}), each sent as a slot frees (--max-concurrency {load.max_concurrency}): "
                "the times sent are the requests' t_arrival in the results")
    real = f"{a['realised_rps']:.3g} req/s realised" if a["realised_rps"] is not None else "no rate realised"
    return f"arrivals: {a['arrivals']} over {a['arrival_span_s']:.4g} s (first to last), {real} (asked: {asked})"


_FLAGS = {"request rate": "--request-rate", "burstiness": "--burstiness", "num-prompts": "--num-prompts",
          "duration": "--duration", "max-concurrency": "--max-concurrency", "think time": "--think-time",
          "seed": "--seed", "prefix length": "--prefix-len", "input_len": "--input-len",
          "output_len": "--output-len", "range_ratio": "--range-ratio"}


def _flag_message(text: str) -> str:
    """A LoadControls message with the option's flag in front."""
    for word, flag in _FLAGS.items():
        if text.startswith(word) or text.startswith(word.replace(" ", "_")):
            return f"{flag}: {text}"
    return text


def load_options(func):
    """Decorator: add the shared load options to a typer command. The command gets
    them as one `LoadOptions` in its parameter `load`; an option whose name the
    command already has (e.g. `seed`) is not added again, and the command's value is
    used."""
    sig = inspect.signature(func, eval_str=True)    # real types: typer reads them from the wrapper
    own = [p for p in sig.parameters.values() if p.name != "load"]
    have = {p.name for p in own}
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (ann, opt) in _OPTIONS.items() if name not in have]

    # typer passes the click context to a parameter of this type: it tells whether
    # --trace was given (the default trace's name given as --trace still contradicts
    # --dataset); typer vendors its own click in recent releases, so no click import.
    context = inspect.Parameter("_typer_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

    @functools.wraps(func)
    def wrapper(**kwargs):
        ctx = kwargs.pop("_typer_ctx")
        values = {name: kwargs.pop(name) for name in _OPTIONS if name in kwargs and name not in have}
        values.update({name: kwargs[name] for name in _OPTIONS if name in have})
        source = ctx.get_parameter_source("trace") if "trace" in ctx.params else None
        given = source is not None and source.name != "DEFAULT"
        return func(load=LoadOptions(**values, trace_given=given), **kwargs)

    del wrapper.__wrapped__     # typer must see the new signature, not the original's
    wrapper.__signature__ = sig.replace(parameters=[*own, *added, context])
    wrapper.__annotations__ = {p.name: p.annotation for p in (*own, *added, context)}
    return wrapper

