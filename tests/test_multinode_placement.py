"""Placement config, the resource check, node specs and local parallel runs (no Ray
cluster started here; tests/test_multinode_ray.py runs the real one)."""

from __future__ import annotations

import pytest

from rack.runtime.cluster import ClusterError, NodeSpec, parse_node_spec
from rack.run.tasks import virtual_results
from rack.runtime.parallel import MapTimeout, RunFailed, map_virtual_runs
from rack.wiring.scenario import ScenarioError, parse_scenario
from rack.wiring.load import load_scenario
from rack.wiring.topology import ComponentSpec, build_topology
from workloads import load_requests


def _with(sc, **changes):
    data = sc.model_dump()
    data.update(changes)
    return type(sc).model_validate(data)


def test_placement_table_reaches_the_components():
    sc = _with(load_scenario(), placement={"router": {"head": 1}, "collector": {"head": 0.5},
                                           "interconnect": {"net": 2}})
    specs = {s.name: s for s in build_topology(sc, [1, 2])}
    assert specs["router"].resources == {"head": 1}
    assert specs["collector"].resources == {"head": 0.5}
    assert specs["interconnect"].resources == {"net": 2}


def test_default_placement_is_empty():
    specs = build_topology(load_scenario(), [1])
    assert all(s.resources == {} for s in specs if s.kind in ("router", "collector", "interconnect"))


@pytest.mark.parametrize("bad", [{"head": 0}, {"head": -1}, {"head": float("inf")}])
def test_bad_placement_amount_is_refused(bad):
    data = load_scenario().model_dump()
    data["placement"] = {"router": bad}
    with pytest.raises(ScenarioError, match="placement.router"):
        parse_scenario(data, "x.toml")


def test_unknown_placement_component_is_refused():
    data = load_scenario().model_dump()
    data["placement"] = {"gateway": {"head": 1}}
    with pytest.raises(ScenarioError, match="placement.gateway"):
        parse_scenario(data, "x.toml")


# -- check_resources on ray.nodes()-style dicts ---------------------------------------

ray_runtime = pytest.importorskip("rack.runtime.ray_runtime")


def _node(**res):
    return {"Alive": True, "Resources": {"CPU": 1.0, "memory": 1e9, "node:10.0.0.1": 1.0, **res}}


def _spec(name, pool=None, **res):
    return ComponentSpec(name, "x:Y", {}, "prefill" if pool else "router", pool, dict(res))


def test_check_passes_when_every_resource_fits():
    nodes = [_node(head=64), _node(prefill=2), _node(decode=1)]
    specs = [_spec("router", head=1), _spec("prefill-0", "prefill", prefill=1),
             _spec("prefill-1", "prefill", prefill=1), _spec("decode-0", "decode", decode=1)]
    assert ray_runtime.check_resources(specs, nodes) is None    # raises RayRunError otherwise


def test_check_names_a_resource_no_node_offers():
    with pytest.raises(ray_runtime.RayRunError) as e:
        ray_runtime.check_resources([_spec("decode-0", "decode", tpu=1)], [_node(prefill=2)])
    msg = str(e.value)
    assert "'tpu'" in msg and "decode-0" in msg and "['prefill']" in msg and "--resources" in msg


def test_check_ignores_dead_nodes():
    dead = {"Alive": False, "Resources": {"decode": 1.0}}
    with pytest.raises(ray_runtime.RayRunError, match="'decode'"):
        ray_runtime.check_resources([_spec("decode-0", "decode", decode=1)], [_node(), dead])


def test_check_needs_one_node_with_all_of_a_components_resources():
    nodes = [_node(prefill=1), _node(gpu_link=1)]
    with pytest.raises(ray_runtime.RayRunError, match="no single node offers all"):
        ray_runtime.check_resources([_spec("prefill-0", "prefill", prefill=1, gpu_link=1)], nodes)


def test_check_counts_the_whole_pool_against_the_cluster_total():
    specs = [_spec(f"prefill-{i}", "prefill", prefill=1) for i in range(3)]
    with pytest.raises(ray_runtime.RayRunError, match=r"'prefill' x 3 in total .* offers only 2"):
        ray_runtime.check_resources(specs, [_node(prefill=1), _node(prefill=1)])
    ray_runtime.check_resources(specs, [_node(prefill=1), _node(prefill=2)])


def test_check_refuses_a_nonpositive_amount():
    with pytest.raises(ray_runtime.RayRunError, match="positive"):
        ray_runtime.check_resources([_spec("router", head=0)], [_node(head=1)])


# -- local cluster node specs -------------------------------------------------------------

def test_parse_node_spec():
    n = parse_node_spec("prefill=2, decode=0.5,cpus=2,store_mb=128", "w0")
    assert n == NodeSpec("w0", {"prefill": 2.0, "decode": 0.5}, 2, 128 * 1024 * 1024)
    assert parse_node_spec("", "w1").resources == {}


@pytest.mark.parametrize("text", ["prefill", "prefill=0", "prefill=x", "cpus=-1", "=3", "store_mb=10"])
def test_parse_node_spec_refuses_bad_entries(text):
    with pytest.raises(ClusterError, match="w0"):
        parse_node_spec(text, "w0")


# -- map_virtual_runs without Ray -------------------------------------------------------

def _square(x):
    return x * x


def _fail_on_two(x):
    if x == 2:
        raise ValueError("two")
    return x


def _slow(x):
    import time

    time.sleep(x)
    return x


def test_map_keeps_order_serial_and_in_processes():
    seen = []
    assert map_virtual_runs(_square, [3, 1, 2], max_workers=1, progress=lambda d, n: seen.append(d)) == [9, 1, 4]
    assert seen == [1, 2, 3]
    out = map_virtual_runs(_fail_on_two, [0, 1, 2, 3, 4], max_workers=2, return_exceptions=True)
    assert out[:2] == [0, 1] and out[3:] == [3, 4] and isinstance(out[2], ValueError)


def test_map_reports_the_failing_item():
    with pytest.raises(RunFailed) as e:
        map_virtual_runs(_fail_on_two, [0, 1, 2, 3], max_workers=1)
    assert e.value.index == 2 and isinstance(e.value.cause, ValueError)


def test_map_timeout_stops_the_runs():
    import time

    t0 = time.monotonic()
    with pytest.raises(MapTimeout):
        map_virtual_runs(_slow, [0, 30, 30], max_workers=2, timeout_s=3)
    assert time.monotonic() - t0 < 15


def test_map_virtual_results_in_processes_equals_in_process():
    reqs = load_requests("mooncake-excerpt", window=(0, 1), output_scale=0.1)
    sc = load_scenario()
    items = [(sc, reqs), (sc.with_overrides(payload_scale=2e-3), reqs)]
    par = map_virtual_runs(virtual_results, items, max_workers=2)
    assert [r["latency"] for r in par] == [virtual_results(it)["latency"] for it in items]


def test_clock_offset_corrects_only_hosts_whose_offset_is_measurable(monkeypatch):
    """The probe's arithmetic on a fake clock: every `time.time()` call advances it by
    one binary-exact step, and a remote host reads its clock (plus its offset) between
    the driver's two readings, so each round trip is two steps and the measured offset
    is exactly the host's offset. No reading of the real clock: nothing lands on the
    |offset| = RTT/2 boundary by float rounding (the earlier version failed ~1 run in 70
    when an instantaneous fake round trip put a zero offset exactly there)."""
    from types import SimpleNamespace

    step = 2.0 ** -10                                    # s; exact in binary
    clock = {"t": 1024.0}

    def tick() -> float:
        clock["t"] += step
        return clock["t"]

    monkeypatch.setattr(ray_runtime, "time", SimpleNamespace(time=tick))   # this module's clock only

    class Actor:
        def __init__(self, offset):
            self.wall_time = SimpleNamespace(remote=lambda: tick() + offset)

    fake_ray = SimpleNamespace(util=SimpleNamespace(get_node_ip_address=lambda: "10.0.0.1"),
                               get=lambda ref, timeout: ref)
    actors = {"router": Actor(0.0), "prefill-0": Actor(5.0), "prefill-1": Actor(5.0), "decode-0": Actor(0.0),
              "decode-1": Actor(4 * step)}
    infos = {"router": {"node_ip": "10.0.0.1"}, "prefill-0": {"node_ip": "10.0.0.2"},
             "prefill-1": {"node_ip": "10.0.0.2"}, "decode-0": {"node_ip": "10.0.0.3"},
             "decode-1": {"node_ip": "10.0.0.4"}}
    hosts = ray_runtime._clock_offsets(fake_ray, actors, infos)
    assert set(hosts) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
    assert all(h["rtt_s"] == 2 * step for h in hosts.values())
    assert hosts["10.0.0.2"]["corrected"] and hosts["10.0.0.2"]["offset_s"] == 5.0
    assert not hosts["10.0.0.1"]["corrected"]                 # the driver's own clock
    assert hosts["10.0.0.3"]["offset_s"] == 0.0 and not hosts["10.0.0.3"]["corrected"]   # within RTT/2: trust NTP
    assert hosts["10.0.0.4"]["offset_s"] == 4 * step and hosts["10.0.0.4"]["corrected"]  # 2 RTT: measurable


# -- the scale test's layout and the CLI's argument checks (no cluster started) ----------

def test_scale_nodes_split_roles_over_workers():
    from rack.cli.scale_test import scale_nodes

    one = scale_nodes(1, 2, 1)
    assert [n.resources for n in one] == [{"prefill": 2.0, "decode": 1.0}]
    three = scale_nodes(3, 4, 2)
    assert [n.name for n in three] == ["prefill-0", "prefill-1", "decode-0"]
    assert three[0].resources == {"prefill": 4.0} and three[2].resources == {"decode": 2.0}
    with pytest.raises(ValueError):
        scale_nodes(0, 1, 1)


def test_scale_scenario_pins_pools_and_components():
    from rack.cli.scale_test import scale_scenario

    sc = scale_scenario(load_scenario(), 3, 2, 15.0)
    pools = {p.role: p for p in sc.pools}
    assert pools["prefill"].instances == 3 and pools["prefill"].resources == {"prefill": 1.0}
    assert pools["decode"].instances == 2 and pools["decode"].resources == {"decode": 1.0}
    assert sc.placement.router == {"head": 1.0} and sc.dilation == 15.0
    specs = build_topology(sc, [1])
    assert sorted(s.name for s in specs if s.kind == "prefill") == ["prefill-0", "prefill-1", "prefill-2"]


def _cli(args):
    from typer.testing import CliRunner

    import rack.cli
    from rack.cli.app import app

    rack.cli._register_commands()
    return CliRunner().invoke(app, args)


def test_cluster_cli_without_a_cluster(tmp_path):
    res = _cli(["cluster", "status", "--state", str(tmp_path / "none.json")])
    assert res.exit_code == 1 and "no local cluster" in res.output
    res = _cli(["cluster", "down", "--state", str(tmp_path / "none.json")])
    assert res.exit_code == 1


def test_cluster_cli_refuses_a_bad_node(tmp_path):
    res = _cli(["cluster", "up", "--node", "prefill=x", "--state", str(tmp_path / "s.json")])
    assert res.exit_code == 2 and "worker-0" in res.output and "prefill=x" in res.output
    assert not (tmp_path / "s.json").exists()


def test_scale_test_cli_refuses_bad_rates():
    res = _cli(["scale-test", "--rate-scales", "1,x"])
    assert res.exit_code == 2 and "--rate-scales" in res.output
