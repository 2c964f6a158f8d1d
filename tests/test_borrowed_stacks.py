"""Every (device, framework) pair answers (issue 22 item 4): a pair without a stack file
borrows the nearest calibrated stack and says so; leave-one-device-out validation
measures how well that works, and its median error is the borrowed stack's uncertainty."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import rack.cli
from devices.borrow import FRAMEWORK_FAMILIES, calibrated_entries, family, nearest_calibrated, resolve_stack
from devices.catalog import device_names, get_device
from devices.lodo import leave_one_device_out
from devices.uncertainty import uncertain_term
from rack.cli.app import app

rack.cli._register_commands()
runner = CliRunner()
FRAMEWORKS = ("sglang", "trt", "trtllm", "dynamo-sglang", "dynamo-trt", "atom", "mori-sglang", "vllm")


def test_alias_table_maps_builds_to_their_framework():
    assert family("ATOM") == family("mori-sglang") == family("dynamo-sglang") == "sglang"
    assert family("trt") == family("dynamo-trt") == "trtllm" and family("nope") is None
    assert set(FRAMEWORK_FAMILIES.values()) == {"sglang", "trtllm", "vllm"}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_catalog_device_answers_every_framework(framework):
    roots = {k.split("-")[0] for k in device_names()}
    for dev in sorted(roots):
        spec = resolve_stack(dev, framework)
        assert spec.memory_bytes == get_device(dev).memory_bytes        # the device's own hardware
        own = get_device(dev).stack.key == family(framework) or spec.key.startswith(f"{dev}-{family(framework)}")
        assert own or spec.borrowed_from, (dev, framework, spec.key)


def test_borrowing_marks_the_lender_and_prefers_the_vendor():
    spec = resolve_stack("mi325x", "sglang")
    assert spec.borrowed_from == "mi355x-sglang" and "terms of mi355x-sglang" in spec.stack_label
    assert get_device(spec.borrowed_from).vendor == "AMD"
    h = resolve_stack("h100", "trt")
    assert h.borrowed_from in calibrated_entries("trtllm") and h.scale_up_domain == get_device("h100").scale_up_domain
    assert resolve_stack("mi355x", "atom").key == "mi355x-sglang" and not resolve_stack("mi355x", "atom").borrowed_from
    # a catalog file's own `stack_from` is a borrowing too, and says so
    assert get_device("mi455x", "sglang").borrowed_from == "mi355x-sglang"
    with pytest.raises(Exception, match="no software stack"):
        resolve_stack("h200", "some-unknown-engine")


def test_leave_one_device_out_excludes_the_device_and_its_siblings():
    r = leave_one_device_out()
    assert r["rows"] >= 30 and len(r["devices"]) >= 4
    for d in r["devices"]:
        assert not d["borrowed_from"].startswith(d["device"] + "-")
    h200 = next(d for d in r["devices"] if d["device"] == "h200")
    assert nearest_calibrated("h200", "sglang", exclude=("h200",)) == h200["borrowed_from"]
    # the borrowed stack's uncertainty term spans the shipped table's median log error
    from devices.lodo import borrowed_stack_uncertainty

    t = uncertain_term("mi455x.stack_time_factor")
    e = borrowed_stack_uncertainty("mi455x")["median_abs_log_error"]
    f = math.exp(max(e["tpot_s"], e["throughput_per_gpu"]))
    assert t.high == pytest.approx(f) and t.low == pytest.approx(1 / f)


def test_validate_answers_a_file_of_unstacked_pairs(tmp_path):
    head = open("devices/catalog/gpu-calibration.csv").readline()
    body = "".join(f"X{i},{hw},8,8,1,false,,,,,,,,,,,dsr1,fp8,{fw},,none,false,1024,1024,4,10,150,90,90,45,,"
                   f"2026-03-01,test,\n" for i, (hw, fw) in enumerate(
                       [("mi325x", "sglang"), ("gb200", "trt"), ("gb300", "trtllm"), ("mi355x", "atom"),
                        ("mi355x", "mori-sglang"), ("mi300x", "dynamo-trt")]))
    path = tmp_path / "rows.csv"
    path.write_text(head + body)
    r = runner.invoke(app, ["validate", "--rows", str(path), "--json"])
    assert r.exit_code in (0, 1), r.output           # answered (criteria may fail on made-up figures)
    out = json.loads(r.stdout)
    assert len(out["serving_rows"]) == 6
    borrowed = {row["id"]: row["borrowed_from"] for row in out["serving_rows"]}
    assert borrowed["X0"] == "mi355x-sglang" and borrowed["X3"] is None and borrowed["X5"]
    assert out["leave_one_device_out"]["median_abs_error"]["tpot_s"] > 0


def test_saturated_prefill_rows():
    from rack.experiments.validation_table import saturated_rows, saturated_summary

    rows = saturated_rows()
    assert len(rows) >= 8 and len({r.row.hardware for r in rows}) >= 3
    assert any(r.row.isl_tokens >= 8192 for r in rows)
    assert any((r.row.prefill_ep or 1) >= 8 and r.row.prefill_dp_attention for r in rows)   # wide EP, DP-attn
    assert all(r.row.source.startswith("https://github.com/SemiAnalysisAI/InferenceX/actions/runs/") for r in rows)
    summary = saturated_summary(rows)
    # the prefill pool's capacity bounds the rate: input tokens/s per prefill GPU within 25 %
    assert summary["met"]["input_per_prefill_gpu"], summary
