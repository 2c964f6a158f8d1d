"""Layer 3 of rack/: what ONE run measured: per-request metrics (TTFT, TPOT, ITL,
goodput, SLO attainment), quantiles, energy and cost, the stage breakdown, the faults
section, time series, the results folder (results.json, requests.csv) and the plots of
one run. Reads the collector's records and the cores' stats; never reaches into a
running core, never starts a run. To change how TTFT is computed: `metrics`.

May import: rack.wiring, rack.serving; devices, interconnect, workloads
(docs/architecture.md).
"""
