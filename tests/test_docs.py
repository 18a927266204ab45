"""The manual stays true: README.md and the pages of docs/ (docs/lab/, the measurement history, aside) document
every setting and every metric the code defines and name none it does not, their command lines parse, their
relative links resolve, docs/configuration.md is what the code generates, and CHANGELOG.md's latest version is
pyproject.toml's."""

import argparse
import importlib
import importlib.util
import inspect
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from service.metrics import Metrics
from service.settings import Settings
from tools import configuration_doc

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # not docs/lab/: history, as it was written
TEXTS = {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in PAGES}
CONFIGURATION = TEXTS["docs/configuration.md"]
OPERATIONS = TEXTS["docs/operations.md"]


# -- settings ---------------------------------------------------------------------------------------------------


def test_the_configuration_page_is_the_generated_one() -> None:
    assert configuration_doc.render() == CONFIGURATION, (
        "docs/configuration.md is stale: run `.venv/bin/python -m tools.configuration_doc` and commit it"
    )


def test_every_setting_is_documented() -> None:
    missing = [Settings.variable(n) for n in Settings.model_fields if f"`{Settings.variable(n)}`" not in CONFIGURATION]
    assert not missing, f"not in docs/configuration.md: {missing}"


def test_every_setting_has_a_description() -> None:
    assert not configuration_doc.undocumented(), "give these settings a Field(description=...) in service/settings.py"


def test_every_documented_variable_exists() -> None:
    """Each `MT_` name the pages give is a setting the server reads or a variable the compose files take."""
    settings = {Settings.variable(name) for name in Settings.model_fields}
    compose = "".join(path.read_text(encoding="utf-8") for path in ROOT.glob("docker-compose*.yml"))
    named = {name for text in TEXTS.values() for name in re.findall(r"\bMT_[A-Z0-9_]+", text)}
    unknown = sorted(name for name in named - settings if not re.search(rf"\b{name}\b", compose))
    assert not unknown


# -- metrics ----------------------------------------------------------------------------------------------------


def exported_metrics() -> set[str]:
    return {m.name for m in Metrics().registry.collect()}


def test_every_metric_is_documented() -> None:
    """docs/operations.md's metric table names every metric service/metrics.py registers (a counter with or without
    its `_total`)."""
    missing = sorted(n for n in exported_metrics() if f"`{n}`" not in OPERATIONS and f"`{n}_total`" not in OPERATIONS)
    assert not missing, f"not in docs/operations.md: {missing}"


def test_every_documented_metric_exists() -> None:
    """Each `mt_` metric the pages name is one the server exports (counters named with `_total` or without,
    histograms with their `_bucket`, `_sum` or `_count`)."""
    exported = exported_metrics()
    named = {name for text in TEXTS.values() for name in re.findall(r"\bmt_[a-z0-9_]+", text)}
    unknown = sorted(name for name in named if re.sub(r"_(total|bucket|sum|count)$", "", name) not in exported)
    assert not unknown


# -- command lines ----------------------------------------------------------------------------------------------


class _Parsed(Exception):
    """Raised in place of running a command once its arguments have parsed."""


def code(text: str) -> list[str]:
    """The code of a page: its fenced blocks (continued lines joined) and its inline code spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return [block.replace("\\\n", " ") for block in blocks] + re.findall(r"`([^`\n]+)`", prose)


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """Every `python -m MODULE ARGS` in the pages' code (comments dropped), but pytest's, with the page it is in."""
    found = set()
    for page, text in TEXTS.items():
        for snippet in code(text):
            for line in snippet.splitlines():
                for module, rest in re.findall(r"python -m ([\w.]+)([^|;&\n]*)", line.split(" #")[0]):
                    if module != "pytest":
                        found.add((page, module, tuple(shlex.split(rest))))
    return [(page, module, list(argv)) for page, module, argv in sorted(found)]


def test_the_pages_give_commands() -> None:
    """The parser above finds the commands it checks (a changed page layout must not make the check vacuous)."""
    modules = {module for _, module, _ in documented_commands()}
    assert {"service", "model_export", "bench.engine", "bench.server", "tools.configuration_doc"} <= modules


@pytest.mark.parametrize(
    ("page", "module", "argv"),
    documented_commands(),
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_every_documented_command_line_parses(
    page: str, module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pages' commands name modules that run and options they take: each line is parsed by its module's own
    argument parser, which then stops it before it runs."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{page} runs python -m {module}, which does not exist"
    runnable = importlib.import_module(f"{module}.__main__" if spec.submodule_search_locations else module)
    if not inspect.signature(runnable.main).parameters:  # a module without options (bench.machine)
        assert not argv, f"python -m {module} takes no options; {page} gives {argv}"
        return
    parse = argparse.ArgumentParser.parse_args

    def parsed(self: argparse.ArgumentParser, args: list[str] | None = None, namespace: object = None) -> None:
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    with pytest.raises(_Parsed):
        runnable.main(argv)


# -- links ------------------------------------------------------------------------------------------------------


def relative_links(text: str) -> list[str]:
    """The targets of a page's Markdown links that are paths in the repository (not URLs or anchors)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t) and t.split("#")[0]]


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page} -> {target}"
        for page, text in TEXTS.items()
        for target in relative_links(text)
        if not ((ROOT / page).parent / target).exists()
    ]
    assert not broken


def test_the_lab_notes_are_linked_at_most_once() -> None:
    """The measurement history stays out of the reader's way: one link from the manual, no more."""
    links = [
        f"{page} -> {t}"
        for page, text in TEXTS.items()
        for t in relative_links(text)
        if ((ROOT / page).parent / t).resolve().is_relative_to(ROOT / "docs" / "lab")
    ]
    assert len(links) <= 1, links


# -- changelog --------------------------------------------------------------------------------------------------


def test_the_changelog_s_latest_version_is_pyproject_s() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.M)
    assert sections[:1] == ["Unreleased"], "CHANGELOG.md opens with an [Unreleased] section"
    released = [s for s in sections if s != "Unreleased"]
    assert released and released[0] == version, (
        f"CHANGELOG.md's latest version is {released[:1]}, pyproject.toml's {version}: add its section"
    )
