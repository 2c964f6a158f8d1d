"""The README is a front page and the docs' examples are recorded (scripts/record_docs.py):
the README stays short and links every docs page, no page names a machine's folders,
every recorded block is well formed, and a deterministic example re-recorded now is
byte for byte what the page shows (so it cannot drift from what the code prints)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("record_docs", ROOT / "scripts" / "record_docs.py")
record_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record_docs)

PAGES = record_docs.files()


def test_the_readme_is_a_front_page_linking_every_docs_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    # the two commands first: install and the main job, then the tests exactly as CI runs them
    first = text.split("```bash\n", 1)[1].splitlines()[:2]
    assert first[0].startswith("pip install -e . && rack run")
    assert first[1].startswith("pip install -e '.[dev]' && python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[dev]'" in ci and "\npython -m pytest\n" in ci
    assert "<!-- rack-says:begin" in text and "<!-- rack-says:end -->" in text
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)\)", text))
    missing = {p.name for p in (ROOT / "docs").glob("*.md")} - linked
    assert not missing, f"docs pages the README does not link: {sorted(missing)}"
    index = (ROOT / "docs" / "README.md").read_text()
    assert not {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"} - set(re.findall(r"\(([\w.-]+\.md)\)", index))


def test_no_page_names_a_machines_folders():
    for path in PAGES:
        bad = re.findall(r"(?:/work/|/home/\w|/Users/\w|/root/)\S*", path.read_text())
        assert not bad, f"{path.relative_to(ROOT)}: {bad[:3]}"


def test_every_code_fence_stands_on_its_own_line():
    """A fence with text after it (other than an info string such as `bash`) is no
    closing fence in CommonMark: the block runs on and the rest of the page renders
    swapped (docs/serve.md did)."""
    for path in [*PAGES, ROOT / "README.md"]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                assert re.fullmatch(r"\s*```+[\w+-]*\s*", line), f"{path.relative_to(ROOT)}:{i}: {line[:60]}"


def test_recorded_blocks_are_well_formed():
    n = 0
    for path in PAGES:
        text = path.read_text()
        assert text.count("<!-- /record -->") == text.count("<!-- record:") + text.count("<!-- record-serve:"), path
        for m in record_docs.blocks(text):
            body = m.group("body")
            assert body.startswith("```\n$ ") and body.endswith("```\n"), (path.name, m.group("cmd"), body[:80])
            if not m.group("serve"):
                assert body.startswith(f"```\n$ {m.group('cmd')}\n"), (path.name, m.group("cmd"))
            n += 1
    assert n >= 10


@pytest.mark.skipif(shutil.which("rack") is None, reason="the `rack` command is not installed (pip install -e .)")
def test_a_deterministic_example_re_records_to_what_the_page_shows():
    cmd = "rack trace stats azure_code --json"
    text = (ROOT / "docs" / "workloads.md").read_text()
    block = next(m for m in record_docs.blocks(text) if m.group("cmd") == cmd)
    with tempfile.TemporaryDirectory() as tmp:
        got = record_docs.run_command(cmd, Path(tmp))
    assert block.group("body") == f"```\n{got}\n```\n"
