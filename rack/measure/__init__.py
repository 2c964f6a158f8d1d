"""What a run measured, and what people read: metrics, the stage breakdown, energy and
cost, comparisons and sweeps, reports and plots, results folders, validation against
measured serving, benchmarks. Reads the collector's records and the cores' stats;
never reaches into a running core."""
