"""The parameters of the study's experiments (`rack.experiments.study.experiments`):
deployments, workloads, rate ladders and SLO variants.

What runs is declared by a study spec (`rack.experiments.study.spec`; the shipped one,
findings.toml, is the study behind docs/findings.md): each section's grid becomes the
`StudyConfig` its experiment reads (`rack.experiments.study.sections.section_config`), on
top of `StudyConfig.full()` (workers, progress) or `StudyConfig.quick()` (a smoke test:
the spec's [section.quick] tables give the tiny inputs). The defaults below are the
shipped spec's values (a test checks they agree); every configuration run is written
into study.json.gz.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

# Deployments (rack/scenarios/*.toml), Kimi-K2 fp8 unless said.
GPU_ONLY = "gpu-only-kimi-k2"            # 32 MI455X, colocated
GPU72 = "helios72-gpu-only-kimi-k2"      # a full Helios rack (72 MI455X), colocated
WAFER = "wafer-only-kimi-k2"             # 28 CS-3, colocated ("the wafer alone")
SPLIT = "helios-cs3-kimi-k2"             # 16 MI455X prefill + 28 CS-3 decode
SPLIT72 = "helios72-cs3-kimi-k2"         # 72 MI455X prefill + 28 CS-3 decode
CONDITIONAL = "conditional-split-kimi-k2"
GPU_PD = "gpu-pd-kimi-k2"                # 32 MI455X, prefill and decode pools
A100 = "a100-llama2-70b"                 # Llama-2-70B, 16 A100, colocated
A100_PD = "a100-pd-llama2-70b"           # Llama-2-70B, 16 A100, prefill and decode pools

#: The deployments every sweep of the split-versus-colocated questions runs.
MAIN = (GPU_ONLY, GPU72, WAFER, SPLIT, SPLIT72)
#: `rack compare`'s four defaults plus the ones the study adds.
SHIPPED = (GPU_ONLY, WAFER, SPLIT, CONDITIONAL, SPLIT72, GPU72, GPU_PD)


def ladder(lo: float, hi: float, per_doubling: int = 2) -> tuple[float, ...]:
    """Rates from `lo` to `hi` (both included when hi/lo is a power of 2), `per_doubling`
    points per factor of 2 (2: a sqrt(2) ladder), rounded to 4 significant digits."""
    out, k = [], 0
    while True:
        v = lo * 2 ** (k / per_doubling)
        if v > hi * (1 + 1e-9):
            return tuple(out)
        out.append(float(f"{v:.4g}"))
        k += 1


@dataclass(frozen=True)
class StudyConfig:
    """One study's inputs (see the module docstring). Rates of trace workloads are
    multiples of the trace's own rate; rates of synthetic workloads are req/s."""

    quick_mode: bool = False                # StudyConfig.quick(): a smoke test, not the study
    target: float = 0.9                    # SLO attainment that defines a sustained rate (DistServe)
    workers: int = 2
    progress: bool = True
    # the shipped comparison (`rack compare` on the excerpt)
    excerpt: str = "mooncake-excerpt"
    excerpt_window: tuple | None = None
    # load: a window of the Mooncake conversation trace, rate-scaled
    trace: str = "mooncake_conv"
    window: tuple = (0.0, 600.0)
    rate_scales: tuple = ladder(0.25, 256)
    # prompt and output length: synthetic Poisson traffic, fixed lengths
    synthetic_n: int = 400                 # requests per point, or
    synthetic_duration_s: float = 12.0     # this many seconds of arrivals, whichever is more
    synthetic_rates: tuple = ladder(0.25, 256)
    prompt_lengths: tuple = (1024, 4096, 16384, 65536)
    prompt_output_tokens: int = 256
    output_lengths: tuple = (32, 128, 512, 2048)
    output_prompt_tokens: int = 8192
    # KV link bandwidth (GB/s)
    bandwidths: tuple = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 400.0, 1600.0)
    # long-context agentic traffic (a shipped workload file)
    agentic_workload: str = "agentic-coding"
    agentic_duration_s: float = 1200.0
    agentic_rate_scales: tuple = ladder(0.5, 64)
    # TPOT targets tighter than the scenarios' 80 ms (interactive speeds the wafer sells)
    tpot_slos_ms: tuple = (10.0, 2.0, 1.0)
    tpot_rate_scales: tuple = ladder(0.5, 128, 1)
    tpot_scenarios: tuple = (WAFER, SPLIT72)
    # GPU-only disaggregation at equal GPU count: (prefill, decode) instance counts
    pd_ratios: tuple = ((1, 3), (2, 2), (3, 1))
    pd_tpot_ms: tuple = (80.0, 20.0)        # the scenario's SLO, and a tighter one
    pd_rate_scales: tuple = ladder(0.25, 8)
    llama_trace: str = "azure_conv"
    llama_window: tuple = (0.0, 300.0)
    llama_pd_ratios: tuple = ((2, 6), (4, 4), (6, 2))
    llama_tpot_ms: tuple = (200.0, 100.0)
    llama_rate_scales: tuple = ladder(0.125, 4)
    main: tuple = MAIN
    shipped: tuple = SHIPPED

    @classmethod
    def full(cls, workers: int = 2, progress: bool = True) -> "StudyConfig":
        """The study behind docs/findings.md."""
        return cls(workers=workers, progress=progress)

    @classmethod
    def quick(cls, workers: int = 1, progress: bool = False) -> "StudyConfig":
        """Every experiment on tiny inputs: a smoke test of the whole pipeline."""
        return replace(
            cls(), quick_mode=True, workers=workers, progress=progress,
            excerpt_window=(0.0, 20.0), window=(0.0, 30.0), rate_scales=(1.0, 8.0),
            synthetic_n=30, synthetic_duration_s=2.0, synthetic_rates=(1.0, 16.0), prompt_lengths=(1024, 16384),
            output_lengths=(32, 512), bandwidths=(1.0, 400.0), agentic_duration_s=300.0,
            agentic_rate_scales=(1.0, 8.0), tpot_slos_ms=(2.0,), tpot_rate_scales=(1.0, 8.0),
            tpot_scenarios=(WAFER, SPLIT72), pd_ratios=((2, 2),), pd_tpot_ms=(80.0,),
            pd_rate_scales=(0.5, 4.0), llama_window=(0.0, 30.0), llama_pd_ratios=((4, 4),),
            llama_tpot_ms=(200.0,), llama_rate_scales=(0.5, 4.0),
            main=(GPU_ONLY, WAFER, SPLIT72), shipped=(GPU_ONLY, WAFER, SPLIT, SPLIT72))

    def as_dict(self) -> dict:
        """JSON-ready (tuples as lists)."""
        return asdict(self)


__all__ = ["A100", "A100_PD", "CONDITIONAL", "GPU72", "GPU_ONLY", "GPU_PD", "MAIN", "SHIPPED",
           "SPLIT", "SPLIT72", "StudyConfig", "WAFER", "ladder"]
