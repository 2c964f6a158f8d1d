"""The architecture's import rules, checked on the source with the standard library's
ast (DESIGN.md, issue 15): cores under devices/ and interconnect/ import neither asyncio
nor Ray, `workloads` imports nothing of the project, and no import cycle exists among
the project's modules (imports inside functions count; `if TYPE_CHECKING:` blocks do not,
they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workloads", "devices", "interconnect", "rack")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _runtime_imports(tree: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """Names of the modules `tree` imports at run time (absolute, dotted)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.append(mod)
                found.extend(f"{mod}.{a.name}" for a in child.names)
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        names = _runtime_imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
        graph[mod] = {n for n in names if n in MODULES and n != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_among_the_projects_modules():
    assert _cycles(_graph()) == []


def test_cores_import_neither_asyncio_nor_ray():
    bad = []
    for mod, path in MODULES.items():
        if mod.split(".")[0] not in ("devices", "interconnect", "workloads"):
            continue
        names = _runtime_imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
        bad += [f"{mod} imports {n}" for n in names if n.split(".")[0] in ("asyncio", "ray")]
    assert bad == []


def test_package_layering():
    """workloads is the bottom (imports nothing of the project); devices and
    interconnect import only workloads and each other; rack is the top."""
    graph = _graph()
    wrong = []
    for mod, deps in graph.items():
        top = mod.split(".")[0]
        for d in deps:
            dtop = d.split(".")[0]
            if top == "workloads" and dtop != "workloads":
                wrong.append((mod, d))
            if top in ("devices", "interconnect") and dtop == "rack":
                wrong.append((mod, d))
    assert wrong == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
