"""The link model: LinkSpec validation, the transfer-time formula and the max-min fair
network (exact event times, faults, accounting, and a property test over random flows)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from interconnect.link import (
    CS3_IO_GBPS,
    FairShareNetwork,
    LinkSpec,
    path_cost,
    transfer_time_alone,
)

GB = 1e9


def _net(**bw_GBps: float) -> FairShareNetwork:
    return FairShareNetwork([LinkSpec(name=n, bandwidth_GBps=b) for n, b in bw_GBps.items()])


def _run_to_end(net: FairShareNetwork) -> dict:
    done = {}
    while net.n_flows:
        t = net.next_event_time()
        assert math.isfinite(t), "flows left that can never finish"
        done.update(net.advance(t))
    return done


# ---------------------------------------------------------------- LinkSpec and formula


def test_linkspec_units_and_validation():
    spec = LinkSpec(name="cs3", bandwidth_GBps=CS3_IO_GBPS, latency_us=5, per_message_us=2)
    assert spec.bandwidth_Bps == 150e9 and spec.latency_s == pytest.approx(5e-6)
    assert spec.per_message_s == pytest.approx(2e-6)
    for bad, field in [
        (dict(bandwidth_GBps=0), "bandwidth_GBps"),
        (dict(bandwidth_GBps=-1), "bandwidth_GBps"),
        (dict(bandwidth_GBps=math.inf), "bandwidth_GBps"),
        (dict(bandwidth_GBps=10, latency_us=-1), "latency_us"),
        (dict(bandwidth_GBps=10, per_message_us=math.nan), "per_message_us"),
        (dict(bandwidth_GBps=10, bandwidth_gbps=3), "bandwidth_gbps"),
    ]:
        with pytest.raises(ValidationError, match=field):
            LinkSpec(name="x", **bad)
    with pytest.raises(ValidationError, match="name"):
        LinkSpec(name="", bandwidth_GBps=1)


def test_path_cost_and_transfer_time_formula():
    a = LinkSpec(name="gpu-nic", bandwidth_GBps=100, latency_us=3, per_message_us=1)
    b = LinkSpec(name="cs3-io", bandwidth_GBps=150, latency_us=4, per_message_us=2.5)
    c = path_cost([a, b])
    assert c.bandwidth_Bps == 100e9
    assert c.per_message_s == pytest.approx(2.5e-6)  # max: messages pipeline through hops
    assert c.latency_s == pytest.approx(7e-6)  # sum: each hop adds its propagation
    t = transfer_time_alone([a, b], n_messages=10, logical_bytes=1e9)
    assert t == pytest.approx(10 * 2.5e-6 + 1e9 / 100e9 + 7e-6, rel=1e-12)
    with pytest.raises(ValueError):
        path_cost([])


# ---------------------------------------------------------------- fair sharing, exact times


def test_single_flow_drains_at_bytes_over_bandwidth():
    net = _net(l=2)
    net.add_flow("f", ["l"], 3 * GB, t=1.0)
    assert net.rate("f") == 2 * GB
    assert net.next_completion() == (2.5, "f")
    assert net.advance(2.4) == [] and net.remaining("f") == pytest.approx(0.2 * GB)
    assert net.advance(10) == [("f", 2.5)]
    assert net.n_flows == 0


def test_equal_sharing_then_speed_up_when_one_leaves():
    net = _net(l=1)
    net.add_flow(1, ["l"], 1 * GB, 0.0)
    net.add_flow(2, ["l"], 2 * GB, 0.0)
    assert net.rate(1) == net.rate(2) == 0.5 * GB
    assert _run_to_end(net) == {1: 2.0, 2: 3.0}


def test_arrival_midway_changes_rates():
    net = _net(l=1)
    net.add_flow("a", ["l"], 2 * GB, 0.0)
    net.add_flow("b", ["l"], 0.5 * GB, 1.0)  # a has 1 GB left; both at 0.5 GB/s
    assert net.rate("a") == 0.5 * GB
    # b drains at 2.0; a then has 0.5 GB at 1 GB/s -> 2.5
    assert _run_to_end(net) == {"b": 2.0, "a": 2.5}


def test_classic_max_min_example():
    net = _net(a=1, b=2)
    net.add_flow(1, ["a"], 1 * GB, 0)
    net.add_flow(2, ["a", "b"], 1 * GB, 0)
    net.add_flow(3, ["b"], 3 * GB, 0)
    # a is the bottleneck of flows 1 and 2 (0.5 each); flow 3 gets the rest of b
    assert net.flow_rates() == {1: 0.5 * GB, 2: 0.5 * GB, 3: 1.5 * GB}
    assert net.link_rates() == {"a": 1 * GB, "b": 2 * GB}
    assert _run_to_end(net) == {1: 2.0, 2: 2.0, 3: 2.0}


def test_zero_byte_flow_drains_at_once_and_remove_returns_remaining():
    net = _net(l=1)
    net.add_flow("z", ["l"], 0, 0.5)
    assert net.advance(0.5) == [("z", 0.5)]
    net.add_flow("x", ["l"], 1 * GB, 1.0)
    assert net.remove_flow("x", 1.25) == pytest.approx(0.75 * GB)
    assert net.n_flows == 0
    with pytest.raises(KeyError):
        net.remove_flow("x", 2.0)


def test_bad_flows_and_time_going_backwards():
    net = _net(l=1, m=1)
    with pytest.raises(KeyError, match="unknown link 'q'"):
        net.add_flow(1, ["q"], 1, 0)
    with pytest.raises(ValueError, match="empty path"):
        net.add_flow(1, [], 1, 0)
    with pytest.raises(ValueError, match="twice"):
        net.add_flow(1, ["l", "l"], 1, 0)
    with pytest.raises(ValueError, match="bytes"):
        net.add_flow(1, ["l"], -1, 0)
    net.add_flow(1, ["l"], 1, 1.0)
    with pytest.raises(ValueError, match="already active"):
        net.add_flow(1, ["m"], 1, 1.0)
    with pytest.raises(ValueError, match="backwards"):
        net.advance(0.5)
    with pytest.raises(ValueError, match="duplicate"):
        _net(l=1).__init__([LinkSpec(name="d", bandwidth_GBps=1)] * 2)


# ---------------------------------------------------------------- faults


def test_degrade_slows_then_resumes():
    net = _net(l=1)
    net.degrade("l", 0.5, 0.5, 1.5)
    net.add_flow("f", ["l"], 2 * GB, 0.0)
    # 0.5 GB by 0.5 s, 0.5 GB during the degraded second, 1 GB at full speed -> 2.5 s
    assert net.next_event_time() == 0.5
    assert _run_to_end(net) == {"f": 2.5}
    u = net.usage()["l"]
    assert u.series == ((0.0, 1.0), (0.5, 0.5), (1.5, 1.0), (2.5, 0.0))
    assert u.busy_s == pytest.approx(2.5) and u.bytes == pytest.approx(2 * GB)


def test_overlapping_degradations_multiply():
    net = _net(l=1)
    net.degrade("l", 0.5, 0.0, 2.0)
    net.degrade("l", 0.5, 1.0, 3.0)
    net.advance(1.0)
    assert net.capacity("l") == 0.25 * GB
    net.advance(2.0)
    assert net.capacity("l") == 0.5 * GB
    net.advance(3.0)
    assert net.capacity("l") == 1 * GB


def test_flap_stops_flows_and_they_resume():
    net = _net(l=1, m=1)
    net.add_flow("f", ["l", "m"], 2 * GB, 0.0)
    net.add_flow("g", ["m"], 1 * GB, 0.0)
    net.flap("l", 0.5, 1.5)
    assert net.advance(0.7) == []
    assert net.rate("f") == 0.0 and net.rate("g") == 1 * GB  # g takes the whole of m
    done = _run_to_end(net)
    # f: 0.25 GB by 0.5 (sharing m), stalls; g: 0.25 GB by 0.5 then 0.75 GB at full speed,
    # drains at 1.25; f resumes at 1.5 with 1.75 GB alone -> 3.25
    assert done == {"g": 1.25, "f": 3.25}
    usage = net.usage()
    assert usage["l"].busy_s == pytest.approx(0.5 + 1.75)  # idle while down
    assert usage["l"].bytes == pytest.approx(2 * GB) and usage["m"].bytes == pytest.approx(3 * GB)


def test_fault_rules():
    net = _net(l=1)
    with pytest.raises(ValueError, match="factor"):
        net.degrade("l", 0.0, 1, 2)
    with pytest.raises(ValueError, match="factor"):
        net.degrade("l", 1.5, 1, 2)
    with pytest.raises(ValueError, match="empty"):
        net.flap("l", 2, 2)
    with pytest.raises(KeyError, match="known links"):
        net.flap("nope", 1, 2)
    net.advance(5.0)
    net.degrade("l", 0.5, 1.0, 6.0)  # the past part is ignored, applies from now
    assert net.capacity("l") == 0.5 * GB
    net.flap("l", 1.0, 2.0)  # entirely in the past: no effect
    assert net.capacity("l") == 0.5 * GB
    net.advance(6.0)
    assert net.capacity("l") == 1 * GB


# ---------------------------------------------------------------- accounting


def test_usage_utilisation_peak_and_series():
    net = FairShareNetwork([LinkSpec(name="l", bandwidth_GBps=1)], t0=0.0)
    net.add_flow(1, ["l"], 1 * GB, 0.0)
    net.add_flow(2, ["l"], 1 * GB, 0.0)
    net.advance(4.0)
    u = net.usage()["l"]
    assert u.bytes == pytest.approx(2 * GB) and u.busy_s == pytest.approx(2.0)
    assert u.utilisation == pytest.approx(0.5) and u.peak_flows == 2
    assert u.series == ((0.0, 1.0), (2.0, 0.0))
    assert net.usage(8.0)["l"].utilisation == pytest.approx(0.25)


# ---------------------------------------------------------------- property test


def _check_invariants(net: FairShareNetwork) -> None:
    rates = net.flow_rates()
    paths = net.flow_paths()
    link_sum = net.link_rates()
    for name, total in link_sum.items():
        cap = net.capacity(name)
        assert total <= cap * (1 + 1e-9) + 1e-6, f"link {name} carries {total} > {cap}"
    # max-min fairness: every flow has a bottleneck link that is saturated and on which
    # no other flow gets more than it
    for fid, path in paths.items():
        ok = False
        for name in path:
            cap = net.capacity(name)
            saturated = link_sum[name] >= cap * (1 - 1e-9) - 1e-6
            biggest = max(r for f, r in rates.items() if name in paths[f])
            if saturated and rates[fid] >= biggest * (1 - 1e-9):
                ok = True
        assert ok, f"flow {fid} has no bottleneck (rate {rates[fid]})"


flow_st = st.tuples(
    st.floats(0, 5),  # start time (s)
    st.floats(0, 5e9),  # bytes
    st.sets(st.integers(0, 3), min_size=1, max_size=4),  # links crossed
)
fault_st = st.tuples(
    st.integers(0, 3), st.floats(0, 6), st.floats(0.01, 3), st.sampled_from([0.0, 0.1, 0.5, 0.9])
)


@settings(max_examples=120, deadline=None)
@given(
    bws=st.lists(st.floats(0.5, 200), min_size=4, max_size=4),
    flows=st.lists(flow_st, min_size=1, max_size=25),
    faults=st.lists(fault_st, max_size=4),
)
def test_random_flows_respect_capacity_finish_and_conserve_bytes(bws, flows, faults):
    names = [f"L{i}" for i in range(4)]
    net = FairShareNetwork([LinkSpec(name=n, bandwidth_GBps=b) for n, b in zip(names, bws)])
    for link, start, length, factor in faults:
        if factor == 0.0:
            net.flap(names[link], start, start + length)
        else:
            net.degrade(names[link], factor, start, start + length)
    arrivals = sorted(enumerate(flows), key=lambda x: (x[1][0], x[0]))
    done: dict[int, float] = {}
    steps = 0
    for fid, (start, nbytes, links) in arrivals:
        while net.next_event_time() <= start:
            done.update(net.advance(net.next_event_time()))
            _check_invariants(net)
            steps += 1
        net.add_flow(fid, [names[i] for i in sorted(links)], nbytes, start)
        done.update(net.advance(start))
        _check_invariants(net)
    while net.n_flows:
        t = net.next_event_time()
        assert math.isfinite(t)
        done.update(net.advance(t))
        _check_invariants(net)
        steps += 1
    # every flow finished exactly once, no earlier than its bottleneck allows
    assert sorted(done) == list(range(len(flows)))
    for fid, (start, nbytes, links) in enumerate(flows):
        fastest = nbytes / (min(bws[i] for i in links) * GB)
        assert done[fid] >= start + fastest * (1 - 1e-9) - 1e-12
    # bytes conserved on every link
    usage = net.usage()
    for i, name in enumerate(names):
        expected = sum(nbytes for _, nbytes, links in flows if i in links)
        assert usage[name].bytes == pytest.approx(expected, rel=1e-9, abs=1e-3)
        assert usage[name].utilisation <= 1.0
        assert all(0.0 <= u <= 1.0 + 1e-9 for _, u in usage[name].series)
    # O(events): steps are bounded by drains + capacity changes, never by bytes
    assert steps <= len(flows) + 2 * len(faults) + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(1, 10**9), st.sampled_from(["a", "b", "ab"])),
                min_size=1, max_size=12),
       st.booleans())
def test_drain_alone_is_the_event_loop_bit_for_bit(flows, series):
    """A lone flow carried in closed form leaves the network as `add_flow` then `advance`
    to its drain do: the same drain time and link figures to the last bit."""
    links = [LinkSpec(name="a", bandwidth_GBps=150.0), LinkSpec(name="b", bandwidth_GBps=87.0)]
    loop, closed = FairShareNetwork(links, series=series), FairShareNetwork(links, series=series)
    t = 0.0
    for i, (gap, nbytes, path) in enumerate(flows):
        t = max(t + gap, loop.now)
        path = tuple(path)
        loop.add_flow(i, path, nbytes, t)
        (fid, t_loop), = loop.advance(loop.next_event_time())
        assert closed.drain_alone(path, nbytes, t, math.inf) == t_loop and closed.now == loop.now
    assert closed.usage() == loop.usage()
    busy = FairShareNetwork(links)
    busy.add_flow("x", ("a",), 10**9, 0.0)
    assert busy.drain_alone(("a",), 1, 0.0, math.inf) is None        # not alone
    assert FairShareNetwork(links).drain_alone(("a",), 10**9, 0.0, 1e-6) is None   # drains after `by`
