"""Layer 2 of rack/: from a scenario file to the cores a run needs: the scenario schema
and its settings (pydantic, from TOML), loading a shipped name or a file and checking it
against the hardware (`load`), the sizing of its pools, the topology of cores (faults
included), and the pacing limits of a dilated clock. Nothing here runs anything.

May import: rack.serving; devices, interconnect, workloads (docs/architecture.md).
"""
