"""Split versus colocated: run several deployments on the same requests, optionally
rescaled to equal cost, power or device count, and put them side by side.

    from rack.experiments.compare import run_compare
    res = run_compare(["gpu-only-kimi-k2", "wafer-only-kimi-k2", "helios-cs3-kimi-k2"],
                      load_requests("mooncake-excerpt"), iso="power")
    print(compare_text(res)); doc = compare_document(res)

Iso scaling (Splitwise-style iso-power / iso-cost): each scenario other than the
reference has its pools' instance counts rescaled so that its provisioned total
matches the reference's:
- "count": devices (a wafer-scale system counts as one device, like a GPU);
- "power": peak watts (catalog `peak_w` x devices);
- "cost": dollars per hour at peak power (rack.measure.energy.pool_rates: amortised capex or
  rental, plus electricity at peak power for capex-priced devices).
Rounding: one pool -> the instance count nearest to target / per-instance figure (ties
go up), at least 1; several pools -> every pool's count multiplied by target / total and
rounded to nearest, at least 1, so the match is within one instance of each pool.
Parallelism (TP/PP) is never changed, so a pool that fits its model still fits; a
target below one instance is reported, not hidden (`iso.note`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from rack.measure.energy import pool_rates
from rack.measure.metrics import itl_array
from rack.wiring.scenario import Scenario, ScenarioError
from rack.wiring.load import load_scenario

#: The four deployments of the comparison (shipped scenarios).
DEFAULT_SCENARIOS: tuple[str, ...] = ("gpu-only-kimi-k2", "wafer-only-kimi-k2",
                                      "helios-cs3-kimi-k2", "conditional-split-kimi-k2")
ISO_MODES: tuple[str, ...] = ("none", "cost", "power", "count")


class CompareError(ValueError):
    """A comparison cannot run (bad scenario, unpriced device under --iso cost, ...)."""


@dataclass
class CompareEntry:
    """One deployment of a comparison: its (possibly rescaled) scenario, the run, and
    how it was scaled (`iso`: {"mode", "target", "achieved", "instances": {pool: [from,
    to]}, "note"})."""

    name: str
    scenario: Scenario
    output: Any                     # rack.run.runner.RunOutput
    iso: dict = field(default_factory=dict)
    provisioned: dict = field(default_factory=dict)


@dataclass
class CompareResult:
    """All entries, the iso mode, the reference scenario's name and the trace's provenance."""

    entries: list[CompareEntry]
    iso: str
    reference: str
    trace: dict = field(default_factory=dict)
    #: a signal stopped the comparison: {"signal", "finished", "deployments"} (the
    #: entries are the deployments that finished), else None
    interrupted: Optional[dict] = None


def provisioned(scenario: Scenario) -> dict:
    """{"devices", "peak_w", "idle_w", "usd_per_hour" (at peak power; None if a device
    is unpriced), "pools": {pool: {"device", "instances", "devices"}}} of `scenario`."""
    rates = pool_rates(scenario)
    usd = [r.usd_per_hour_at_peak for r in rates]
    return {
        "devices": sum(r.devices_per_instance * r.instances for r in rates),
        "peak_w": sum(r.peak_w * r.instances for r in rates),
        "idle_w": sum(r.idle_w * r.instances for r in rates),
        "usd_per_hour": None if any(u is None for u in usd) else
        sum(u * r.instances for u, r in zip(usd, rates)),
        "pools": {r.pool: {"device": r.device, "instances": r.instances,
                           "devices": r.devices_per_instance * r.instances} for r in rates},
    }


_ISO_KEY = {"count": "devices", "power": "peak_w", "cost": "usd_per_hour"}


def _per_instance(scenario: Scenario, iso: str) -> dict[str, float]:
    out = {}
    for r in pool_rates(scenario):
        v = {"count": r.devices_per_instance, "power": r.peak_w, "cost": r.usd_per_hour_at_peak}[iso]
        if v is None:
            raise CompareError(f"scenario {scenario.name!r}, pool {r.pool!r}: device {r.device!r} has no "
                               f"price, so --iso cost cannot scale it; set [cost].capex_usd.{r.device} "
                               f"or [cost].price_per_hour_usd.{r.device} in the scenario")
        out[r.pool] = float(v)
    return out


def iso_scale(scenario: Scenario, target: float, iso: str) -> tuple[Scenario, dict]:
    """`scenario` with its pools' instance counts rescaled so its provisioned total of
    `iso` ("count" | "power" | "cost") is nearest `target` (see the module docstring).

    Returns (scaled scenario, {"mode", "target", "achieved", "instances", "note"}).
    Raises CompareError for an unknown mode or an unpriced device under "cost".
    """
    if iso not in _ISO_KEY:
        raise CompareError(f"--iso: expected one of {', '.join(ISO_MODES)}, got {iso!r}")
    unit = _per_instance(scenario, iso)
    current = sum(unit[p.name] * p.instances for p in scenario.pools)
    if len(scenario.pools) == 1:
        p = scenario.pools[0]
        counts = {p.name: max(1, int(target / unit[p.name] + 0.5))}
    else:
        f = target / current if current > 0 else 1.0
        counts = {p.name: max(1, int(p.instances * f + 0.5)) for p in scenario.pools}
    data = scenario.model_dump()
    for pool in data["pools"]:
        pool["instances"] = counts[pool["name"]]
    scaled = Scenario.model_validate(data)
    achieved = sum(unit[n] * c for n, c in counts.items())
    note = ""
    min_total = sum(unit.values())
    if target < min_total and achieved == min_total:
        note = (f"one instance of each pool ({_fmt_iso(min_total, iso)}) already exceeds the reference's "
                f"{_fmt_iso(target, iso)}: kept at the minimum")
    return scaled, {"mode": iso, "target": target, "achieved": achieved,
                    "instances": {p.name: [p.instances, counts[p.name]] for p in scenario.pools},
                    "note": note}


def _fmt_iso(v: float, iso: str) -> str:
    return {"count": f"{v:.0f} devices", "power": f"{v / 1e3:.1f} kW peak", "cost": f"${v:,.2f}/h"}[iso]


def choose_reference(scenarios: Sequence[Scenario], reference: Optional[str] = None) -> Scenario:
    """The scenario others are scaled to: `reference` by name, else the first split
    deployment (a pool with role "prefill" and one with role "decode"), else the first.
    Raises CompareError for an unknown name."""
    if reference:
        for s in scenarios:
            if s.name == reference:
                return s
        raise CompareError(f"--reference {reference!r} is not among the compared scenarios "
                           f"{[s.name for s in scenarios]}")
    for s in scenarios:
        roles = {p.role for p in s.pools}
        if roles == {"prefill", "decode"}:
            return s
    return scenarios[0]


def check_scenario(scenario: Scenario) -> None:
    """Build `scenario`'s topology (no run) so a model that does not fit, an unknown
    device or a missing route fails before anything runs. Raises CompareError naming the
    scenario (for the wafer engine: how many systems the model needs)."""
    from devices.catalog import CatalogError
    from rack.wiring.topology import build_topology

    try:
        build_topology(scenario, [])
    except (ScenarioError, CatalogError, ValueError) as exc:
        raise CompareError(f"scenario {scenario.name!r}: {exc}") from None


def load_scenarios(names: Sequence[str]) -> list[Scenario]:
    """Scenarios by name or TOML path (the four defaults when empty); names must differ.
    Raises CompareError with the loader's message."""
    names = list(names) or list(DEFAULT_SCENARIOS)
    out = []
    for n in names:
        try:
            out.append(load_scenario(n))
        except ScenarioError as exc:
            raise CompareError(str(exc)) from None
    seen = [s.name for s in out]
    dup = sorted({n for n in seen if seen.count(n) > 1})
    if dup:
        raise CompareError(f"scenario names must differ to be compared side by side; repeated: {dup}")
    return out


def prepare(scenarios: Sequence[Scenario], iso: str = "none", reference: Optional[str] = None,
            fixed_stages: Sequence[Any] = ()) -> tuple[list[tuple[Scenario, dict]], str]:
    """Apply fixed stages and iso scaling; check every topology. Returns ([(scenario,
    iso note)], reference name). Raises CompareError."""
    if iso not in ISO_MODES:
        raise CompareError(f"--iso: expected one of {', '.join(ISO_MODES)}, got {iso!r}")
    if not scenarios:
        raise CompareError("no scenarios to compare")
    if fixed_stages:
        scenarios = [s.model_copy(update={"fixed_stages": list(fixed_stages)}) for s in scenarios]
    ref = choose_reference(scenarios, reference)
    out = []
    target = None
    if iso != "none":
        unit = _per_instance(ref, iso)
        target = sum(unit[p.name] * p.instances for p in ref.pools)
    for s in scenarios:
        if iso == "none" or s.name == ref.name:
            note = {"mode": iso, "target": target, "achieved": target if iso != "none" else None,
                    "instances": {p.name: [p.instances, p.instances] for p in s.pools},
                    "note": "reference" if s.name == ref.name and iso != "none" else ""}
            out.append((s, note))
        else:
            out.append(iso_scale(s, target, iso))
    for s, _ in out:
        check_scenario(s)
    return out, ref.name


def run_compare(scenarios: Sequence[Scenario | str], requests: Sequence[Any], *, runtime: str = "virtual",
                iso: str = "none", reference: Optional[str] = None, address: Optional[str] = None,
                trace_info: Optional[dict] = None, fixed_stages: Sequence[Any] = (),
                on_start: Optional[Callable[[str, int, int], None]] = None,
                run_kwargs: Optional[dict] = None) -> CompareResult:
    """Run every scenario on the same `requests` (runtime "virtual" or "ray").

    scenarios: Scenario objects or names/paths (empty: the four defaults).
    on_start(name, i, n): called before each run (progress display).
    run_kwargs: more keyword arguments of `run_scenario` for every run (a closed loop:
    max_concurrency, think_time_s; kv_payload, "account" by default on the virtual
    runtime: the payloads described, not built, with the same results).
    address: a Ray cluster address; with runtime "virtual" every run is a Ray task on
    that cluster (all submitted at once), with "ray" the actors run there.
    Raises CompareError before any run for a bad scenario or iso request.
    """
    from rack.run.runner import run_scenario

    if not scenarios:
        loaded = load_scenarios([])
    else:   # keep the caller's order, loading names and paths in place
        loaded = [s if isinstance(s, Scenario) else load_scenarios([s])[0] for s in scenarios]
        seen = [s.name for s in loaded]
        dup = sorted({n for n in seen if seen.count(n) > 1})
        if dup:
            raise CompareError(f"scenario names must differ to be compared side by side; repeated: {dup}")
    plan, ref = prepare(loaded, iso, reference, fixed_stages)
    entries = []
    if runtime == "virtual":
        # virtual comparisons account the KV payload instead of building it (the same
        # numbers, `run_scenario(kv_payload="account")`); the caller may ask for bytes
        run_kwargs = {"kv_payload": "account", **(run_kwargs or {})}
    if runtime == "virtual" and address is not None:
        # Independent virtual-time runs: one Ray task each, spread over the cluster
        # (rack.runtime.parallel.map_virtual_runs); the numbers do not depend on where.
        from rack.run.tasks import virtual_run_output
        from rack.runtime.parallel import map_virtual_runs

        for i, (sc, _) in enumerate(plan):
            if on_start is not None:
                on_start(sc.name, i, len(plan))
        outs = map_virtual_runs(virtual_run_output,
                                [(sc, list(requests), trace_info, run_kwargs or {}) for sc, _ in plan],
                                address=address)
        return CompareResult([CompareEntry(sc.name, sc, out, note, provisioned(sc))
                              for (sc, note), out in zip(plan, outs)], iso, ref, trace_info or {})
    for i, (sc, note) in enumerate(plan):
        try:
            if on_start is not None:
                on_start(sc.name, i, len(plan))
            out = run_scenario(sc, requests, runtime=runtime, address=address, trace_info=trace_info,
                               **(run_kwargs or {}))
        except KeyboardInterrupt:
            # a signal (rack.runtime.interrupt): the deployments that finished are kept
            from rack.runtime.interrupt import current_stop

            stop = current_stop()
            if not entries or stop is None:
                raise
            return CompareResult(entries, iso, ref, trace_info or {},
                                 {"signal": stop.signal_name, "finished": len(entries), "deployments": len(plan)})
        entries.append(CompareEntry(sc.name, sc, out, note, provisioned(sc)))
    return CompareResult(entries, iso, ref, trace_info or {})


# ---------------------------------------------------------------------------- vendor claim
def is_wafer_only(s: Scenario) -> bool:
    """True if every pool of `s` is on a wafer-scale device (the "Cerebras alone" side)."""
    from devices.catalog import resolve_device

    return all(resolve_device(p.device).kind == "wafer" for p in s.pools)


def is_gpu_prefill_wafer_decode(s: Scenario) -> bool:
    """True if `s` prefills on GPUs (role prefill) and decodes on wafers (role decode)."""
    from devices.catalog import resolve_device

    pre = [p for p in s.pools if p.role == "prefill"]
    dec = [p for p in s.pools if p.role == "decode"]
    return bool(pre and dec) and all(resolve_device(p.device).kind == "gpu" for p in pre) and \
        all(resolve_device(p.device).kind == "wafer" for p in dec)


def vendor_claim(result: CompareResult) -> dict:
    """The tokens-per-joule ratio of GPU prefill + wafer decode over wafer alone (the
    setting of the "up to 5x tokens per watt" claim), as measured in this comparison.

    Returns {"split", "wafer_only", "ratio", "ratio_by_activity": {"busy", "roofline"},
    "tokens_per_joule": {...}, "claim": "up to 5x", "assumptions": [str]}; the ratio is
    None (with "missing" saying why) when the comparison lacks either deployment.
    """
    split = next((e for e in result.entries if is_gpu_prefill_wafer_decode(e.scenario)), None)
    wafer = next((e for e in result.entries if is_wafer_only(e.scenario)), None)
    out: dict = {"claim": "up to 5x tokens per watt (AMD Helios prefill + Cerebras decode vs Cerebras alone, "
                          "modelled by the vendors for trillion-parameter models; assumptions not public)",
                 "split": split.name if split else None, "wafer_only": wafer.name if wafer else None,
                 "ratio": None, "ratio_by_activity": {}, "tokens_per_joule": {}}
    if split is None or wafer is None:
        out["missing"] = ("no GPU-prefill + wafer-decode scenario" if split is None else
                          "no wafer-only scenario")
        return out
    es, ew = split.output.results["energy"], wafer.output.results["energy"]
    if es["tokens_per_joule"] and ew["tokens_per_joule"]:
        out["ratio"] = es["tokens_per_joule"] / ew["tokens_per_joule"]
    for k in ("busy", "roofline"):
        a, b = es["sensitivity"][k]["tokens_per_joule"], ew["sensitivity"][k]["tokens_per_joule"]
        out["ratio_by_activity"][k] = a / b if a and b else None
    out["tokens_per_joule"] = {split.name: es["tokens_per_joule"], wafer.name: ew["tokens_per_joule"]}
    rs, rw = split.output.results, wafer.output.results
    other = "roofline" if es["activity"] == "busy" else "busy"
    tok_s, tok_w = rs["throughput"]["output_tokens"], rw["throughput"]["output_tokens"]
    out["assumptions"] = [
        f"same requests ({rs['requests']['submitted']}) through both; model {split.scenario.model} "
        f"({split.scenario.weight_dtype} weights)",
        f"{split.name}: {_pools_text(split)}; {wafer.name}: {_pools_text(wafer)}",
        f"iso mode: {result.iso}",
        f"power: {es['activity']} activity model (idle + (peak - idle) x utilisation), "
        + ("devices plus hosts, NICs and switch ports (boundary 'system'); " if es.get("boundary") == "system"
           else "devices only; ")
        + f"the {other} model gives {_x(out['ratio_by_activity'].get(other))}",
        f"energy integrated over each run: {es['window_s']:.1f} s (split), {ew['window_s']:.1f} s (wafer only); "
        f"mean power {es['mean_power_w'] / 1e3:,.1f} kW vs {ew['mean_power_w'] / 1e3:,.1f} kW "
        f"(idle floor {es['idle_power_w'] / 1e3:,.1f} kW vs {ew['idle_power_w'] / 1e3:,.1f} kW)",
        f"load: {rs['throughput']['requests_per_s']:.2f} req/s completed; SLO attainment "
        f"{rs['goodput']['slo_attainment']:.0%} (split) vs {rw['goodput']['slo_attainment']:.0%} (wafer only)",
    ]
    if out["ratio"] is not None:
        out["assumptions"].append(
            f"the ratio is the output-token ratio ({tok_s:,} / {tok_w:,} = {tok_s / tok_w:.3f}) times the energy "
            f"ratio ({ew['joules'] / 1e6:,.1f} MJ / {es['joules'] / 1e6:,.1f} MJ = {ew['joules'] / es['joules']:.3f}): "
            "while both racks serve the whole offered load the tokens are equal and the GPUs' energy can only "
            "lower it; the split gains only where the wafer alone falls behind (higher rates: `rack sweep rate`)")
    return out


def _x(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _pools_text(e: CompareEntry) -> str:
    from devices.catalog import resolve_device

    parts = []
    for p in e.scenario.pools:
        d = resolve_device(p.device)
        parts.append(f"{p.instances * p.devices_per_instance} x {d.name} ({p.role})")
    return " + ".join(parts)


# ---------------------------------------------------------------------------- table
def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1%}"


def _ms(v: Optional[float]) -> str:
    """Seconds as milliseconds with 3 significant digits ("-" for no sample)."""
    if v is None:
        return "-"
    ms = v * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _num(v: Optional[float], fmt: str = "{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def table_rows(result: CompareResult) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(column headers, [(metric label, [cell per scenario])]) of the side-by-side table."""
    heads = [e.name for e in result.entries]
    R = [e.output.results for e in result.entries]
    rows: list[tuple[str, list[str]]] = []

    def add(label: str, f: Callable[[dict, CompareEntry], str]) -> None:
        rows.append((label, [f(r, e) for r, e in zip(R, result.entries)]))

    add("devices", lambda r, e: " + ".join(f"{v['devices']} {v['device']}" for v in e.provisioned["pools"].values()))
    add("peak power (kW)", lambda r, e: f"{e.provisioned['peak_w'] / 1e3:,.1f}")
    add("provisioned $/h", lambda r, e: _num(e.provisioned["usd_per_hour"], "{:,.2f}"))
    add("completed / rejected / failed", lambda r, e: f"{r['requests']['completed']} / {r['requests']['rejected']}"
                                                         f" / {r['requests']['failed']}")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        add(f"{label} p50 / p90 / p99 (ms)", lambda r, e, key=key: " / ".join(
            _ms(r["latency"][key][p]) for p in ("p50", "p90", "p99")))
    add("throughput (req/s, out tok/s)", lambda r, e: f"{r['throughput']['requests_per_s']:.2f}, "
                                                      f"{r['throughput']['output_tokens_per_s']:,.0f}")
    add("goodput (req/s)", lambda r, e: f"{r['goodput']['requests_per_s']:.2f}")
    add("SLO attainment", lambda r, e: _pct(r["goodput"]["slo_attainment"]))
    add("output tokens / J", lambda r, e: _num(r["energy"]["tokens_per_joule"], "{:.4g}"))
    add("J / output token", lambda r, e: _num(r["energy"]["joules_per_output_token"], "{:,.1f}"))
    add("mean power (kW)", lambda r, e: f"{r['energy']['mean_power_w'] / 1e3:,.1f}")
    add("$ / M output tokens", lambda r, e: _num(r["cost"]["usd_per_mtok"], "{:,.2f}"))
    add("$ / M tokens (in + out)", lambda r, e: _num(r["cost"]["usd_per_mtok_total"], "{:,.3f}"))
    add("KV shipped (GB logical)", lambda r, e: f"{r['kv_transfer']['bytes_logical'] / 1e9:,.1f}")
    add("KV link utilisation", lambda r, e: ", ".join(f"{_pct(l['utilization'])}"
                                                      for l in r["kv_transfer"]["links"].values()) or "-")
    add("MFU / MBU / busy", lambda r, e: "; ".join(
        f"{p}: {u['compute']:.1%} / {u['memory_bandwidth']:.1%} / {u['busy_fraction']:.0%}"
        for p, u in r["utilization"].items()))
    add("peak memory", lambda r, e: "; ".join(f"{p}: {m['peak_fraction']:.0%} of "
                                              f"{m['capacity_bytes'] / 1e12:,.2f} TB"
                                              for p, m in r["memory"].items()))
    if result.iso != "none":
        add(f"iso-{result.iso} scaling", lambda r, e: ", ".join(
            f"{p} {a}->{b}" for p, (a, b) in e.iso["instances"].items()) + (" (reference)" if e.name ==
                                                                           result.reference else ""))
    return heads, rows


def compare_text(result: CompareResult) -> str:
    """The side-by-side table as plain text (fixed-width columns)."""
    heads, rows = table_rows(result)
    w0 = max(len(r[0]) for r in rows)
    widths = [max(len(h), *(len(r[1][i]) for r in rows)) for i, h in enumerate(heads)]
    line = lambda a, cells: f"{a:<{w0}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths))
    out = [line("", heads), "-" * (w0 + 2 + sum(widths) + 2 * (len(widths) - 1))]
    out += [line(label, cells) for label, cells in rows]
    return "\n".join(out)


def compare_markdown(result: CompareResult) -> str:
    """The side-by-side table as a Markdown table."""
    heads, rows = table_rows(result)
    out = ["| metric | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    out += ["| " + label + " | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(out)


def compare_rich_table(result: CompareResult):
    """The side-by-side table as a rich Table (for the terminal)."""
    from rich.table import Table

    heads, rows = table_rows(result)
    t = Table(title=f"rack compare ({'as configured' if result.iso == 'none' else 'iso-' + result.iso}, "
                    f"reference {result.reference})")
    t.add_column("metric", style="bold")
    for h in heads:
        t.add_column(h, justify="right")
    for label, cells in rows:
        t.add_row(label, *cells)
    return t


def model_warning(scenarios: Sequence[Scenario]) -> Optional[str]:
    """A warning when the deployments do not serve the same model (or dtypes): their
    latencies, tokens/J and costs then compare different work. None when they agree."""
    from devices.catalog import resolve_model

    served = {s.name: (resolve_model(s.model).name, s.weight_dtype) for s in scenarios}
    if len(set(served.values())) <= 1:
        return None
    listed = "; ".join(f"{n}: {m} ({dt} weights)" for n, (m, dt) in served.items())
    return (f"the deployments serve different models or weight precisions ({listed}): their latencies, "
            "tokens/J and costs compare different work, not the same model on different racks")


def compare_document(result: CompareResult) -> dict:
    """The JSON document of a comparison: {"scenarios": [results.json of each run plus
    "name", "iso", "provisioned"], "iso", "reference", "trace", "vendor_claim",
    "warnings", "interrupted" (None, or what a signal left: `CompareResult.interrupted`)}."""
    docs = []
    for e in result.entries:
        d = dict(e.output.results)
        d = {"name": e.name, **d, "iso": e.iso, "provisioned": e.provisioned}
        docs.append(d)
    warning = model_warning([e.scenario for e in result.entries])
    return {"scenarios": docs, "iso": result.iso, "reference": result.reference,
            "trace": result.trace, "vendor_claim": vendor_claim(result),
            "warnings": [warning] if warning else [], "interrupted": result.interrupted}


def write_compare(result: CompareResult, out_dir: Any, *, plots: bool = True, trace_sample: int = 200) -> dict:
    """Write the comparison's results folder and return {what: path}.

    Layout: compare.json (`compare_document`), report.md and report.html (table, vendor
    claim, stage breakdown, plots), plots/*.png (latency CDFs, stage breakdown, memory
    occupancy, KV link utilisation, per-instance time series of each scenario),
    timelines.json (Chrome/Perfetto trace of `trace_sample` requests per scenario and
    the engine and link counter tracks), and one `rack run`-style folder per scenario
    (<name>/results.json, requests.csv, summary.txt, timeseries.csv).
    """
    from pathlib import Path

    from rack.measure import plots as P
    from rack.experiments import report
    from rack.measure.breakdown import write_chrome_trace
    from rack.measure.results import to_json, write_results
    from rack.measure.timeseries import write_timeseries_csv

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = compare_document(result)
    files: dict[str, str] = {}
    (out / "compare.json").write_text(to_json(doc))
    files["all scenarios (JSON)"] = "compare.json"
    for e in result.entries:
        write_results(out / e.name, e.output.results, e.output.columns)
        write_timeseries_csv(out / e.name / "timeseries.csv", e.output.stats)
        files[f"{e.name} results"] = f"{e.name}/results.json"
    labels = {e.name: e.output.columns for e in result.entries}
    write_chrome_trace(out / "timelines.json", labels, sample=trace_sample,
                       stages={e.name: e.scenario.fixed_stages for e in result.entries},
                       engines={e.name: e.output.stats for e in result.entries})
    files["request timelines (open in ui.perfetto.dev)"] = "timelines.json"
    breakdowns = {e.name: e.output.results["breakdown"] for e in result.entries}
    pngs: dict[str, str] = {}
    if plots:
        pd = out / "plots"
        colours = P.palette([e.name for e in result.entries])    # one colour per deployment
        P.latency_cdfs(labels, pd / "latency_cdf.png",
                       itl={e.name: itl_array(e.output.snapshot) for e in result.entries}, colours=colours)
        pngs["Latency CDFs"] = "plots/latency_cdf.png"
        P.stage_breakdown(breakdowns, pd / "stage_breakdown.png")
        pngs["Where the time goes"] = "plots/stage_breakdown.png"
        P.memory_over_time({e.name: (e.output.specs, e.output.stats, e.output.results["energy"]["window_s"])
                            for e in result.entries}, pd / "memory.png")
        pngs["Memory occupancy over time"] = "plots/memory.png"
        P.link_utilisation({e.name: e.output.stats.get("interconnect", {}) for e in result.entries},
                           pd / "link_utilisation.png",
                           end_s=max(e.output.results["energy"]["window_s"] for e in result.entries),
                           colours=colours)
        pngs["KV link utilisation over time"] = "plots/link_utilisation.png"
        for e in result.entries:
            P.timeseries(e.output.stats, pd / f"timeseries-{e.name}.png",
                         end_s=e.output.results["energy"]["window_s"], title=e.name)
            pngs[f"{e.name}: queues, batches, KV, prefix hits, links over time"] = f"plots/timeseries-{e.name}.png"
    md = report.compare_markdown_report(doc, compare_markdown(result), pngs, breakdowns, files)
    md_path, html_path = report.write_report(out, md, "rack compare")
    return {"json": out / "compare.json", "report_md": md_path, "report_html": html_path,
            "timelines": out / "timelines.json", **{k: out / v for k, v in pngs.items()}}


__all__ = ["CompareEntry", "CompareError", "CompareResult", "DEFAULT_SCENARIOS", "ISO_MODES",
           "check_scenario", "choose_reference", "compare_document", "compare_markdown",
           "is_gpu_prefill_wafer_decode", "is_wafer_only",
           "compare_rich_table", "compare_text", "iso_scale", "load_scenarios", "prepare",
           "provisioned", "run_compare", "table_rows", "vendor_claim", "write_compare"]
