"""The split-versus-colocated study (issue 14, "Redo the study"): where GPU prefill +
wafer decode beats the wafer alone and the GPUs alone on tokens per joule, dollars per
million tokens and goodput under SLO, and where it loses; a full Helios rack as the
GPU side; the vendors' "up to 5x tokens per watt"; and prefill/decode disaggregation on
GPUs alone.

`python scripts/study.py` (or `rack study`) runs it and writes docs/findings.md, its
figures and study.json.gz (every point of every run). Modules:

- `config`: what runs (deployments, workloads, rate ladders, SLO variants; full and quick);
- `experiments`: the runs, through `rack.experiments.compare.run_compare` and `rack.sweep`;
- `analysis`: pairwise verdicts at capacity and at equal load, the claims' ratios;
- `figures`, `text`, `findings`: the figures and the page, built from measured values only;
- `run`: the whole study, provenance, and writing it out.
"""

from rack.experiments.study.config import StudyConfig

__all__ = ["StudyConfig"]
