"""InferenceX measured rows: the reader of the published layout, deployment as deployed
(EP with data-parallel attention), the closed loop under load (admission and prefill
queueing, board power), the leave-one-device-out data the study reads, and `rack
validate --rows` on that layout."""

from __future__ import annotations

import csv
import json
import math

import pytest
from typer.testing import CliRunner

from devices.catalog import CatalogError
from devices.costmodel import Parallelism
from devices.inferencex import (CRITERIA_MODEL, PACKAGED_ROWS, check_rows, is_inferencex_csv,
                                load_inferencex_rows)
from devices.serving_rows import closed_loop_estimate, deployment
import rack.cli
from rack.cli.app import app

rack.cli._register_commands()


@pytest.fixture(scope="module")
def rows():
    return {m.id: m for m in load_inferencex_rows()}


def _subset(tmp_path, ids):
    """A CSV of the packaged file's header and the rows `ids`."""
    with open(PACKAGED_ROWS, newline="") as f:
        lines = list(csv.reader(f))
    keep = [lines[0]] + [r for r in lines[1:] if r[0] in ids]
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(keep)
    return path


def test_packaged_copy_every_deepseek_r1_row_priced_or_named(rows):
    assert len(rows) == 258
    r1 = [m for m in rows.values() if m.model == CRITERIA_MODEL]
    # every R1 row is deployed except the legacy disaggregated ones without a P/D split
    for m in r1:
        assert (m.row is not None) or "legacy" in m.problem, (m.id, m.problem)
    assert sum(m.row is None for m in r1) <= 8
    # a model the catalog does not have is named with its model
    other = [m for m in rows.values() if m.model == "DeepSeek-V4-Pro"]
    assert other and all("DeepSeek-V4-Pro" in m.problem for m in other)


def test_units_and_disaggregated_workers(rows):
    m = rows["ixapp-fix-0026"]          # GB200 Dynamo+TRT: 1 prefill worker x tp4, 4 decode workers x tp8
    r = m.row
    assert r.disaggregated and (r.prefill_gpus, r.prefill_workers, r.prefill_tp) == (4, 1, 4)
    assert (r.decode_gpus, r.decode_workers, r.decode_tp) == (32, 4, 8)
    assert math.isclose(r.median_ttft_ms, 187.825) and math.isclose(r.median_tpot_ms, 7.54547)
    assert rows["ixapp-fix-0003"].power_w_per_gpu == pytest.approx(627.531)
    assert rows["ixapp-fix-0291"].row.spec_decoding == "mtp"


def test_reader_refuses_other_layouts_naming_what_is_missing(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("id,hardware\nA,B200\n")
    assert not is_inferencex_csv(bad)
    with pytest.raises(CatalogError, match=r"x\.csv: not InferenceX's measured-rows layout: missing columns"):
        load_inferencex_rows(bad)
    lines = PACKAGED_ROWS.read_text().splitlines()
    good = tmp_path / "g.csv"
    good.write_text(lines[0] + "\n" + lines[1].replace("MI355X,8,", "MI355X,eight,", 1) + "\n")
    with pytest.raises(CatalogError, match=r"g\.csv:2: column 'gpu_count'"):
        load_inferencex_rows(good)


def test_expert_parallel_with_dp_attention_as_deployed(rows):
    # InferenceX reports SGLang's --tp N --dp N --enable-dp-attention --ep N as TP 1, EP N
    par = Parallelism.deployed(tp=1, ep=8, dp_attention=True)
    assert (par.tp, par.ep, par.dp_attention) == (8, 8, True)
    with pytest.raises(ValueError):
        Parallelism.deployed(tp=1, ep=8, dp_attention=False)
    dep = deployment(rows["ixapp-fix-0355"].row)      # GB200: 6 prefill workers x 8 GPUs, 1 decode worker x 24
    pre, dec = dep.pools
    assert (pre.instances, pre.parallelism.tp, pre.parallelism.ep) == (6, 8, 8)
    assert (dec.instances, dec.parallelism.tp, dec.parallelism.ep, dec.parallelism.dp_attention) == (1, 24, 24, True)


def test_closed_loop_queues_beyond_capacity_and_power_within_board_limits(rows):
    import dataclasses

    dep = deployment(rows["ixapp-fix-0290"].row)       # B200 TensorRT-LLM TP8, 8k prompts, 256 users
    few, many = (closed_loop_estimate(dataclasses.replace(dep, concurrency=c)) for c in (2048, 8192))
    # beyond the instance's capacity more users only wait: throughput saturates, TTFT
    # grows by the extra users over the rate (Little's law)
    assert many["throughput_per_gpu"] == pytest.approx(few["throughput_per_gpu"], rel=0.05)
    extra = (8192 - 2048) / (many["requests_per_s"])
    assert many["ttft_s"] - few["ttft_s"] == pytest.approx(extra, rel=0.3)
    from devices.borrow import resolve_stack

    spec = resolve_stack(dep.device, dep.stack)
    for est in (few, many):
        assert spec.idle_w <= est["power_w_per_gpu"] <= spec.peak_w
        assert est["tokens_per_joule"] == pytest.approx(est["throughput_per_gpu"] / est["power_w_per_gpu"])


def test_check_rows_reports_errors_criteria_and_reasons(rows):
    picked = [rows[i] for i in ("ixapp-fix-0003", "ixapp-fix-0290", "ixapp-powerx-440439")]
    res = check_rows(picked)
    by = {r["id"]: r for r in res["rows"]}
    assert "DeepSeek-V4-Pro" in by["ixapp-powerx-440439"]["unanswered"]
    r = by["ixapp-fix-0003"]
    assert set(r["measured"]) >= {"ttft_s", "tpot_s", "throughput_per_gpu", "power_w_per_gpu", "tokens_per_joule"}
    for k, e in r["relative_error"].items():
        assert e == pytest.approx(r["predicted"][k] / r["measured"][k] - 1)
    s = res["summary"]
    assert s["n"]["ttft_s"] == 1                      # only 0290 is saturated (8k, >= 64 users)
    assert s["n"]["tokens_per_joule"] == 1 and set(s["met"]) == {"tpot_s", "throughput_per_gpu", "ttft_s",
                                                                 "tokens_per_joule"}
    assert all(w["why"] for w in res["worst"])
    (g,) = s["saturated_ttft_by_stack"]           # 0290's (hardware, framework) alone
    assert (g["hardware"], g["framework"], g["rows"]) == ("B200", "TensorRT-LLM", 1)
    assert g["signed_median"] == pytest.approx(by["ixapp-fix-0290"]["relative_error"]["ttft_s"])
    assert g["within"] == int(abs(g["signed_median"]) <= 0.25)


def test_validate_cli_on_the_inferencex_layout(tmp_path):
    path = _subset(tmp_path, {"ixapp-fix-0003", "ixapp-fix-0010", "ixapp-powerx-440439"})
    res = CliRunner().invoke(app, ["validate", "--rows", str(path), "--json"])
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.output)
    assert [r["id"] for r in out["rows"]] == ["ixapp-fix-0003", "ixapp-fix-0010", "ixapp-powerx-440439"]
    assert "leave_one_device_out" in out and out["summary"]["criteria_model"] == CRITERIA_MODEL


def test_lodo_table_feeds_the_mi455x_terms():
    from devices.lodo import borrowed_stack_uncertainty, power_fractions
    from devices.uncertainty import uncertain_term

    u = borrowed_stack_uncertainty("mi455x")          # no MI455X rows: the median over every device
    assert u["scope"] == "all" and u["factor"] >= 1.0 and u["rows"] > 100
    t = uncertain_term("mi455x.stack_time_factor")
    assert t.low == pytest.approx(1 / u["factor"]) and t.high == pytest.approx(u["factor"])
    pf = power_fractions("mi355x-sglang")
    assert 0 < pf["idle"] < pf["busy"] <= 1.05
    tdp = uncertain_term("mi455x.tdp_w")
    assert (tdp.low, tdp.high) == pytest.approx((pf["busy"] * 2000, pf["busy"] * 2500))
    assert tdp.low <= tdp.nominal <= tdp.high


def test_scenario_pool_takes_dp_attention_over_an_ep_group():
    from rack.wiring.scenario import PoolConfig

    pool = PoolConfig(name="p", device="h100", role="prefill", tp=1, ep=8, dp_attention=True)
    assert pool.tp == 8 and pool.devices_per_instance == 8


def test_wide_ep_public_figure_within_35_percent():
    """SGLang PD + large EP (LMSYS, May 2025): DeepSeek-V3 on 96 H100, the prefill side on
    4 nodes (32 GPUs, DP attention, EP 32, DeepEP, two-batch overlap), 2,000-token
    inputs: 52.3k input tokens/s per node. `rack estimate` prices one prefill pass of
    the instance's chunk budget (8,192 tokens per attention rank)."""
    from rack.cli.estimate import build_estimate

    est = build_estimate("deepseek-v3", "h100", 32, None, None, 32, "fp8", "fp8", 128, 4096, 2048,
                         stack="sglang", dp_attention=True, two_batch_overlap=True)
    assert est["instance"]["tp"] == 32 and est["instance"]["dp_attention"]
    per_node = est["prefill"]["batch"]["tokens_per_s"] / 4
    assert per_node == pytest.approx(52.3e3, rel=0.35)


def test_the_benchmark_clients_synchronized_start_spreads_out_after_one_wave(rows):
    """InferenceX's client (benchmark_serving.py: 10 x C prompts, --max-concurrency C,
    --request-rate inf) sends C prompts at once: the first wave's prompts queue for
    prefill behind one another. Their completions then come back spaced by those
    passes, so later waves arrive spread out and wait little: the row's median TTFT is
    the steady state's, which the closed-loop estimate prices."""
    from rack.experiments.validation_runs import replay_row

    row = rows["ixapp-fix-0019"].row                  # H200 TensorRT-LLM TP8, 8k prompts, 64 users
    rr = replay_row(row)
    waves = rr.details["ttft_by_wave_s"]
    assert len(waves) == 10 and rr.details["requests"] == 640
    assert waves[0] > 5 * max(waves[1:])             # the bunched start, then spread out
    est = closed_loop_estimate(deployment(row))
    assert rr.predicted["ttft_s"] == pytest.approx(est["ttft_s"], rel=0.35)


def test_validate_replays_inferencex_rows_on_request(tmp_path):
    path = _subset(tmp_path, {"ixapp-fix-0019", "ixapp-powerx-440439"})
    res = CliRunner().invoke(app, ["validate", "--rows", str(path), "--json", "--replay"])
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.output)
    assert out["summary"]["priced_by"] == "engine replay of the benchmark client"
    r = {x["id"]: x for x in out["rows"]}["ixapp-fix-0019"]
    p = r["predicted"]
    assert p["tokens_per_joule"] == pytest.approx(p["throughput_per_gpu"] / p["power_w_per_gpu"])
    res = CliRunner().invoke(app, ["validate", "--replay"])
    assert res.exit_code == 2 and "InferenceX rows" in res.output


def test_the_disaggregated_path_adds_its_handoff_to_disaggregated_rows_only(rows):
    """`disagg_request_latency_s` (the disaggregated front end's routing and handoff)
    is in every request's TTFT of a disaggregated deployment, in the closed form and in
    the replay's front-end stage, and nowhere in a colocated one."""
    from devices.borrow import resolve_stack
    from rack.experiments.validation_runs import row_scenario

    dis, col = deployment(rows["ixapp-fix-0238"].row), deployment(rows["ixapp-fix-0008"].row)   # B200 TRT-LLM
    for dep, extra in ((dis, 0.25), (col, 0.0)):
        spec = resolve_stack(dep.device, dep.stack)
        slow = spec.model_copy(update={"disagg_request_latency_s": spec.disagg_request_latency_s + 0.25})
        a, b = closed_loop_estimate(dep, device=spec), closed_loop_estimate(dep, device=slow)
        assert b["ttft_s"] - a["ttft_s"] == pytest.approx(extra, abs=0.02)
    spec = resolve_stack(dis.device, dis.stack)
    stage = row_scenario(rows["ixapp-fix-0238"].row).fixed_stages[0]
    assert stage.latency_ms == pytest.approx((spec.request_latency_s + spec.disagg_request_latency_s) * 1e3)
    stage = row_scenario(rows["ixapp-fix-0008"].row).fixed_stages[0]
    assert stage.latency_ms == pytest.approx(spec.request_latency_s * 1e3)


def test_a_replay_that_cannot_complete_leaves_its_row_unanswered_and_the_rest_go_on(rows):
    """`rack validate --replay`: one row whose replay raises (requests that did not
    complete) is unanswered with the reason; every other row is still priced."""
    picked = [rows["ixapp-fix-0019"], rows["ixapp-fix-0008"]]

    def replay(row):
        if row is picked[0].row:
            raise RuntimeError("row ixapp-fix-0019: 3 of 640 requests did not complete ({'rejected': 3})")
        return {"ttft_s": 1.0, "tpot_s": 0.03, "throughput_per_gpu": 2000.0}

    res = check_rows(picked, replay=replay)
    by_id = {r["id"]: r for r in res["rows"]}
    assert by_id["ixapp-fix-0019"]["unanswered"].startswith("replay: row ixapp-fix-0019: 3 of 640")
    assert by_id["ixapp-fix-0008"]["predicted"]["ttft_s"] == 1.0
    assert res["summary"]["answered"] == 1


def test_a_replay_never_refuses_what_the_benchmark_client_can_have_waiting(rows):
    """The serving front end queues every prompt the client sends: the replay's router
    limit is above concurrency x isl (a 16,130-user row was refused at the default)."""
    from rack.experiments.validation_runs import row_scenario

    for rid in ("ixapp-fix-0029", "ixapp-fix-0019"):
        dep = deployment(rows[rid].row)
        assert row_scenario(rows[rid].row, dep).router.max_outstanding_tokens > dep.concurrency * dep.isl
