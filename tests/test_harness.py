"""The serving harness: how the benchmark behind a measured row launched and drove the
server (devices/catalog/serving-harness.toml), matched by the row's fields and date."""

from __future__ import annotations

import dataclasses

import pytest

from devices.catalog import CatalogError
from devices.harness import RowHarness, harness_for, load_harness
from devices.serving_rows import closed_loop_estimate, deployment
from rack.experiments.validation_runs import row_requests, row_scenario
from rack.experiments.validation_table import serving_rows
from rack.wiring.scenario import ScenarioError, parse_scenario


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in serving_rows()}


def test_shipped_harness_of_the_b300_rows(rows):
    """InferenceX's SGLang B300 scripts: receive interval 10 below 16 users, else 30;
    the MTP script drafts two tokens (EAGLE, num-steps 2, draft tokens 3)."""
    c33, c35, c09, c01 = (deployment(rows[i]) for i in ("C33", "C35", "C09", "C01"))
    assert (c33.recv_interval, c35.recv_interval, c09.recv_interval) == (10, 30, 10)
    assert (c35.chunk_tokens, c35.max_num_seqs, c09.chunk_tokens, c09.max_num_seqs) == (16384, 512, 32768, 128)
    assert c35.speculative.draft_tokens == 2
    assert c35.speculative.tokens_per_step == pytest.approx(2.5, abs=0.01)       # InferenceX PR 649
    # H200 SGLang: no --scheduler-recv-interval in its script; --chunked-prefill-size 32768,
    # --max-running-requests 512 at 1k / 1k (256 at 8k prompts)
    assert (c01.recv_interval, c01.chunk_tokens, c01.max_num_seqs, c01.requests_per_user) == (1, 32768, 512, 10)
    assert all(d.requests_per_user == 10 for d in (c33, c35, c09))
    h = harness_for(rows["C35"])
    assert any("dsr1_fp8_b300_mtp.sh" in s for s in h.sources)


def test_harness_reaches_the_replayed_scenario(rows):
    sc = row_scenario(rows["C35"])
    (pool,) = sc.pools
    assert (pool.scheduler_recv_interval, pool.chunk_tokens, pool.max_num_seqs) == (30, 16384, 512)
    assert pool.speculative.draft_tokens == 2
    assert len(row_requests(deployment(rows["C35"]))) == 128 * 10
    assert row_scenario(rows["C01"]).pools[0].scheduler_recv_interval == 1


def test_receive_interval_lengthens_the_estimated_ttft(rows):
    dep = deployment(rows["C13"])
    slow, fast = closed_loop_estimate(dep), closed_loop_estimate(dataclasses.replace(dep, recv_interval=1))
    assert slow["ttft_s"] > fast["ttft_s"] + 5 * 0.02          # ~15 more decode steps of ~30 ms


def test_matching_order_and_dates(tmp_path, rows):
    f = tmp_path / "h.toml"
    f.write_text("""
[[harness]]
source = "a"
match = {}
requests_per_user = 5
[[harness]]
source = "b"
match = { hardware = ["b300", "b200"], framework = "sglang", from = "2026-04-01" }
requests_per_user = 1
scheduler_recv_interval = { "1" = 10, "16" = 30 }
[[harness]]
source = "c"
match = { hardware = "b300", until = "2026-01-01" }
chunk_tokens = 4096
""")
    c35, c01 = rows["C35"], rows["C01"]
    h = harness_for(c35, f)
    assert (h.requests_per_user, h.recv_interval(4), h.recv_interval(16), h.recv_interval(128)) == (1, 10, 30, 30)
    assert h.chunk_tokens is None and h.sources == ("a", "b")          # C35 is from 2026-04-17
    assert harness_for(dataclasses.replace(c35, date="2026-03-01"), f).requests_per_user == 5
    assert harness_for(dataclasses.replace(c35, date="2025-12-01"), f).chunk_tokens == 4096
    assert harness_for(c01, f) == RowHarness(requests_per_user=5, sources=("a",))
    assert RowHarness(scheduler_recv_interval={16: 30}).recv_interval(8) == 1


@pytest.mark.parametrize("body, message", [
    ('source = "x"\nmatch = {}\nnum_prompts = 3', "unknown keys \\['num_prompts'\\]"),
    ('match = {}\nrequests_per_user = 3', "needs a source"),
    ('source = "x"\nmatch = {}\nrequests_per_user = 0', "requests_per_user: expected a positive integer"),
    ('source = "x"\nmatch = {}\nscheduler_recv_interval = { "many" = 3 }', "key 'many' is not a concurrency"),
    ('source = "x"\nmatch = {}\nspeculative = { draft_tokens = 2, acceptance_rate = 1.2 }',
     "acceptance_rate: expected a number in \\[0, 1\\)"),
    ('source = "x"\nmatch = {}\nkv_cache_free_memory_fraction = 1.5',
     "kv_cache_free_memory_fraction: expected a number in \\(0, 1\\]"),
])
def test_bad_harness_entries_are_named(tmp_path, body, message):
    f = tmp_path / f"bad-{abs(hash(body))}.toml"
    f.write_text("[[harness]]\n" + body + "\n")
    with pytest.raises(CatalogError, match=f"{f.name}: harness\\[0\\].*{message}"):
        load_harness(f)
    with pytest.raises(CatalogError, match="cannot read"):
        load_harness(tmp_path / "absent.toml")


def test_unknown_match_field_is_named(tmp_path, rows):
    f = tmp_path / "field.toml"
    f.write_text('[[harness]]\nsource = "x"\nmatch = { gpu = "b300" }\n')
    with pytest.raises(CatalogError, match=r"field\.toml: harness\[0\]\.match: \['gpu'\] are not serving-row fields"):
        harness_for(rows["C01"], f)


def test_speculative_row_without_a_configuration_is_refused(tmp_path, rows, monkeypatch):
    import devices.harness as harness
    f = tmp_path / "none.toml"
    f.write_text('[[harness]]\nsource = "x"\nmatch = {}\n')
    monkeypatch.setattr(harness, "HARNESS_FILE", f)
    monkeypatch.setattr(harness.harness_for, "__defaults__", (f,))
    with pytest.raises(CatalogError, match="row C35: no speculative configuration"):
        deployment(rows["C35"])


def test_receive_interval_is_a_colocated_setting():
    base = {"name": "x", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000.0, "tpot_ms": 80.0}, "pools": [
        {"name": "p", "device": "h100", "role": "prefill", "scheduler_recv_interval": 10},
        {"name": "d", "device": "h100", "role": "decode"}],
        "links": [{"name": "kv", "src": "p", "dst": "d", "bandwidth_GBps": 50.0}]}
    with pytest.raises(ScenarioError, match="scheduler_recv_interval.*only modelled on role 'both'"):
        parse_scenario(base, "test")


def test_dynamo_trtllm_rows_run_their_recipes():
    """InferenceX's Dynamo+TensorRT-LLM rows take their srt-slurm recipe's decode
    max_batch_size (per attention-DP rank) and MTP depth: ctx5_gen2_dep8_batch32_eplb0_mtp3
    at 658 users (B200 FP4 8k/1k) runs 8 x 32 requests per decode worker and drafts three
    tokens; ctx7_gen2_dep8_batch128_eplb0_mtp0 at 2222 users runs 8 x 128 and no speculation; the throughput
    recipe ctx11_gen1_dep16_batch256_eplb256_mtp1 (GB200 FP4 8k/1k, 4301 users) drafts one."""
    from devices.inferencex import load_inferencex_rows

    by_id = {m.id: m.row for m in load_inferencex_rows()}
    mtp3, stp, mtp1 = (deployment(by_id[f"ixapp-fix-{i}"]) for i in ("0111", "0112", "0034"))
    assert (mtp3.max_num_seqs, mtp3.speculative.draft_tokens) == (256, 3)
    assert (stp.max_num_seqs, stp.speculative) == (1024, None)
    assert (mtp1.max_num_seqs, mtp1.speculative.draft_tokens) == (4096, 1)
    assert mtp1.speculative.tokens_per_step == pytest.approx(1.77)
    assert any("nvidia-master.yaml" in s for s in harness_for(by_id["ixapp-fix-0111"]).sources)


def test_users_beyond_the_decode_slots_wait_in_ttft():
    """A disaggregated closed loop with more users than decode slots: the excess waits
    for a slot before its first token (TTFT grows with the users beyond the cap, TPOT
    does not), and without a cap the same row does not wait."""
    from devices.inferencex import load_inferencex_rows

    (row,) = [m.row for m in load_inferencex_rows() if m.id == "ixapp-fix-0111"]
    dep = deployment(row)                                   # 658 users, 2 x 256 decode slots
    capped = closed_loop_estimate(dep)
    wider = closed_loop_estimate(dataclasses.replace(dep, max_num_seqs=512))
    assert capped["batch"] <= 256 + 1e-6
    assert capped["ttft_s"] > wider["ttft_s"] + 1.0
    assert capped["tpot_s"] <= wider["tpot_s"] * 1.001


def test_recipe_names_give_the_decode_slots_and_mtp_depth():
    """scripts/harness_from_inferencex.py reads a recipe name's decode layout: batch per
    attention-DP rank for "dep"/"dp" recipes, per worker otherwise; MTP depth 0 is none."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("yaml")
    path = Path(__file__).resolve().parents[1] / "scripts" / "harness_from_inferencex.py"
    spec = importlib.util.spec_from_file_location("harness_from_inferencex", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pre = {"num-worker": 5, "tp": 4, "additional-settings": [
        "CONFIG_FILE=recipes/trtllm/b200-fp4/8k1k/mtp/ctx5_gen2_dep8_batch32_eplb0_mtp3.yaml"]}
    assert mod.recipe_facts(pre, {"num-worker": 2, "tp": 8, "dp-attn": True})[:2] == (256, 3)
    tep = {"additional-settings": ["CONFIG_FILE=recipes/x/ctx1_gen4_tep8_batch16_eplb0_mtp0.yaml"]}
    assert mod.recipe_facts(tep, {"num-worker": 4, "tp": 8, "dp-attn": False})[:2] == (16, 0)
    old = {"additional-settings": ["DECODE_MAX_BATCH_SIZE=64", "DECODE_MTP_SIZE=2"]}
    assert mod.recipe_facts({}, {"num-worker": 1, "tp": 16, "dp-attn": True, **old})[:2] == (1024, 2)
    assert mod.recipe_facts({}, {"num-worker": 1, "tp": 8, "dp-attn": True}) is None
    # a recipe body: decode slots per attention-DP rank, MTP depth, prefill prompts per rank
    body = {"decode": {"enable_attention_dp": True, "max_batch_size": 32,
                       "speculative_config": {"num_nextn_predict_layers": 3}},
            "prefill": {"max_batch_size": 2, "max_num_tokens": 16896}}
    assert mod.body_facts(body, {"tp": 8}, 8192) == (256, 3, 16384)
    tp_body = {"decode": {"max_batch_size": 1}, "prefill": {}}
    assert mod.body_facts(tp_body, {"tp": 8}, 1024) == (1, None, None)
    with pytest.raises(ValueError, match="decode layout"):
        mod.recipe_facts(pre, {"num-worker": 3, "tp": 8, "dp-attn": True})
