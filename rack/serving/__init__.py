"""Layer 1 of rack/ (the bottom): the rack's own cores besides the engines
(`workloads.core` cores, like `devices.engines`): the router (admission, routing, closed
loop, fault recovery), the metrics collector and its record columns, the fault injector,
prefix-aware routing and the admission rules they apply.

May import: devices, interconnect, workloads. Nothing of rack/ (docs/architecture.md).
"""
