"""`rack bench --peer` (rack.experiments.bench_peer): the trace conversion for the
mocker, the not-installed path, and one small rack-only round."""

import json


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
