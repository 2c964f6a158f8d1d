"""Every per-request metric of every shipped scenario on the shipped excerpts equals the
stored reference within 1e-9 s. The reference (tests/data/reference_core.json.gz) was
recorded before the engine-core rewrite (issue 15) with the code of the time (async
components on an asyncio virtual loop); the cores and the virtual driver must give the
same numbers. Re-record it only for a deliberate change of behaviour, and say so:
it is recorded with that same pre-rewrite code (git tag pre-engine-core, 7bbe12a) plus
the cost-model fixes made since (tests/data/pre_engine_core_fixes.patch: `CostModel.mixed`
splits a prompt chunk over micro-batches; a prefill pass takes the micro-batch count
that finishes first; a fused pass streams weights at the lower of the two phases'
efficiencies; a pass's bytes count the KV replicas; issue 22: a wafer streams prompts
through its layers, `prompt_token_layer_s`, with the CS-3 entries that carry it; issue 33:
the prompts of several requests stream through the wafer's regions at once, a wafer's
mixed step runs its decode micro-batches beside the streams, a per-prompt chunk cap and
chunk sizes from the TPOT target, which wafer-only-kimi-k2 uses; issue 37: on SGLang
stacks a colocated instance's chunked-prefill budget is not cut by the running decodes,
and requests that tie on the router's cost go round robin among the tied instances;
issue 34: the SGLang-on-MI355X terms refitted on measured serving points, which the
MI455X pools borrow, and the MI455X's power from them), so it still pins the rewrite;
`scripts/record_core_reference.py` says how."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from rack.run.runner import run_scenario
from rack.wiring.load import load_scenario
from workloads import load_requests

REFERENCE = Path(__file__).parent / "data" / "reference_core.json.gz"
_REF = json.loads(gzip.open(REFERENCE, "rt").read())["runs"]


@pytest.fixture(scope="module")
def traces():
    return {t: load_requests(t) for t in ("mooncake-excerpt", "azure-conv-excerpt")}


@pytest.mark.parametrize("key", sorted(_REF))
def test_per_request_metrics_match_the_stored_reference(key, traces):
    name, trace = key.split("|")
    want = _REF[key]
    out = run_scenario(load_scenario(name), traces[trace], runtime="virtual")
    c = out.columns
    assert c["id"].tolist() == want["id"]
    assert c["outcome"].tolist() == want["outcome"]
    assert c["reason"].tolist() == want["reason"]
    assert c["output_tokens"].tolist() == want["output_tokens"]
    for col, values in want.items():
        if not (col.startswith("t_") or col in ("ttft_s", "tpot_s", "e2e_s")):
            continue
        exp = np.array([np.nan if v is None else v for v in values], float)
        np.testing.assert_allclose(c[col], exp, rtol=0, atol=1e-9, err_msg=f"{key} {col}")
    itl = out.results["latency"]["itl_s"]
    assert itl["n"] == want["itl_n"]
    for p in ("p50", "p99"):
        if want[f"itl_{p}"] is not None:
            assert itl[p] == pytest.approx(want[f"itl_{p}"], rel=0, abs=1e-9)
