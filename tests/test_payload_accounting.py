"""Payload accounting (run_scenario(kv_payload="account")): KV payloads described
instead of built give the per-request metrics and results of the full-payload path;
a sampled share is built and checked; the Ray runtime keeps real bytes."""

from __future__ import annotations

import numpy as np
import pytest

from interconnect.codec import (FrameError, check_description, describe_kv_frames, make_kv_frames,
                                scan_kv_frames)
from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import load_requests


@pytest.mark.parametrize("args", [(7, 1, 64, 1, 1, 1.0, "fp8", 0), (12345, 3000, 70_272, 61, 8, 1e-3, "fp8", 2),
                                  (2**40, 517, 327_680, 80, 3, 0.25, "bf16", 1)])
def test_description_matches_the_real_frames(args):
    desc = describe_kv_frames(*args)
    real = make_kv_frames(*args)
    assert len(desc) == len(real)
    assert desc.sizes == tuple(f.nbytes for f in real) and desc.nbytes == sum(f.nbytes for f in real)
    assert list(desc.entries) == scan_kv_frames(real, True) == scan_kv_frames(desc, True)
    check_description(desc, real)
    check_description(desc, desc.build())
    other = make_kv_frames(args[0], args[1] + 1, *args[2:])
    with pytest.raises(FrameError, match="differs from its real frames"):
        check_description(desc, other)


@pytest.mark.parametrize("args", [(7, 1, 64, 1, 1, 1.0, "fp8", 0), (12345, 3000, 70_272, 61, 8, 1e-3, "fp8", 2),
                                  (2**40, 517, 327_680, 80, 3, 0.25, "bf16", 1)])
def test_description_answers_the_header_checks_as_its_real_frames(args):
    """`passes_transfer_checks` / `verifies_for` (O(1), from the arguments) never accept
    what the interconnect's header checks or the receiver's bad-frame count reject on
    the real frames."""
    from devices.engines.decode import _count_bad_frames
    from interconnect.component import Interconnect, TransferError
    from interconnect.link import LinkSpec
    from workloads.request import Request

    desc, real = describe_kv_frames(*args), make_kv_frames(*args)
    rid, n_tokens, per_token, n_layers, _, scale = args[:6]
    logical = n_tokens * per_token
    for r, sc, lb in [(rid, scale, logical), (rid + 1, scale, logical), (rid, scale * 0.5, logical),
                      (rid, scale, logical + 1)]:
        ic = Interconnect(links=[LinkSpec(name="l", bandwidth_GBps=1.0)], routes={("a", "b"): ["l"]}, receivers=["b"], payload_scale=sc)
        req = Request(id=r, arrival_s=0.0, prompt_tokens=n_tokens, output_tokens=2)
        try:
            ic._check_frames(req, real, lb)
            ok = True
        except TransferError:
            ok = False
        assert desc.passes_transfer_checks(r, sc, lb) <= ok
        assert desc.passes_transfer_checks(r, sc, lb) == (r == rid and sc == scale and lb == logical)
    for r, kv, layers in [(rid, n_tokens, n_layers), (rid + 1, n_tokens, n_layers), (rid, n_tokens + 1, n_layers),
                          (rid, n_tokens, n_layers + 1), (rid, n_tokens, max(1, n_layers - 1))]:
        bad = _count_bad_frames(r, kv, layers, real)
        assert desc.verifies_for(r, kv, layers) == (bad == 0)
        assert _count_bad_frames(r, kv, layers, desc) == bad


def test_describe_checks_its_arguments_like_make():
    with pytest.raises(ValueError, match="payload_scale"):
        describe_kv_frames(1, 10, 64, 4, 2, 0.0)
    with pytest.raises(ValueError, match="n_tokens"):
        describe_kv_frames(1, 0, 64, 4, 2, 1.0)


def _strip(results: dict) -> dict:
    """results.json without what may differ between the two paths by design."""
    out = {k: v for k, v in results.items() if k not in ("emulation", "provenance")}
    out["kv_transfer"] = {k: v for k, v in results["kv_transfer"].items() if k != "described_transfers"}
    return out


def test_accounting_gives_the_full_payload_paths_metrics():
    sc = load_scenario("helios-cs3-kimi-k2")
    reqs = load_requests("mooncake-excerpt", window=(0.0, 20.0))
    full = run_scenario(sc, reqs, runtime="virtual")
    acc = run_scenario(sc, reqs, runtime="virtual", kv_payload="account", kv_verify_every=8)
    assert set(full.columns) == set(acc.columns)
    for k, col in full.columns.items():
        assert np.array_equal(col, acc.columns[k], equal_nan=col.dtype.kind == "f"), k
    assert _strip(full.results) == _strip(acc.results)
    n = acc.results["kv_transfer"]["transfers"]
    assert n > 8
    # every transfer but the sampled ones (the first of each instance, then one in 8) was described
    built = n - acc.results["kv_transfer"]["described_transfers"]
    instances = sum(p.instances for p in sc.pools if p.role == "prefill")
    assert n // 8 <= built <= n // 8 + instances
    assert full.results["kv_transfer"]["described_transfers"] == 0
    assert acc.results["provenance"]["load"]["kv_payload"] == "account"


def test_accounting_is_refused_where_bytes_must_ship():
    sc = load_scenario("helios-cs3-kimi-k2")
    reqs = load_requests("mooncake-excerpt", window=(0.0, 2.0))
    with pytest.raises(ValueError, match="Ray runtime always ships real KV bytes"):
        run_scenario(sc, reqs, runtime="ray", kv_payload="account")
    with pytest.raises(ValueError, match="kv_payload"):
        run_scenario(sc, reqs, kv_payload="none")
    with pytest.raises(ValueError, match="kv_verify_every"):
        run_scenario(sc, reqs, kv_payload="account", kv_verify_every=0)
