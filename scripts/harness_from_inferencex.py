"""Print serving-harness entries for InferenceX's Dynamo+TensorRT-LLM DeepSeek-R1 recipes.

Each search-space entry of InferenceX's `.github/configs/nvidia-master.yaml` under a
`dsr1-*-dynamo-trt` config names the srt-slurm recipe it launched for its concurrency
list and worker layout, `CONFIG_FILE=recipes/trtllm/<hw>-<precision>/<isl><osl>/{mtp,stp}/
ctx<P>_gen<D>_<dep|tep|dp|tp><N>_batch<B>_eplb<E>_mtp<K>.yaml` (older entries give
`DECODE_MAX_BATCH_SIZE` / `DECODE_MTP_SIZE` instead). Two of its facts change what a row
measured (devices/catalog/serving-harness.toml says how): the decode workers'
`max_batch_size` B, per attention-DP rank for "dep"/"dp" recipes (an instance runs at most
B x ranks requests: `max_num_seqs`), and the MTP depth K (`speculative.draft_tokens`, each
drafted token accepted at `ACCEPTANCE`).

    python scripts/harness_from_inferencex.py INFERENCEX_CHECKOUT COMMIT[,COMMIT...] >> entries.toml

The commits are read in order; where several give the same layout and concurrencies the
first one's entry is kept and a disagreement is reported on stderr.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import yaml

#: TensorRT-LLM's measured DeepSeek-R1 MTP acceptance per drafted token (the harness
#: file's MTP entry: gpu-calibration.md row T7).
ACCEPTANCE = 0.77
HARDWARE = ("b200", "b300", "gb200", "gb300", "h100", "h200")
RECIPE = re.compile(r"(?:^|_)gen(\d+)_(tep|dep|tp|dp)(\d+)_batch(\d+)_eplb\d+_mtp(\d*)")


def recipe_facts(prefill: dict, decode: dict) -> tuple[int, int | None, str] | None:
    """(requests per decode instance, MTP depth or None, the recipe named) of one
    search-space entry, or None when it names neither a recipe nor a decode batch.

    Raises ValueError when the recipe's decode layout disagrees with the entry's."""
    sets = [*prefill.get("additional-settings", []), *decode.get("additional-settings", [])]
    files = [s.split("=", 1)[1] for s in sets if s.startswith("CONFIG_FILE=")]
    env = dict(s.split("=", 1) for s in sets if "=" in s)
    if files:
        m = RECIPE.search(files[0].rsplit("/", 1)[-1])
        if m is None:
            return None
        workers, kind, size, batch, mtp = m.groups()
        if (int(workers), int(size)) != (decode["num-worker"], decode["tp"]):
            raise ValueError(f"{files[0]}: decode layout differs from the entry's {decode}")
        per_rank, name = kind in ("dep", "dp"), files[0]
    elif "DECODE_MAX_BATCH_SIZE" in env:
        batch, mtp, per_rank = env["DECODE_MAX_BATCH_SIZE"], env.get("DECODE_MTP_SIZE", ""), decode["dp-attn"]
        name = f"DECODE_MAX_BATCH_SIZE={batch}" + (f", DECODE_MTP_SIZE={mtp}" if mtp else "")
    else:
        return None
    cap = int(batch) * (decode["tp"] if per_rank else 1)
    return cap, (int(mtp) if mtp else None), name


def entries(checkout: str, commits: list[str]) -> dict:
    """{match key: (cap, mtp, recipe, config name, commit)} over the commits' configs."""
    seen: dict = {}
    for c in commits:
        text = subprocess.run(["git", "-C", checkout, "show", f"{c}:.github/configs/nvidia-master.yaml"],
                              capture_output=True, text=True, check=True).stdout
        for name, cfg in yaml.safe_load(text).items():
            if not name.startswith("dsr1") or cfg.get("framework") != "dynamo-trt":
                continue
            hw = next(h for h in HARDWARE if f"-{h}-" in name)
            for sl in cfg["seq-len-configs"]:
                for s in sl["search-space"]:
                    facts = recipe_facts(s["prefill"], s["decode"])
                    if facts is None:
                        continue
                    spec = s.get("spec-decoding", "none")
                    cap, mtp, recipe = facts
                    key = (hw, cfg["precision"], sl["isl"], sl["osl"], spec, s["prefill"]["num-worker"],
                           s["decode"]["num-worker"], s["decode"]["tp"], tuple(s["conc-list"]))
                    val = (cap, mtp if spec == "mtp" else None, recipe, name, c)
                    if key in seen and seen[key][:2] != val[:2]:
                        print(f"# disagreement: {key}: {seen[key]} vs {val}", file=sys.stderr)
                    seen.setdefault(key, val)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", help="a git clone of SemiAnalysisAI/InferenceX")
    ap.add_argument("commits", help="comma-separated commits whose nvidia-master.yaml to read, in order")
    args = ap.parse_args()
    for key, (cap, mtp, recipe, name, commit) in entries(args.checkout, args.commits.split(",")).items():
        hw, prec, isl, osl, spec, pw, dw, dtp, concs = key
        print("[[harness]]")
        print(f'name = "InferenceX {name} {isl}/{osl} ({recipe.rsplit("/", 1)[-1]})"')
        print(f'match = {{ framework = "dynamo-trt", hardware = "{hw}", precision = "{prec}", isl_tokens = {isl}, '
              f'osl_tokens = {osl}, spec_decoding = "{spec}", prefill_workers = {pw}, decode_workers = {dw}, '
              f'decode_tp = {dtp}, concurrency_requests = [{", ".join(map(str, concs))}] }}')
        print(f"max_num_seqs = {cap}")
        if mtp:
            print(f"speculative = {{ draft_tokens = {mtp}, acceptance_rate = {ACCEPTANCE} }}")
        print(f'source = "InferenceX .github/configs/nvidia-master.yaml @ {commit}"')
        print()


if __name__ == "__main__":
    main()
