"""Property: link sharing. Under any mix of flows, degradations and flaps, no link
carries more than its capacity at any time, every flow drains exactly once and no
earlier than its bytes allow, and the bytes each link carried equal the bytes of the
flows that crossed it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interconnect.link import FairShareNetwork, LinkSpec

LINKS = ("a", "b", "c")
GBPS = {"a": 10.0, "b": 4.0, "c": 25.0}

paths = st.lists(st.sampled_from(LINKS), min_size=1, max_size=3, unique=True)
flows = st.lists(st.tuples(st.floats(0.0, 2.0), paths, st.integers(0, 3 * 10**9)), min_size=1, max_size=12)
faults = st.lists(st.tuples(st.sampled_from(LINKS), st.floats(0.0, 2.0), st.floats(0.01, 1.0),
                            st.one_of(st.none(), st.floats(0.05, 1.0))), max_size=4)


@settings(max_examples=120, deadline=None)
@given(flows=flows, faults=faults)
def test_no_link_above_capacity_and_bytes_conserved(flows, faults):
    net = FairShareNetwork([LinkSpec(name=n, bandwidth_GBps=GBPS[n]) for n in LINKS])
    for link, start, dur, factor in faults:          # factor None: the link flaps (down)
        if factor is None:
            net.flap(link, start, start + dur)
        else:
            net.degrade(link, factor, start, start + dur)
    arrivals = sorted(((t, i, p, b) for i, (t, p, b) in enumerate(flows)), key=lambda x: (x[0], x[1]))
    drained: dict[int, float] = {}
    k = 0
    t = 0.0
    steps = 0
    while k < len(arrivals) or net.n_flows:
        steps += 1
        assert steps < 10_000, "the network does not progress"
        t_next = net.next_event_time()
        if k < len(arrivals) and arrivals[k][0] <= t_next:
            t = arrivals[k][0]
            _, i, path, nbytes = arrivals[k]
            net.add_flow(i, path, nbytes, t)
            k += 1
        else:
            assert math.isfinite(t_next), "flows left but no event to move them"
            t = t_next
        for fid, when in net.advance(t):
            assert fid not in drained, "a flow drained twice"
            drained[fid] = when
        rates = net.link_rates()
        for name in LINKS:
            assert rates[name] <= net.capacity(name) * (1 + 1e-9) + 1e-6, (name, rates[name])
            assert net.capacity(name) <= GBPS[name] * 1e9
    assert set(drained) == set(range(len(flows)))
    for i, (start, path, nbytes) in enumerate(flows):
        fastest = nbytes / (min(GBPS[n] for n in path) * 1e9)
        assert drained[i] >= start + fastest * (1 - 1e-9)
    usage = net.usage()
    for name in LINKS:
        crossed = sum(b for _, p, b in flows if name in p)
        assert usage[name].bytes == pytest.approx(crossed, rel=1e-9, abs=1e-3)
        assert 0.0 <= usage[name].utilisation <= 1.0

