"""Workloads: requests, the emulated clock, trace readers, synthetic generators, replay.

The bottom package of the project: it imports nothing else of it, and importing it
does not import numpy (the generators, which need numpy, load on first use).

Traces::

    from workloads import open_trace, load_requests, trace_stats
    reader = open_trace("azure_conv")            # lazy; NAME or PATH; format detected
    for req in reader: ...                       # Request(id, arrival_s, prompt_tokens, ...)
    reqs = load_requests("mooncake-excerpt", window=(0, 60), rate_scale=2.0)
    trace_stats("mooncake_conv").to_dict()

Synthetic::

    from workloads import synthesize, GammaArrivals, LogNormalLengths
    reqs = synthesize(GammaArrivals(rate_per_s=5, cv=2),
                      LogNormalLengths(2000, 1.0, 200, 1.0), n=1000, seed=1)

See docs/workloads.md for formats, names, error messages and the statistics' definitions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import TraceError
from .formats import FORMATS, Schema
from .names import resolve_trace, trace_dirs, trace_names
from .reader import TraceReader, open_trace
from .replay import (RequestList, load_requests, parse_window, replay, sample_fraction,
                     scale_output, scale_rate, select_window, take)
from .request import Request, Turn
from .stats import LengthStats, PrefixHits, TraceStats, ideal_prefix_hits, trace_stats

# Generators need numpy; load them on first attribute access (PEP 562) so that
# `import workloads` stays light.
_LAZY = {
    "PoissonArrivals": "arrivals", "GammaArrivals": "arrivals", "WeibullArrivals": "arrivals",
    "ConstantArrivals": "arrivals", "arrival_times": "arrivals", "window_times": "arrivals",
    "FixedLengths": "lengths", "UniformLengths": "lengths", "LogNormalLengths": "lengths",
    "EmpiricalLengths": "lengths", "IndependentLengths": "lengths", "FixedTokens": "lengths",
    "UniformTokens": "lengths", "LogNormalTokens": "lengths", "PmfTokens": "lengths",
    "random_dataset_lengths": "lengths",
    "synthesize": "synth", "ClosedLoop": "synth", "ClosedLoopSource": "synth",
    "make_arrivals": "synth", "make_lengths": "synth",
    "shared_prefix_requests": "prefix", "PrefixHasher": "prefix",
    "LoadControls": "load", "apply_load": "load", "retime": "load",
    "random_dataset": "load", "closed_loop": "load", "LoadPlan": "load",
    "WorkloadSpec": "workload_spec", "load_workload": "workload_spec",
    "WorkloadSpecError": "workload_spec", "workload_names": "workload_spec",
    "generate_workload": "mixture", "realised_windows": "mixture",
    "session_chains": "sessions", "take_sessions": "sessions", "count_sessions": "sessions",
    "RequestTable": "table",
}

if TYPE_CHECKING:  # pragma: no cover
    from .arrivals import (ConstantArrivals, GammaArrivals, PoissonArrivals, WeibullArrivals,
                           arrival_times, window_times)
    from .lengths import (EmpiricalLengths, FixedLengths, FixedTokens, IndependentLengths,
                          LogNormalLengths, LogNormalTokens, PmfTokens, UniformLengths,
                          UniformTokens, random_dataset_lengths)
    from .load import LoadControls, LoadPlan, apply_load, closed_loop, random_dataset, retime
    from .mixture import generate_workload, realised_windows
    from .prefix import PrefixHasher, shared_prefix_requests
    from .sessions import count_sessions, session_chains, take_sessions
    from .synth import ClosedLoop, ClosedLoopSource, make_arrivals, make_lengths, synthesize
    from .table import RequestTable
    from .workload_spec import WorkloadSpec, WorkloadSpecError, load_workload, workload_names


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Request", "Turn", "TraceError", "TraceReader", "open_trace", "load_requests", "RequestList",
    "trace_stats", "ideal_prefix_hits", "PrefixHits", "TraceStats", "LengthStats", "resolve_trace", "trace_names", "trace_dirs",
    "replay", "select_window", "scale_rate", "sample_fraction", "take", "scale_output",
    "parse_window", "Schema", "FORMATS", *_LAZY,
]
