"""README.md stays true: every setting and every metric the code defines is documented there, and the
test command it gives is the one CI runs."""

from pathlib import Path

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
