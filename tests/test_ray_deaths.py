"""A real actor death on the Ray runtime (no fault configured) is noticed at once: the
run ends with the component named and what finished written as "aborted"; with
restarts configured the instance is restarted and its requests recovered as after an
injected crash, and the run completes; a hung actor is caught by the liveness check
(rack.runtime.ray_watch, docs/robustness.md)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import typer

import rack.runtime.ray_runtime as ray_runtime
from rack.runtime.errors import ActorLost
from rack.run.runner import run_scenario
from rack.wiring.scenario import parse_scenario
from workloads import Request

VICTIM = "decode-0"
KILL_AT_S = 0.4
"""Emulated s at which the victim is killed: about ten requests are decoding then."""


def _scenario(**extra):
    return parse_scenario({
        "name": "ray-actor-death", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "dilation": 5.0,
        "pools": [{"name": "prefill", "device": "h100", "role": "prefill"},
                  {"name": "decode", "device": "h100", "role": "decode", "max_batch": 64,
                   "memory_reserve_fraction": 0.85}],
        "links": [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0}], **extra}, "<test>")


def _requests() -> list[Request]:
    return [Request(id=i, arrival_s=i * 0.01, prompt_tokens=1000, output_tokens=150) for i in range(40)]


class Topologies:
    """Keeps the topology each Ray run launches (the test reaches its actors through it)."""

    def __init__(self, monkeypatch) -> None:
        self.made: list = []
        real = ray_runtime.launch_topology

        def launch(*args, **kwargs):
            topo = real(*args, **kwargs)
            self.made.append(topo)
            return topo

        monkeypatch.setattr(ray_runtime, "launch_topology", launch)

    def wait(self, timeout_s: float = 180.0):
        deadline = time.time() + timeout_s
        while not self.made:
            assert time.time() < deadline, "the Ray run did not start its actors"
            time.sleep(0.2)
        return self.made[-1]


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        out["ended"] = time.time()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def _pid_when(ray, topo, name: str, t_s: float, timeout_s: float = 120.0) -> int:
    """The process id of `name`'s actor once its emulated time has reached `t_s`."""
    deadline = time.time() + timeout_s
    while True:
        h = ray.get(topo.actors[name].health.remote(), timeout=30)
        if h["t_s"] >= t_s:
            return h["pid"]
        assert time.time() < deadline, f"{name} never reached t={t_s}"
        time.sleep(0.1)


def _conserved(r: dict) -> None:
    q = r["requests"]
    assert q["completed"] + q["rejected"] + q["failed"] + q["unfinished"] == q["submitted"] == 40


@pytest.mark.ray
def test_a_killed_actor_ends_the_run_at_once_naming_it(ray_session, monkeypatch, tmp_path, capsys):
    """kill -9 of the decode engine's process, no fault configured: rack run's path
    (`rack.cli.run.execute`) ends within seconds, names decode-0, its node, the time and
    the requests it held, and writes the aborted results."""
    from rack.cli.run import execute

    ray = ray_session
    topos = Topologies(monkeypatch)
    sc = _scenario()
    address = ray.get_runtime_context().gcs_address        # the shared session: not shut down
    thread, out = _in_thread(lambda: execute(tmp_path, sc, _requests(), runtime="ray", address=address,
                                             timeout_s=600))
    topo = topos.wait()
    pid = _pid_when(ray, topo, VICTIM, KILL_AT_S)
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the run did not end"
    took = out["ended"] - killed
    err = out.get("error")
    assert isinstance(err, typer.Exit) and err.exit_code == 1, out
    # the one-line error the command prints, captured (a passing test prints nothing)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert took < 60, f"kill -9 of {VICTIM} (pid {pid}) to the end of the run: {took:.1f} s"
    assert line.startswith(f"error: run aborted: the actor of component '{VICTIM}' (node "), line
    assert f"pid {pid}) died at about t=" in line and "not an injected fault; no restarts configured" in line
    assert "ActorDiedError" in line and "status aborted" in line

    r = json.loads((tmp_path / "results.json").read_text())
    assert r["status"] == "aborted"
    e = r["error"]
    assert (e["component"], e["how"], e["type"], e["pid"]) == (VICTIM, "died", "ActorDiedError", pid)
    assert e["node_id"] == topo.nodes[VICTIM] and e["node_ip"] == topo.infos[VICTIM]["node_ip"]
    assert e["t_s"] >= KILL_AT_S and e["components_without_stats"] == [VICTIM]
    _conserved(r)
    q = r["requests"]
    assert q["completed"] < 40 and q["unfinished"] > 0
    # what it held: open requests routed to it, every one still open in the results
    assert 0 < e["held_requests"] <= q["unfinished"]
    rows = {int(row.split(",")[0]): row for row in (tmp_path / "requests.csv").read_text().splitlines()[1:]}
    assert len(rows) == 40
    assert (tmp_path / "error.log").exists()
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith(f"RUN ABORTED: the actor of component '{VICTIM}' (node ")


@pytest.mark.ray
def test_with_restarts_configured_a_killed_actor_is_recovered_and_the_run_completes(ray_session, monkeypatch):
    """max_restarts = 1: the death is handled as an injected crash (Ray restarts the
    actor, it reloads its weights, the router re-dispatches what it lost), counted in
    `faults.actor_deaths`, and every request completes."""
    ray = ray_session
    topos = Topologies(monkeypatch)
    sc = _scenario(max_restarts=1)
    thread, out = _in_thread(lambda: run_scenario(sc, _requests(), runtime="ray", timeout_s=600))
    topo = topos.wait()
    pid = _pid_when(ray, topo, VICTIM, KILL_AT_S)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=600)
    assert not thread.is_alive(), "the run did not end"
    assert "error" not in out, repr(out.get("error"))
    res = out["value"].results
    assert res["status"] == "complete"
    q = res["requests"]
    assert q["completed"] == q["submitted"] == 40 and q["unfinished"] == 0
    assert res["emulation"]["violations"] == []
    f = res["faults"]
    print("faults:", {k: v for k, v in f.items() if k != "list"})
    assert f["actor_deaths"] == 1 and f["injected"] == 0 and f["recovered"] == 1 and f["requests_failed"] == 0
    (rec,) = f["list"]
    assert (rec["kind"], rec["instance"], rec["cause"]) == ("decode_crash", VICTIM, "actor_died")
    before, after = rec["incarnations"]
    assert rec["restarted"] and before == pid and after != pid
    assert rec["serving_from_s"] > rec["applied_at_s"]          # it reloaded its weights
    assert f["requests_redispatched"] > 0 and f["requests_recovered"] == f["requests_redispatched"]
    assert out["value"].stats[VICTIM]["restarts"] == 1
    from rack.measure.results import summary_text

    assert "faults: 0 injected, 1 actor death(s) (not injected), 1 recovered" in summary_text(res)
    for name, st in out["value"].stats.items():
        mem = st.get("memory")
        if mem:
            assert mem["held_bytes"].get("kv", 0) == 0 and mem["held_bytes"].get("reserved", 0) == 0, name


@pytest.mark.ray
@pytest.mark.parametrize("restarts", [0, 1], ids=["no-restarts", "max_restarts=1"])
def test_a_hung_actor_is_caught_by_the_liveness_check(restarts, ray_session, monkeypatch):
    """SIGSTOP of the decode engine's process: its probe goes unanswered for the
    liveness timeout (short here). Without restarts the run ends naming it as hung;
    with one, the driver kills it, Ray restarts it and it is recovered as a death."""
    ray = ray_session
    topos = Topologies(monkeypatch)
    from rack.wiring.topology import build_topology

    reqs = _requests()
    specs = build_topology(_scenario(max_restarts=restarts), [r.id for r in reqs])
    thread, out = _in_thread(lambda: ray_runtime.run_topology_ray(specs, reqs, dilation=5.0, timeout_s=600,
                                                                  liveness_timeout_s=3.0))
    topo = topos.wait()
    pid = _pid_when(ray, topo, VICTIM, KILL_AT_S)
    os.kill(pid, signal.SIGSTOP)
    try:
        thread.join(timeout=600)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert not thread.is_alive(), "the run did not end"
    if restarts:
        assert "error" not in out, repr(out.get("error"))
        raw = out["value"]
        assert raw["snapshot"]["violations"] == [] and raw["stats"][VICTIM]["restarts"] == 1
        (rec,) = raw["snapshot"]["faults"]
        assert (rec["cause"], rec["incarnations"][0], rec["recovered"]) == ("actor_died", pid, True)
        return
    err = out.get("error")
    assert isinstance(err, ActorLost), repr(err)
    assert (err.component, err.how, err.pid) == (VICTIM, "hung", pid)
    assert "stopped answering" in str(err) and "liveness timeout 3 s" in str(err)
    assert err.partial is not None and err.partial["stats_missing"] == [VICTIM]


def test_the_error_names_the_component_where_it_ran_and_what_it_held():
    err = ActorLost("decode-0", 1.5, RuntimeError("gone."), how="died", detail="died", node_ip="10.0.0.2",
                    pid=42, last_answer_t_s=1.25, held=[3, 5])
    assert str(err) == ("the actor of component 'decode-0' (node 10.0.0.2, pid 42) died at about t=1.500 s of "
                        "emulated time (it last answered at t=1.250 s), not an injected fault; no restarts "
                        "configured (scenario max_restarts, rack run --max-restarts); 2 open request(s) routed "
                        "to it, e.g. 3, 5: RuntimeError: gone")
    d = err.details()
    assert (d["component"], d["held_requests"], d["held_request_ids"], d["how"]) == ("decode-0", 2, [3, 5], "died")
    router = ActorLost("router", None, RuntimeError("x"), how="hung", detail="stopped answering", can_restart=False)
    assert "only prefill and decode instances are restarted" in str(router)


def test_max_restarts_makes_every_engine_restartable_and_the_injector_its_health_monitor():
    from rack.wiring.topology import build_topology

    plain = build_topology(_scenario(), range(3))
    assert all(s.weight_load_s is None for s in plain) and "faults" not in {s.name for s in plain}
    specs = {s.name: s for s in build_topology(_scenario(max_restarts=2), range(3))}
    for name in ("prefill-0", "decode-0"):
        assert specs[name].restarts == 2 and specs[name].crashes == 0 and specs[name].weight_load_s > 0
    assert specs["router"].restarts == 0 and specs["router"].weight_load_s is None
    restartable = specs["faults"].kwargs["restartable"]
    assert restartable == {"prefill-0": {"kind": "prefill_crash", "weight_load_s": specs["prefill-0"].weight_load_s},
                           "decode-0": {"kind": "decode_crash", "weight_load_s": specs["decode-0"].weight_load_s}}
    crash = {"kind": "decode_crash", "target": "decode-0", "at_s": 1.0}
    specs = {s.name: s for s in build_topology(_scenario(faults=[crash, {**crash, "at_s": 2.0}]), range(3))}
    assert (specs["decode-0"].crashes, specs["decode-0"].restarts) == (2, 0)       # Ray max_restarts 2
    assert specs["faults"].kwargs["restartable"] == {}


def test_a_real_death_is_recovered_as_an_injected_crash_is():
    """The injector's side (no Ray): `instance_died` records a crash of the instance's
    kind, tells every core, pings until the new incarnation answers, then recovers."""
    from rack.serving.fault_injector import FaultInjector
    from workloads.core import BROADCAST

    inj = FaultInjector(faults=[], collector="collector", router="router",
                        restartable={"decode-0": {"kind": "decode_crash", "weight_load_s": 0.5}})
    inj.outbox.clear()
    inj.instance_died(2.0, "decode-0", 111, 1.8)
    sent = [(BROADCAST if dst[0] == BROADCAST else dst, m) for dst, m, _ in inj.outbox]
    assert sent == [("collector", "note_fault"), (BROADCAST, "peer_lost"), ("decode-0", "ping")]
    rec = inj.records[0]
    assert (rec["kind"], rec["cause"], rec["applied_at_s"], rec["serving_from_s"], rec["incarnations"]) == \
        ("decode_crash", "actor_died", 1.8, 2.3, [111])
    inj.outbox.clear()
    inj.pong(2.5, (0, "after"), {"incarnation": 222})
    assert [(dst, m) for dst, m, _ in inj.outbox] == [("router", "recover")]
    assert rec["restarted"] and rec["incarnations"] == [111, 222]
    with pytest.raises(KeyError):
        inj.instance_died(3.0, "prefill-0", 1)          # not covered by max_restarts


def test_max_restarts_changes_nothing_on_the_virtual_runtime():
    reqs = _requests()[:12]
    a = run_scenario(_scenario(), reqs, runtime="virtual").results
    b = run_scenario(_scenario(max_restarts=3), reqs, runtime="virtual").results
    assert a["latency"] == b["latency"] and a["requests"] == b["requests"]
    assert b["faults"]["actor_deaths"] == 0 and b["faults"]["list"] == []


def test_a_decode_engine_answers_a_repeated_reservation_once_held():
    """After a real death the sender may ask a restarted decode engine twice for the
    same reservation (its first ask was queued for the new process, then the death's
    peer_lost voided it at the sender): one reservation, granted to both asks; a second
    sender for the same request is still a bug."""
    from _engine_fakes import GB, Client, FakeCollector, FakeCost, plan, run_cores
    from devices.engines.decode import DecodeEngine
    from rack.runtime.errors import ComponentError

    def engine():
        cost = FakeCost()
        col = FakeCollector()
        return col, DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                                 memory_plan=plan(40 * GB, cost.weight_bytes))

    req = Request(id=3, arrival_s=0, prompt_tokens=300, output_tokens=5)
    col, eng = engine()
    client = Client([(0.0, "d", "reserve_kv", req, 300, None, "client"),
                     (0.5, "d", "reserve_kv", req, 300, None, "client")])
    run_cores([col, eng, client], idle=False)          # the reservation waits for its KV
    assert client.of("kv_reserved") == [(3, "granted"), (3, "granted")]
    assert eng.counts["reserved"] == 1 and eng.counts["reserve_repeated"] == 1
    col, eng = engine()
    other = Client([(0.0, "d", "reserve_kv", req, 300, None, "client"),
                    (0.5, "d", "reserve_kv", req, 300, None, "other")])
    with pytest.raises(ComponentError, match="reserved twice"):
        run_cores([col, eng, other], idle=False)


@pytest.mark.parametrize("asked", [True, False], ids=["after-recovery", "re-sent"])
def test_a_second_copy_of_a_request_decoding_here_is_refused(asked):
    """On Ray a request can move from its prefill instance to a restarted decode engine
    between the recovery's two questions (the engine answers first, the prefill
    instance after its KV left): nobody holds it when asked, so it is re-dispatched
    while it decodes. The re-dispatched copy's reservation is refused (its KV is here)
    and the request ends once, not twice (the collector's "ended twice"). The same
    without a recovery's question (a copy re-sent across a restart)."""
    from _engine_fakes import GB, Client, FakeCollector, FakeCost, plan, run_cores
    from devices.engines.decode import DecodeEngine

    cost = FakeCost()
    col = FakeCollector()
    eng = DecodeEngine(name="d", cost=cost, collector=col.name, max_batch=4,
                       memory_plan=plan(40 * GB, cost.weight_bytes))
    req = Request(id=3, arrival_s=0, prompt_tokens=300, output_tokens=400)
    ask = [(0.01, "d", "holding", [3], False, "client", "recover")] if asked else []   # the recovery asks
    client = Client([(0.0, "d", "reserve_kv", req, 300, 0.0, "client"), *ask,
                     (0.02, "d", "reserve_kv", req, 300, 0.0, "client")],        # the second copy
                    deliver={3: ("d", cost)})
    run_cores([col, eng, client])       # FakeCollector.finish fails on a second end
    assert client.of("kv_reserved") == [(3, "granted"), (3, "refused")]
    assert col.outcomes[3]["outcome"] == "completed" and eng.counts["reserve_duplicate_refused"] == 1
