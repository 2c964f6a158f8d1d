"""scripts/fit_gpu_stacks.py's probe (which rows hold a term where it is) and --start."""

import importlib.util
from pathlib import Path

import pytest

from devices.catalog import CATALOG_DIR
from devices.serving_rows import deployment, load_serving_rows


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "fit_gpu_stacks.py"
    spec = importlib.util.spec_from_file_location("fit_gpu_stacks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _h200_sglang_rows():
    rows = [r for r in load_serving_rows(CATALOG_DIR / "gpu-calibration.csv") if r.id in ("C01", "C06")]
    assert len(rows) == 2
    return [(deployment(r), r) for r in rows]


def test_probe_at_the_catalog_value_moves_nothing_and_its_loss_is_the_fits():
    """The loss the probe reports is the fit's objective, the sum of the rows' shares; at
    the catalog's own value no row moves."""
    fit = _script()
    rows = _h200_sglang_rows()
    dev = fit.get_device("h200-sglang")
    here = dev.efficiency.decode_memory
    [same, lower] = fit.probe("h200-sglang", rows, "decode_memory", [here, 0.6])
    assert same["rows"] == [] and same["loss"] == pytest.approx(same["catalog_loss"])
    assert same["loss"] == pytest.approx(sum(fit.row_loss(dev, d, r)[0] for d, r in rows))
    # a slower weight read lengthens these small-batch decode steps: TPOT rises on both rows
    assert {m["id"] for m in lower["rows"]} == {"C01", "C06"}
    for m in lower["rows"]:
        assert m["errors_at_value"]["tpot_s"] > m["errors_at_catalog"]["tpot_s"]
    assert lower["loss"] == pytest.approx(lower["catalog_loss"] + sum(m["change"] for m in lower["rows"]), abs=0.01)


def test_probe_and_start_name_their_bad_input():
    fit = _script()
    with pytest.raises(SystemExit, match="no parameter 'decode_memroy'"):
        fit.probe("h200-sglang", _h200_sglang_rows(), "decode_memroy", [0.8])
    with pytest.raises(SystemExit, match="--start: expected name=value"):
        fit._assignments("decode_memory=0.8,front_end=0.1", "--start")
    assert fit._assignments("decode_memory=0.8, prefill_layer_latency_s=5e-4", "--start") == {
        "decode_memory": 0.8, "prefill_layer_latency_s": 5e-4}
