"""Layer 5 of rack/: one run, from a scenario and its requests to results:
`run_scenario` (topology -> a driver -> results.json and the per-request columns) and the
same as tasks of a parallel map (`tasks`).

May import: rack.runtime, rack.measure, rack.wiring, rack.serving; devices,
interconnect, workloads (docs/architecture.md).
"""
