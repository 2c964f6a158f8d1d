"""`rack scale-test`: the Ray runtime on K nodes, P prefill instances, D decode engines,
the trace's rate scaled by R; how far it scales before timer lateness breaks the bound.

For each K it starts a one-machine cluster (`LocalCluster`: a head with the router,
collector and interconnect, and K worker nodes: with K = 1 one node offers both
`prefill` and `decode`, otherwise ceil(K/2) nodes offer `prefill` and the rest
`decode`; a pool's instances spread over its nodes), or uses the cluster at
`--address`. For each R (ascending) it replays the first `span x R` trace seconds at
R times the rate (so every run covers `span` emulated seconds of arrivals and the
request count grows with R) on both runtimes and reports:

- emulated throughput (output tokens/s, completed requests/s) and wall time;
- messages per second received by each actor (wall clock);
- KV bytes that crossed nodes (each hop: prefill -> interconnect -> decode);
- timer lateness p50/p99 per actor (emulated), and the bound: the p99 over every
  timer of the run <= `lateness_bound` x the virtual runtime's median TPOT (default
  1%: the bound `rack run`'s summary warns about). Pooled, because one actor may
  have only a few dozen timers, whose p99 is their maximum: one hiccup of the host;
- whether every request completed, and agreement with the virtual runtime on the same
  inputs: the same completed count and median TTFT/TPOT within 5% (the split-rack
  tolerance).

It stops a K at the first R over the bound (`--keep-going` runs them all) and prints
the largest R within it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Optional

import typer

from rack.cli.app import app
from rack.cli._checks import check_positive, positive_numbers, prepare_out_file, stops_on_signal
from rack.cli.run import DEFAULT_TRACE, fail

AGREEMENT_TOLERANCE = 0.05   # Ray vs virtual medians (the split-rack issue's tolerance)
HEAD_RESOURCES = {"head": 64.0}


def scale_nodes(k: int, prefill: int, decode: int):
    """The K worker `NodeSpec`s: K = 1: one node offering `prefill` x P and `decode` x D;
    K >= 2: ceil(K/2) nodes offering `prefill` x P each, the others `decode` x D each
    (enough on every node for the whole pool, so the spread is Ray's choice)."""
    from rack.runtime.cluster import NodeSpec

    if k < 1:
        raise ValueError(f"workers: need at least 1 worker node, got {k}")
    if k == 1:
        return [NodeSpec("worker", {"prefill": float(prefill), "decode": float(decode)})]
    n_pf = math.ceil(k / 2)
    return ([NodeSpec(f"prefill-{i}", {"prefill": float(prefill)}) for i in range(n_pf)]
            + [NodeSpec(f"decode-{i}", {"decode": float(decode)}) for i in range(k - n_pf)])


def scale_scenario(base, prefill: int, decode: int, dilation: float):
    """`base` with every prefill pool at `prefill` instances on `prefill` nodes, every
    decode pool at `decode` instances on `decode` nodes, router/collector/interconnect
    on the head, and the given dilation. Raises ValueError for a scenario without a
    prefill and a decode pool (a colocated-only rack has nothing to split over nodes)."""
    data = base.model_dump()
    roles = {p["role"] for p in data["pools"]}
    if not {"prefill", "decode"} <= roles:
        raise ValueError(f"scenario {base.name!r}: the scale test needs a prefill pool and a decode pool "
                         f"(roles here: {sorted(roles)})")
    for p in data["pools"]:
        if p["role"] == "prefill":
            p.update(instances=prefill, resources={"prefill": 1.0})
        elif p["role"] == "decode":
            p.update(instances=decode, resources={"decode": 1.0})
        else:
            p.update(resources={"decode": 1.0})
    data["placement"] = {"router": {"head": 1.0}, "collector": {"head": 1.0}, "interconnect": {"head": 1.0}}
    data["dilation"] = dilation
    return type(base).model_validate(data)


def _rel(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b - 1.0


def run_point(sc, reqs, *, workers: int, rate_scale: float, address: str, node_names: dict,
              lateness_bound: float, timeout_s: float) -> dict:
    """One (K, R) point: the virtual run, the Ray run, and their comparison."""
    from rack.run.runner import run_scenario

    v = run_scenario(sc, reqs, runtime="virtual").results
    wall0 = time.monotonic()
    r = run_scenario(sc, reqs, runtime="ray", address=address, timeout_s=timeout_s).results
    wall = time.monotonic() - wall0
    load1 = os.getloadavg()[0]     # the host's 1-min load: other work competes for the cores
    e, rs = r["emulation"], r["emulation"]["ray"]
    tpot_v = v["latency"]["tpot_s"]["p50"]
    bound = lateness_bound * tpot_v if tpot_v else None
    late = {a: {"p50": s["p50"], "p99": s["p99"], "n": s["n"]} for a, s in e["lateness_by_actor"].items()}
    worst = max((s["p99"] for s in late.values() if s["p99"] is not None), default=0.0)
    pooled = e["lateness_s"]
    ttft = (r["latency"]["ttft_s"]["p50"], v["latency"]["ttft_s"]["p50"])
    tpot = (r["latency"]["tpot_s"]["p50"], tpot_v)
    d_ttft, d_tpot = _rel(*ttft), _rel(*tpot)
    agrees = (r["requests"]["completed"] == v["requests"]["completed"]
              and d_ttft is not None and abs(d_ttft) <= AGREEMENT_TOLERANCE
              and (d_tpot is None or abs(d_tpot) <= AGREEMENT_TOLERANCE))
    return {
        "workers": workers, "rate_scale": rate_scale, "requests": len(reqs),
        "completed": r["requests"]["completed"], "completed_virtual": v["requests"]["completed"],
        "all_completed": r["requests"]["completed"] == len(reqs),
        "output_tokens_per_s": r["throughput"]["output_tokens_per_s"],
        "requests_per_s": r["throughput"]["requests_per_s"],
        "output_tokens_per_s_virtual": v["throughput"]["output_tokens_per_s"],
        "wall_s": wall, "replay_wall_s": rs["replay_wall_s"], "host_load_1min": load1,
        "messages_per_s": {a: x["calls_in_per_s"] for a, x in rs["actors"].items()},
        "kv_bytes_cross_node": rs["cross_node"]["kv_bytes"],
        "kv_bytes_all_hops": rs["cross_node"]["kv_bytes_all_hops"],
        "lateness_s": late, "worst_actor_p99_lateness_s": worst,
        "p50_lateness_s": pooled["p50"], "p99_lateness_s": pooled["p99"], "lateness_bound_s": bound,
        "within_bound": bound is not None and (pooled["p99"] or 0.0) <= bound,
        "ttft_p50_s": {"ray": ttft[0], "virtual": ttft[1], "rel_diff": d_ttft},
        "tpot_p50_s": {"ray": tpot[0], "virtual": tpot[1], "rel_diff": d_tpot},
        "agrees_with_virtual": agrees,
        "nodes": {a: node_names.get(n, n[:8]) for a, n in e["nodes"].items()},
    }


def _ms(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None else f"{x * 1e3:.{digits}f}"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def summary_table(points: list[dict]):
    """A rich Table, one row per (K, R) point."""
    from rich.table import Table

    t = Table(title="scale test (emulated units unless marked wall)", show_lines=False)
    for col in ("K", "R", "req", "done ray/virt", "out tok/s", "max msg/s/actor (wall)", "KV x-node MB",
                "late p50/p99 ms", "worst actor p99", "bound ms", "TTFT p50 d", "TPOT p50 d", "agree",
                "in bound", "wall s", "load"):
        t.add_column(col, justify="right")
    for p in points:
        t.add_row(str(p["workers"]), f"{p['rate_scale']:g}", str(p["requests"]),
                  f"{p['completed']}/{p['completed_virtual']}", f"{p['output_tokens_per_s']:.0f}",
                  f"{max(p['messages_per_s'].values()):.1f}", f"{p['kv_bytes_cross_node'] / 1e6:.1f}",
                  f"{_ms(p['p50_lateness_s'], 3)}/{_ms(p['p99_lateness_s'], 3)}",
                  _ms(p["worst_actor_p99_lateness_s"], 3), _ms(p["lateness_bound_s"], 3),
                  _pct(p["ttft_p50_s"]["rel_diff"]), _pct(p["tpot_p50_s"]["rel_diff"]),
                  "yes" if p["agrees_with_virtual"] else "NO", "yes" if p["within_bound"] else "NO",
                  f"{p['wall_s']:.0f}", f"{p['host_load_1min']:.1f}")
    return t


def actor_table(p: dict):
    """A rich Table of one point: per actor, its node, messages/s and lateness."""
    from rich.table import Table

    t = Table(title=f"K={p['workers']} R={p['rate_scale']:g}: per actor")
    for col in ("actor", "node", "msg/s in (wall)", "lateness p50 ms", "p99 ms", "timers"):
        t.add_column(col, justify="right")
    for a in sorted(p["messages_per_s"]):
        s = p["lateness_s"].get(a, {})
        t.add_row(a, p["nodes"].get(a, "?"), f"{p['messages_per_s'][a]:.1f}", _ms(s.get("p50"), 3),
                  _ms(s.get("p99"), 3), str(s.get("n", 0)))
    return t


@app.command("scale-test")
@stops_on_signal
def scale_test(
    workers: str = typer.Option("1,2,3", "--workers", help="worker-node counts K to try (a local cluster each)"),
    prefill: int = typer.Option(2, "--prefill", min=1, help="prefill instances P"),
    decode: int = typer.Option(1, "--decode", min=1, help="decode engines D"),
    rate_scales: str = typer.Option("1,2,4,8", "--rate-scales", help="rate multipliers R, tried in this order"),
    span: float = typer.Option(3.5, "--span", min=0.1, help="emulated seconds of arrivals per run"),
    output_scale: float = typer.Option(0.25, "--output-scale", help="multiply every output length"),
    dilation: float = typer.Option(10.0, "--dilation", help="wall seconds per emulated second"),
    lateness_bound: float = typer.Option(0.01, "--lateness-bound", help="bound on the p99 lateness of all timers, as a fraction of the virtual median TPOT"),
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario name or TOML [default: helios-cs3-kimi-k2]"),
    trace: str = typer.Option(DEFAULT_TRACE, "--trace", "-t", help="trace name or path"),
    address: Optional[str] = typer.Option(None, "--address", help="use this Ray cluster (nodes offering head, prefill, decode) instead of local ones"),
    keep_going: bool = typer.Option(False, "--keep-going", help="run every R even past the bound"),
    timeout: float = typer.Option(900.0, "--timeout", help="wall-clock limit per Ray run (s)"),
    out: Path = typer.Option(Path("rack-results/scale-test.json"), "--out", help="JSON file for every point"),
) -> None:
    """Scale the Ray runtime over nodes and rate; check lateness and agreement with virtual time.
    SIGINT/SIGTERM stop it at once (one line, exit code 130/143; the local clusters it
    started are shut down)."""
    from rich.console import Console

    from rack.wiring.scenario import ScenarioError

    from rack.wiring.load import load_scenario
    from workloads import TraceError, load_requests

    for name, value in (("--dilation", dilation), ("--lateness-bound", lateness_bound),
                        ("--output-scale", output_scale), ("--timeout", timeout)):
        check_positive(name, value)
    prepare_out_file("--out", out, "a JSON file")
    ks = [int(k) for k in positive_numbers(workers, "--workers")]
    rs = sorted(positive_numbers(rate_scales, "--rate-scales"))
    try:
        sc = scale_scenario(load_scenario(scenario), prefill, decode, dilation)
        loads = {r: load_requests(trace, window=(0, span * r), rate_scale=r, output_scale=output_scale)
                 for r in rs}
    except (ScenarioError, TraceError, ValueError) as exc:
        fail(str(exc))
    console = Console(width=180)
    err = Console(stderr=True)
    points: list[dict] = []
    largest: dict[int, Optional[float]] = {}
    for k in ([0] if address else ks):
        cluster = None
        try:
            if address:
                from rack.runtime.ray_runtime import ensure_ray, live_nodes

                ensure_ray(address)
                k = len(live_nodes()) - 1
                addr, names = address, {}
            else:
                from rack.runtime.cluster import LocalCluster

                err.print(f"K={k}: starting a head and {k} worker node(s)")
                cluster = LocalCluster(scale_nodes(k, prefill, decode), head=None)
                addr = cluster.up()
                names = {i: n for n, i in cluster.node_ids.items()}
            largest[k] = None
            for r in rs:
                reqs = loads[r]
                err.print(f"K={k} R={r:g}: {len(reqs)} requests, {span:g} s emulated x dilation {dilation:g}")
                try:
                    p = run_point(sc, reqs, workers=k, rate_scale=r, address=addr, node_names=names,
                                  lateness_bound=lateness_bound, timeout_s=timeout)
                except Exception as exc:     # a refused or stalled run ends this K, reported
                    err.print(f"K={k} R={r:g}: run failed: {type(exc).__name__}: {exc}")
                    points.append({"workers": k, "rate_scale": r, "error": f"{type(exc).__name__}: {exc}"})
                    break
                p.update(prefill=prefill, decode=decode, dilation=dilation, span_s=span,
                         output_scale=output_scale)
                points.append(p)
                if p["within_bound"]:
                    largest[k] = r
                elif not keep_going:
                    break
        finally:
            if cluster is not None:
                left = cluster.down()
                if left:
                    err.print(f"K={k}: killed {len(left)} process(es) left after shutdown: {left}")
    good = [p for p in points if "error" not in p]
    if good:
        console.print(summary_table(good))
        for k in largest:       # per actor, at the highest rate each K ran
            mine = [p for p in good if p["workers"] == k]
            if mine:
                console.print(actor_table(mine[-1]))
    for k, r in largest.items():
        console.print(f"K={k}: largest rate-scale with p99 lateness (all timers) <= "
                      f"{lateness_bound:.0%} of the median TPOT: " + (f"{r:g}" if r else "none of those tried"))
    out.write_text(json.dumps({"points": points, "largest_rate_scale_within_bound": largest,
                               "lateness_bound_fraction_of_tpot": lateness_bound,
                               "agreement_tolerance": AGREEMENT_TOLERANCE}, indent=1, default=str))
    console.print(f"points: {out}")
    if not good or any(not p.get("all_completed", False) for p in good):
        raise typer.Exit(1)
