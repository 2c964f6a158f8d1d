"""`rack cluster up|down|status`: a multi-node Ray cluster on this one machine.

`up` starts a head and worker nodes (`rack.runtime.cluster.LocalCluster`) in a
background process that holds them, writes a state file (address, pid, nodes) and
returns once every node is up; `rack run --address ADDRESS` (or `rack sweep`,
`rack compare`, `rack scale-test --address`) then uses it. `down` asks that process to
stop the nodes and checks that nothing of the cluster is left running. `--foreground`
keeps `up` in the terminal until Ctrl-C instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from rack.cli.app import app, command_group

cluster_app = command_group(help="A local multi-node Ray cluster on this machine (head + worker nodes).")
app.add_typer(cluster_app, name="cluster")

DEFAULT_NODES = ["prefill=8", "decode=8"]


def default_state_path() -> Path:
    """$RACK_CLUSTER_STATE, or /tmp/rack-cluster-<uid>.json (one cluster per user)."""
    return Path(os.environ.get("RACK_CLUSTER_STATE") or f"/tmp/rack-cluster-{os.getuid()}.json")


_STATE = typer.Option(None, "--state", help="state file [default: $RACK_CLUSTER_STATE or /tmp/rack-cluster-<uid>.json]")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _read_state(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        _fail(f"no local cluster: {path} does not exist (start one with `rack cluster up`)", code=1)
    except json.JSONDecodeError as exc:
        _fail(f"{path}: not a cluster state file ({exc})")
    missing = [k for k in ("pid", "address", "temp_root", "nodes") if not isinstance(info, dict) or k not in info]
    if missing:
        _fail(f"{path}: not a cluster state file (no {', '.join(missing)}); pass --state or remove it")
    return info


def _alive(pid: int) -> bool:
    import psutil

    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _parse_nodes(nodes: List[str], head: str):
    from rack.runtime.cluster import ClusterError, parse_node_spec

    try:
        workers = [parse_node_spec(text, f"worker-{i}") for i, text in enumerate(nodes)]
        head_spec = parse_node_spec(head, "head")
    except ClusterError as exc:
        _fail(str(exc))
    # Name a node after its first custom resource ("prefill") when that is unambiguous.
    firsts = [next(iter(w.resources), None) for w in workers]
    workers = [replace(w, name=f) if f and f != "head" and firsts.count(f) == 1 else w
               for w, f in zip(workers, firsts)]
    return workers, head_spec


@cluster_app.command("up")
def up(
    node: Optional[List[str]] = typer.Option(None, "--node", help="a worker node: RES=N[,RES=N...][,cpus=N][,store_mb=N]; repeat for more nodes [default: prefill=8 and decode=8]"),
    head: str = typer.Option("head=64", "--head", help="the head node, same syntax"),
    state: Optional[Path] = _STATE,
    foreground: bool = typer.Option(False, "--foreground", help="stay in the terminal; Ctrl-C stops the cluster"),
    timeout: float = typer.Option(120.0, "--timeout", help="seconds to wait for the nodes"),
) -> None:
    """Start a head and worker nodes on this machine; print the address to pass to --address."""
    path = state or default_state_path()
    nodes = list(node or DEFAULT_NODES)
    workers, head_spec = _parse_nodes(nodes, head)
    if path.exists():
        old = _read_state(path)
        if _alive(old.get("pid", -1)):
            _fail(f"a local cluster is already up at {old.get('address')} (pid {old['pid']}); "
                  f"`rack cluster down` first", code=1)
        path.unlink()
    if foreground:
        _serve(workers, head_spec, path, timeout)
        return
    log = Path(str(path) + ".log")
    cmd = [sys.executable, "-m", "rack", "cluster", "up", "--foreground", "--state", str(path),
           "--head", head, "--timeout", str(timeout)] + [a for n in nodes for a in ("--node", n)]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + timeout + 30
    while time.monotonic() < deadline:
        if path.exists():
            info = _read_state(path)
            typer.echo(_describe(info))
            return
        if proc.poll() is not None:
            _fail(f"the cluster process exited ({proc.returncode}); its log: {log}\n"
                  + log.read_text()[-2000:], code=1)
        time.sleep(0.3)
    proc.terminate()
    _fail(f"the cluster did not come up within {timeout + 30:.0f} s; its log: {log}", code=1)


def _serve(workers, head_spec, path: Path, timeout: float) -> None:
    from rack.runtime.cluster import ClusterError, LocalCluster

    c = LocalCluster(workers, head=head_spec, connect=False, node_timeout_s=timeout)
    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        c.up()
    except ClusterError as exc:
        _fail(str(exc), code=1)
    try:
        info = {"pid": os.getpid(), "address": c.address, "temp_root": c.temp_root, "nodes": c.describe(),
                "started": time.time()}
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(path)            # atomic: a reader never sees half a file
        typer.echo(_describe(info), err=True)
        while not stop["flag"]:
            time.sleep(0.5)
    finally:
        killed = c.down()
        if killed:
            typer.echo(f"killed {len(killed)} process(es) that outlived the shutdown: {killed}", err=True)
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass


def _describe(info: dict) -> str:
    lines = [f"local Ray cluster at {info['address']} (pid {info['pid']}, logs under {info['temp_root']})"]
    for n in info["nodes"]:
        res = ", ".join(f"{k}={v:g}" for k, v in n["resources"].items()) or "-"
        lines.append(f"  {n['name']:<10} {(n['node_id'] or '')[:12]:<12} cpus={n['num_cpus']} "
                     f"store={n['object_store_bytes'] / 2**20:.0f} MiB  resources: {res}")
    lines.append(f"use it: rack run --address {info['address']} ...; stop it: rack cluster down")
    return "\n".join(lines)


@cluster_app.command("status")
def status(state: Optional[Path] = _STATE) -> None:
    """Show the local cluster's address and nodes (exit code 1 when none is up)."""
    path = state or default_state_path()
    info = _read_state(path)
    if not _alive(info.get("pid", -1)):
        _fail(f"the local cluster recorded in {path} is gone (pid {info.get('pid')} not running)", code=1)
    typer.echo(_describe(info))


@cluster_app.command("address")
def address(state: Optional[Path] = _STATE) -> None:
    """Print only the address (for `--address $(rack cluster address)`)."""
    info = _read_state(state or default_state_path())
    typer.echo(info["address"])


@cluster_app.command("down")
def down(state: Optional[Path] = _STATE,
         timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for every process to exit")) -> None:
    """Stop the local cluster and check that none of its processes is left."""
    from rack.runtime.cluster import wait_gone, cluster_processes

    path = state or default_state_path()
    info = _read_state(path)
    pid = info.get("pid", -1)
    import psutil

    procs = cluster_processes(info["temp_root"])
    if _alive(pid):
        server = psutil.Process(pid)
        os.kill(pid, signal.SIGTERM)
        if wait_gone([server], timeout):
            _fail(f"the cluster process {pid} did not exit within {timeout:.0f} s", code=1)
    left = wait_gone(procs, 5.0)
    path.unlink(missing_ok=True)
    Path(str(path) + ".log").unlink(missing_ok=True)
    if left:
        for p in left:
            try:
                p.kill()
            except Exception:
                pass
        _fail(f"{len(left)} process(es) of the cluster outlived it and were killed: "
              f"{[p.pid for p in left]}", code=1)
    typer.echo(f"local Ray cluster at {info['address']} stopped; no process left")
