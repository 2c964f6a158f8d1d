"""rack: emulator of a heterogeneous LLM inference rack.

GPU prefill pools, wafer-scale SRAM decode engines and the KV interconnect between
them, driven by real request traces, on a virtual-time runtime or on Ray actors.
"""

__version__ = "0.1.0"
