"""Every (device, framework) pair answers: a pair without a stack file borrows the
nearest calibrated stack, and says so.

`resolve_stack(device, stack)` is `catalog.resolve_device` that never refuses a
framework `FRAMEWORK_FAMILIES` knows:
1. the device has a variant for the stack (or for its framework family: "atom" or
   "mori-sglang" on MI355X is its SGLang entry) -> that entry;
2. otherwise the software terms (`catalog.SOFTWARE_FIELDS`) of the nearest *calibrated*
   entry of the same family (fitted on measured rows: its file has no `stack_from`),
   same vendor first, nearest hardware by `hardware_distance`, run on this device's
   hardware; the spec's `borrowed_from` names the entry lent (and `stack_label` shows it);
3. a wafer has no GPU serving framework: its own default stack, marked borrowed.

How well borrowing works is measured by leave-one-device-out validation
(`devices.lodo.leave_one_device_out`): each calibrated device's measured rows predicted with the
stack it would borrow if its own were missing; the median error is the borrowed
stack's uncertainty (`rack validate` prints the table).
"""

from __future__ import annotations

import functools
import math
import re

from .catalog import (SOFTWARE_FIELDS, CatalogError, _lookup_key, _raw_entries, _resolve_extends, _root,
                      device_stacks, get_device, resolve_device)
from .specs import HardwareSpec

#: Serving software names -> the catalog's stack key of their framework family. Builds
#: of a framework run its scheduler and kernels: Dynamo (NVIDIA's disaggregation layer)
#: over SGLang / TensorRT-LLM / vLLM; ATOM and MoRI-SGLang are AMD's SGLang-based builds
#: (InferenceX framework names "atom", "mori-sglang"); "trt" is InferenceX's name for
#: TensorRT-LLM.
FRAMEWORK_FAMILIES = {
    "sglang": "sglang", "dynamo-sglang": "sglang", "atom": "sglang", "mori-sglang": "sglang",
    "sglang-mori": "sglang",
    "trtllm": "trtllm", "trt": "trtllm", "tensorrt-llm": "trtllm", "tensorrtllm": "trtllm", "dynamo-trt": "trtllm",
    "vllm": "vllm", "dynamo-vllm": "vllm", "vllm-rocm": "vllm",
}
FRAMEWORK_NAMES = {"sglang": "SGLang", "trtllm": "TensorRT-LLM", "vllm": "vLLM"}
#: Entries fitted with few rows, taking their other terms from a sibling stack
#: (scripts/fit_gpu_stacks.py): a left-out device's rows must not reach its prediction
#: through them.
#: (None since the InferenceX rows: B200 and GB200 SGLang have 27 and 15 rows of their own.)
FIT_SIBLINGS: dict[str, str] = {}


def family(stack: str) -> str | None:
    """The framework family of a stack name (None: not a known framework)."""
    return FRAMEWORK_FAMILIES.get(re.sub(r"[\s_.]+", "-", stack.strip().lower()))


def hardware_distance(a: HardwareSpec, b: HardwareSpec) -> float:
    """How far apart two devices' hardware is: the sum of |log ratio| of memory
    bandwidth, 8-bit dense peak and memory capacity (0: the same figures)."""
    return (abs(math.log(a.memory_bandwidth_Bps / b.memory_bandwidth_Bps))
            + abs(math.log(a.dense_peak_flops("fp8") / b.dense_peak_flops("fp8")))
            + abs(math.log(a.memory_bytes / b.memory_bytes)))


@functools.lru_cache(maxsize=None)
def calibrated_entries(fam: str) -> tuple[str, ...]:
    """Catalog entries of framework family `fam` whose software terms were fitted on
    measured rows (their files borrow nothing: no `stack_from`)."""
    return tuple(k for k in _family_entries(fam) if not _raw_entries("devices")[k][1].get("stack_from"))


def _family_entries(fam: str) -> list[str]:
    """Every GPU catalog entry whose stack key is `fam`."""
    return [k for k, (path, data) in sorted(_raw_entries("devices").items())
            if data.get("kind", "gpu") != "wafer"
            and _resolve_extends("devices", data, path).get("stack", {}).get("key") == fam]


def nearest_calibrated(device: str, fam: str, exclude: tuple[str, ...] = ()) -> str:
    """The calibrated entry of family `fam` a device borrows: same vendor first, then
    the nearest hardware (`hardware_distance`); entries of `exclude`d hardware (catalog
    roots) and of the device's own hardware are skipped.

    Raises:
        CatalogError: no calibrated entry of the family.
    """
    root = _root(_lookup_key("devices", device))
    hw = get_device(root, "roofline") if "roofline" in device_stacks(root) else get_device(root)
    def skip(k: str) -> bool:
        sib = FIT_SIBLINGS.get(k)
        return _root(k) == root or _root(k) in exclude or (sib is not None and _root(sib) in exclude)

    cands = [k for k in calibrated_entries(fam) if not skip(k)]
    if not cands and not exclude:        # no fitted entry of the family: one that borrows itself
        cands = [k for k in _family_entries(fam) if not skip(k)]
    if not cands:
        raise CatalogError(f"no calibrated {FRAMEWORK_NAMES.get(fam, fam)} stack to borrow for {device!r}")
    return min(cands, key=lambda k: (get_device(k).vendor != hw.vendor, hardware_distance(hw, get_device(k)), k))


def borrowed_spec(device: str, lender: str, fam: str) -> HardwareSpec:
    """`device`'s hardware running the software terms of catalog entry `lender`."""
    root = _root(_lookup_key("devices", device))
    path, data = _raw_entries("devices")[root]
    base = _resolve_extends("devices", data, path)
    lpath, ldata = _raw_entries("devices")[lender]
    soft = _resolve_extends("devices", ldata, lpath)
    merged = {k: v for k, v in base.items() if k not in ("default_stack", "aliases")}
    merged.update({k: soft[k] for k in SOFTWARE_FIELDS if k in soft})
    merged["stack"] = {**soft.get("stack", {}), "key": fam, "aliases": []}
    merged["name"] = f"{base.get('name', root)} ({FRAMEWORK_NAMES.get(fam, fam)}, borrowed)"
    return HardwareSpec(key=f"{root}-{fam}", borrowed_from=lender, **merged)


def resolve_stack(device, stack: str | None = None) -> HardwareSpec:
    """A device spec for `device` (catalog name, file path or spec) running `stack`,
    borrowing the nearest calibrated stack when the pair has no entry (module docstring).

    Raises:
        CatalogError: unknown device, or a stack that is neither one of the device's
            nor a known framework (`FRAMEWORK_FAMILIES`).
    """
    if isinstance(device, HardwareSpec) or str(device).endswith((".toml", ".json")) or stack is None:
        return resolve_device(device, stack)
    return _catalog_stack(str(device), str(stack))


@functools.lru_cache(maxsize=None)
def _catalog_stack(device: str, stack: str) -> HardwareSpec:
    try:
        return resolve_device(device, stack)
    except CatalogError:
        fam = family(stack)
        if fam is None:
            raise
    stacks = device_stacks(device)
    if fam in stacks:
        return get_device(device, fam)
    own = get_device(device)
    if own.kind == "wafer":
        return own.model_copy(update={"borrowed_from": own.key, "name": f"{own.name} (no {FRAMEWORK_NAMES[fam]} "
                                                                      "on a wafer: its default stack)"})
    return borrowed_spec(device, nearest_calibrated(device, fam), fam)


def forget_cached() -> None:
    """Forget the stacks resolved so far (`resolve_stack`'s cache and the calibrated
    entries per family): a caller that rewrites catalog files (the stack fit) reads
    the new values after this and `devices.catalog`'s own cache clears."""
    _catalog_stack.cache_clear()
    calibrated_entries.cache_clear()


__all__ = ["FIT_SIBLINGS", "FRAMEWORK_FAMILIES", "FRAMEWORK_NAMES", "borrowed_spec", "calibrated_entries", "family",
           "forget_cached", "hardware_distance", "nearest_calibrated", "resolve_stack"]
