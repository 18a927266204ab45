"""The code's layout holds: service/'s modules import each other without a circle, model_export reaches the server
only through its public packages, the server never imports torch or model_export, and no module grows past the
size a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 720  # "no module over ~700 lines" (the layout's rule): the longest today is engine/kv_cache.py
# what model_export may import of the server: the model folder's package, the engine's public entry, and the
# argument types every command line shares
MODEL_EXPORT_REACHES = {"service.model", "service.engine", "service.arguments"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The modules a file imports when it runs: at its top level and in its functions, not under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from service.text import markup`
    return found


def top_level_imports(path: Path) -> set[str]:
    """The modules a file imports as it loads (a circle among these fails at import time, or half-loaded), and
    those it imports for its types alone (under TYPE_CHECKING: a circle there is one a reader still has to follow)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    nodes = [*tree.body, *(n for b in tree.body if isinstance(b, ast.If) for n in b.body)]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def service_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "service").rglob("*.py"))}


def test_service_modules_import_each_other_without_a_circle() -> None:
    modules = service_modules()
    edges = {  # a module that takes its siblings from its own package (`from service.files import gettext`) waits on
        # nothing: the package is the one loading it
        name: {m for m in top_level_imports(path) if m in modules and m != name and not name.startswith(m + ".")}
        for name, path in modules.items()
    }
    for name in modules:  # importing a package's module from outside it runs the package's __init__ first
        edges[name] |= {
            package
            for imported in list(edges[name])
            if (package := imported.rsplit(".", 1)[0]) in modules and package != "service"
            and not name.startswith(package + ".") and package != name
        }
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for other in sorted(edges[node]):
            if state.get(other) == 1:
                circle = trail[trail.index(other) :] + [other] if other in trail else [node, other]
                pytest.fail(f"import circle: {' -> '.join(circle)}")
            if other not in state:
                visit(other, [*trail, other])
        state[node] = 2

    for name in modules:
        if name not in state:
            visit(name, [name])


def test_model_export_reaches_the_server_only_through_its_public_packages() -> None:
    modules = service_modules()
    reached: dict[str, list[str]] = {}
    for path in sorted((ROOT / "model_export").rglob("*.py")):
        for name in runtime_imports(path):
            if name in modules and name not in MODEL_EXPORT_REACHES:  # a module of the server's, not a public one
                reached.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not reached, f"model_export imports server internals: {reached}"


def test_the_server_imports_neither_torch_nor_model_export() -> None:
    for path in service_modules().values():
        taken = {name.split(".")[0] for name in runtime_imports(path)}
        assert not taken & {"torch", "model_export", "onnx"}, f"{path.relative_to(ROOT)} imports {taken}"


def test_no_server_module_is_longer_than_a_reader_takes_in() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in service_modules().values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert not long, f"modules over {MOST_LINES} lines: {long}"
