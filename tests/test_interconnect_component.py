"""The Interconnect core on the virtual driver: exact transfer times, sharing,
verification on arrival, faults, errors, stats, determinism and O(events) work."""

from __future__ import annotations

import math

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
from workloads.core import Core
from workloads.request import Request

from _engine_fakes import Client, run_cores

GB = 1e9
KVPT = 131072  # Llama-3.1-8B KV bytes/token at 16-bit (reference/hardware.md)
SCALE = 1e-4


class Receiver(Core):
    """A decode-engine stand-in: verifies frames like the real one must and replies the
    bad count (-1 for the request ids in `lost`: it holds no reservation for them, as
    after a restart)."""

    def __init__(self, name="d", lost=()):
        super().__init__(name)
        self.lost = set(lost)
        self.got: list[tuple[int, int, int, float | None, float]] = []

    def receive_kv(self, now, req, frames, first_token_s, reply_to, tag):
        good, bad, _, _ = verify_kv_frames(frames)
        self.got.append((req.id, good, bad, first_token_s, now))
        self.send(reply_to, "kv_received", tag, -1 if req.id in self.lost else bad)


def _req(i: int, prompt: int = 1000) -> Request:
    return Request(id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=10)


def _frames(i: int, tokens: int = 1000, scale: float = SCALE) -> list[np.ndarray]:
    return make_kv_frames(i, tokens, KVPT, 32, 8, scale, kv_dtype="bf16")


def _ic(links=None, routes=None, scale=SCALE, receivers=("d",)):
    links = links or [LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)]
    routes = routes or {("p", "d"): ["l"]}
    return Interconnect(links=links, routes=routes, receivers=list(receivers), payload_scale=scale)


def _send(t, i, tokens=1000, *, frames=None, logical=None, src="p", dst="d", first_token_s=None):
    """A client script entry: at t, ship request i's KV (`tokens` tokens) from src to
    dst (tag i)."""
    frames = _frames(i, tokens) if frames is None else frames
    logical = tokens * KVPT if logical is None else logical
    return (t, "interconnect", "transfer", _req(i, tokens), frames, logical, src, dst, first_token_s, i)


def _run(ic, *clients, receiver=None):
    """Run senders `clients` (named after their endpoints), `ic` and a receiver until
    idle; returns ({tag: TransferResult or None}, receiver, driver)."""
    rx = receiver or Receiver()
    drv = run_cores([*clients, ic, rx])
    return {tag: res for c in clients for tag, res in c.of("transfer_done")}, rx, drv


def test_single_transfer_matches_formula_and_is_verified():
    spec = LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)
    res, rx, _ = _run(_ic(links=[spec]), Client([_send(1.0, 1, first_token_s=0.9)], name="p"))
    res = res[1]
    expected = transfer_time_alone([spec], 4, 1000 * KVPT)
    assert res.start_s == 1.0
    assert res.end_s == pytest.approx(1.0 + expected, rel=1e-12)
    assert res.wire_start_s == pytest.approx(1.0 + 4 * 2e-6)
    assert res.wire_end_s == pytest.approx(res.wire_start_s + 1000 * KVPT / 10e9)
    assert (res.n_frames, res.logical_bytes, res.bad_frames) == (4, 1000 * KVPT, 0)
    assert res.payload_bytes == sum(f.nbytes for f in _frames(1))
    assert rx.got == [(1, 4, 0, 0.9, res.end_s)]  # receiver called when the last byte arrived


def test_concurrent_transfers_share_max_min_fairly():
    # 1 GB/s link, no fixed costs: a 1 GB and a 2 GB transfer start together
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    res, _, _ = _run(_ic(links=[spec]), Client([_send(0.0, 1, 7630), _send(0.0, 2, 15260)], name="p"))
    small, big = res[1], res[2]
    b1, b2 = 7630 * KVPT, 15260 * KVPT  # ~1 GB and ~2 GB
    assert small.end_s == pytest.approx(2 * b1 / GB, rel=1e-12)  # half the link until done
    assert big.end_s == pytest.approx((b1 + b2) / GB, rel=1e-12)  # then the whole link


def test_staggered_arrival_slows_the_first_transfer():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT
    res, _, _ = _run(_ic(links=[spec]), Client([_send(0.0, 1, 7630), _send(0.5 * b / GB, 2, 7630)], name="p"))
    first, second = res[1], res[2]                 # the second starts when the first is half done
    # from 0.5 b/GB both share: first's remaining b/2 takes b/GB, then second alone
    assert first.end_s == pytest.approx(1.5 * b / GB, rel=1e-12)
    assert second.end_s == pytest.approx(2.0 * b / GB, rel=1e-12)


def test_multi_hop_route_uses_bottleneck_and_sums_latency():
    gpu = LinkSpec(name="gpu-nic", bandwidth_GBps=100, latency_us=3, per_message_us=1)
    cs3 = LinkSpec(name="cs3-io", bandwidth_GBps=150, latency_us=4, per_message_us=2)
    ic = Interconnect(links=[gpu, cs3], routes={("p0", "d0"): ["gpu-nic", "cs3-io"]},
                      receivers=["d0"], payload_scale=SCALE)
    res, _, _ = _run(ic, Client([_send(0.0, 3, src="p0", dst="d0")], name="p0"), receiver=Receiver("d0"))
    res = res[3]
    assert res.path == ("gpu-nic", "cs3-io")
    assert res.duration_s == pytest.approx(4 * 2e-6 + 1000 * KVPT / 100e9 + 7e-6, rel=1e-12)


def test_corrupted_frames_are_reported_by_the_receiver():
    frames = _frames(4)
    frames[1] = corrupt_frame(frames[1], seed=5)
    frames[3] = corrupt_frame(frames[3], seed=6)
    ic = _ic()
    res, _, drv = _run(ic, Client([_send(0.0, 4, frames=frames), _send(1.0, 5)], name="p"))
    stats = ic.stats(drv.now)
    assert res[4].bad_frames == 2 and res[5].bad_frames == 0
    assert stats["checksum_failures"] == 2 and stats["failed_transfers"] == 1 and stats["transfers"] == 2


def test_flap_delays_transfer_by_the_outage_and_degrade_by_the_lost_bandwidth():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT
    alone = b / GB

    def then(client, now, method, args):
        if method == "transfer_done" and args[0] == 1:       # the flapped one arrived: degrade, ship again
            client.send("interconnect", "degrade", "l", 0.5, now, now + 0.2)
            _, *msg = _send(now, 2, 7630)
            client.send(*msg)

    ic = _ic(links=[spec])
    client = Client([(0.0, "interconnect", "flap", "l", 0.1, 0.4), _send(0.0, 1, 7630)], name="p", on_reply=then)
    res, _, drv = _run(ic, client)
    stats = ic.stats(drv.now)
    flapped, degraded = res[1], res[2]
    assert flapped.duration_s == pytest.approx(alone + 0.3, rel=1e-12)
    assert degraded.start_s == flapped.end_s
    assert degraded.duration_s == pytest.approx(alone + 0.1, rel=1e-12)  # 0.2 s at half speed
    series = stats["links"]["l"]["series"]
    assert [0.1, 0.0] in series and [0.4, 1.0] in series
    assert all(u <= 1.0 for _, u in series)


def test_link_down_during_a_flow_that_is_already_waiting():
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT
    client = Client([_send(0.0, 1, 7630), (0.2, "interconnect", "flap", "l", 0.2, 0.7)], name="p")
    res, _, _ = _run(_ic(links=[spec]), client)        # the flap starts while the flow is in progress
    assert res[1].end_s == pytest.approx(b / GB + 0.5, rel=1e-12)


def test_zero_byte_transfer_pays_only_fixed_costs():
    res, _, _ = _run(_ic(), Client([_send(0.0, 1, frames=[], logical=0)], name="p"))
    assert res[1].duration_s == pytest.approx(5e-6) and res[1].n_frames == 0


def test_construction_errors_name_the_problem():
    link = LinkSpec(name="l", bandwidth_GBps=1)
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
        args = dict(receivers=["d"], payload_scale=0.1)
        args.update(kw)
        with pytest.raises(InterconnectConfigError, match=match):
            Interconnect(**args)


def test_transfer_errors():
    ic = _ic()
    errors = []
    for call in [
        lambda: ic.transfer(0.0, _req(1), _frames(1), 1000 * KVPT, "p", "nowhere"),
        lambda: ic.transfer(0.0, _req(1), _frames(1), -1, "p", "d"),
        lambda: ic.transfer(0.0, _req(1), _frames(1), 999 * KVPT, "p", "d"),
        lambda: ic.transfer(0.0, _req(2), _frames(1), 1000 * KVPT, "p", "d"),
        lambda: ic.transfer(0.0, _req(1), _frames(1, scale=1e-3), 1000 * KVPT, "p", "d"),
        lambda: ic.transfer(0.0, _req(1), ["x"], 1000 * KVPT, "p", "d"),
    ]:
        with pytest.raises(TransferError) as info:
            call()
        errors.append(str(info.value))
    assert "no route from 'p' to 'nowhere'" in errors[0]
    assert "logical_bytes" in errors[1]
    assert "carry 131072000 logical bytes but the transfer says 130940928" in errors[2]
    assert "names request 1" in errors[3]
    assert "payload_scale" in errors[4]
    assert "frame 0 is a str" in errors[5]
    assert ic.is_idle() and ic.stats()["in_flight"] == 0          # nothing was started
    # on the driver, the error ends the run naming the interconnect, the time and the request
    from rack.runtime.errors import ComponentError

    with pytest.raises(ComponentError, match=r"'interconnect' raised at t=0.500000 s \(request 1\)") as info:
        _run(_ic(), Client([_send(0.5, 1, logical=999 * KVPT)], name="p"))
    assert isinstance(info.value.cause, TransferError)


def test_unreadable_header_is_left_to_the_receiver():
    frames = _frames(1)
    frames[0] = np.zeros(10, np.uint8)
    res, _, _ = _run(_ic(), Client([_send(0.0, 1, frames=frames)], name="p"))
    assert res[1].bad_frames == 1


def test_transfer_to_a_receiver_that_lost_its_reservation():
    """A transfer whose receiver holds no reservation (it restarted) crossed for
    nothing: the sender is told None, its bytes are counted lost, not transferred, and
    it shared the link while it flowed. (The old interconnect also let a sender cancel
    a transfer mid-flight, freeing its bandwidth at once; a core has no cancellation:
    what its sender learns is this.)"""
    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=0, per_message_us=0)
    b = 7630 * KVPT
    ic = _ic(links=[spec])
    client = Client([_send(0.0, 1, 4 * 7630), _send(0.0, 2, 7630)], name="p")
    res, rx, drv = _run(ic, client, receiver=Receiver(lost={1}))
    stats = ic.stats(drv.now)
    assert res[1] is None                                   # lost: the sender may send again
    assert res[2].end_s == pytest.approx(2 * b / GB, rel=1e-12)   # half the link while both flow
    assert [(rid, t) for rid, *_, t in rx.got] == [(2, pytest.approx(2 * b / GB, rel=1e-12)),
                                                   (1, pytest.approx(5 * b / GB, rel=1e-12))]
    assert stats["transfers"] == 1 and stats["in_flight"] == 0 and stats["lost_transfers"] == 1
    link = stats["links"]["l"]
    assert link["bytes_lost"] == 4 * b and link["bytes_logical"] == b == stats["bytes_logical"]
    assert link["bytes_carried"] == pytest.approx(5 * b)
    assert ic.is_idle()


def test_stats_report_links_and_samples():
    spec = LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)
    ic = _ic(links=[spec])
    res, _, drv = _run(ic, Client([_send(0.0, i) for i in range(3)], name="p"))
    results = [res[i] for i in range(3)]
    stats = ic.stats(drv.now)
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


def _scenario(n=60):
    """n transfers from two senders over two routes sharing link b; returns (cores,
    interconnect)."""
    rng = np.random.default_rng(7)
    links = [LinkSpec(name="a", bandwidth_GBps=5), LinkSpec(name="b", bandwidth_GBps=8)]
    routes = {("p0", "d"): ["a", "b"], ("p1", "d"): ["b"]}
    ic = Interconnect(links=links, routes=routes, receivers=["d"], payload_scale=SCALE)
    script = {"p0": [], "p1": []}
    for i in range(n):
        t = float(rng.exponential(0.05)) * i / 4
        tokens = int(rng.integers(100, 4000))
        script[f"p{i % 2}"].append(_send(t, i, tokens, src=f"p{i % 2}"))
    return [Client(script["p0"], name="p0"), Client(script["p1"], name="p1"), ic, Receiver()], ic


def test_runs_are_deterministic_and_work_grows_with_events():
    def run():
        cores, ic = _scenario()
        drv = run_cores(cores)
        res = {tag: r for c in cores[:2] for tag, r in c.of("transfer_done")}
        return [res[i] for i in sorted(res)], ic.stats(drv.now), drv

    (r1, s1, drv), (r2, s2, _) = run(), run()
    assert r1 == r2 and s1 == s2
    n = len(r1)
    # per transfer four messages (transfer, receive_kv, kv_received, transfer_done); the
    # interconnect wakes for a transfer's per-message phase, its flow's start and drain
    # and its delivery, the senders once per send time: O(events), never O(bytes)
    assert drv.messages == 4 * n
    assert drv.wakeups <= 4 * n + 2 * n + 5
    for name in ("a", "b"):
        assert all(u <= 1.0 + 1e-9 for _, u in s1["links"][name]["series"])
    assert s1["links"]["b"]["transfers"] == n


def test_wakes_only_when_a_delivery_may_be_due():
    """The interconnect wakes at a lower bound of its next delivery (module docstring):
    once for a transfer alone on its path, and for contended ones the same transfer
    results and link figures as waking at every phase end and flow event (the mode a
    degraded link switches to)."""
    wakes = []

    class Counting(Interconnect):
        def on_wake(self, now):
            wakes.append(now)
            super().on_wake(now)

    spec = LinkSpec(name="l", bandwidth_GBps=10, latency_us=5, per_message_us=2)
    ic = Counting(links=[spec], routes={("p", "d"): ["l"]}, receivers=["d"], payload_scale=SCALE)
    res, rx, _ = _run(ic, Client([_send(1.0, 1)], name="p"))
    assert wakes == [res[1].end_s] == [rx.got[0][4]]
    assert res[1].end_s == pytest.approx(1.0 + transfer_time_alone([spec], 4, 1000 * KVPT), abs=1e-12)

    def run(eager):
        cores, ic = _scenario()
        ic._lazy = not eager
        drv = run_cores(cores)
        res = {tag: r for c in cores[:2] for tag, r in c.of("transfer_done")}
        return [res[i] for i in sorted(res)], ic.stats(drv.now), drv.wakeups

    (r_lazy, s_lazy, w_lazy), (r_eager, s_eager, w_eager) = run(False), run(True)
    assert r_lazy == r_eager and s_lazy == s_eager
    assert w_lazy < w_eager


def _run_late(cores, lateness_s, seed=0):
    """Drive `cores` as a wall-clock host does on a loaded machine: every wake-up fires
    late by up to `lateness_s` (drawn from `seed`); messages are delivered at once, at
    the (late) time they were sent. Returns the time reached."""
    rng = np.random.default_rng(seed)
    cores = {c.name: c for c in cores}
    now, queue = 0.0, []
    while True:
        for c in cores.values():
            queue.extend(c.outbox)
            c.outbox.clear()
        if queue:
            dst, method, args = queue.pop(0)
            getattr(cores[dst], method)(now, *args)
            continue
        due = min(cores.values(), key=lambda c: c.wake_at)
        if due.wake_at == math.inf:
            return now
        now = max(now, due.wake_at + float(rng.uniform(0, lateness_s)))
        due.on_wake(now)


def test_late_wakeups_give_model_times_despite_lateness():
    # a wall-clock driver wakes cores late (scheduler jitter, a loaded host); the
    # modelled transfer times must not stretch
    from interconnect.link import FairShareNetwork

    spec = LinkSpec(name="l", bandwidth_GBps=1, latency_us=100, per_message_us=10)
    b1, b2 = 200 * KVPT, 100 * KVPT  # ~26 ms and ~13 ms alone at 1 GB/s
    client = Client([_send(0.0, 1, 200), _send(0.0, 2, 100)], name="p")
    t_done = _run_late([client, _ic(links=[spec]), Receiver()], lateness_s=2e-3)
    r1, r2 = (dict(client.of("transfer_done"))[i] for i in (1, 2))
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
    assert t_done > max(r1.end_s, r2.end_s) + 1e-6       # the driver was late, the model was not


# --- issue 37: a transfer is released when its receiver dies, or when its request ended


def _handed_over(ic):
    """Run a transfer of request 7 until the interconnect has sent `receive_kv`
    (the receiver's reply not yet given); returns its tid."""
    ic.transfer(0.0, _req(7), _frames(7), 1000 * KVPT, "p", "d", tag="t7")
    t = ic.wake_at
    while True:
        ic.on_wake(t)
        sent = [m for m in ic.outbox if m[1] == "receive_kv"]
        if sent:
            ic.outbox.clear()
            return sent[0][2][-1]
        t = ic.wake_at
        assert t < math.inf


def test_a_receiver_that_dies_before_answering_loses_the_transfer_once():
    # On Ray the receiver's reply can die with its process: without this the transfer
    # stayed "in flight" after its request ended and the run waited on it to its deadline.
    ic = _ic()
    tid = _handed_over(ic)
    assert ic.held_requests() == [7] and not ic.is_idle()
    ic.peer_lost(1.0, "d")
    assert ic.is_idle() and ic.held_requests() == []
    assert ic.outbox == [("p", "transfer_done", ("t7", None))]     # the sender re-sends
    ic.outbox.clear()
    ic.kv_received(1.1, tid, -1)          # the new incarnation's late answer: told once only
    assert ic.outbox == [] and ic.stats()["late_replies"] == 1 and ic.stats()["lost_transfers"] == 1


def test_a_receive_kv_that_could_not_be_delivered_is_a_lost_transfer():
    ic = _ic()
    tid = _handed_over(ic)
    ic.send_failed(1.0, "d", "receive_kv", (_req(7), [], 0.0, "interconnect", tid))
    assert ic.is_idle() and ic.outbox == [("p", "transfer_done", ("t7", None))]


def test_a_peer_lost_of_another_core_or_before_delivery_keeps_the_transfer():
    ic = _ic()
    ic.transfer(0.0, _req(7), _frames(7), 1000 * KVPT, "p", "d", tag="t7")
    ic.peer_lost(0.0, "d")               # not handed over yet: it reaches the new incarnation
    ic.peer_lost(0.0, "p")
    assert ic.held_requests() == [7] and ic.outbox == []


def test_release_drops_an_ended_requests_transfer_mid_wire_and_frees_the_link():
    ic = _ic()
    ic.transfer(0.0, _req(7), _frames(7, tokens=100000), 100000 * KVPT, "p", "d", tag="t7")
    # the interconnect wakes only when a delivery may be due (lazy): halfway to that
    # wake-up the transfer is past its latency phase and on the wire
    due = ic.wake_at
    assert 0.0 < due < math.inf and ic.held_requests() == [7]
    ic.release(due / 2, [7])
    assert ic.is_idle() and ic._net.n_flows == 0 and ic.wake_at == math.inf and ic.outbox == []
    assert ic.stats()["released_after_end"] == 1

