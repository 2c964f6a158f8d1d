"""Layer 4 of rack/: the two drivers that place the same cores: `virtual` (one process,
virtual time, deterministic) and `ray` (one Ray actor per core, dilated wall clock),
their hosting and watching of actors, signals, errors, and parallel maps of independent
runs (local processes or Ray tasks).

Only `rack.runtime.ray_runtime` and its hosts import Ray, and only when a Ray run is
asked for. May import: rack.measure, rack.wiring, rack.serving; devices, interconnect,
workloads (docs/architecture.md).
"""
