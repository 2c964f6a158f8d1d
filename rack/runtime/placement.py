"""Shared by both drivers: build cores from `ComponentSpec`s."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from rack.wiring.topology import ComponentSpec, Ref


def load_factory(path: str) -> Callable[..., Any]:
    """The class named by "module:Class"."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def resolve_refs(value: Any, lookup: Callable[[str], Any]) -> Any:
    """`value` with every `Ref(name)` (also inside dicts, lists, tuples) replaced by `lookup(name)`."""
    if isinstance(value, Ref):
        return lookup(value.name)
    if isinstance(value, dict):
        return {k: resolve_refs(v, lookup) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, lookup) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_refs(v, lookup) for v in value)
    return value


def construct(spec: ComponentSpec, loading_until_s: float | None = None) -> Any:
    """The core of `spec`, its peers given by name; `loading_until_s`: a restarted
    core that reloads its weights until then (`rack.wiring.faults`)."""
    kwargs = resolve_refs(spec.kwargs, lambda name: name)
    if loading_until_s is not None:
        kwargs["loading_until_s"] = loading_until_s
    return load_factory(spec.factory)(**kwargs)
