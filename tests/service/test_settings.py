"""The MT_* settings: a bad value, or values that contradict each other or a model, stop the start with one line
that names the variable; a misspelt variable is warned about."""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from pathlib import Path

import pytest

from service.__main__ import main
from service.errors import ModelFolderError, SettingsError
from service.metrics import Metrics
from service.model import folder as model_folder
from service.settings import COMPOSE_VARIABLES, Settings, load_settings, unknown_variables, warn_unknown_variables
from service.translation.registry import load_translators
from tests.service.test_e2e import free_port, start_server


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"MT_MAX_BATCH_ROWS": "0"}, "MT_MAX_BATCH_ROWS='0': Input should be greater than or equal to 1"),
        ({"MT_MAX_BATCH_ROWS": "abc"}, "MT_MAX_BATCH_ROWS='abc': Input should be a valid integer"),
        ({"MT_MAX_OUTPUT_RATIO": "inf"}, "MT_MAX_OUTPUT_RATIO='inf': Input should be a finite number"),
        ({"MT_REQUEST_TIMEOUT_SECONDS": "nan"}, "MT_REQUEST_TIMEOUT_SECONDS='nan': Input should be a finite number"),
        ({"MT_REQUEST_TIMEOUT_SECONDS": "1e10"}, "MT_REQUEST_TIMEOUT_SECONDS='1e10': Input should be less than"),
        ({"MT_SHUTDOWN_GRACE_SECONDS": "1e10"}, "MT_SHUTDOWN_GRACE_SECONDS='1e10': Input should be less than"),
        ({"MT_LOG_LEVEL": "LOUD"}, "MT_LOG_LEVEL='LOUD': must be one of CRITICAL, FATAL, ERROR, WARN, WARNING, INFO"),
        ({"MT_API_KEYS": " , "}, "MT_API_KEYS: is set but lists nothing"),
        ({"MT_METADATA_API_KEYS": ""}, "MT_METADATA_API_KEYS: is set but lists nothing"),  # a secret's: not shown
        ({"MT_API_KEYS": '["", "k1"]'}, "MT_API_KEYS: holds an empty key (which a request without a key would"),
        ({"MT_API_KEYS": "[1]"}, "MT_API_KEYS: lists something that is not text"),
        ({"MT_PROVIDERS": ""}, "MT_PROVIDERS='': is set but lists nothing"),
        ({"MT_PROVIDERS": "tpu"}, "MT_PROVIDERS='tpu': Input should be 'cpu' or 'cuda'"),
        ({"MT_PROVIDERS": "[cpu"}, "MT_PROVIDERS='[cpu': Expecting value"),
        ({"MT_MODELS": "../elsewhere"}, "MT_MODELS='../elsewhere': '../elsewhere' is not a folder name"),
        ({"MT_MODELS": "en-fr,en-fr"}, "MT_MODELS='en-fr,en-fr': names a folder twice"),
        ({"MT_MODELS_DIR": " "}, "MT_MODELS_DIR=' ': is empty; give a folder"),
        ({"MT_GLOSSARY_FILE": ""}, "MT_GLOSSARY_FILE='': is empty; give a file, or unset it"),
        ({"MT_BATCHING": "dynamic"}, "MT_BATCHING='dynamic': Input should be 'continuous' or 'static'"),
        (
            {"MT_DEFAULT_BEAM_SIZE": "8", "MT_MAX_BEAM_SIZE": "4"},
            "MT_DEFAULT_BEAM_SIZE (8) is over MT_MAX_BEAM_SIZE (4): every request without a beam_size would be",
        ),
        (
            {"MT_DEFAULT_BEAM_SIZE": "4", "MT_MAX_BATCH_ROWS": "2"},
            "MT_DEFAULT_BEAM_SIZE (4) is over MT_MAX_BATCH_ROWS (2)",
        ),
    ],
)
def test_a_bad_setting_is_one_message_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], message: str
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_malformed_key_list_is_refused_without_its_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MT_API_KEYS", '["s3cr3t-prod-key", oops')
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert str(raised.value) == "MT_API_KEYS: Expecting value"  # the parser's message quoted the keys


@pytest.mark.parametrize("level", ["warn", "fatal", "NOTSET", "Warning"])
def test_every_level_python_names_is_a_log_level(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    monkeypatch.setenv("MT_LOG_LEVEL", level)
    assert load_settings().log_level == level.upper()


def test_values_that_hold_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().api_keys == [] and Settings().providers == ["cpu"]  # unset: the defaults, not "lists nothing"
    monkeypatch.setenv("MT_LOG_LEVEL", "debug")
    monkeypatch.setenv("MT_API_KEYS", " a , b ")
    monkeypatch.setenv("MT_MODELS", '["en-fr"]')
    settings = load_settings()
    assert (settings.log_level, settings.api_keys, settings.models) == ("DEBUG", ["a", "b"], ["en-fr"])


def test_a_misspelt_variable_is_named_with_the_setting_it_is_closest_to(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"MT_MAX_BEAMSIZE": "4", "MT_PORT": "8001", "MT_MAX_BEAM_SIZE": "4", "MT_ZZZ": "1", "PATH": "/bin"}
    assert unknown_variables(environ) == ["MT_MAX_BEAMSIZE (did you mean MT_MAX_BEAM_SIZE?)", "MT_ZZZ"]
    assert unknown_variables({"MT_log_level": "debug", "mt_zzz": "1"}) == ["mt_zzz"]  # read in any case
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MT_MAX_BEAMSIZE", "4")
        warn_unknown_variables(logging.getLogger("service"))
    assert "MT_MAX_BEAMSIZE (did you mean MT_MAX_BEAM_SIZE?) is not a setting and is ignored" in caplog.text


def test_the_compose_files_own_variables_are_known() -> None:
    """unknown_variables takes the compose files' variables as known: the list must be theirs."""
    root = Path(__file__).resolve().parents[2]
    compose = "".join(path.read_text(encoding="utf-8") for path in root.glob("docker-compose*.yml"))
    settings = {Settings.variable(name) for name in Settings.model_fields}
    assert set(re.findall(r"\bMT_[A-Z0-9_]+", compose)) - settings == COMPOSE_VARIABLES


def test_a_batch_budget_that_cannot_hold_the_longest_sentence_stops_the_start(model_dir: Path) -> None:
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, max_batch_tokens=10)
    with pytest.raises(SettingsError, match=r"MT_MAX_BATCH_TOKENS \(10\) cannot hold model tiny-en-fr's longest"):
        load_translators(settings, Metrics())


GLOSSARY_FILES = [
    ('{"en": {"de": {"Files": "Dateien"}}}', "en->de: no loaded model translates en into de (loaded: en->fr); fix"),
    ('{"en": {"fr": {"Files": ""}}}', "en->fr: term 'Files': an empty translation: give the term itself"),
    ('{"en": {"fr": {"Files": 5}}}', "en->fr: term 'Files': its translation is not text"),
    ('{"en": {"fr": ["Files"]}}', 'must be a JSON object of source languages, each an object of target languages'),
    ('{"en": {"fr": {"a\\nb": "c"}}}', "en->fr: term 'a\\nb': a control or format character or a line break"),
    ("{not json", "not a JSON file in UTF-8 (Expecting property name"),
]


@pytest.mark.parametrize(("content", "message"), GLOSSARY_FILES)
def test_a_glossary_file_that_cannot_be_used_stops_the_start(
    model_dir: Path, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "glossary.json"
    path.write_text(content, encoding="utf-8")
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, glossary_file=path)
    with pytest.raises(SettingsError, match=re.escape(f"MT_GLOSSARY_FILE={str(path)!r}: {message}")):
        load_translators(settings, Metrics())


def test_a_glossary_file_the_server_can_use_is_its_models_own(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "glossary.json"
    many = {"en": {"fr": {f"term{i}": "x" for i in range(10_001)}}}
    path.write_text(json.dumps(many), encoding="utf-8")
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, glossary_file=path)
    with pytest.raises(SettingsError, match="en->fr has 10001 terms; the limit is 10,000"):
        load_translators(settings, Metrics())
    with pytest.raises(SettingsError, match=r"glossary.json' ?: cannot be read \(No such file or directory\)"):
        load_translators(settings.model_copy(update={"glossary_file": tmp_path / "none" / "glossary.json"}), Metrics())
    path.write_text('{"en": {"fr": {"Files": "Files", "file": "fichier"}}}', encoding="utf-8")
    [translator] = load_translators(settings, Metrics())
    assert translator.glossary("fr", None).given == {"Files": "Files", "file": "fichier"}
    assert translator.glossary("fr", None).terms == {"Files": "Files", "file": "fichier", "File": "Fichier"}
    merged = translator.glossary("fr", {"file": "document", "Open": "Ouvrir"})  # the request's over the server's
    assert merged.given == {"Files": "Files", "file": "document", "Open": "Ouvrir"}
    assert merged.terms["File"] == "Document"  # the request's term's upper-case form, not the server's
    assert translator.glossary("fr", {"file": "document", "Open": "Ouvrir"}) is merged  # compiled once
    assert translator.glossary("de", None) is None
    off = settings.model_copy(update={"mask_symbols": False})
    with pytest.raises(SettingsError, match="MT_GLOSSARY_FILE needs placeholders, which MT_MASK_SYMBOLS=false"):
        load_translators(off, Metrics())


def test_two_folders_of_one_model_name_stop_the_start(model_dir: Path, tmp_path: Path) -> None:
    """Requests pick a model by name: of two folders with one name, one could never be used."""
    for copy in ("a", "b"):
        shutil.copytree(model_dir, tmp_path / copy)
    settings = Settings(models_dir=tmp_path, engine_process=False)
    with pytest.raises(ModelFolderError, match=r"are both model 'tiny-en-fr' \(their manifests' name\)"):
        load_translators(settings, Metrics())


def test_the_real_server_refuses_a_bad_setting_in_one_line(model_dir: Path) -> None:
    process = start_server(model_dir, free_port(), MT_MAX_BATCH_ROWS="0", MT_LOG_LEVEL="WARNING")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "cannot start: MT_MAX_BATCH_ROWS='0': Input should be greater" in lines[0], output


def test_a_model_file_the_server_cannot_read_is_one_line(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError while loading: in a container, often a mounted file that uid 10001 may not read (as root here,
    every file is readable, so the read is made to fail as it would)."""
    def refused(path: Path) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(model_folder, "sha256_of", refused)
    monkeypatch.setenv("MT_MODELS_DIR", str(model_dir.parent))
    monkeypatch.setenv("MT_MODELS", model_dir.name)
    assert main(["--port", "0"]) == 1
    err = capsys.readouterr().err
    assert f"cannot start: {model_dir}/" in err and ": Permission denied (this server runs as uid " in err, err
    assert "the model folders must be readable by it" in err and "Traceback" not in err
