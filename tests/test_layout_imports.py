"""The architecture's import rules, checked on the source with the standard library's
ast (DESIGN.md, issues 15 and 32; the rules and the checker: scripts/architecture.py):
cores under devices/ and interconnect/ import neither asyncio nor Ray; `workloads`
imports nothing of the project; inside rack/ every import points down the layers
(serving < wiring < measure < runtime < run < serve < experiments < cli); no import
cycle among the project's modules; no private name taken across packages; and
docs/architecture.md is what the imports draw today (imports inside functions count;
`if TYPE_CHECKING:` blocks do not, they never run)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import architecture as A  # noqa: E402

sys.path.pop(0)

MODULES = A.modules()
GRAPH = A.graph()


def test_no_import_cycle_among_the_projects_modules():
    assert A.cycles(GRAPH) == []


def test_every_import_inside_rack_points_down_a_layer():
    assert A.wrong_imports(GRAPH) == []


def test_no_private_name_is_taken_across_packages():
    assert A.private_imports() == []


def test_cores_import_neither_asyncio_nor_ray():
    bad = []
    for mod, path in MODULES.items():
        if mod.split(".")[0] not in ("devices", "interconnect", "workloads"):
            continue
        names = A.runtime_imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
        bad += [f"{mod} imports {n}" for n in names if n.split(".")[0] in ("asyncio", "ray")]
    assert bad == []


def test_every_rack_folder_is_a_layer_and_says_its_job_and_what_it_may_import():
    folders = sorted(p.name for p in (ROOT / "rack").iterdir()
                     if p.is_dir() and any(p.glob("*.py")))
    assert folders == sorted(A.RANK)
    for name in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "rack" / name / "__init__.py").read_text())) or ""
        assert "May import" in doc or "may import" in doc, name


def test_architecture_page_is_generated_from_todays_imports():
    assert A.missing_path_steps() == []
    assert (ROOT / "docs" / "architecture.md").read_text() == A.render(), \
        "docs/architecture.md is stale: run python scripts/architecture.py"


@pytest.mark.parametrize("graph, expected", [
    ({"rack.serving.router": {"rack.cli.run"}, "rack.cli.run": set()}, "a layer above"),
    ({"rack.measure.metrics": {"rack.runtime.virtual"}, "rack.runtime.virtual": set()}, "a layer above"),
    ({"workloads.core": {"devices.specs"}, "devices.specs": set()}, "not below"),
    ({"devices.specs": {"rack.cli.run"}, "rack.cli.run": set()}, "not below"),
    ({"rack": {"rack.run.runner"}, "rack.run.runner": set()}, "at load time"),
])
def test_the_checker_finds_an_upward_import(graph, expected):
    found = A.wrong_imports(graph)
    assert len(found) == 1 and expected in found[0]


def test_the_checker_allows_downward_and_same_folder_imports():
    assert A.wrong_imports({"rack.cli.run": {"rack.run.runner", "rack.cli.app", "rack", "devices.specs"},
                            "rack.run.runner": {"rack.measure.metrics"}, "rack.cli.app": set(),
                            "rack": set(), "devices.specs": {"workloads.core"},
                            "rack.measure.metrics": set(), "workloads.core": set()}) == []


def test_the_checker_finds_a_cycle():
    assert A.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_the_checker_finds_a_private_name_taken_across_packages(tmp_path):
    for pkg in A.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "rack" / "measure").mkdir()
    (tmp_path / "rack" / "measure" / "__init__.py").write_text("")
    (tmp_path / "rack" / "measure" / "plots.py").write_text("def _plt():\n    pass\n")
    (tmp_path / "rack" / "cli").mkdir()
    (tmp_path / "rack" / "cli" / "__init__.py").write_text("")
    (tmp_path / "rack" / "cli" / "a.py").write_text("from rack.measure.plots import _plt\n")
    (tmp_path / "rack" / "cli" / "b.py").write_text("import rack.measure.plots as P\nP._plt()\n")
    (tmp_path / "rack" / "measure" / "c.py").write_text("from .plots import _plt\n")   # same package: fine
    assert A.private_imports(tmp_path) == ["rack.cli.a imports _plt from rack.measure.plots",
                                           "rack.cli.b reads _plt of rack.measure.plots"]
