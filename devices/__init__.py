"""devices: hardware and model specs, the catalog, the roofline cost model, the memory
planner, memory managers and the engines.

`import devices` is cheap: the names below are loaded on first use (PEP 562), so a
process that only needs, say, `devices.memory` never imports pydantic or numpy here.

    from devices import get_model, get_device, CostModel, Parallelism, plan_memory
    cost = CostModel("kimi-k2", "cs3", Parallelism(pp=24), weight_dtype="fp8")
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "specs": ("ACTIVATION_BYTES", "DTYPES", "DTYPE_BYTES", "Dtype", "Efficiency", "HardwareSpec",
              "MLASpec", "MoESpec", "ModelSpec", "dtype_bytes"),
    "catalog": ("CatalogError", "device_names", "get_device", "get_model", "load_device_file",
                "load_hf_config", "load_model_file", "model_names", "resolve_device", "resolve_model"),
    "costmodel": ("CostModel", "IterationCost", "Parallelism", "SpeculativeConfig", "StepCosts"),
    "planner": ("MemoryPlan", "ModelDoesNotFit", "format_bytes", "plan_memory"),
    "validation": ("ValidationRow", "validate"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'devices' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
