"""Five behaviours that public bug reports in other simulators found (issue 37), each
checked against the physics or the definition it restates, not against rack's output."""

from __future__ import annotations

import numpy as np

from rack.measure import metrics


def test_offered_rate_of_a_steady_window_counts_arrivals_over_a_half_open_interval():
    # Definition: the offered rate is the arrivals of the window per second of it. A
    # trace at exactly 1 request/s puts n arrivals in n seconds: over [start, end) the
    # count is the window's length; a closed interval counts the arrival at `end` too,
    # 17 in 16 s (1.0625 req/s).
    for n in (21, 101, 1001):
        arrivals = np.arange(n, dtype=float)            # 1.000 req/s
        meets = np.ones(n, dtype=bool)
        g = metrics.goodput_section(arrivals, meets, float(n), 2.0, 0.08)
        assert g["basis"] == "steady_state"
        assert g["offered_requests_per_s"] == 1.0, (n, g["offered_requests_per_s"], g["window_s"])
        assert g["requests_per_s"] == 1.0
    # A window whose ends fall between arrivals holds its length x rate arrivals,
    # rounded either way: within one arrival of the rate
    arrivals = np.arange(400) * 0.25
    g = metrics.goodput_section(arrivals, np.ones(400, bool), 100.0, 2.0, 0.08)
    length = g["window_s"][1] - g["window_s"][0]
    assert abs(g["offered_requests_per_s"] - 4.0) <= 1.0 / length
