"""`rack bench --peer` (rack.experiments.bench_peer): the trace conversion for the
mocker, the not-installed path, and one small rack-only round."""

import json
from pathlib import Path

import pytest


from rack.experiments import bench_peer as BP
from workloads import Request


def test_write_mooncake_jsonl_keeps_hash_ids_and_generates_fresh_ones(tmp_path):
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=1100, output_tokens=5, block_hashes=(3, 4, 9)),
            Request(id=1, arrival_s=1.5, prompt_tokens=1025, output_tokens=7),
            Request(id=2, arrival_s=2.25, prompt_tokens=10, output_tokens=1)]
    path = tmp_path / "t.jsonl"
    assert BP.write_mooncake_jsonl(reqs, path, block_tokens=512) == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {"timestamp": 0.0, "input_length": 1100, "output_length": 5, "hash_ids": [3, 4, 9]}
    assert rows[1]["timestamp"] == 1500.0 and rows[1]["hash_ids"] == [10, 11, 12]   # ceil(1025 / 512) new ids
    assert rows[2]["hash_ids"] == [13]


def test_peer_status_says_why_when_not_installed(tmp_path):
    st = BP.peer_status(str(tmp_path / "no-such-python"))
    assert st["installed"] is False and "cannot run" in st["why"]


def test_peer_section_without_the_peer_still_replays_rack(tmp_path):
    sec = BP.peer_section(["mooncake-excerpt"], pairs=[("gpu-only-kimi-k2", "agg", (4,))], repeat=1,
                          python=str(tmp_path / "no-such-python"), output_scales=(1.0,), window=(0.0, 10.0))
    assert sec["peer"]["installed"] is False
    row = sec["traces"]["mooncake-excerpt"]["x1"]["gpu-only-kimi-k2"]
    assert row["requests"] > 0 and row["cpu_s"]["current"] > 0 and "peer" not in row["cpu_s"]
    checks = BP.peer_checks(sec)
    assert checks["peer.mooncake-excerpt.gpu-only-kimi-k2.cpu_ratio_to_mocker"]["ok"] is None


def test_peer_section_checks_the_itl_summary_against_the_baseline(tmp_path):
    from rack.experiments.bench_baseline import project_root

    sec = BP.peer_section(["mooncake-excerpt"], pairs=[("gpu-pd-kimi-k2", "pd", (2, 2))], repeat=1,
                          baseline=str(project_root()), python=str(tmp_path / "no-such-python"),
                          output_scales=(1.0,), window=(0.0, 10.0))
    m = sec["traces"]["mooncake-excerpt"]["x1"]["gpu-pd-kimi-k2"]["metrics"]
    assert m["max_abs_diff_s"] == 0.0 and m["itl_summary_equal"] is True
    assert m["itl_s"]["current"]["n"] > 0
    checks = BP.peer_checks(sec)
    assert checks["peer.mooncake-excerpt.gpu-pd-kimi-k2.itl_summary_equal"]["ok"] is True


def test_the_mocker_is_matched_to_the_scenarios_kv_block_size_at_the_same_capacity(tmp_path):
    assert BP.scenario_block_tokens("helios-cs3-kimi-k2") == 16
    assert BP.matched_block_args(16) == {"block_tokens": 16, "gpu_blocks": 65536}   # 64 x 16,384 tokens
    assert BP.matched_block_args(64) == {"block_tokens": 64, "gpu_blocks": 16384}   # its own defaults
    with pytest.raises(ValueError, match="must divide"):
        BP.matched_block_args(48)
    import rack

    text = (Path(rack.__file__).parent / "scenarios" / "gpu-pd-kimi-k2.toml").read_text()
    head, sep, tail = text.rpartition("kv_block_tokens = 16")      # the decode pool's
    path = tmp_path / "mixed.toml"
    path.write_text(head + "kv_block_tokens = 32" + tail)
    with pytest.raises(ValueError, match=r"\[16, 32\]"):
        BP.scenario_block_tokens(str(path))


FAKE_PEER = """#!/bin/sh
# A stand-in for the peer's interpreter: answers the import check, and for a replay prints
# the mocker's JSON line with a CPU time that says which limits it was given.
if [ "$1" = "-c" ]; then echo 1.6.1; exit 0; fi
case "$*" in
  *"--block-tokens 16 --gpu-blocks 65536"*) cpu=2.0 ;;
  *"--block-tokens"*) cpu=9.0 ;;
  *) cpu=1.0 ;;
esac
echo "{\\"peer\\": \\"dynamo-mocker\\", \\"cpu_s\\": $cpu, \\"wall_s\\": 3.0, \\"requests\\": 5, \\"completed\\": 5, \\"ttft_p50_ms\\": 7.5}"
"""


def test_peer_section_runs_the_mocker_at_its_defaults_and_at_racks_block_size(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PEER)
    fake.chmod(0o755)
    sec = BP.peer_section(["mooncake-excerpt"], pairs=[("gpu-only-kimi-k2", "agg", (4,))], repeat=1,
                          python=str(fake), output_scales=(1.0, 2.0), window=(0.0, 10.0))
    row = sec["traces"]["mooncake-excerpt"]["x1"]["gpu-only-kimi-k2"]
    doubled = sec["traces"]["mooncake-excerpt"]["x2"]["gpu-only-kimi-k2"]
    assert doubled["cpu_s"]["peer_matched"] == 2.0 and doubled["requests"] == row["requests"]
    assert row["cpu_s"]["peer"] == 1.0 and row["cpu_s"]["peer_matched"] == 2.0
    assert row["mocker"]["matched"] == {"block_tokens": 16, "gpu_blocks": 65536}
    rack_cpu = row["cpu_s"]["current"]
    assert row["cpu_ratio_to_peer"]["current"] == rack_cpu / 1.0
    assert row["cpu_ratio_to_peer_matched"]["current"] == rack_cpu / 2.0
    assert row["peer_ttft_p50_ms"] == {"peer": 7.5, "peer_matched": 7.5}
    checks = BP.peer_checks(sec)
    key = "peer.mooncake-excerpt.gpu-only-kimi-k2"
    assert checks[f"{key}.cpu_ratio_to_mocker_at_rack_blocks"]["value"] == rack_cpu / 2.0
    assert "16-token KV blocks, 65,536 per worker" in checks[f"{key}.cpu_ratio_to_mocker_at_rack_blocks"]["target"]
    assert checks[f"{key}.doubled_output_cpu_ratio"]["value"] == doubled["cpu_s"]["current"] / rack_cpu
    only = BP.peer_section(["mooncake-excerpt"], pairs=[("gpu-only-kimi-k2", "agg", (4,))], repeat=1,
                           python=str(fake), output_scales=(1.0,), window=(0.0, 10.0), matched_blocks=False)
    assert "peer_matched" not in only["traces"]["mooncake-excerpt"]["x1"]["gpu-only-kimi-k2"]["cpu_s"]
