"""A multi-node Ray cluster on one machine, for trying placement and scale before a
real cluster (`ray.cluster_utils.Cluster`: one head and N worker nodes, each its own
raylet with its own resources and object store, all on this host).

    with LocalCluster([NodeSpec("prefill", {"prefill": 2}), NodeSpec("decode", {"decode": 1})]) as c:
        run_scenario(scenario, requests, runtime="ray", address=c.address)

Every node's processes live under one short temp root (default /tmp/rack-mn-<pid>-<n>),
so `down()` can find everything this cluster started and confirm that none of it
outlives it. Ray's cluster-address file goes there too (`RAY_TMPDIR` is set while the
cluster starts and stops), so a bare `ray.init()` elsewhere on the machine does not
join this cluster by accident; connect with the explicit `address`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

# Ray's default object store for a `Cluster` node is 150 MiB (ray/cluster_utils.py);
# a run's KV frames at payload_scale 1e-3 are ~0.5 MB each, so 256 MiB leaves room.
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024 * 1024
# The head offers `head` so that router, collector and interconnect can be pinned to
# it (`[placement] router = {head = 1}`); 64 is more than a scenario ever asks for.
DEFAULT_HEAD_RESOURCES = {"head": 64.0}
_counter = itertools.count()


class ClusterError(RuntimeError):
    """The local cluster could not start, or a node spec is invalid."""


@dataclass(frozen=True)
class NodeSpec:
    """One Ray node: a name (for reports), its custom resources, CPUs it advertises
    (Ray scheduling units, not cores: component actors ask for 0, sweep tasks for 1)
    and its object-store size in bytes."""

    name: str
    resources: dict[str, float] = field(default_factory=dict)
    num_cpus: int = 1
    object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES


def parse_node_spec(text: str, name: str) -> NodeSpec:
    """A node from "RES=N,RES=N,...", with the reserved keys `cpus=N` and
    `store_mb=N` (object store, MiB); "" is a node without custom resources.

    Raises ClusterError naming the bad entry.
    """
    resources: dict[str, float] = {}
    cpus, store = 1, DEFAULT_OBJECT_STORE_BYTES
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        try:
            if not sep or not key:
                raise ValueError
            if key == "cpus":
                cpus = int(value)
                if cpus < 0:
                    raise ValueError
            elif key == "store_mb":
                store = int(float(value) * 1024 * 1024)
                if store < 80 * 1024 * 1024:  # Ray refuses object stores under ~75 MiB
                    raise ClusterError(f"node {name!r}: store_mb={value}: Ray needs at least 80 MiB")
            else:
                amount = float(value)
                if not amount > 0:
                    raise ValueError
                resources[key] = amount
        except ValueError:
            raise ClusterError(f"node {name!r}: bad entry {part!r}: expected RESOURCE=AMOUNT (> 0), "
                               "cpus=N or store_mb=N") from None
    return NodeSpec(name, resources, cpus, store)


@contextlib.contextmanager
def _ray_tmpdir(root: str) -> Iterator[None]:
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = root
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


class LocalCluster:
    """Head + worker nodes on this machine; `up()` starts them, `down()` stops them.

    workers: the worker nodes. head: the head node (default: 1 CPU and
    DEFAULT_HEAD_RESOURCES). temp_root: where every node keeps sockets and logs
    (default a fresh /tmp/rack-mn-<pid>-<n>, removed by `down()`; a given one is kept).
    connect: `up()` also connects this process (`ray.init(address=...)`) and `down()`
    disconnects it. node_timeout_s: limit for the nodes to register.
    """

    def __init__(self, workers: Sequence[NodeSpec], *, head: NodeSpec | None = None,
                 temp_root: str | None = None, connect: bool = True, node_timeout_s: float = 60.0) -> None:
        names = [w.name for w in workers] + ["head"]
        if len(set(names)) != len(names):
            raise ClusterError(f"node names must be unique (and not 'head'): {names}")
        self.workers = list(workers)
        self.head = head or NodeSpec("head", dict(DEFAULT_HEAD_RESOURCES))
        self._own_root = temp_root is None
        self.temp_root = temp_root or f"/tmp/rack-mn-{os.getpid()}-{next(_counter)}"
        self.connect = connect
        self.node_timeout_s = node_timeout_s
        self._cluster = None
        self._connected = False
        self.node_ids: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------------------

    def up(self) -> str:
        """Start the nodes (and connect, if asked); returns the cluster address
        ("IP:PORT" of the head's GCS). Raises ClusterError if Ray is already initialised
        in this process (when connecting) or a node does not come up in time; whatever
        started is stopped again."""
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray
        from ray.cluster_utils import Cluster

        if self._cluster is not None:
            return self.address
        if self.connect and ray.is_initialized():
            raise ClusterError("a Ray session is already initialised in this process: "
                               "call ray.shutdown() before starting a local cluster")
        os.makedirs(os.path.join(self.temp_root, "ray"), exist_ok=True)
        try:
            with _ray_tmpdir(self.temp_root):
                self._cluster = Cluster(initialize_head=True, head_node_args=self._node_args(self.head, head=True))
                self.node_ids["head"] = self._cluster.head_node.node_id
                for w in self.workers:
                    node = self._cluster.add_node(**self._node_args(w))
                    self.node_ids[w.name] = node.node_id
                self._cluster.wait_for_nodes(timeout=self.node_timeout_s)
            if self.connect:
                from .ray_runtime import init_ray

                init_ray(address=self.address, log_to_driver=False, logging_level="ERROR")
                self._connected = True
        except Exception as exc:
            self.down()
            if isinstance(exc, ClusterError):
                raise
            raise ClusterError(f"local cluster did not start: {type(exc).__name__}: {exc}") from exc
        return self.address

    def _node_args(self, spec: NodeSpec, head: bool = False) -> dict:
        args = {"num_cpus": spec.num_cpus, "resources": dict(spec.resources),
                "object_store_memory": spec.object_store_bytes}
        if head:
            args.update(include_dashboard=False, temp_dir=self.temp_root)
        return args

    def down(self, timeout_s: float = 30.0) -> list[dict]:
        """Disconnect, stop every node, and wait (up to `timeout_s`) until every process
        the cluster started has exited; one still alive then is killed. Returns those
        that had to be killed ([] when the shutdown was clean). Safe to call twice."""
        import ray

        procs = self.processes()
        if self._connected:
            ray.shutdown()
            self._connected = False
        if self._cluster is not None:
            with _ray_tmpdir(self.temp_root):
                try:
                    self._cluster.shutdown()
                finally:
                    self._cluster = None
        survivors = wait_gone(procs, timeout_s)
        killed = []
        for p in survivors:
            try:
                killed.append({"pid": p.pid, "name": p.name()})
                p.kill()
            except Exception:
                pass
        if self._own_root:
            shutil.rmtree(self.temp_root, ignore_errors=True)
        return killed

    def __enter__(self) -> "LocalCluster":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- inspection ------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The head's GCS address, "IP:PORT" (pass it to `ray.init`/`rack run --address`)."""
        if self._cluster is None:
            raise ClusterError("the local cluster is not up")
        return self._cluster.address

    def describe(self) -> list[dict]:
        """One row per node: name, node_id, resources, num_cpus, object_store_bytes."""
        return [{"name": s.name, "node_id": self.node_ids.get(s.name), "resources": dict(s.resources),
                 "num_cpus": s.num_cpus, "object_store_bytes": s.object_store_bytes}
                for s in [self.head] + self.workers]

    def node_of(self, node_id: str) -> str | None:
        """The name of the node with Ray node id `node_id` (None if not ours)."""
        return next((n for n, i in self.node_ids.items() if i == node_id), None)

    def processes(self) -> list:
        """psutil.Process objects of every process this cluster runs: those whose
        command line names its temp root (GCS, raylets, agents) and their descendants
        (the workers and actors, whose titles are rewritten to "ray::...")."""
        return cluster_processes(self.temp_root)


def cluster_processes(temp_root: str) -> list:
    """Processes whose command line contains `temp_root`, plus all their descendants."""
    import psutil

    roots = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_root in a for a in (p.info["cmdline"] or [])):
                roots.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    seen = {p.pid: p for p in roots}
    for p in roots:
        try:
            for c in p.children(recursive=True):
                seen.setdefault(c.pid, c)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return list(seen.values())


def wait_gone(procs: list, timeout_s: float) -> list:
    """Wait up to `timeout_s` for the psutil processes `procs` to exit; returns those
    still running (zombies count as gone)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = procs
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
    out = []
    for p in alive:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out
