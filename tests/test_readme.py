"""README.md stays true: every setting and every metric the code defines is documented there, the test command
it gives is the one CI runs, and every command line it gives parses."""

import argparse
import importlib
import importlib.util
import inspect
import re
import shlex
from pathlib import Path

import pytest

from service.metrics import Metrics
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_setting_is_documented() -> None:
    missing = [f"MT_{name.upper()}" for name in Settings.model_fields if f"`MT_{name.upper()}`" not in README]
    assert not missing


def test_every_metric_is_documented() -> None:
    names = {m.name for m in Metrics().registry.collect()}
    missing = [n for n in names if f"`{n}`" not in README and f"`{n}_total`" not in README]
    assert not missing


def test_ci_runs_the_readme_test_command() -> None:
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    assert command in README
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


class _Parsed(Exception):
    """Raised in place of running a command once its arguments have parsed."""


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m MODULE ARGS` in README.md (continued lines joined, comments dropped), but pytest's."""
    text = README.replace("\\\n", " ")
    found = {
        (module, tuple(shlex.split(rest.split("#")[0])))
        for module, rest in re.findall(r"python -m ([\w.]+)([^`|\n]*)", text)
        if module != "pytest"
    }
    return [(module, list(argv)) for module, argv in sorted(found)]


@pytest.mark.parametrize(
    ("module", "argv"), documented_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_every_documented_command_line_parses(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's commands name modules that run and options they take: each line is parsed by its module's own
    argument parser, which then stops it before it runs."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"README runs python -m {module}, which does not exist"
    runnable = importlib.import_module(f"{module}.__main__" if spec.submodule_search_locations else module)
    if not inspect.signature(runnable.main).parameters:  # a module without options (bench.machine)
        assert not argv, f"python -m {module} takes no options; README gives {argv}"
        return
    parse = argparse.ArgumentParser.parse_args

    def parsed(self: argparse.ArgumentParser, args: list[str] | None = None, namespace: object = None) -> None:
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    with pytest.raises(_Parsed):
        runnable.main(argv)


def test_every_documented_variable_exists() -> None:
    """Each `MT_` name README.md and docs/ give is a setting the server reads or a variable the compose files take."""
    settings = {f"MT_{name.upper()}" for name in Settings.model_fields}
    compose = "".join(path.read_text(encoding="utf-8") for path in ROOT.glob("docker-compose*.yml"))
    texts = [README] + [path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))]
    named = {name for text in texts for name in re.findall(r"\bMT_[A-Z0-9_]+", text)}
    unknown = sorted(name for name in named - settings if not re.search(rf"\b{name}\b", compose))
    assert not unknown


def test_every_documented_metric_exists() -> None:
    """Each `mt_` metric README.md and docs/ name is one the server exports (counters named with `_total` or
    without, histograms with their `_bucket`, `_sum` or `_count`)."""
    exported = {m.name for m in Metrics().registry.collect()}
    texts = [README] + [path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))]
    named = {name for text in texts for name in re.findall(r"\bmt_[a-z0-9_]+", text)}
    unknown = sorted(name for name in named if re.sub(r"_(total|bucket|sum|count)$", "", name) not in exported)
    assert not unknown
