"""Record tests/data/reference_core.json.gz: every per-request metric of every shipped
scenario on the shipped excerpts, computed by the code before the engine-core rewrite
(git tag `pre-engine-core`, async components on an asyncio virtual loop) with the
cost-model fixes made since applied to it (tests/data/pre_engine_core_fixes.patch), so
that `tests/test_core_reference.py` pins the rewrite and nothing else.

It imports that code's module layout (`rack.runner`, `rack.scenario`), so run it with
the old tree first on the path:

    git worktree add /tmp/pre-core pre-engine-core
    git -C /tmp/pre-core apply "$PWD/tests/data/pre_engine_core_fixes.patch"
    PYTHONPATH=/tmp/pre-core python scripts/record_core_reference.py tests/data/reference_core.json.gz
    git worktree remove --force /tmp/pre-core

(`pre-engine-core` is commit 7bbe12a where the tag is not fetched.) When two branches
both extended the patch, merge the code, not the patch text: on the old tree, commit the
common ancestor's patch applied, then each branch's patch applied on top of that commit
(`git read-tree -u --reset` of a tree with the branch's patch applied), merge those two
commits with git, and write `git diff 7bbe12a <merged>` back as the patch before
recording.
"""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np

NOTE = ("per-request metrics of every shipped scenario on the shipped excerpts, recorded with the "
        "async-component code before the engine-core rewrite (git tag pre-engine-core) plus "
        "tests/data/pre_engine_core_fixes.patch (the cost-model fixes made since); "
        "scripts/record_core_reference.py")


def main(out_path: str) -> None:
    from rack.runner import run_scenario          # the pre-rewrite layout
    from rack.scenario import load_scenario, scenario_names
    from workloads import load_requests

    runs = {}
    for trace in ("mooncake-excerpt", "azure-conv-excerpt"):
        reqs = load_requests(trace)
        for name in scenario_names():
            o = run_scenario(load_scenario(name), reqs, runtime="virtual")
            c, itl = o.columns, o.results["latency"]["itl_s"]
            keys = [k for k in c if k.startswith("t_") or k in ("ttft_s", "tpot_s", "e2e_s")]
            runs[f"{name}|{trace}"] = {
                "id": c["id"].tolist(), "outcome": c["outcome"].tolist(), "reason": c["reason"].tolist(),
                "output_tokens": c["output_tokens"].tolist(),
                **{k: [None if np.isnan(x) else float(x) for x in c[k]] for k in keys},
                "itl_p50": itl["p50"], "itl_p99": itl["p99"], "itl_n": itl["n"]}
            print(f"{name} {trace}: {o.results['requests']['completed']} of {len(reqs)} completed", flush=True)
    with gzip.open(out_path, "wt") as f:
        json.dump({"note": NOTE, "runs": runs}, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: PYTHONPATH=<pre-engine-core tree> python scripts/record_core_reference.py OUT.json.gz")
    main(sys.argv[1])
