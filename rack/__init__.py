"""rack: emulator of a heterogeneous LLM inference rack.

GPU prefill pools, wafer-scale SRAM decode engines and the KV interconnect between
them, driven by real request traces, on a virtual-time runtime or on Ray actors.

Layout, bottom to top (each folder imports only those before it; docs/architecture.md,
generated from the imports): `rack.serving` (router, collector, fault injector cores),
`rack.wiring` (scenario, sizing, topology), `rack.measure` (what one run measured),
`rack.runtime` (the virtual and Ray drivers), `rack.run` (`run_scenario`), `rack.serve`
(the HTTP endpoint), `rack.experiments` (compare, sweeps, study, validation, bench),
`rack.cli` (the `rack` command). This root imports nothing at load time: the main entry
points are re-exported here, loaded on first use, so that `import rack` stays light:

    from rack import load_scenario, run_scenario
    from workloads import load_requests
    out = run_scenario(load_scenario(), load_requests("mooncake-excerpt"), runtime="virtual")
"""

__version__ = "0.1.0"

_API = {"run_scenario": "rack.run.runner", "load_scenario": "rack.wiring.load",
        "parse_scenario": "rack.wiring.scenario", "Scenario": "rack.wiring.scenario"}


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'rack' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["Scenario", "__version__", "load_scenario", "parse_scenario", "run_scenario"]
