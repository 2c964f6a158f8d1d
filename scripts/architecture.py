"""The project's layers, read from its own imports: writes docs/architecture.md and
checks the import rules (tests/test_layout_imports.py uses the same functions).

    python scripts/architecture.py            # rewrite docs/architecture.md
    python scripts/architecture.py --check    # exit 1 if docs/architecture.md is stale
                                              # or an import breaks a rule

The rules (issue 32):
- the top-level packages stack as `workloads` < `devices`, `interconnect` < `rack`
  (`workloads` imports nothing of the project; `devices` and `interconnect` never import
  `rack`);
- inside `rack/`, every folder is one layer of `LAYERS` and imports only folders
  below it (or itself); the package root `rack/__init__.py` imports nothing at load
  time (its lazy re-exports name modules as strings), so any module may read
  `rack.__version__`;
- no import cycle among the project's modules;
- no module imports a private name (`_x`) from another package, or reads one as an
  attribute of a module it imported (`mod._x`).

Imports inside functions count (they run); `if TYPE_CHECKING:` blocks do not.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workloads", "devices", "interconnect", "rack")
DOC = ROOT / "docs" / "architecture.md"

#: rack/'s folders, bottom to top, each with its one job. A folder may import the
#: folders listed before it (and devices/, interconnect/, workloads/).
LAYERS: tuple[tuple[str, str], ...] = (
    ("serving", "the rack's own cores besides the engines: router (admission, routing, closed "
                "loop, fault recovery), collector, fault injector, admission rules"),
    ("wiring", "from a scenario file to the cores a run needs: scenario schema and loading, "
               "settings, sizing, topology, faults, pacing limits"),
    ("measure", "what one run measured: per-request metrics, quantiles, energy and cost, stage "
                "breakdown, faults section, time series, results folder, plots of one run"),
    ("runtime", "the two drivers that place the same cores (virtual time; Ray actors on a "
                "dilated clock), Ray hosting and watching, parallel maps of independent runs"),
    ("run", "one run from scenario and requests to results: `run_scenario`, its map tasks"),
    ("serve", "the live HTTP endpoint (OpenAI and vLLM routes, gateway core, Ray front host, "
              "live session, load generator)"),
    ("experiments", "many runs: compare, sweeps and capacity search, interactivity curves, "
                    "the study, validation against measured serving, benchmarks, reports"),
    ("cli", "the `rack` command: one module per command"),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
PACKAGE_RANK = {"workloads": 0, "devices": 1, "interconnect": 1, "rack": 2}

#: One request's path through the layers (`rack run`, virtual runtime). Each step names
#: a `module:qualname` that must exist, so the page fails its check when code moves.
REQUEST_PATH: tuple[tuple[str, str], ...] = (
    ("rack.cli.run:run", "`rack run` parses options, loads the scenario and the trace"),
    ("rack.wiring.load:load_scenario", "a shipped name or TOML file becomes a checked `Scenario`"),
    ("workloads.replay:load_requests", "the trace becomes `Request`s (arrival, prompt and output "
                                      "tokens, prefix hashes)"),
    ("rack.run.runner:run_scenario", "one run: topology, then a driver, then results"),
    ("rack.wiring.topology:build_topology", "the cores a run needs, each a `ComponentSpec` "
                                            "(sized by `rack.wiring.sizing`)"),
    ("rack.runtime.virtual_run:run_topology_virtual", "the virtual driver places the cores and "
                                                      "delivers their messages in time order"),
    ("rack.serving.router:Router", "the request arrives: admission, then a prefill instance "
                                   "chosen by the routing policy"),
    ("devices.engines.prefill:PrefillEngine", "its prompt is prefilled in batches under the "
                                              "cost model's compute and memory budgets"),
    ("interconnect.component:Interconnect", "its KV cache crosses the throttled link as a "
                                            "msgpack payload"),
    ("devices.engines.decode:DecodeEngine", "its tokens are decoded in continuous batches "
                                            "(micro-batches in flight on a pipeline)"),
    ("rack.serving.collector:Collector", "its first token, end and reason are recorded"),
    ("rack.measure.metrics:compute", "TTFT, TPOT, ITL, goodput and SLO attainment from the "
                                     "records"),
    ("rack.measure.results:write_results", "results.json and requests.csv"),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `PACKAGES` under `root`."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _base(module: str, is_pkg: bool, level: int) -> list[str]:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    return base[: len(base) - (level - 1)]


def _walk_runtime(tree: ast.AST):
    """Every node of `tree` outside `if TYPE_CHECKING:` bodies (they never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            yield child
            stack.append(child)


def runtime_imports(tree: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """Names of the modules `tree` imports at run time (absolute, dotted), plus
    `mod.name` for each name of a from-import (a name may be a submodule)."""
    found: list[str] = []
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = (".".join(_base(module, is_pkg, node.level) + ([node.module] if node.module else []))
                   if node.level else (node.module or ""))
            found.append(mod)
            found.extend(f"{mod}.{a.name}" for a in node.names)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project's modules it imports at run time."""
    mods = modules(root)
    out: dict[str, set[str]] = {}
    for mod, path in mods.items():
        names = runtime_imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
        out[mod] = {n for n in names if n in mods and n != mod}
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def folder(module: str) -> str | None:
    """The layer of a rack module (`rack.measure.metrics` -> "measure"); None for the
    package root and modules directly under rack/ (`rack.__main__`, above every layer)."""
    parts = module.split(".")
    if parts[0] != "rack" or len(parts) < 2:
        return None
    if parts[1] not in RANK:
        return None if len(parts) == 2 else parts[1]
    return parts[1]


def wrong_imports(g: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the layering rules (module docstring), as text."""
    bad = []
    for mod, deps in sorted(g.items()):
        top = mod.split(".")[0]
        for d in sorted(deps):
            dtop = d.split(".")[0]
            if PACKAGE_RANK[dtop] > PACKAGE_RANK[top] or (top != dtop and PACKAGE_RANK[dtop] == PACKAGE_RANK[top]
                                                          and top == "workloads"):
                bad.append(f"{mod} -> {d}: package {dtop} is not below {top}")
                continue
            if top != "rack" or dtop != "rack":
                continue
            if mod == "rack":
                bad.append(f"rack/__init__.py imports {d} at load time (re-export it lazily)")
                continue
            fm, fd = folder(mod), folder(d)
            if fd is None or fm == fd:
                continue            # the package root (for __version__), or the same folder
            if fm is None:
                if mod != "rack.__main__":
                    bad.append(f"{mod}: a module directly under rack/ outside every layer")
                continue
            if fm not in RANK or fd not in RANK:
                bad.append(f"{mod} -> {d}: folder {fm if fm not in RANK else fd} is in no layer")
            elif RANK[fd] > RANK[fm]:
                bad.append(f"{mod} -> {d}: {fm} imports {fd}, a layer above it")
    return bad


def _package(module: str, mods: dict[str, Path]) -> str:
    """The package a module belongs to (itself for a package's __init__)."""
    return module if mods[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def private_imports(root: Path = ROOT) -> list[str]:
    """`from x import _name` and `mod._name` reads across packages, as text."""
    mods = modules(root)
    bad = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        is_pkg = path.name == "__init__.py"
        here = _package(mod, mods)
        aliases: dict[str, str] = {}     # local name -> project module it is bound to
        for node in _walk_runtime(tree):
            if isinstance(node, ast.ImportFrom):
                src = (".".join(_base(mod, is_pkg, node.level) + ([node.module] if node.module else []))
                       if node.level else (node.module or ""))
                if src.split(".")[0] not in PACKAGES:
                    continue
                for a in node.names:
                    full = f"{src}.{a.name}"
                    if full in mods:
                        aliases[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__") and src in mods \
                            and _package(src, mods) != here:
                        bad.append(f"{mod} imports {a.name} from {src}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        aliases[a.asname] = a.name
        for node in _walk_runtime(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if _package(target, mods) != here:
                    bad.append(f"{mod} reads {node.attr} of {target}")
    return sorted(set(bad))


def render(root: Path = ROOT) -> str:
    """docs/architecture.md, from the imports under `root`."""
    g = graph(root)
    edges: set = set()
    for mod, deps in g.items():
        a = folder(mod) or mod.split(".")[0]
        for d in deps:
            b = folder(d) or d.split(".")[0]
            if a != b and b != "rack" and a != "rack":
                edges.add((a, b))
    order = [name for name, _ in reversed(LAYERS)] + ["devices", "interconnect", "workloads"]
    jobs = dict(LAYERS) | {
        "devices": "hardware and models: catalog, cost model, memory planner, the engine cores",
        "interconnect": "the KV link core and the payload codec",
        "workloads": "requests and traces, the event core (`workloads.core`), clocks; imports "
                     "nothing of the project",
    }
    out = ["# Architecture: the layers and one request's path",
           "",
           "<!-- generated by `python scripts/architecture.py` from the code's own imports; "
           "do not edit (tests/test_layout_imports.py fails when it is stale) -->",
           "",
           "Every arrow is a folder importing another; each points down the page. A folder "
           "may import any folder below it, never one above; inside `rack/` the order is "
           "the list below (top first). `devices/`, `interconnect/` and `workloads/` are the "
           "cores and never import `rack/`. The rules and their check: `scripts/architecture.py`"
           " and `tests/test_layout_imports.py`.",
           "",
           "```mermaid",
           "flowchart TD"]
    for name in order:
        out.append(f'    {name}["{"rack/" if name in RANK else ""}{name}/"]')
    for (a, b) in sorted(edges, key=lambda e: (order.index(e[0]), order.index(e[1]))):
        out.append(f"    {a} --> {b}")
    # counts of lines and modules are left out on purpose: the page changes only when a
    # folder starts (or stops) importing another, which is a change of architecture
    out += ["```", "",
            "| folder | its job | imports |",
            "|---|---|---|"]
    for name in order:
        deps = ", ".join(b for (a, b) in sorted(edges, key=lambda e: order.index(e[1])) if a == name) or "-"
        path = f"rack/{name}/" if name in RANK else f"{name}/"
        out.append(f"| `{path}` | {jobs[name]} | {deps} |")
    out += ["", "## One request's path (`rack run`, virtual runtime)", ""]
    for i, (ref, what) in enumerate(REQUEST_PATH, 1):
        mod, name = ref.split(":")
        layer = folder(mod) or mod.split(".")[0]
        out.append(f"{i}. `{mod}.{name}` ({layer}): {what}.")
    out += ["",
            "On the Ray runtime step 6 is `rack.runtime.ray_runtime` (one actor per core, "
            "`rack.runtime.ray_host.CoreHost`), and the cores are the same objects; `rack serve` "
            "puts the HTTP front (`rack.serve.ray_front.FrontHost`) in front of the router "
            "instead of the trace. Experiments (`rack compare`, `rack sweep`, `rack study`) "
            "call step 4 once per run, in parallel (`rack.runtime.parallel`).",
            ""]
    return "\n".join(out)


def missing_path_steps(root: Path = ROOT) -> list[str]:
    """Steps of `REQUEST_PATH` whose module or top-level name no longer exists."""
    mods = modules(root)
    bad = []
    for ref, _ in REQUEST_PATH:
        mod, name = ref.split(":")
        if mod not in mods:
            bad.append(f"{ref}: no module {mod}")
            continue
        tree = ast.parse(mods[mod].read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if name not in names:
            bad.append(f"{ref}: {mod} defines no {name}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is stale or a rule is broken")
    args = ap.parse_args(argv)
    problems = (wrong_imports(graph()) + [f"cycle: {c}" for c in cycles(graph())] + private_imports()
                + missing_path_steps())
    for p in problems:
        print(p, file=sys.stderr)
    text = render()
    if args.check:
        stale = not DOC.exists() or DOC.read_text() != text
        if stale:
            print(f"{DOC.relative_to(ROOT)} is stale: run python scripts/architecture.py", file=sys.stderr)
        return 1 if stale or problems else 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
