"""README.md stays a short manual that points at the pages: its test command is the one CI runs, it links every
page of docs/, and it stays under 250 lines. What holds for every page (settings, metrics, commands, links) is in
tests/test_docs.py."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"


def test_ci_runs_the_readme_test_command() -> None:
    assert TEST_COMMAND in README, "README.md must give the test command .ci/run runs"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in ci, ".ci/run must run the test command README.md gives"


def test_the_readme_gives_the_command_that_serves_the_default_model() -> None:
    assert ".venv/bin/python -m service" in README


def test_the_readme_is_short() -> None:
    lines = README.count("\n")
    assert lines <= 250, f"README.md has {lines} lines; keep it at most 250 and move the detail to a docs/ page"


def test_the_readme_links_every_docs_page() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", README))
    pages = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    missing = sorted(pages - linked)
    assert not missing, f"README.md's Documentation table must link {missing}"
