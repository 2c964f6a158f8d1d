"""Requests as columns (`workloads.table.RequestTable`) for long virtual replays: the
same requests as the list path, the same per-request metrics and results (issue 24
item 6), and the Mooncake repeat the memory bench reads."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from workloads import Request, Turn
from workloads.load import LoadControls, LoadPlan
from workloads.table import RequestTable

PLANS = [
    dict(source="random", controls=LoadControls(16.0, num_prompts=400), range_ratio=0.5),
    dict(source="random", controls=LoadControls(16.0, num_prompts=300), prefix_len=700),
    dict(source="random", controls=LoadControls(4.0, duration_s=60.0)),
    dict(source="random", controls=LoadControls(None, num_prompts=40)),
    dict(source="trace", name="mooncake-excerpt", controls=LoadControls(8.0, num_prompts=200), rate_scale=2.0),
    dict(source="trace", name="azure-conv-excerpt", window=(10.0, 60.0), controls=LoadControls(None, duration_s=30.0)),
    dict(source="workload", name="agentic_sessions", controls=LoadControls(2.0, duration_s=120.0)),
    dict(source="random", controls=LoadControls(16.0, num_prompts=500), output_scale=2.0, max_requests=100),
]


@pytest.mark.parametrize("kw", PLANS, ids=lambda kw: f"{kw['source']}-{kw.get('name', '')}")
def test_compact_loading_gives_the_same_requests_and_provenance(kw):
    plan = LoadPlan(**kw)
    listed, table = plan.requests(), plan.requests(compact=True)
    assert isinstance(table, RequestTable)
    assert list(table) == list(listed)
    assert table.summary() == listed.summary()
    assert [table[i] for i in (0, len(table) // 2, -1)] == [listed[0], listed[len(listed) // 2], listed[-1]]


def test_table_keeps_every_field_hashes_labels_and_turns():
    reqs = [Request(i, i * 0.5, 10 + i, 1 + i % 3,
                    None if i % 5 == 0 else () if i % 5 == 1 else (i, 2**40 + i) if i % 5 == 2
                    else (2**70,) if i == 3 else (i, i + 1),
                    4 + i % 2, "t" if i % 2 else None, "gold" if i % 3 == 0 else None, i % 2,
                    Turn("s", i) if i % 4 == 0 else None)
            for i in range(3 * 4096 + 5)]         # across blocks of built requests
    table = RequestTable.from_requests(reqs, name="x")
    assert list(table) == reqs
    assert table[4097] == reqs[4097] and table[-1] == reqs[-1]
    assert table.has_turns and table.any_hashes and table.hash_flat.dtype == np.int64
    assert list(table[100:300:7]) == reqs[100:300:7]
    order = np.arange(len(reqs))[::-1]
    assert list(table.take(order)) == reqs[::-1]
    assert list(table.take(order).sorted_by_arrival()) == reqs
    pos = table.positions()
    assert pos[reqs[17].id] == 17 and pos.get(10**9, -1) == -1 and 5 in pos
    pos[10**9] = 99
    assert pos[10**9] == 99


def test_no_hashes_and_small_hashes_are_compact():
    reqs = [Request(i, float(i), 100, 10, (i, i + 1) if i % 2 else None) for i in range(50)]
    t = RequestTable.from_requests(reqs)
    assert t.hash_flat.dtype == np.int32 and list(t) == reqs
    none = RequestTable.from_requests([Request(i, float(i), 100, 10) for i in range(5)])
    assert not none.any_hashes and none.hash_flat.size == 0


def test_overlay_replaces_and_appends_as_a_list_does():
    reqs = [Request(i, float(i), 100, 10) for i in range(10)]
    o = RequestTable.from_requests(reqs).overlay()
    short = Request(3, 3.0, 100, 2)
    o[3] = short
    extra = Request(50, 20.0, 5, 5)
    o.append(extra)
    assert len(o) == 11 and o[3] == short and o[-1] == extra and o[10] == extra
    assert list(o) == [*reqs[:3], short, *reqs[4:], extra]


def test_from_columns_refuses_a_bad_length():
    with pytest.raises(ValueError, match="prompt_tokens"):
        RequestTable.from_columns(np.arange(3), np.zeros(3), np.array([5, 0, 5]), np.ones(3, np.int64))


def _strip(results: dict) -> dict:
    from rack.measure.results import to_json

    r = json.loads(to_json(results))
    r["emulation"].pop("wall_s")
    r["emulation"].pop("records")
    return r


@pytest.mark.parametrize("scenario,kw", [
    (None, dict(source="trace", name="mooncake-excerpt", window=(0.0, 20.0))),
    ("a100-llama2-70b", dict(source="trace", name="azure-conv-excerpt", window=(0.0, 15.0))),
    (None, dict(source="random", controls=LoadControls(8.0, num_prompts=200), prefix_len=600)),
])
def test_columns_and_streamed_records_give_the_in_memory_metrics(tmp_path, scenario, kw):
    """The long-run path (requests as columns, records streamed to disk) gives the
    per-request columns and results.json of the in-memory path (a list, records held)."""
    from rack.run.runner import run_scenario
    from rack.wiring.load import load_scenario

    plan, sc = LoadPlan(**kw), load_scenario(scenario)
    held = run_scenario(sc, plan.requests(), runtime="virtual")
    streamed = run_scenario(sc, plan.requests(compact=True), runtime="virtual", records_dir=str(tmp_path / "rec"))
    assert held.results["emulation"]["records"] == "memory"
    assert streamed.results["emulation"]["records"] == "disk"
    assert held.columns.keys() == streamed.columns.keys()
    for k, v in held.columns.items():
        assert np.array_equal(v, streamed.columns[k], equal_nan=v.dtype.kind == "f"), k
    assert _strip(held.results) == _strip(streamed.results)
    assert held.results["requests"]["completed"] > 0


def test_rack_run_records_disk_matches_records_memory(tmp_path):
    """Through the CLI: `--records disk` (columns, streamed) and `--records memory`
    (the list path) write the same requests.csv."""
    from typer.testing import CliRunner

    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    rows = {}
    for mode in ("disk", "memory"):
        out = tmp_path / mode
        res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--dataset", "random", "--num-prompts", "120",
                                       "--request-rate", "10", "--range-ratio", "0.5", "--records", mode,
                                       "--no-plots", "--out", str(out)])
        assert res.exit_code == 0, res.output
        with open(out / "requests.csv") as f:
            rows[mode] = list(csv.reader(f))
    assert len(rows["disk"]) == 121 and rows["disk"] == rows["memory"]


def test_repeat_mooncake_shifts_copies_and_cuts_the_last(tmp_path):
    from rack.experiments.bench_memory import repeat_mooncake
    from workloads import load_requests, resolve_trace

    src = resolve_trace("mooncake-excerpt")
    one = load_requests(src)
    n = 2 * len(one) + 7
    dst = tmp_path / "big.jsonl"
    assert repeat_mooncake(src, dst, n) == n
    big = load_requests(dst, compact=True)
    assert len(big) == n
    period = one[-1].arrival_s + 3.0
    second = big[len(one) + 5]
    assert second.block_hashes == one[5].block_hashes and second.prompt_tokens == one[5].prompt_tokens
    assert second.arrival_s == pytest.approx(one[5].arrival_s + period)
    assert big.in_arrival_order()
    (tmp_path / "bad.jsonl").write_text('{"ts": 1}\n')
    with pytest.raises(ValueError, match="Mooncake rows"):
        repeat_mooncake(tmp_path / "bad.jsonl", tmp_path / "x.jsonl", 3)
