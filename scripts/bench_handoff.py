"""Per-request cost of the three pure modules every request goes through, old vs new code.

The modules: the KV payload codec (`interconnect/codec.py`: a request's KV handoff =
`make_kv_frames`, the interconnect's header check, the receiver's verification), the
memory managers (`devices/memory.py`: `MemoryLedger`, `KVBlockPool`, `PrefixCache`) and
the cost model's per-iteration calls (`devices/costmodel.py`: `CostModel.prefill`,
`mixed`, `mixed_steps`, `decode_steps`, `decode_step`).

How it measures:
1. Record. One whole-trace replay (virtual runtime, `--trace` through `--scenario`) with
   these classes and functions wrapped: every outermost call into them is logged with
   its arguments (arrays copied), with the constructor arguments of each ledger, block
   pool, prefix cache and cost model. The wrappers also time the calls, so the share of
   the three modules in that replay is printed too ("in the replay", wrapper overhead
   included).
2. Load the old code: the three modules as they are at `--base` (a git revision,
   default `main`), read with `git show` and imported under private names; the new code
   is the working tree's.
3. Check, then time. One untimed pass checks that both versions give the same values
   (memory and cost model: every call's result, floats within 1e-12 relative; handoff:
   the receiver's header tuples). Then `--rounds` rounds replay the log with both
   versions interleaved call by call (request by request for the handoff), the order
   alternating, so that both see the same machine load (this machine's speed drifts by
   20-70% within a day). A request's handoff is what the prefill engine, the
   interconnect and the decode engine do: `make_kv_frames`, the header check without
   hashing (`scan_kv_frames(frames, False)` and the interconnect's checks on the header
   tuples) and the verification (`scan_kv_frames(frames, True)`, every body hashed, and
   the decode engine's checks).
4. The handoff's bytes alone: per request, the payload buffer allocated, every body
   copied from the codec's random block and hashed there, then hashed again in the
   buffer (the receiver): the part of the handoff no Python change removes, timed in the
   same rounds.

Prints microseconds per request (median over rounds) per module, old and new, and
old / new; and the three together. Run:

    python scripts/bench_handoff.py [--trace mooncake_conv] [--scenario helios-cs3-kimi-k2]
        [--base main] [--rounds 5] [--log /tmp/handoff.pkl] [--json]

`--log PATH` reuses a recorded log (recorded and saved there if missing). Timing each
call adds the same ~0.1 us to old and new (it pulls ratios slightly toward 1).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import typer
import xxhash
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MODULES = {"codec": ("interconnect.codec", "interconnect/codec.py"),
           "memory": ("devices.memory", "devices/memory.py"),
           "costmodel": ("devices.costmodel", "devices/costmodel.py")}
MEMORY_CLASSES = ("MemoryLedger", "KVBlockPool", "PrefixCache")
MEMORY_SKIP = {"snapshot"}          # statistics, once per run
COST_METHODS = ("prefill", "mixed", "mixed_steps", "decode_steps", "decode_step")
PAYLOAD_CHECKS = ("scan_kv_frames", "verify_kv_frames")   # timed in the replay, not logged

app = typer.Typer(add_completion=False)


# ---------------------------------------------------------------------------- record
@dataclass
class CallLog:
    """What one replay asked of the three modules.

    kv: make_kv_frames argument tuples (request_id, n_tokens, kv_bytes_per_token,
    n_layers, layer_group, payload_scale, kv_dtype, seed), in call order.
    memory: (object index, method, args, kwargs, refs) in call order, `refs` the
    positions in args of earlier objects (given by their index); method "__init__"
    creates object `index` of class args[0] from args[1:].
    cost: the same for cost models.
    requests: requests in the trace; replay_s: the recorded replay's wall time;
    in_replay_s: seconds spent in each module's outermost calls during it.
    """

    kv: list = field(default_factory=list)
    memory: list = field(default_factory=list)
    cost: list = field(default_factory=list)
    requests: int = 0
    replay_s: float = 0.0
    in_replay_s: dict = field(default_factory=dict)


def _frozen(a: Any) -> Any:
    """A copy of a call argument that later mutation by the caller cannot change."""
    if isinstance(a, np.ndarray):
        return a.copy()
    if isinstance(a, list):
        return [_frozen(x) for x in a]
    return a


class _Recorder:
    """Wraps the modules' classes and functions; logs and times outermost calls."""

    def __init__(self) -> None:
        self.log = CallLog()
        self.depth = 0
        self.ids: dict[int, int] = {}          # id(object) -> index
        self.keep: list = []                   # keeps recorded objects alive (ids stay unique)
        self.spent = {"codec": 0.0, "memory": 0.0, "costmodel": 0.0}
        self.undo: list[Callable[[], None]] = []

    def _args(self, args: tuple) -> tuple[tuple, tuple]:
        """(args with recorded objects replaced by their index, positions replaced)."""
        refs = tuple(i for i, a in enumerate(args) if id(a) in self.ids)
        return tuple(self.ids[id(a)] if i in refs else _frozen(a) for i, a in enumerate(args)), refs

    def _timed(self, orig: Callable, module: str, log: Callable[..., None] | None) -> Callable:
        rec = self

        def wrapper(*args, **kwargs):
            if rec.depth:
                return orig(*args, **kwargs)
            if log is not None:
                log(*args, **kwargs)
            rec.depth += 1
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                rec.spent[module] += time.perf_counter() - t0
                rec.depth -= 1
        return wrapper

    def _wrap_method(self, cls: type, name: str, sink: list, module: str) -> None:
        orig = cls.__dict__[name]

        def log(obj, *args, **kwargs):
            logged, refs = self._args(args)
            if name == "__init__":
                self.ids[id(obj)] = len(self.keep)
                self.keep.append(obj)
                sink.append((self.ids[id(obj)], name, (cls.__name__, *logged), kwargs, tuple(i + 1 for i in refs)))
            else:
                sink.append((self.ids[id(obj)], name, logged, _frozen(kwargs), refs))

        setattr(cls, name, self._timed(orig, module, log))
        self.undo.append(lambda: setattr(cls, name, orig))

    def _wrap_function(self, mod: Any, name: str, sink: Optional[list], module: str) -> None:
        orig = getattr(mod, name)
        wrapper = self._timed(orig, module, None if sink is None else (lambda *a, **k: sink.append(_make_args(*a, **k))))
        # every module that imported the function by name calls the wrapper
        for m in list(sys.modules.values()):
            if getattr(m, name, None) is orig:
                setattr(m, name, wrapper)
                self.undo.append(lambda m=m: setattr(m, name, orig))

    def install(self, codec: Any, memory: Any, costmodel: Any) -> None:
        self._wrap_function(codec, "make_kv_frames", self.log.kv, "codec")
        for fn in PAYLOAD_CHECKS:
            self._wrap_function(codec, fn, None, "codec")
        for cname in MEMORY_CLASSES:
            cls = getattr(memory, cname)
            for name, v in list(vars(cls).items()):
                if callable(v) and not isinstance(v, (staticmethod, classmethod, type)) and (
                        name in ("__init__", "__len__") or not (name.startswith("_") or name in MEMORY_SKIP)):
                    self._wrap_method(cls, name, self.log.memory, "memory")
        for name in ("__init__", *COST_METHODS):
            self._wrap_method(costmodel.CostModel, name, self.log.cost, "costmodel")

    def uninstall(self) -> None:
        for f in reversed(self.undo):
            f()
        self.undo.clear()


def _make_args(request_id, n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale,
               kv_dtype="fp8", seed=0) -> tuple:
    return (int(request_id), int(n_tokens), int(kv_bytes_per_token), int(n_layers), int(layer_group),
            float(payload_scale), kv_dtype, int(seed))


def record(trace: str, scenario: str) -> CallLog:
    """Replay `trace` through `scenario` (virtual runtime) and log the modules' calls."""
    import devices.costmodel as costmodel
    import devices.memory as memory
    import interconnect.codec as codec
    from rack.run.runner import run_scenario
    from rack.wiring.load import load_scenario
    from workloads import load_requests

    sc = load_scenario(scenario)
    reqs = load_requests(trace)
    run_scenario(sc, reqs[:20], runtime="virtual")           # imports, catalog, payload block
    rec = _Recorder()
    rec.install(codec, memory, costmodel)
    try:
        t0 = time.perf_counter()
        run_scenario(sc, reqs, runtime="virtual")
        rec.log.replay_s = time.perf_counter() - t0
    finally:
        rec.uninstall()
    rec.log.requests = len(reqs)
    rec.log.in_replay_s = dict(rec.spent)
    return rec.log


# ---------------------------------------------------------------------------- versions
def load_module_at(rev: str, key: str) -> Any:
    """The module `key` ("codec", "memory", "costmodel") as it is at git revision `rev`,
    imported under a private name in its package (its relative imports resolve to the
    working tree's modules, e.g. devices.specs)."""
    name, path = MODULES[key]
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True,
                         capture_output=True, text=True).stdout
    package = name.rpartition(".")[0]
    private = f"{package}._bench_{key}_{''.join(c if c.isalnum() else '_' for c in rev)}"
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(private, loader=None))
    mod.__package__ = package
    sys.modules[private] = mod          # dataclasses look their module up while decorating
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


@dataclass
class Version:
    """One version of the three modules."""

    label: str
    codec: Any
    memory: Any
    costmodel: Any

    def classes(self, part: str) -> dict:
        """Class name -> class of the memory ("memory") or cost-model ("cost") log."""
        if part == "memory":
            return {c: getattr(self.memory, c) for c in MEMORY_CLASSES}
        return {"CostModel": self.costmodel.CostModel}

    def handoff(self, args: tuple) -> list:
        """One request's KV handoff (see the module docstring); returns the receiver's
        header tuples."""
        request_id, n_tokens, kvpt, n_layers, _group, scale, _dtype, _seed = args
        frames = self.codec.make_kv_frames(*args[:6], kv_dtype=args[6], seed=args[7])
        _header_check(self.codec, frames, request_id, n_tokens * kvpt, scale)
        return _verify(self.codec, frames, request_id, n_tokens, n_layers)


def _header_check(codec: Any, frames: list, rid: int, logical_bytes: int, scale: float) -> int:
    """The interconnect's check before shipping (interconnect/component.py `_check_frames`)."""
    shipped = sum(f.nbytes for f in frames)
    total = 0
    for h_rid, _a, _b, _t0, _t1, _d, _s, logical, payload in codec.scan_kv_frames(frames, False):
        if h_rid != rid or payload != codec.payload_size(logical, scale):
            raise AssertionError(f"request {rid}: header check failed")
        total += logical
    if total != logical_bytes:
        raise AssertionError(f"request {rid}: {total} logical bytes, expected {logical_bytes}")
    return shipped


def _verify(codec: Any, frames: list, rid: int, kv_tokens: int, n_layers: int) -> list:
    """The receiver's verification (devices/engines/decode.py `_count_bad_frames`)."""
    entries = codec.scan_kv_frames(frames, True)
    covered = []
    for h in entries:
        if h is None or h[0] != rid or h[3] != 0 or h[4] != kv_tokens:
            raise AssertionError(f"request {rid}: bad frame")
        covered.append((h[1], h[2]))
    pos = 0
    for a, b in sorted(covered):
        if a > pos:
            break
        pos = max(pos, b)
    if pos < n_layers:
        raise AssertionError(f"request {rid}: layers uncovered")
    return entries


def handoff_bytes(codec: Any, args: tuple) -> None:
    """The bytes of one handoff and nothing else: the payload buffer allocated, each
    body copied from the codec's random block and hashed there (the sender), then hashed
    in the buffer (the receiver). Bodies sized as `make_kv_frames` sizes them, at
    pseudo-random offsets in the block, as its bodies are."""
    request_id, n_tokens, kvpt, n_layers, group, scale, _dtype, seed = args
    total = n_tokens * kvpt
    sizes = [codec.payload_size(codec.group_logical_bytes(total, n_layers, a, min(n_layers, a + group)), scale)
             for a in range(0, n_layers, group)]
    block = memoryview(codec._random_block())
    span = len(block) - max(sizes) if max(sizes) < len(block) else 0
    buf = memoryview(np.empty(sum(sizes), dtype=np.uint8))
    digest = xxhash.xxh3_64_intdigest
    off = 0
    for i, n in enumerate(sizes):
        n = min(n, len(block))
        start = digest(bytes((seed & 0xFF, i)) + request_id.to_bytes(8, "little")) % max(span, 1)
        src = block[start : start + n]
        buf[off : off + n] = src
        digest(src)
        off += n
    off = 0
    for n in sizes:
        digest(buf[off : off + n])
        off += n


# ---------------------------------------------------------------------------- timing
def _call_plan(calls: list, classes: dict) -> list:
    """[(bound method, args, kwargs)] of a memory or cost-model log, on fresh objects."""
    objs: dict[int, Any] = {}
    plan = []
    for idx, name, args, kwargs, refs in calls:
        args = tuple(objs[a] if i in refs else a for i, a in enumerate(args))
        if name == "__init__":
            objs[idx] = classes[args[0]](*args[1:], **kwargs)
        else:
            plan.append((getattr(objs[idx], name), args, kwargs))
    return plan


def _plain(v: Any) -> Any:
    """A comparable form of a return value (cost-model results as tuples of floats)."""
    if hasattr(v, "time_s") and hasattr(v, "bound"):
        t = np.asarray(v.time_s, dtype=float)
        n = int(t.size)
        work = v.work(n) if hasattr(v, "work") else (v.flops, v.bytes)
        busy = v.busy(n) if hasattr(v, "busy") else v.device_busy_s
        return (tuple(t.ravel().tolist()), v.bound, tuple(float(x) for x in work), float(busy))
    return v


def _close(a: Any, b: Any, rtol: float = 1e-12) -> bool:
    """Equal, floats within `rtol` relative (the cost model's fast paths' tolerance)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b))
    return a == b


def check_same_results(old: Version, new: Version, log: CallLog) -> None:
    """Both versions give the same values for every call of `log` (AssertionError if not)."""
    for args in log.kv:
        a, b = old.handoff(args), new.handoff(args)
        if a != b:
            raise AssertionError(f"handoff {args}: header tuples differ: {a} vs {b}")
    for part in ("memory", "cost"):
        calls = getattr(log, part)
        plans = [_call_plan(calls, v.classes(part)) for v in (old, new)]
        for i, ((fa, args, kw), (fb, _, _)) in enumerate(zip(*plans)):
            a, b = _plain(fa(*args, **kw)), _plain(fb(*args, **kw))
            if not _close(a, b):
                raise AssertionError(f"{part} call {i} ({fa.__qualname__}): {a!r} vs {b!r}")


def time_round(old: Version, new: Version, log: CallLog) -> dict:
    """Seconds per version and module (and the handoff's bytes alone) for one pass over
    `log`, the versions interleaved call by call, the order alternating."""
    clock = time.perf_counter
    spent = {(v, k): 0.0 for v in ("old", "new") for k in MODULES}
    spent["bytes", "codec"] = 0.0
    for i, args in enumerate(log.kv):
        for label, version in ((("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old))):
            t0 = clock()
            version.handoff(args)
            spent[label, "codec"] += clock() - t0
        t0 = clock()
        handoff_bytes(new.codec, args)
        spent["bytes", "codec"] += clock() - t0
    for part, module in (("memory", "memory"), ("cost", "costmodel")):
        calls = getattr(log, part)
        pairs = zip(_call_plan(calls, old.classes(part)), _call_plan(calls, new.classes(part)))
        for i, ((fo, args, kw), (fn, _, _)) in enumerate(pairs):
            for label, fun in ((("old", fo), ("new", fn)) if i % 2 else (("new", fn), ("old", fo))):
                t0 = clock()
                fun(*args, **kw)
                spent[label, module] += clock() - t0
    return spent


def run(trace: str, scenario: str, base: str, rounds: int, log_path: Optional[str]) -> dict:
    """Record (or load) the log, check that both versions agree, time them."""
    if log_path and os.path.exists(log_path):
        with open(log_path, "rb") as f:
            log = CallLog(**pickle.load(f))
    else:
        log = record(trace, scenario)
        if log_path:
            with open(log_path, "wb") as f:
                pickle.dump(vars(log), f, protocol=pickle.HIGHEST_PROTOCOL)
    import devices.costmodel
    import devices.memory
    import interconnect.codec
    old = Version(base, *(load_module_at(base, k) for k in MODULES))
    new = Version("working tree", interconnect.codec, devices.memory, devices.costmodel)
    check_same_results(old, new, log)
    samples = [time_round(old, new, log) for _ in range(max(1, rounds))]
    n = log.requests
    us = lambda key: 1e6 * statistics.median(s[key] for s in samples) / n  # noqa: E731
    rows = {}
    for k in MODULES:
        rows[k] = {"old_us_per_request": us(("old", k)), "new_us_per_request": us(("new", k))}
    both = {lab: [sum(s[lab, k] for k in MODULES) for s in samples] for lab in ("old", "new")}
    rows["together"] = {"old_us_per_request": 1e6 * statistics.median(both["old"]) / n,
                        "new_us_per_request": 1e6 * statistics.median(both["new"]) / n}
    for r in rows.values():
        r["ratio"] = r["old_us_per_request"] / r["new_us_per_request"]
    return {"trace": trace, "scenario": scenario, "base": base, "rounds": rounds, "requests": n,
            "calls": {"make_kv_frames": len(log.kv), "memory": len(log.memory),
                      "costmodel": sum(1 for c in log.cost if c[1] != "__init__")},
            "handoff_bytes_us_per_request": us(("bytes", "codec")),
            "recorded_replay_s": log.replay_s,
            "in_recorded_replay_us_per_request": {k: 1e6 * v / n for k, v in log.in_replay_s.items()},
            "modules": rows}


@app.command()
def main(trace: str = typer.Option("mooncake_conv", help="trace name or path"),
         scenario: str = typer.Option("helios-cs3-kimi-k2", help="scenario name or file"),
         base: str = typer.Option("main", help="git revision of the old code"),
         rounds: int = typer.Option(5, min=1, help="timed rounds (old and new interleaved in each)"),
         log: Optional[str] = typer.Option(None, help="pickle of a recorded log: reused if present, else saved"),
         as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
    """Per-request cost of the codec, memory managers and cost model: old vs new code."""
    out = run(trace, scenario, base, rounds, log)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    table = Table(title=f"{out['trace']} through {out['scenario']}: {out['requests']} requests; "
                        f"us per request, median of {rounds} rounds")
    for col in ("module", f"old ({base})", "new (working tree)", "old / new"):
        table.add_column(col, justify="left" if col == "module" else "right")
    for k, r in out["modules"].items():
        table.add_row(k, f"{r['old_us_per_request']:.1f}", f"{r['new_us_per_request']:.1f}", f"{r['ratio']:.2f}")
    console = Console()
    console.print(table)
    console.print(f"calls: {out['calls']}")
    console.print(f"the handoff's bytes alone (allocate, copy, hash twice): "
                  f"{out['handoff_bytes_us_per_request']:.1f} us per request")
    console.print(f"the recorded replay (working tree) took {out['recorded_replay_s']:.1f} s; in it, per request "
                  "(us, wrappers included): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in out["in_recorded_replay_us_per_request"].items()))


if __name__ == "__main__":
    app()
