"""Print serving-harness entries for InferenceX's Dynamo+TensorRT-LLM DeepSeek-R1 recipes.

Each search-space entry of InferenceX's `.github/configs/nvidia-master.yaml` under a
`dsr1-*-dynamo-trt` config names the srt-slurm recipe it launched for its concurrency
list and worker layout, `CONFIG_FILE=recipes/trtllm/<hw>-<precision>/<isl><osl>/{mtp,stp}/
ctx<P>_gen<D>_<dep|tep|dp|tp><N>_batch<B>_eplb<E>_mtp<K>.yaml` (older entries give
`DECODE_MAX_BATCH_SIZE` / `DECODE_MTP_SIZE` instead). Two of its facts change what a row
measured (devices/catalog/serving-harness.toml says how): the decode workers'
`max_batch_size` B, per attention-DP rank for "dep"/"dp" recipes (an instance runs at most
B x ranks requests: `max_num_seqs`), and the MTP depth K (`speculative.draft_tokens`, each
drafted token accepted at `ACCEPTANCE`). With `--recipes` (a clone of srt-slurm holding the
`recipes/trtllm` tree) both are read from the recipe's body where it is there (the name's
batch is not always the body's), else from the name; `--prefill-budget` adds the prefill
workers' whole-prompt budget per rank as `chunk_tokens` (off in the shipped harness: its
header says why).

    python scripts/harness_from_inferencex.py INFERENCEX_CHECKOUT COMMIT[,COMMIT...] \
        --recipes SRT_SLURM_CHECKOUT >> entries.toml

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


def recipe_body(recipes: str | None, name: str) -> dict | None:
    """The `backend.trtllm_config` of recipe `name` (a path under the srt-slurm checkout
    `recipes`, e.g. recipes/trtllm/b200-fp4/8k1k/mtp/ctx5_...yaml), None when absent."""
    if recipes is None:
        return None
    out = subprocess.run(["git", "-C", recipes, "show", f"HEAD:{name}"], capture_output=True, text=True)
    if out.returncode:
        return None
    return (yaml.safe_load(out.stdout).get("backend") or {}).get("trtllm_config")


def body_facts(cfg: dict, decode: dict, isl: int) -> tuple[int, int | None, int | None]:
    """(requests per decode instance, MTP depth, prefill tokens per rank and pass) from a
    recipe body: decode `max_batch_size` (per rank with enable_attention_dp),
    `speculative_config.num_nextn_predict_layers`, and the prefill workers' whole-prompt
    budget min(max_num_tokens, max_batch_size x isl) (they run no chunked prefill)."""
    dec, pre = cfg["decode"], cfg.get("prefill") or {}
    ranks = decode["tp"] if dec.get("enable_attention_dp") else 1
    mtp = (dec.get("speculative_config") or {}).get("num_nextn_predict_layers")
    budget = None
    if pre.get("max_num_tokens") and pre.get("max_batch_size"):
        budget = min(int(pre["max_num_tokens"]), int(pre["max_batch_size"]) * isl)
    return int(dec["max_batch_size"]) * ranks, (int(mtp) if mtp else None), budget


def recipe_facts(prefill: dict, decode: dict) -> tuple[int, int | None, str] | None:
    """(requests per decode instance, MTP depth or None, the recipe named) of one
    search-space entry from its recipe's name, or None when it names neither a recipe
    nor a decode batch.

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


def entries(checkout: str, commits: list[str], recipes: str | None = None) -> dict:
    """{match key: (cap, mtp, prefill budget, recipe, config name, commit, read from the
    recipe's body)} over the
    commits' configs; a recipe whose body `recipes` holds is read from it (its name's
    batch is sometimes not the body's: ctx1_gen3_tp8_batch1024_eplb0_mtp0_4 runs 1)."""
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
                    budget = None
                    body = recipe_body(recipes, recipe) if recipe.startswith("recipes/") else None
                    if body is not None:
                        cap, mtp, budget = body_facts(body, s["decode"], sl["isl"])
                    key = (hw, cfg["precision"], sl["isl"], sl["osl"], spec, s["prefill"]["num-worker"],
                           s["decode"]["num-worker"], s["decode"]["tp"], tuple(s["conc-list"]))
                    val = (cap, mtp if spec == "mtp" else None, budget, recipe, name, c, body is not None)
                    if key in seen and seen[key][:3] != val[:3]:
                        print(f"# disagreement: {key}: {seen[key]} vs {val}", file=sys.stderr)
                    seen.setdefault(key, val)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", help="a git clone of SemiAnalysisAI/InferenceX")
    ap.add_argument("commits", help="comma-separated commits whose nvidia-master.yaml to read, in order")
    ap.add_argument("--recipes", help="a git clone of srt-slurm holding the recipes the configs name "
                    "(their bodies are read where present; else the names)")
    ap.add_argument("--prefill-budget", action="store_true",
                    help="also write the prefill workers' whole-prompt budget as chunk_tokens (off in the "
                    "shipped harness: see its header)")
    args = ap.parse_args()
    found = entries(args.checkout, args.commits.split(","), args.recipes)
    for key, (cap, mtp, budget, recipe, name, commit, from_body) in found.items():
        hw, prec, isl, osl, spec, pw, dw, dtp, concs = key
        print("[[harness]]")
        print(f'name = "InferenceX {name} {isl}/{osl} ({recipe.rsplit("/", 1)[-1]})"')
        print(f'match = {{ framework = "dynamo-trt", hardware = "{hw}", precision = "{prec}", isl_tokens = {isl}, '
              f'osl_tokens = {osl}, spec_decoding = "{spec}", prefill_workers = {pw}, decode_workers = {dw}, '
              f'decode_tp = {dtp}, concurrency_requests = [{", ".join(map(str, concs))}] }}')
        print(f"max_num_seqs = {cap}")
        if budget and args.prefill_budget:
            print(f"chunk_tokens = {budget}")
        if mtp:
            print(f"speculative = {{ draft_tokens = {mtp}, acceptance_rate = {ACCEPTANCE} }}")
        where = f"; recipe body: srt-slurm {recipe}" if from_body else ""
        print(f'source = "InferenceX .github/configs/nvidia-master.yaml @ {commit}{where}"')
        print()


if __name__ == "__main__":
    main()
