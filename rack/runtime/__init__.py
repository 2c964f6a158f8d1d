"""The two runtimes that place the same components: `virtual` (one process, virtual
time, deterministic) and `ray` (one Ray actor per component, dilated wall clock).

Only `rack.runtime.ray_runtime` imports Ray, and only when a Ray run is asked for.
"""
