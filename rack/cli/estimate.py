"""`rack estimate`: what one instance of a model on some devices can do, from the
roofline cost model (devices.costmodel) and the memory planner (devices.planner)."""

from __future__ import annotations

import json
import math
from typing import List, Optional

import typer

from rack.cli.app import app
from rack.cli._terms import TERM_OPTION, parse_terms


def _fmt_rate(x: float, unit: str) -> str:
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _count(n: int, noun: str) -> str:
    """"1 token", "2 tokens", "1,024 tokens"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _split(c) -> dict:
    """A pass's time split (IterationCost): roofline (compute and memory overlap, the
    larger counts), collectives (and pipeline hops), the stack's fixed latencies."""
    return {"compute_s": c.compute_s, "memory_s": c.memory_s, "roofline_s": c.roofline_s,
            "collectives_s": c.comm_s, "fixed_s": c.fixed_s, "time_s": c.time_s}


def build_estimate(model: str, device: str, count: int, tp: Optional[int], pp: Optional[int], ep: int,
                   weight_dtype: Optional[str], kv_dtype: str, batch: int, context: int, prompt: int,
                   draft_tokens: int = 0, acceptance_rate: float = 0.7, spec_method: str = "mtp",
                   draft_model: Optional[str] = None, reserve_fraction: Optional[float] = None,
                   stack: Optional[str] = None, dp_attention: bool = False,
                   terms: Optional[dict] = None, tpot_ms: float = 80.0,
                   two_batch_overlap: bool = False) -> dict:
    """The estimate as a plain dict (what `--json` prints). `weight_dtype` None: the
    model's native dtype (`ModelSpec.native_dtype`, from its config; bf16 if unknown).
    `terms`: uncertain terms set on the device ({key: value}, `devices.uncertainty`;
    those naming another device are ignored). `tpot_ms`: the TPOT target of the
    chunked-prefill sizes printed (`devices.chunking.tpot_chunks`); "sizing": the fewest
    devices holding the weights plus `batch` requests' KV at `context` tokens.

    Raises:
        devices.CatalogError: unknown model/device; ValueError: bad parallelism or sizes;
        devices.ModelDoesNotFit is caught and reported as {"fits": False, "error": ...}.
    """
    import numpy as np

    from devices.borrow import resolve_stack
    from devices.catalog import resolve_model
    from devices.costmodel import CostModel, Parallelism, SpeculativeConfig
    from devices.chunking import tpot_chunks
    from devices.planner import ModelDoesNotFit, plan_memory
    from devices.uncertainty import apply_terms
    from devices.validation import default_parallelism

    for name, v in (("batch", batch), ("context", context), ("prompt", prompt)):
        if v < 1:
            raise ValueError(f"--{name} must be >= 1, got {v}")
    dev = apply_terms(resolve_stack(device, stack), terms or {})
    if dp_attention and ep > (tp or count):
        tp = ep          # attention replicated on each EP rank (Parallelism.deployed)
    par = default_parallelism(dev, count, tp, pp, ep)
    if dp_attention or two_batch_overlap:
        par = Parallelism.deployed(tp=par.tp, pp=par.pp, ep=par.ep, dp_attention=dp_attention,
                                   two_batch_overlap=two_batch_overlap)
    spec = None
    if draft_tokens:
        spec = SpeculativeConfig(draft_tokens, acceptance_rate, spec_method, draft_model)
    spec_model = resolve_model(model)
    if weight_dtype is None:
        weight_dtype = spec_model.native_dtype or "bf16"
    cost = CostModel(spec_model, dev, par, weight_dtype=weight_dtype, kv_dtype=kv_dtype, speculative=spec)
    limit = cost.model.max_context_tokens
    for name, v in (("context", context), ("prompt", prompt)):
        if limit is not None and v > limit:
            raise ValueError(f"--{name} {v:,} is above {cost.model.name}'s context window of {limit:,} "
                             "tokens (max_context_tokens in its catalog file): no server would accept it")
    out: dict = {"instance": cost.describe(), "model_name": cost.model.name, "device_name": cost.device.name,
                 "stack": cost.device.stack_label, "software_stack": cost.device.software_stack_for(cost.model),
                 "weight_dtype_source": ("the model's native dtype" if weight_dtype == cost.model.native_dtype
                                         else "given")}
    try:
        plan = plan_memory(cost, reserve_fraction=reserve_fraction)
    except ModelDoesNotFit as e:
        out.update(fits=False, error=str(e))
        return out
    out["fits"] = True
    out["memory"] = plan.to_dict()
    out["memory"]["max_batch_at_context"] = plan.max_batch(context)
    need = batch * math.ceil(context / plan.block_size) * plan.block_size
    out["memory"]["batch_kv_tokens"] = need
    out["memory"]["batch_fits"] = need <= plan.kv_blocks * plan.block_size

    one = cost.prefill([prompt], [0])
    many = cost.prefill(np.full(batch, prompt), 0)
    out["prefill"] = {
        "prompt_tokens": prompt,
        "single": {"time_s": one.time_s, "tokens_per_s": prompt / one.time_s, "bound": one.bound,
                   "mfu": one.flops / (one.time_s * cost.peak_flops), "split": _split(one)},
        "batch": {"requests": batch, "time_s": many.time_s, "tokens_per_s": batch * prompt / many.time_s,
                  "bound": many.bound, "mfu": many.flops / (many.time_s * cost.peak_flops),
                  "comm_s": many.comm_s},
    }
    step = cost.decode_step(np.full(batch, context))
    per_user = cost.tokens_per_step / step.time_s
    out["decode"] = {
        "batch": batch, "context": context, "step_time_s": step.time_s, "tokens_per_step": cost.tokens_per_step,
        "tpot_s": step.time_s / cost.tokens_per_step, "tokens_per_s_per_user": per_user,
        "tokens_per_s": batch * per_user, "bound": step.bound, "comm_s": step.comm_s,
        "compute_s": step.compute_s, "memory_s": step.memory_s, "comm_bw_s": step.comm_bw_s,
        "latency_s": step.latency_s, "split": _split(step),
        "mfu": step.flops / (step.time_s * cost.peak_flops),
        "mbu": step.bytes / (step.time_s * cost.memory_bandwidth),
    }
    out["prefill"]["single"]["rate_vs_decode"] = out["prefill"]["single"]["tokens_per_s"] / per_user
    if dev.prompt_token_layer_s > 0:
        # the pipeline's prompt rate at a batch: the given one, else the stack's request cap
        out["prefill"]["wafer"] = cost.prompt_throughput(prompt, batch if batch > 1 else (cost.max_num_seqs or 256))
        out["prefill"]["wafer"]["prompt_streams"] = dev.prompt_streams
    out["chunks"] = tpot_chunks(cost, tpot_ms * 1e-3, batch if batch > 1 else (cost.max_num_seqs or 256))
    out["sizing"] = _sizing(cost, batch, context, reserve_fraction, plan.block_size)
    out["uncertain_terms"] = _device_terms(cost.device)
    return out


def _sizing(cost, requests: int, context: int, reserve_fraction, block_size: int) -> dict:
    """The fewest devices of this kind holding the weights plus `requests` x `context`
    tokens of KV (`devices.planner.devices_for_workload`, with this instance's dtypes
    and layout: pipelined on a wafer, tensor parallel on GPUs)."""
    from devices.costmodel import CostModel, Parallelism
    from devices.planner import devices_for_workload

    wafer = cost.device.kind == "wafer"

    def cost_of(n: int):
        par = Parallelism(pp=n) if wafer else Parallelism(tp=n, ep=n if cost.parallelism.ep > 1 else 1)
        return CostModel(cost.model, cost.device, par, cost.weight_dtype, cost.kv_dtype, cost.speculative)

    try:
        return devices_for_workload(cost_of, requests, context, reserve_fraction=reserve_fraction,
                                    block_size=block_size, max_devices=cost.model.n_layers if wafer else 128)
    except ValueError as e:
        return {"error": str(e), "requests": requests, "context_tokens": context}


def _device_terms(device) -> list[dict]:
    """The documented uncertain terms that set `device` (devices.uncertainty): key,
    value on this device, range, unit and sources."""
    from devices.uncertainty import applies_to, term_value, uncertain_terms

    out = []
    for t in uncertain_terms():
        if t.target == "link" or not applies_to(t.target, device):
            continue
        value = term_value(t.key, device)
        out.append({"key": t.key, "label": t.label, "value": value, "nominal": t.nominal, "low": t.low,
                    "high": t.high, "unit": t.unit, "sources": list(t.sources)})
    return out


def _print_tables(est: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from devices.planner import format_bytes

    con = Console()
    inst = est["instance"]
    title = (f"{est['model_name']} on {inst['n_devices']} x {est['device_name']}  "
             f"(tp={inst['tp']} pp={inst['pp']} ep={inst['ep']}, weights {inst['weight_dtype']}, "
             f"KV {inst['kv_dtype']}, compute {inst['compute_dtype']})")
    con.print(f"[bold]{title}[/bold]")
    if est.get("stack") or est.get("software_stack"):
        con.print(f"software stack: {est.get('stack') or est['software_stack']}"
                  + (f" ({est['software_stack']})" if est.get("stack") and est.get("software_stack") else ""))
    if "speculative" in inst:
        s = inst["speculative"]
        con.print(f"speculative decoding: {s['method']} ({s['draft_model']}), k={s['draft_tokens']}, "
                  f"acceptance {s['acceptance_rate']}: {inst['tokens_per_step']:.3g} tokens/step")
    if not est["fits"]:
        con.print(f"[bold red]does not fit:[/bold red] {est['error']}")
        return
    m = est["memory"]
    t = Table(title="Memory (whole instance)", show_header=False)
    t.add_row("capacity", format_bytes(m["capacity_bytes"]))
    t.add_row("weights", format_bytes(m["weight_bytes"]))
    t.add_row(f"activation reserve ({m['reserve_fraction']:.0%})", format_bytes(m["reserve_bytes"]))
    t.add_row("KV cache", f"{format_bytes(m['kv_bytes'])} = {m['kv_tokens']:,} tokens = "
              f"{m['kv_blocks']:,} blocks of {m['block_size']}")
    rep = int(inst.get("kv_replication") or 1)
    # MLA's latent (or GQA heads fewer than tp) is held by every TP device of a stage:
    # the cache holds kv_bytes / (per-token bytes x copies) tokens
    held = (f" x {rep} copies across TP = {format_bytes(m['kv_bytes_per_token'] * rep)} held"
            if rep > 1 else "")
    t.add_row("KV per token", format_bytes(m["kv_bytes_per_token"]) + held)
    ctx = est["decode"]["context"]
    fits = "fits" if m["batch_fits"] else "[red]does NOT fit[/red]"
    seqs = inst.get("max_num_seqs")
    over = (f"; [red]above the stack's max_num_seqs {seqs:,}[/red]"
            if seqs is not None and est["decode"]["batch"] > seqs else "")
    t.add_row(f"max batch at {ctx:,} tokens", f"{m['max_batch_at_context']:,} (batch {est['decode']['batch']} {fits}{over})")
    con.print(t)
    p, d = est["prefill"], est["decode"]
    t = Table(title="Throughput and latency")
    for col in ("phase", "time", "tokens/s", "per user", "bound", "utilisation"):
        t.add_column(col)
    t.add_row(f"prefill 1 x {p['prompt_tokens']:,}", _fmt_time(p["single"]["time_s"]),
              f"{p['single']['tokens_per_s']:,.0f}", "", p["single"]["bound"], f"MFU {p['single']['mfu']:.0%}")
    if p["batch"]["requests"] > 1:         # batch 1 is the row above
        t.add_row(f"prefill {p['batch']['requests']} x {p['prompt_tokens']:,}", _fmt_time(p["batch"]["time_s"]),
                  f"{p['batch']['tokens_per_s']:,.0f}", "", p["batch"]["bound"], f"MFU {p['batch']['mfu']:.0%}")
    t.add_row(f"decode {d['batch']} @ {d['context']:,}", f"{_fmt_time(d['step_time_s'])}/step",
              f"{d['tokens_per_s']:,.0f}", f"{d['tokens_per_s_per_user']:,.1f}", d["bound"],
              f"MFU {d['mfu']:.0%}, MBU {d['mbu']:.0%}")
    con.print(t)
    con.print(f"peak {_fmt_rate(inst['peak_flops'], 'FLOP/s')} ({inst['compute_dtype']}, dense), "
              f"memory bandwidth {_fmt_rate(inst['memory_bandwidth_Bps'], 'B/s')}")
    t = Table(title="Where a step's time goes (roofline = max(compute, memory): they overlap)")
    for col in ("pass", "compute", "memory", "collectives", "fixed latencies", "total"):
        t.add_column(col, justify="left" if col == "pass" else "right")
    for label, s in ((f"prefill 1 x {p['prompt_tokens']:,}", p["single"]["split"]),
                     (f"decode {d['batch']} @ {d['context']:,}", d["split"])):
        roof = "compute" if s["compute_s"] >= s["memory_s"] else "memory"
        cells = {k: _fmt_time(s[f"{k}_s"]) + (" *" if k == roof else "") for k in ("compute", "memory")}
        t.add_row(label, cells["compute"], cells["memory"], _fmt_time(s["collectives_s"]), _fmt_time(s["fixed_s"]),
                  _fmt_time(s["time_s"]))
    con.print(t)
    con.print("* the binding roofline term; collectives: all-reduce / all-to-all / pipeline hops "
              "(measured latency + bandwidth); fixed: the stack's per-layer, per-MoE-layer and per-iteration latencies")
    if inst.get("prompt_token_layer_s"):
        con.print(f"prompt on the wafer: {p['single']['tokens_per_s']:,.0f} tokens/s for one request, "
                  f"{p['single']['rate_vs_decode']:.1f}x its decode rate per user (public indications: 3-20x, "
                  "docs/devices.md); its tokens stream through the layers at "
                  f"{inst['prompt_token_layer_s'] * 1e6:.3g} us per token per layer region "
                  "(fitted on the wafer prompt rows of `rack validate`)")
    w = p.get("wafer")
    if w:
        con.print(f"prompts through the pipeline: {w['requests']} prompts of {p['prompt_tokens']:,} at once in "
                  f"{_fmt_time(w['aggregate_time_s'])}: {w['aggregate_tokens_per_s']:,.0f} tokens/s "
                  f"(MFU {w['aggregate_mfu']:.1%}), {w['gain']:.1f}x one request's "
                  f"{w['single_tokens_per_s']:,.0f} tokens/s (MFU {w['single_mfu']:.2%}); each request is a "
                  "stream through the layer regions, the streams of several requests in flight at once"
                  + (f" (at most {w['prompt_streams']} per region)" if w["prompt_streams"] else
                     ", bounded by the regions' arithmetic at the prefill efficiency"))
    ch = est.get("chunks")
    if ch:
        con.print(f"chunked prefill at a {ch['tpot_s'] * 1e3:g} ms TPOT target (devices/chunking.py, "
                  f"chunk_tokens = \"tpot\"): at most {_count(ch['prompt_chunk_tokens'], 'token')} of one prompt per "
                  f"iteration ({_fmt_time(ch['prompt_chunk_s'])}), {ch['chunk_tokens']:,} tokens per iteration "
                  f"({_fmt_time(ch['step_s'])})")
    sz = est.get("sizing")
    if sz and "error" not in sz:
        con.print(f"sizing for {_count(sz['requests'], 'request')} of {sz['context_tokens']:,} tokens: "
                  f"{sz['devices']} devices hold the {format_bytes(sz['weight_bytes'])} of weights plus "
                  f"{format_bytes(sz['kv_bytes_needed'])} of KV ({sz['weights_only_devices']} hold the weights "
                  "alone; devices.planner.devices_for_workload)")
    elif sz:
        con.print(f"sizing: {sz['error']}")
    terms = est.get("uncertain_terms") or []
    if terms:
        con.print("uncertain terms of this device (range; sources in docs/devices.md, `--term KEY=VALUE` sets one): "
                  + "; ".join(f"{t['key']} {t['value']:.3g}{(' ' + t['unit']) if t['unit'] else ''} "
                              f"[{t['low']:g}-{t['high']:g}]" for t in terms))


@app.command("estimate")
def estimate(
    model: str = typer.Option(..., "--model", "-m", help="catalog model (e.g. kimi-k2), HF config.json or TOML path"),
    device: str = typer.Option(..., "--device", "-d", help="catalog device (e.g. cs3, mi455x) or TOML path"),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="software stack of the device (e.g. sglang, "
                                        "trtllm, vllm, 2024q4; default: the device's default stack)"),
    count: int = typer.Option(1, "--count", "-n", min=1, help="devices in the instance (= tp x pp)"),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="tensor parallel degree (default: count on GPUs)"),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="pipeline stages (default: count on wafer systems)"),
    ep: int = typer.Option(1, "--ep", min=1, help="expert parallel degree (divides tp)"),
    dp_attention: bool = typer.Option(False, "--dp-attention", help="data-parallel attention over the tp devices "
                                      "(with --ep above --tp: attention replicated on each of the ep devices)"),
    two_batch_overlap: bool = typer.Option(False, "--two-batch-overlap", help="overlap the expert-parallel "
                                           "all-to-all with compute (SGLang --enable-two-batch-overlap)"),
    weight_dtype: Optional[str] = typer.Option(None, "--weight-dtype", help="bf16 | fp8 | fp4 [default: the "
                                               "model's native dtype, from its config (e.g. fp4 for gpt-oss's MXFP4)]"),
    kv_dtype: str = typer.Option("fp8", "--kv-dtype", help="bf16 | fp8 | fp4"),
    # bounded before any array is built: 10**12 tried to allocate 7.28 TiB (issue 24); a
    # million requests in one batch is ~1,000x any stack's max_num_seqs, and token counts
    # stop at workloads.request.MAX_TOKENS (10^8)
    batch: int = typer.Option(1, "--batch", "-b", min=1, max=1_000_000, help="decode batch (and prefill batch) size"),
    context: int = typer.Option(4096, "--context", "-c", min=1, max=100_000_000, help="context length of each decoding request (tokens)"),
    prompt: int = typer.Option(1024, "--prompt", "-p", min=1, max=100_000_000, help="prompt length for the prefill figures (tokens)"),
    draft_tokens: int = typer.Option(0, "--draft-tokens", help="speculative decoding: tokens drafted per step (0: off)"),
    acceptance_rate: float = typer.Option(0.7, "--acceptance-rate", help="speculative decoding: acceptance rate in [0, 1)"),
    spec_method: str = typer.Option("mtp", "--spec-method", help="mtp | draft_model"),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="draft model (with --spec-method draft_model)"),
    reserve_fraction: Optional[float] = typer.Option(None, "--reserve-fraction", help="memory kept for activations (default: the device's)"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    term: Optional[List[str]] = TERM_OPTION,
    tpot_ms: float = typer.Option(80.0, "--tpot-ms", min=0.1, help="TPOT target of the chunked-prefill sizes "
                                  "printed (devices/chunking.py)"),
) -> None:
    """Estimate memory fit, KV capacity, prefill and decode speed, and the binding roof."""
    from devices.catalog import CatalogError

    terms = parse_terms(term)
    try:
        est = build_estimate(model, device, count, tp, pp, ep, weight_dtype, kv_dtype, batch, context, prompt,
                             draft_tokens, acceptance_rate, spec_method, draft_model, reserve_fraction,
                             stack, dp_attention, terms, tpot_ms, two_batch_overlap)
    except (CatalogError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if json_out:
        typer.echo(json.dumps(est, indent=2, default=float))
    else:
        _print_tables(est)
    if not est["fits"]:
        raise typer.Exit(1)
