"""Layer 7 of rack/: experiments over many runs: `compare`, rate/bandwidth/length
sweeps and capacity search (with early stopping, `slo_watch`), interactivity curves,
the split-versus-colocated study (`study/`: to add a section, `study/sections.py` and
`study/findings.toml`), validation against measured serving, the emulator's own
benchmarks, and the one-page reports.

May import: every layer below (rack.serve, rack.run, rack.runtime, rack.measure,
rack.wiring, rack.serving); devices, interconnect, workloads. Never rack.cli
(docs/architecture.md).
"""
