"""Serving engines: the GPU prefill engine, the decode engine (wafer-scale SRAM or GPU
HBM) and the colocated engine (both on one instance). Plain classes with async
methods, placed by a runtime (docs/interfaces.md)."""

from devices.engines.colocated import ColocatedEngine
from devices.engines.decode import DecodeEngine
from devices.engines.prefill import PrefillEngine

__all__ = ["ColocatedEngine", "DecodeEngine", "PrefillEngine"]
