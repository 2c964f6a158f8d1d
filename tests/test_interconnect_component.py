"""The Interconnect component on the virtual-time loop: exact transfer times, sharing,
verification on arrival, faults, errors, stats, determinism and O(events) work."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from interconnect import (
    Interconnect,
    InterconnectConfigError,
    LinkSpec,
    TransferError,
    corrupt_frame,
    make_kv_frames,
    transfer_time_alone,
    verify_kv_frames,
)
from rack.runtime.virtual import run_virtual
from workloads.request import Request

GB = 1e9
KVPT = 131072  # Llama-3.1-8B KV bytes/token at 16-bit (reference/hardware.md)
SCALE = 1e-4


class Receiver:
    """A decode-engine stand-in: verifies frames like the real one must."""

    def __init__(self, clock=None):
        self.clock = clock
        self.got: list[tuple[int, int, int, float, float | None]] = []

    async def receive_kv(self, req, frames, first_token_s):
        good, bad, _, _ = verify_kv_frames(frames)
        self.got.append((req.id, good, bad, first_token_s, self.clock.now() if self.clock else None))
        return bad


class CountingClock:
    """Wraps a clock and counts the waits it is asked for."""

    def __init__(self, inner):
        self.inner = inner
        self.waits = 0

    def now(self):
        return self.inner.now()

    async def sleep_until(self, t):
        self.waits += 1
        await self.inner.sleep_until(t)

    async def wait_until(self, event, t):
        self.waits += 1
        return await self.inner.wait_until(event, t)


def _req(i: int, prompt: int = 1000) -> Request:
    return Request(id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=10)


def _frames(i: int, tokens: int = 1000, scale: float = SCALE) -> list[np.ndarray]:
    return make_kv_frames(i, tokens, KVPT, 32, 8, scale, kv_dtype="bf16")


def _ic(clock, receiver, links=None, routes=None, scale=SCALE):
    links = links or [LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)]
    routes = routes or {("p", "d"): ["l"]}
    return Interconnect(clock=clock, links=links, routes=routes, receivers={"d": receiver}, payload_scale=scale)


def test_single_transfer_matches_formula_and_is_verified():
    spec = LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)

    async def main(clock):
        rx = Receiver(clock)
        ic = _ic(clock, rx, links=[spec])
        await clock.sleep_until(1.0)
        res = await ic.transfer(_req(1), _frames(1), 1000 * KVPT, "p", "d", first_token_s=0.9)
        return res, rx.got

    res, got = run_virtual(main)
    expected = transfer_time_alone([spec], 4, 1000 * KVPT)
    assert res.start_s == 1.0
    assert res.end_s == pytest.approx(1.0 + expected, rel=1e-12)
    assert res.wire_start_s == pytest.approx(1.0 + 4 * 2e-6)
    assert res.wire_end_s == pytest.approx(res.wire_start_s + 1000 * KVPT / 10e9)
    assert (res.n_frames, res.logical_bytes, res.bad_frames) == (4, 1000 * KVPT, 0)
    assert res.payload_bytes == sum(f.nbytes for f in _frames(1))
    assert got == [(1, 4, 0, 0.9, res.end_s)]  # receiver called when the last byte arrived


def test_concurrent_transfers_share_max_min_fairly():
    # 1 GB/s link, no fixed costs: a 1 GB and a 2 GB transfer start together
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        small = ic.transfer(_req(1), _frames(1, tokens=7630), 7630 * KVPT, "p", "d")
        big = ic.transfer(_req(2), _frames(2, tokens=15260), 15260 * KVPT, "p", "d")
        return await asyncio.gather(small, big)

    small, big = run_virtual(main)
    b1, b2 = 7630 * KVPT, 15260 * KVPT  # ~1 GB and ~2 GB
    assert small.end_s == pytest.approx(2 * b1 / GB, rel=1e-12)  # half the link until done
    assert big.end_s == pytest.approx((b1 + b2) / GB, rel=1e-12)  # then the whole link


def test_staggered_arrival_slows_the_first_transfer():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        first = asyncio.ensure_future(ic.transfer(_req(1), _frames(1, 7630), b, "p", "d"))
        await clock.sleep_until(0.5 * b / GB)  # first is half done
        second = await ic.transfer(_req(2), _frames(2, 7630), b, "p", "d")
        return await first, second

    first, second = run_virtual(main)
    # from 0.5 b/GB both share: first's remaining b/2 takes b/GB, then second alone
    assert first.end_s == pytest.approx(1.5 * b / GB, rel=1e-12)
    assert second.end_s == pytest.approx(2.0 * b / GB, rel=1e-12)


def test_multi_hop_route_uses_bottleneck_and_sums_latency():
    gpu = LinkSpec(name="gpu-nic", bandwidth_GBps=100, latency_us=3, per_message_us=1)
    cs3 = LinkSpec(name="cs3-io", bandwidth_GBps=150, latency_us=4, per_message_us=2)

    async def main(clock):
        rx = Receiver()
        ic = Interconnect(clock=clock, links=[gpu, cs3], routes={("p0", "d0"): ["gpu-nic", "cs3-io"]},
                          receivers={"d0": rx}, payload_scale=SCALE)
        return await ic.transfer(_req(3), _frames(3), 1000 * KVPT, "p0", "d0")

    res = run_virtual(main)
    assert res.path == ("gpu-nic", "cs3-io")
    assert res.duration_s == pytest.approx(4 * 2e-6 + 1000 * KVPT / 100e9 + 7e-6, rel=1e-12)


def test_corrupted_frames_are_reported_by_the_receiver():
    async def main(clock):
        ic = _ic(clock, Receiver())
        frames = _frames(4)
        frames[1] = corrupt_frame(frames[1], seed=5)
        frames[3] = corrupt_frame(frames[3], seed=6)
        res = await ic.transfer(_req(4), frames, 1000 * KVPT, "p", "d")
        ok = await ic.transfer(_req(5), _frames(5), 1000 * KVPT, "p", "d")
        return res, ok, await ic.stats()

    res, ok, stats = run_virtual(main)
    assert res.bad_frames == 2 and ok.bad_frames == 0
    assert stats["checksum_failures"] == 2 and stats["failed_transfers"] == 1 and stats["transfers"] == 2


def test_flap_delays_transfer_by_the_outage_and_degrade_by_the_lost_bandwidth():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT
    alone = b / GB

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        await ic.flap("l", 0.1, 0.4)
        flapped = await ic.transfer(_req(1), _frames(1, 7630), b, "p", "d")
        t = clock.now()
        await ic.degrade("l", 0.5, t, t + 0.2)
        degraded = await ic.transfer(_req(2), _frames(2, 7630), b, "p", "d")
        return flapped, degraded, await ic.stats()

    flapped, degraded, stats = run_virtual(main)
    assert flapped.duration_s == pytest.approx(alone + 0.3, rel=1e-12)
    assert degraded.duration_s == pytest.approx(alone + 0.1, rel=1e-12)  # 0.2 s at half speed
    series = stats["links"]["l"]["series"]
    assert [0.1, 0.0] in series and [0.4, 1.0] in series
    assert all(u <= 1.0 for _, u in series)


def test_link_down_during_a_flow_that_is_already_waiting():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        task = asyncio.ensure_future(ic.transfer(_req(1), _frames(1, 7630), b, "p", "d"))
        await clock.sleep_until(0.2)
        await ic.flap("l", 0.2, 0.7)  # starts now, while the flow is in progress
        return await task

    assert run_virtual(main).end_s == pytest.approx(b / GB + 0.5, rel=1e-12)


def test_zero_byte_transfer_pays_only_fixed_costs():
    async def main(clock):
        ic = _ic(clock, Receiver())
        return await ic.transfer(_req(1), [], 0, "p", "d")

    res = run_virtual(main)
    assert res.duration_s == pytest.approx(5e-6) and res.n_frames == 0


def test_construction_errors_name_the_problem():
    rx = Receiver()
    link = LinkSpec(name="l", bandwidth_GBps=1)

    class C:
        def now(self):
            return 0.0

    cases = [
        (dict(links=[link], routes={("p", "d"): ["x"]}), "unknown link"),
        (dict(links=[link], routes={("p", "zz"): ["l"]}), "no receiver for endpoint 'zz'"),
        (dict(links=[link], routes={("p", "d"): []}), "empty path"),
        (dict(links=[link], routes={("p", "d"): ["l", "l"]}), "twice"),
        (dict(links=[link, link], routes={}), "duplicate link"),
        (dict(links=[], routes={}), "at least one link"),
        (dict(links=[link], routes={"p": ["l"]}), "pair"),
        (dict(links=[link], routes={}, payload_scale=0.0), "payload_scale"),
    ]
    for kw, match in cases:
        args = dict(clock=C(), receivers={"d": rx}, payload_scale=0.1)
        args.update(kw)
        with pytest.raises(InterconnectConfigError, match=match):
            Interconnect(**args)


def test_transfer_errors():
    async def main(clock):
        ic = _ic(clock, Receiver())
        errors = []
        for call in [
            lambda: ic.transfer(_req(1), _frames(1), 1000 * KVPT, "p", "nowhere"),
            lambda: ic.transfer(_req(1), _frames(1), -1, "p", "d"),
            lambda: ic.transfer(_req(1), _frames(1), 999 * KVPT, "p", "d"),
            lambda: ic.transfer(_req(2), _frames(1), 1000 * KVPT, "p", "d"),
            lambda: ic.transfer(_req(1), _frames(1, scale=1e-3), 1000 * KVPT, "p", "d"),
            lambda: ic.transfer(_req(1), ["x"], 1000 * KVPT, "p", "d"),
        ]:
            with pytest.raises(TransferError) as info:
                await call()
            errors.append(str(info.value))
        return errors

    errors = run_virtual(main)
    assert "no route from 'p' to 'nowhere'" in errors[0]
    assert "logical_bytes" in errors[1]
    assert "carry 131072000 logical bytes but the transfer says 130940928" in errors[2]
    assert "names request 1" in errors[3]
    assert "payload_scale" in errors[4]
    assert "frame 0 is a str" in errors[5]


def test_unreadable_header_is_left_to_the_receiver():
    async def main(clock):
        ic = _ic(clock, Receiver())
        frames = _frames(1)
        frames[0] = np.zeros(10, np.uint8)
        return await ic.transfer(_req(1), frames, 1000 * KVPT, "p", "d")

    assert run_virtual(main).bad_frames == 1


def test_cancelled_transfer_frees_its_bandwidth():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        doomed = asyncio.ensure_future(ic.transfer(_req(1), _frames(1, 4 * 7630), 4 * b, "p", "d"))
        other = asyncio.ensure_future(ic.transfer(_req(2), _frames(2, 7630), b, "p", "d"))
        await clock.sleep_until(0.5 * b / GB)  # each has moved b/4
        doomed.cancel()
        res = await other
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return res, await ic.stats()

    res, stats = run_virtual(main)
    assert res.end_s == pytest.approx(0.5 * b / GB + 0.75 * b / GB, rel=1e-12)
    assert stats["transfers"] == 1 and stats["in_flight"] == 0


def test_stats_report_links_and_samples():
    spec = LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)

    async def main(clock):
        ic = _ic(clock, Receiver(), links=[spec])
        results = await asyncio.gather(*(ic.transfer(_req(i), _frames(i), 1000 * KVPT, "p", "d") for i in range(3)))
        await ic.drain()
        await clock.sleep_until(clock.now() + 0.01)
        return results, await ic.stats()

    results, stats = run_virtual(main)
    link = stats["links"]["l"]
    assert link["transfers"] == 3 and link["peak_flows"] == 3
    assert link["bytes_logical"] == 3 * 1000 * KVPT == stats["bytes_logical"]
    assert link["bytes_shipped"] == sum(r.payload_bytes for r in results) == stats["bytes_shipped"]
    assert link["bytes_carried"] == pytest.approx(3 * 1000 * KVPT)
    assert link["busy_s"] == pytest.approx(3 * 1000 * KVPT / 10e9)
    assert link["utilisation"] == pytest.approx(3 * 1000 * KVPT / (10e9 * stats["elapsed_s"]))
    assert link["series"][0] == [pytest.approx(8e-6), 1.0] and link["series"][-1][1] == 0.0
    assert stats["transfer_time_s"] == [r.duration_s for r in results]
    assert stats["in_flight"] == 0 and stats["payload_scale"] == SCALE


def _scenario(clock, n=60):
    rng = np.random.default_rng(7)
    links = [LinkSpec(name="a", bandwidth_GBps=5), LinkSpec(name="b", bandwidth_GBps=8)]
    routes = {("p0", "d"): ["a", "b"], ("p1", "d"): ["b"]}
    ic = Interconnect(clock=clock, links=links, routes=routes, receivers={"d": Receiver()}, payload_scale=SCALE)

    async def one(i):
        await clock.sleep_until(float(rng.exponential(0.05)) * i / 4)
        tokens = int(rng.integers(100, 4000))
        return await ic.transfer(_req(i, tokens), _frames(i, tokens), tokens * KVPT, f"p{i % 2}", "d")

    return ic, [one(i) for i in range(n)]


def test_runs_are_deterministic_and_work_grows_with_events():
    def run():
        async def main(clock):
            counting = CountingClock(clock)
            ic, coros = _scenario(counting)
            results = await asyncio.gather(*coros)
            return results, await ic.stats(), counting.waits

        return run_virtual(main)

    (r1, s1, waits), (r2, s2, _) = run(), run()
    assert r1 == r2 and s1 == s2
    n = len(r1)
    # per transfer: one per-message sleep, one wait for its flow, one latency sleep
    # (+ one sleep of the scenario itself); the driver wakes once per flow event
    assert waits <= 4 * n + 2 * n + 5
    for name in ("a", "b"):
        assert all(u <= 1.0 + 1e-9 for _, u in s1["links"][name]["series"])
    assert s1["links"]["b"]["transfers"] == n


def test_wall_clock_loop_gives_model_times_despite_lateness():
    # a real asyncio loop: wake-ups are late by scheduler jitter, the modelled times are not
    from interconnect.link import FairShareNetwork
    from rack.runtime.virtual import LoopClock

    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=100, per_message_us=10)
    b1, b2 = 200 * KVPT, 100 * KVPT  # ~26 ms and ~13 ms alone at 1 GB/s
    f1, f2 = _frames(1, 200), _frames(2, 100)

    async def main():
        loop = asyncio.get_running_loop()
        clock = LoopClock(loop, origin=loop.time())
        ic = _ic(clock, Receiver(), links=[spec])
        results = await asyncio.gather(ic.transfer(_req(1), f1, b1, "p", "d"), ic.transfer(_req(2), f2, b2, "p", "d"))
        return results, clock.now()

    (r1, r2), t_done = asyncio.run(main())
    # replay the model from the recorded start times: the results must match it exactly
    net = FairShareNetwork([spec])
    for r in sorted((r1, r2), key=lambda r: r.wire_start_s):
        assert r.wire_start_s == pytest.approx(r.start_s + 4 * 10e-6, abs=1e-12)
        net.add_flow(r.request_id, ["l"], r.logical_bytes, r.wire_start_s)
    drained = dict(net.advance(1.0))
    for r in (r1, r2):
        assert r.wire_end_s == pytest.approx(drained[r.request_id], abs=1e-12)
        assert r.end_s == pytest.approx(r.wire_end_s + 100e-6, abs=1e-12)
    assert t_done >= max(r1.end_s, r2.end_s)
