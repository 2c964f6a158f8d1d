"""Measured serving rows: the CSV layout, the deployment a row means, its closed-loop
replay through the engines, and `rack validate` over them."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from devices.catalog import CatalogError
from devices.serving_rows import COLUMNS, closed_loop_estimate, deployment, load_serving_rows, mean_lengths
import rack.cli
from rack.cli.app import app
from rack.experiments.validation_runs import replay_row, row_requests, row_scenario
from rack.experiments.validation_table import SERVING_ROWS, serving_rows, summarize

rack.cli._register_commands()
SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "gpu-calibration.csv"


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in serving_rows()}


@pytest.mark.skipif(not SHARED.exists(), reason="shared/reference/gpu-calibration.csv not beside the repo")
def test_built_in_rows_are_every_row_of_the_reference_csv():
    assert [r.id for r in load_serving_rows(SHARED)] == [r.id for r in load_serving_rows(SERVING_ROWS)]
    assert SHARED.read_text() == SERVING_ROWS.read_text()


def test_reader_names_file_line_and_column(tmp_path):
    src = SERVING_ROWS.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([src[0], src[1].replace(",10.28,", ",fast,")]) + "\n")
    with pytest.raises(CatalogError, match=r"bad\.csv:2: column 'median_tpot_ms': expected a positive number"):
        load_serving_rows(bad)
    bad.write_text(src[0].replace("median_tpot_ms", "tpot") + "\n" + src[1] + "\n")
    with pytest.raises(CatalogError, match=r"missing \['median_tpot_ms'\].*unknown \['tpot'\]"):
        load_serving_rows(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        load_serving_rows(tmp_path / "absent.csv")
    bad.write_bytes(src[0].encode() + b"\n\xc9\xff\x00garbage\n")
    with pytest.raises(CatalogError, match=r"bad\.csv: not a UTF-8 text file"):
        load_serving_rows(bad)


def test_deployments(rows):
    d = deployment(rows["C01"])
    assert (d.device, d.stack, d.weight_dtype, d.kv_dtype, d.gpus) == ("h200", "sglang", "fp8", "fp8", 8)
    assert d.pools[0].role == "both" and d.pools[0].parallelism.tp == 8 and d.speculative is None
    fp4 = deployment(rows["C23"])
    assert (fp4.stack, fp4.weight_dtype, fp4.kv_dtype) == ("trtllm", "fp4", "fp8")
    # SGLang EAGLE with two drafted tokens at InferenceX's measured ~2.5 accept length (serving harness)
    assert deployment(rows["C33"]).speculative.tokens_per_step == pytest.approx(2.5, abs=0.01)
    dis = deployment(rows["C36"])
    assert [(p.role, p.instances, p.parallelism.tp) for p in dis.pools] == [("prefill", 1, 8), ("decode", 9, 8)]
    gb = deployment(rows["C39"])           # 4 GPUs per worker, tp 1 with DP attention
    assert all(p.parallelism.dp_attention and p.parallelism.tp == 4 == p.parallelism.ep for p in gb.pools)
    assert mean_lengths(d) == pytest.approx((0.9 * 1024, 0.9 * 1024))


def test_requests_and_scenario_of_a_row(rows):
    dep = deployment(rows["C36"])
    reqs = row_requests(dep, per_user=10)
    assert len(reqs) == 10 and all(820 <= r.prompt_tokens <= 1024 and 820 <= r.output_tokens <= 1024 for r in reqs)
    sc = row_scenario(rows["C36"])
    assert [p.role for p in sc.pools] == ["prefill", "decode"] and sc.links[0].src == "prefill"
    assert all(p.stack == "sglang" for p in sc.pools)
    assert sc.fixed_stages and sc.fixed_stages[0].name == "api_server"


def test_replay_reads_what_the_benchmark_reads(rows):
    rr = replay_row(rows["C01"])
    assert rr.details["requests"] == 40 and rr.details["gpus"] == 8
    # the engines and the closed-loop formula agree on the same deployment
    est = closed_loop_estimate(deployment(rows["C01"]))
    assert rr.predicted["tpot_s"] == pytest.approx(est["tpot_s"], rel=0.15)
    assert rr.predicted["throughput_per_gpu"] == pytest.approx(est["throughput_per_gpu"], rel=0.15)
    # more users: a bigger batch, slower per user, more per GPU
    rr64 = replay_row(rows["C05"])
    assert rr64.predicted["tpot_s"] > rr.predicted["tpot_s"]
    assert rr64.predicted["throughput_per_gpu"] > 3 * rr.predicted["throughput_per_gpu"]
    s = summarize([rr, rr64])
    assert set(s.median) == {"tpot_s", "ttft_s", "throughput_per_gpu"}


def test_validate_cli_reads_a_csv_and_plots(tmp_path):
    src = SERVING_ROWS.read_text().splitlines()
    mine = tmp_path / "mine.csv"
    mine.write_text("\n".join([src[0], src[1], src[5]]) + "\n")          # C01 and C05: one curve
    r = CliRunner().invoke(app, ["validate", "--rows", str(mine), "--json", "--plot", str(tmp_path / "plots")])
    assert r.exit_code in (0, 1), r.output
    import json
    out = json.loads(r.stdout)
    assert [x["id"] for x in out["serving_rows"]] == ["C01", "C05"] and out["figures"] == []
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    # and the leave-one-device-out table of borrowed stacks (issue 22)
    assert files == ["curve-h200-sglang-fp8-tp8-1024-1024.png", "leave-one-device-out.png", "parity.png"]
    bad = tmp_path / "bad.csv"
    bad.write_text("id,hardware\nX,h200\n")
    r = CliRunner().invoke(app, ["validate", "--rows", str(bad)])
    assert r.exit_code == 2 and "missing" in r.output


def test_columns_match_the_reference_header():
    with open(SERVING_ROWS, newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS


def test_adp_balance_wait_invariants():
    """TensorRT-LLM's attention-DP balance: no wait without it or without DP attention;
    at most half the timeout; half the coupon-collector fill time when arrivals fill
    every rank before the timeout; more ranks or fewer arrivals never wait less."""
    from devices.costmodel import Parallelism
    from devices.serving_rows import adp_balance_wait

    dp8, dp4 = (Parallelism.deployed(tp=n, ep=n, dp_attention=True) for n in (8, 4))
    tp8 = Parallelism.deployed(tp=8, ep=8, dp_attention=False)
    assert adp_balance_wait(None, dp8, 5.0, 0.03) == 0.0
    assert adp_balance_wait(60, tp8, 5.0, 0.03) == 0.0
    assert adp_balance_wait(60, dp8, 0.0, 0.03) == pytest.approx(60 * 0.03 / 2)     # the timeout alone
    h4 = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert adp_balance_wait(60, dp4, 100.0, 0.03) == pytest.approx(4 * h4 / 100.0 / 2)
    for rate in (0.5, 2.0, 8.0, 50.0):
        w = adp_balance_wait(60, dp8, rate, 0.03)
        assert 0.0 < w <= 60 * 0.03 / 2 + 1e-12
        assert adp_balance_wait(60, dp8, rate / 2, 0.03) >= w
        assert adp_balance_wait(60, dp8, rate, 0.03) >= adp_balance_wait(60, dp4, rate, 0.03)


def test_adp_balance_lengthens_a_trtllm_dp_attention_ttft():
    """A TensorRT-LLM colocated row with DP attention gets the balance wait from its
    launch script (harness); the same row without it is faster by about that wait."""
    import dataclasses

    from devices.inferencex import load_inferencex_rows

    (m,) = [m for m in load_inferencex_rows() if m.id == "ixapp-fix-0017"]
    dep = deployment(m.row)
    assert dep.adp_timeout_iters == 60
    on, off = closed_loop_estimate(dep), closed_loop_estimate(dataclasses.replace(dep, adp_timeout_iters=None))
    assert on["ttft_s"] > off["ttft_s"] + 0.3
    assert on["tpot_s"] == pytest.approx(off["tpot_s"], rel=0.05)


def test_trtllm_kv_cache_caps_the_running_requests_and_the_ttft_never_shrinks():
    """B200 TensorRT-LLM, 8k prompts, TP 8, 256 users (row 0290): the launch script's
    free_gpu_memory_fraction (harness) sizes the KV cache, GUARANTEED_NO_EVICT admits
    fewer requests than users and the others queue (Little's law). The fewer requests
    fit (a smaller fraction), the fewer run at once and the longer a prompt waits: the
    TTFT never shrinks and the throughput never grows."""
    import dataclasses

    from devices.inferencex import load_inferencex_rows

    (m,) = [m for m in load_inferencex_rows() if m.id == "ixapp-fix-0290"]
    dep = deployment(m.row)
    assert dep.kv_free_fraction == 0.8
    runs = [closed_loop_estimate(dataclasses.replace(dep, kv_free_fraction=f)) for f in (1.0, 0.9, 0.8, 0.7, 0.6)]
    assert runs[2]["batch"] < dep.concurrency - 5           # the cap binds at the script's 0.8
    for a, b in zip(runs, runs[1:]):
        assert b["ttft_s"] >= a["ttft_s"] - 1e-9 and b["batch"] <= a["batch"] + 1e-9
        assert b["throughput_per_gpu"] <= a["throughput_per_gpu"] * (1 + 1e-9)
    # a queue, not a prompt pass: seconds, against a quarter of a second without the cap
    assert runs[2]["ttft_s"] > 10 * closed_loop_estimate(dataclasses.replace(dep, kv_free_fraction=None))["ttft_s"]


def test_benchmark_run_invariants():
    """The benchmark client's view of a closed loop (devices.serving_rows.benchmark_run):
    its throughput is the steady state's diluted by the synchronized start, below it and
    tending to it from below as the prompts per user grow; in the queue-bound regime
    (the first wave's mean TTFT above the steady wait) the median TTFT is the steady
    wait and the mean is above it; one prompt per user gives the first wave alone."""
    from devices.serving_rows import benchmark_run

    # saturated prefill: cycle 30 s of which TTFT 4.5 s; the burst of C prompts takes a cycle
    W, E, W0, burst = 4.5, 30.0, 0.5, 29.5
    ratios = [benchmark_run(W, E, W0, burst, R)["throughput_ratio"] for R in (1, 2, 5, 10, 100, 10_000)]
    assert all(0 < r < 1 for r in ratios)
    assert ratios == sorted(ratios) and ratios[-1] == pytest.approx(1.0, abs=1e-3)
    run = benchmark_run(W, E, W0, burst, 10)
    assert run["duration_s"] == pytest.approx(10 * E + W0 + burst - W)     # R C / X + (O - 1) TPOT
    assert run["ttft_median_s"] == pytest.approx(W, rel=1e-6) and run["ttft_mean_s"] > W
    # a wait above the first wave's mean (over half the cycle): the median is still the
    # steady wait, the mean now below it
    long = benchmark_run(20.0, E, W0, burst, 10)
    assert long["ttft_median_s"] == pytest.approx(20.0, rel=1e-6) and long["ttft_mean_s"] < 20.0
    one = benchmark_run(W, E, W0, burst, 1)
    assert one["ttft_median_s"] == pytest.approx(W0 + burst / 2, rel=1e-6)
    assert one["ttft_mean_s"] == pytest.approx(W0 + burst / 2)
    # no queue (one user, or a burst shorter than the wait): the steady state as it is
    calm = benchmark_run(0.2, 10.0, 0.2, 0.0, 10)
    assert calm["throughput_ratio"] == 1.0 and calm["ttft_median_s"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="requests_per_user"):
        benchmark_run(W, E, W0, burst, 0)


def test_closed_loop_reports_the_benchmark_throughput_below_the_steady_state():
    """A saturated disaggregated row: the estimate's throughput is the whole run's
    (ramp and drain), below its steady state's: 1 / (1 + (O - 1) TPOT / (R E))."""
    from devices.inferencex import load_inferencex_rows
    from devices.serving_rows import mean_lengths

    (m,) = [m for m in load_inferencex_rows() if m.id == "ixapp-fix-0421"]
    dep = deployment(m.row)
    est = closed_loop_estimate(dep)
    _, O = mean_lengths(dep)
    cycle = est["ttft_s"] + (O - 1) * est["tpot_s"]
    ratio = est["requests_per_s"] / est["steady_requests_per_s"]
    assert ratio == pytest.approx(1 / (1 + (O - 1) * est["tpot_s"] / (dep.requests_per_user * cycle)), rel=0.02)


def test_sglang_chunk_is_the_instance_budget_split_over_dp_ranks():
    """SGLang divides --chunked-prefill-size by the DP size (`pass_budget`): an SGLang
    instance's budget is the flag, a rank's its share; other stacks' chunk is per rank.
    A pass's chunks (`_pass_chunks`) carry k prompts' worth of tokens, a prompt longer
    than a rank's share in chunks over its own earlier KV."""
    from dataclasses import replace

    from devices.costmodel import Parallelism
    from devices.serving_rows import _pass_chunks, pass_budget

    dp8, tp8 = Parallelism.deployed(tp=8, ep=8, dp_attention=True), Parallelism.deployed(tp=8, ep=8)
    dep = replace(deployment(_row("S03")), stack="sglang", chunk_tokens=32768)
    assert pass_budget(dep, dp8) == (32768.0, 4096.0)
    assert pass_budget(dep, tp8) == (32768.0, None)
    assert pass_budget(replace(dep, stack="trtllm"), dp8) == (8 * 32768.0, 32768.0)
    assert pass_budget(replace(dep, chunk_tokens=None), dp8) == (8 * 8192.0, 8192.0)   # the default, per rank
    for k, budget in ((1.0, None), (4.4, None), (4.4, 4096.0), (1.0, 4096.0), (2.5, 8192.0)):
        new, cached = _pass_chunks(k, 7373.0, budget)
        assert new.sum() == pytest.approx(k * 7373.0)
        assert (new > 0).all() and (new <= (budget or 7373.0)).all()
        assert ((cached == 0) | (cached % (budget or 7373.0) == 0)).all()


def _row(rid: str):
    from devices.catalog import CATALOG_DIR

    return next(r for r in load_serving_rows(CATALOG_DIR / "saturated-prefill.csv") if r.id == rid)


def test_disaggregated_ttft_grows_with_the_users_and_batches_their_prompts():
    """A disaggregated pool batches the prompts that arrive during a pass into the next
    one (bigger passes, then the capacity's queue): the TTFT never falls as users are
    added."""
    from dataclasses import replace

    dep = deployment(_row("S03"))
    ttfts = [closed_loop_estimate(replace(dep, concurrency=c))["ttft_s"] for c in (1, 8, 32, 128, 512)]
    assert all(b >= a * 0.999 for a, b in zip(ttfts, ttfts[1:]))
