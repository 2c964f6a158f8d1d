"""The hardware and model catalog: TOML data files shipped in `devices/catalog/`.

Layout: `catalog/devices/<key>.toml` (one `HardwareSpec` each) and
`catalog/models/<key>.toml` (one `ModelSpec` each). Every number in those files
carries a comment naming its source. A device file may say `extends = "<key>"` to
start from another entry and override some fields (used for software-stack variants
of the same hardware, and handy in a user's own file).

Software stacks: an entry is hardware running a stack. A hardware entry (no
`extends`) may name its `default_stack`; its variants (`<hw>-<stack>.toml`, extending
it) carry a `[stack]` table (key, framework, version, aliases) and the stack's
efficiencies, fixed latencies and scheduler defaults. `get_device(name, stack=...)`
picks a variant of the named hardware by its stack key, alias, framework or entry
key; without `stack`, a hardware entry with a `default_stack` means that variant. A
variant may say `stack_from = "<key>"` to run the software terms of another entry
(`SOFTWARE_FIELDS`: the same stack measured on a sibling device), overriding some.

Lookup is case-insensitive, ignores `_`/space/`-`/`.` differences and accepts each
entry's `aliases`; an unknown name raises `CatalogError` listing the closest names.
Users can also load a device from their own TOML file (`load_device_file`) and a
model from a Hugging Face `config.json` (`load_hf_config`) or a TOML file
(`load_model_file`); `resolve_device` / `resolve_model` take either a name or a path.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from .specs import HardwareSpec, ModelSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CATALOG_DIR = Path(__file__).with_name("catalog")


class CatalogError(ValueError):
    """An unknown catalog name, or a data file that cannot be read or validated."""


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _compact(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _read_toml(path: Path) -> dict:
    _check_regular(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path}: not valid TOML: {e}") from None


def _check_regular(path: Path) -> None:
    """A FIFO, device or broken link is named, never opened (opening a FIFO blocks)."""
    from workloads.paths import file_problem

    bad = file_problem(path)
    if bad is not None:
        raise CatalogError(f"{path}: {bad}; expected a TOML or JSON file")


def _validation_message(path: Path | str, exc: Exception) -> str:
    """One line per pydantic error: the file, the dotted field and what was wrong."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{path}: {exc}"
    lines = []
    for err in errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        msg = err.get("msg", "invalid")
        if err.get("type") == "missing":
            lines.append(f"{path}: field '{loc}' is required but missing")
        elif err.get("type") == "extra_forbidden":
            lines.append(f"{path}: unknown field '{loc}' (check its spelling)")
        else:
            got = err.get("input")
            lines.append(f"{path}: field '{loc}': {msg} (got {got!r})")
    return "\n".join(lines)


def _build(cls: Callable[..., Any], data: dict, path: Path | str):
    try:
        return cls(**data)
    except CatalogError:
        raise
    except Exception as e:  # pydantic.ValidationError, TypeError
        raise CatalogError(_validation_message(path, e)) from None


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@functools.lru_cache(maxsize=None)
def _raw_entries(kind: str) -> dict[str, tuple[Path, dict]]:
    """{key: (path, raw dict)} for every catalog file of `kind` ("devices"/"models")."""
    out: dict[str, tuple[Path, dict]] = {}
    for path in sorted((CATALOG_DIR / kind).glob("*.toml")):
        data = _read_toml(path)
        key = data.get("key", path.stem)
        if key in out:
            raise CatalogError(f"{path}: duplicate catalog key {key!r} (also in {out[key][0]})")
        out[key] = (path, data)
    return out


#: HardwareSpec fields that describe the software stack rather than the hardware
#: (what `stack_from` copies from another entry).
SOFTWARE_FIELDS = (
    "software_stack", "stack", "efficiency", "layer_latency_s", "moe_layer_latency_s",
    "prefill_layer_latency_s", "pipeline_hop_latency_s", "iteration_overhead_s", "request_latency_s",
    "disagg_request_latency_s", "max_num_seqs",
    "mixed_prefill", "attention_dtype", "moe_tile_tokens", "attention_context_half_tokens",
    "activation_reserve_fraction", "kv_profile_overhead_gb",
)


def _resolve_extends(kind: str, data: dict, path: Path | str, seen: tuple = ()) -> dict:
    data = dict(data)
    source = data.pop("stack_from", None)
    if source is not None:
        if source in seen:
            raise CatalogError(f"{path}: 'stack_from' cycle through {source!r}")
        skey = _lookup_key(kind, source)
        spath, sdata = _raw_entries(kind)[skey]
        soft = _resolve_extends(kind, sdata, spath, seen + (source,))
        data = _merge({k: soft[k] for k in SOFTWARE_FIELDS if k in soft}, data)
        data.setdefault("borrowed_from", skey)       # says whose terms it runs (stack_label)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if parent in seen:
        raise CatalogError(f"{path}: 'extends' cycle through {parent!r}")
    raw = _raw_entries(kind)
    key = _lookup_key(kind, parent)
    ppath, pdata = raw[key]
    base = _resolve_extends(kind, pdata, ppath, seen + (parent,))
    base.pop("aliases", None)  # aliases name one entry, never its variants
    base.pop("default_stack", None)  # a variant is a stack: it has no other default
    for unit, other in (("memory_bytes", "memory_gib"), ("memory_gib", "memory_bytes")):
        if unit in data:
            base.pop(other, None)        # a capacity given in one unit replaces the other
    return _merge(base, data)


@functools.lru_cache(maxsize=None)
def _alias_index(kind: str) -> dict[str, str]:
    index: dict[str, str] = {}
    for key, (path, data) in _raw_entries(kind).items():
        for name in [key, data.get("name", ""), *data.get("aliases", [])]:
            if not name:
                continue
            for form in (_norm(name), _compact(name)):
                other = index.get(form)
                if other is not None and other != key:
                    raise CatalogError(f"{path}: name {name!r} already names {other!r}")
                index[form] = key
    return index


def _lookup_key(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise CatalogError(f"expected a {kind[:-1]} name, got {name!r}")
    index = _alias_index(kind)
    for form in (_norm(name), _compact(name)):
        if form in index:
            return index[form]
    keys = sorted(_raw_entries(kind))
    close = difflib.get_close_matches(_norm(name), keys, n=3, cutoff=0.4)
    if not close:
        close = difflib.get_close_matches(_compact(name), [_compact(k) for k in keys], n=3, cutoff=0.4)
        close = [k for k in keys if _compact(k) in close]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise CatalogError(f"unknown {kind[:-1]} {name!r}{hint} (known: {', '.join(keys)})")


def _root(key: str) -> str:
    """The hardware entry a device entry extends (itself if it extends none)."""
    raw = _raw_entries("devices")
    seen = {key}
    while raw[key][1].get("extends"):
        key = _lookup_key("devices", raw[key][1]["extends"])
        if key in seen:
            raise CatalogError(f"{raw[key][0]}: 'extends' cycle through {key!r}")
        seen.add(key)
    return key


def _stack_names(key: str) -> list[str]:
    """Names a stack variant answers to: its stack key, aliases and framework, its
    entry key and that key without the hardware prefix."""
    raw = _raw_entries("devices")
    path, data = raw[key]
    stack = _resolve_extends("devices", data, path).get("stack", {})
    root = _root(key)
    names = [stack.get("key", ""), stack.get("framework", ""), *stack.get("aliases", ()), key]
    if key.startswith(root + "-"):
        names.append(key[len(root) + 1:])
    return [n for n in names if n]


def device_stacks(name: str) -> dict[str, str]:
    """{stack key: catalog entry} of every software stack the catalog has for the
    hardware of device `name` (the hardware entry itself under its own stack key, if
    it has one).

    Raises:
        CatalogError: unknown device name.
    """
    root = _root(_lookup_key("devices", name))
    out = {}
    for key in sorted(_raw_entries("devices")):
        if _root(key) == root:
            path, data = _raw_entries("devices")[key]
            skey = _resolve_extends("devices", data, path).get("stack", {}).get("key")
            if skey and (key != root or not data.get("default_stack")):
                out[skey] = key
    return out


def _variant_key(key: str, stack: str) -> str:
    """The entry of hardware `key`'s family whose stack answers to `stack`."""
    root = _root(key)
    want = {_norm(stack), _compact(stack)}
    family = [k for k in sorted(_raw_entries("devices")) if _root(k) == root]
    for k in family:
        if any({_norm(n), _compact(n)} & want for n in _stack_names(k)):
            return k
    known = ", ".join(sorted(device_stacks(root))) or "none"
    raise CatalogError(f"device {key!r} has no software stack {stack!r} in the catalog (stacks: {known}); "
                       f"add a file devices/catalog/devices/{root}-<stack>.toml with extends = {root!r}")


@functools.lru_cache(maxsize=None)
def get_device(name: str, stack: str | None = None) -> HardwareSpec:
    """The catalog device called `name` (key, display name or alias; any case) running
    software stack `stack` (a variant's stack key, alias, framework or entry key, e.g.
    "sglang", "trtllm", "2024q4"); None: the entry named, or the `default_stack` of a
    hardware entry that names one.

    Raises:
        CatalogError: unknown name or stack (the message lists the closest names / the
            stacks the hardware has) or a bad file.
    """
    key = _lookup_key("devices", name)
    path, data = _raw_entries("devices")[key]
    if stack is None and data.get("default_stack") and not data.get("extends"):
        stack = data["default_stack"]
    if stack is not None:
        key = _variant_key(key, str(stack))
        path, data = _raw_entries("devices")[key]
    return _build(HardwareSpec, {"key": key, **_resolve_extends("devices", data, path)}, path)


@functools.lru_cache(maxsize=None)
def get_model(name: str) -> ModelSpec:
    """The catalog model called `name` (key, display name, alias or HF repo id).

    Raises:
        CatalogError: unknown name (the message lists the closest names) or a bad file.
    """
    key = _lookup_key("models", name)
    path, data = _raw_entries("models")[key]
    return _build(ModelSpec, {"key": key, **_resolve_extends("models", data, path)}, path)


def device_names() -> list[str]:
    """Catalog device keys, sorted."""
    return sorted(_raw_entries("devices"))


def model_names() -> list[str]:
    """Catalog model keys, sorted."""
    return sorted(_raw_entries("models"))


def load_device_file(path: str | Path) -> HardwareSpec:
    """A device from a user's TOML file (same fields as the catalog's; may `extends` a
    catalog entry). `key` defaults to the file's stem.

    `extends` names what a scenario's `device` would: a hardware entry with a
    `default_stack` (`extends = "h100"`) means that stack's variant (H100 with SGLang),
    so a file that changes a few figures keeps the stack the catalog runs (extending the
    bare entry silently dropped its stack's terms: a roofline H100, TPOT 17.11 ms
    instead of SGLang's 15.71). `extends_stack = "..."` picks another stack of that
    hardware (any name `get_device(name, stack=...)` takes; "roofline" for the hardware
    alone, on entries whose own stack is called so).

    Raises:
        CatalogError: missing file, bad TOML (with line/column), an unknown stack, or a
            field that is missing or out of range (named, with the file).
    """
    path = Path(path)
    data = _read_toml(path)
    stack = data.pop("extends_stack", None)
    if data.get("extends") is not None:
        key = _lookup_key("devices", data["extends"])
        parent = _raw_entries("devices")[key][1]
        if stack is None and parent.get("default_stack") and not parent.get("extends"):
            stack = parent["default_stack"]
        if stack is not None:
            try:
                data["extends"] = _variant_key(key, str(stack))
            except CatalogError as exc:
                raise CatalogError(f"{path}: field 'extends_stack': {exc}") from None
    elif stack is not None:
        raise CatalogError(f"{path}: field 'extends_stack': needs `extends` (the hardware whose stack it names)")
    data.setdefault("key", path.stem.lower())
    data.setdefault("name", data["key"])
    return _build(HardwareSpec, _resolve_extends("devices", data, path), path)


def load_model_file(path: str | Path) -> ModelSpec:
    """A model from a TOML file with `ModelSpec` fields (may `extends` a catalog model).

    Raises:
        CatalogError: as `load_device_file`.
    """
    path = Path(path)
    data = _read_toml(path)
    data.setdefault("key", path.stem.lower())
    data.setdefault("name", data["key"])
    return _build(ModelSpec, _resolve_extends("models", data, path), path)


def _hf_get(cfg: dict, path: Path, *names: str, default: Any = ..., kind: type = int):
    for n in names:
        if n in cfg and cfg[n] is not None:
            v = cfg[n]
            if kind is int and not (isinstance(v, int) and not isinstance(v, bool)):
                raise CatalogError(f"{path}: field '{n}' should be an integer, got {v!r}")
            return v
    if default is ...:
        raise CatalogError(f"{path}: missing field '{names[0]}' (expected an integer)")
    return default


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A model from a Hugging Face `config.json` on disk (a file, or a folder holding one).

    Understands Llama/Mistral/Qwen (GQA), DeepSeek-V3/Kimi-K2 (MLA + MoE with shared
    experts and leading dense layers), Qwen3-MoE, Mixtral and gpt-oss (MoE, sliding
    window layers via `layer_types`). Fields read: num_hidden_layers, hidden_size,
    num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
    tie_word_embeddings; MoE: n_routed_experts | num_local_experts | num_experts,
    num_experts_per_tok, n_shared_experts, moe_intermediate_size, first_k_dense_replace,
    mlp_only_layers; MLA: kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
    v_head_dim; sliding window: sliding_window with layer_types or use_sliding_window;
    context limit: max_position_embeddings | n_positions | max_sequence_length | seq_length.

    Raises:
        CatalogError: missing file, invalid JSON, or a missing/ill-typed field (named).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    _check_regular(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise CatalogError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CatalogError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM here
        cfg = {**cfg, **cfg["text_config"]}

    g = functools.partial(_hf_get, cfg, path)
    layers = g("num_hidden_layers", "n_layer", "num_layers")
    hidden = g("hidden_size", "n_embd", "d_model")
    heads = g("num_attention_heads", "n_head")
    kv_heads = g("num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = g("head_dim", default=None) or hidden // heads
    vocab = g("vocab_size")
    ffn = g("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)

    moe = None
    n_experts = g("n_routed_experts", "num_local_experts", "num_experts", default=None)
    if n_experts:
        dense = g("first_k_dense_replace", default=0)
        mlp_only = cfg.get("mlp_only_layers") or []
        if mlp_only and not dense:
            if sorted(mlp_only) != list(range(len(mlp_only))):
                raise CatalogError(f"{path}: field 'mlp_only_layers' must list the leading layers "
                                   f"(0, 1, ...) for this model; got {mlp_only!r}")
            dense = len(mlp_only)
        moe = {
            "n_routed_experts": n_experts,
            "n_active_experts": g("num_experts_per_tok", "experts_per_token", "moe_topk"),
            "n_shared_experts": g("n_shared_experts", "num_shared_experts", default=0),
            "expert_ffn_size": g("moe_intermediate_size", default=ffn),
            "n_dense_layers": dense,
            "topk_group": g("topk_group", default=None) if (cfg.get("n_group") or 1) > 1 else None,
        }
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = {
            "kv_lora_rank": g("kv_lora_rank"),
            "qk_rope_head_dim": g("qk_rope_head_dim"),
            "qk_nope_head_dim": g("qk_nope_head_dim"),
            "v_head_dim": g("v_head_dim"),
            "q_lora_rank": g("q_lora_rank", default=None),
        }
        head_dim = mla["v_head_dim"]
    window = g("sliding_window", default=None)
    n_sliding = 0
    if window:
        types = cfg.get("layer_types")
        if isinstance(types, list):
            n_sliding = sum(1 for t in types if t == "sliding_attention")
        elif cfg.get("use_sliding_window", True):
            n_sliding = layers
    native = _native_dtype(cfg)
    key = name or cfg.get("_name_or_path") or path.parent.name or path.stem
    data = {
        "key": _norm(str(key)).split("/")[-1],
        "name": str(key).split("/")[-1],
        "description": f"loaded from {path}",
        "n_layers": layers, "hidden_size": hidden, "n_heads": heads, "n_kv_heads": kv_heads,
        "head_dim": head_dim, "ffn_size": ffn, "vocab_size": vocab,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "moe": moe, "mla": mla, "native_dtype": native,
        "sliding_window": window if n_sliding else None, "n_sliding_layers": n_sliding,
        # the context limit vLLM derives by default (its max_model_len); None if absent
        "max_context_tokens": g("max_position_embeddings", "n_positions", "max_sequence_length",
                                "seq_length", default=None),
    }
    return _build(ModelSpec, data, path)


#: quantization_config.quant_method (or fmt) -> the dtype of the same width rack prices:
#: MXFP4 / NVFP4 and 4-bit integer weights are 0.5 byte, FP8 / INT8 one byte.
_QUANT_DTYPES = {"mxfp4": "fp4", "nvfp4": "fp4", "fp4": "fp4", "int4": "fp4", "awq": "fp4", "gptq": "fp4",
                 "fp8": "fp8", "fbgemm_fp8": "fp8", "int8": "fp8", "e4m3": "fp8"}


def _native_dtype(cfg: dict):
    """The dtype a config.json's weights ship in: its quantization_config's method (or
    format), else its torch_dtype's width (16-bit: bf16), else None."""
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        for k in ("quant_method", "fmt", "format"):
            v = str(q.get(k, "")).lower()
            if v in _QUANT_DTYPES:
                return _QUANT_DTYPES[v]
    t = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").lower()
    if t in ("bfloat16", "float16", "bf16", "fp16", "half"):
        return "bf16"
    return None


def _is_path(s: str) -> bool:
    """A file argument rather than a catalog name: a .toml/.json name, or an existing
    path with a directory part (catalog names such as "meta-llama/Llama-3.1-8B" contain
    "/" too, so those must exist to count as paths)."""
    return s.endswith((".toml", ".json")) or ("/" in s and Path(s).exists())


def resolve_device(name_or_path: str | HardwareSpec, stack: str | None = None) -> HardwareSpec:
    """A HardwareSpec from a spec, a catalog name (with `stack`, see `get_device`), or a
    path to a TOML file (a user's file is its own stack: `stack` must then be None).

    Raises:
        CatalogError: unknown name or stack, a bad file, or a stack named for a file or spec.
    """
    if isinstance(name_or_path, HardwareSpec):
        if stack is not None and stack not in (name_or_path.stack.key, name_or_path.key):
            raise CatalogError(f"device {name_or_path.key!r} is a given spec: it cannot take stack {stack!r}")
        return name_or_path
    s = str(name_or_path)
    if _is_path(s):
        if stack is not None:
            raise CatalogError(f"{s}: a device file describes its own stack; remove stack = {stack!r} "
                               "or write `extends` to a catalog variant in the file")
        return load_device_file(s)
    return get_device(s, stack)


def resolve_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A ModelSpec from a spec, a catalog name, a Hugging Face config.json (file or
    folder) or a TOML file."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".toml"):
        return load_model_file(s)
    if _is_path(s) or (Path(s).is_dir() and (Path(s) / "config.json").is_file()):
        return load_hf_config(s)
    return get_model(s)


__all__ = [
    "CATALOG_DIR", "CatalogError", "SOFTWARE_FIELDS", "device_names", "device_stacks", "get_device", "get_model", "load_device_file",
    "load_hf_config", "load_model_file", "model_names", "resolve_device", "resolve_model",
]
