"""mt-translate-files: through a server (a stand-in on loopback that answers POST /translate as the server does) and
in-process on the tiny model; files written whole or not at all, a non-zero exit naming each file that failed; a
--glossary file checked and sent with every request."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from translate.storage import pypo

from service.files.cli import main
from tests.files.test_formats import PO, loud
from tests.service.test_translate_file import Glossaries


class StandIn(BaseHTTPRequestHandler):
    """POST /translate as the server answers it, with `loud` as its model; a target "xx" is refused with 400."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        StandIn.requests.append(body)
        if body["target"] == "xx":
            answer, status = {"error": "language pair en->xx is not supported"}, 400
        else:
            answer, status = {"translatedText": loud(body["q"], body["format"])}, 200
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    StandIn.requests = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_folder_through_a_server(server: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "app.po").write_bytes(PO)
    (tmp_path / "src" / "sub" / "fr.json").write_text('{"a": "Open %s"}')
    (tmp_path / "src" / "notes.md").write_text("not a format")
    out = tmp_path / "out"
    assert main([str(tmp_path / "src"), "--target", "fr", "--source", "en", "--server", server, "--out", str(out)]) == 0
    store = pypo.pofile.parsestring((out / "app.po").read_bytes())
    assert next(u for u in store.units if u.source == "Open %s in %(app)s").target == "OPEN %s IN %(app)s"
    assert json.loads((out / "sub" / "fr.json").read_text()) == {"a": "OPEN %s"}
    assert not (out / "notes.md").exists() and (tmp_path / "src" / "app.po").read_bytes() == PO  # sources as they were
    assert {r["format"] for r in StandIn.requests} == {"html"} and all(r["source"] == "en" for r in StandIn.requests)


def test_in_place_with_no_fuzzy(server: str, tmp_path: Path) -> None:
    path = tmp_path / "app.po"
    path.write_bytes(PO)
    assert main([str(path), "--target", "fr", "--server", server, "--no-fuzzy", "--quiet"]) == 0
    store = pypo.pofile.parsestring(path.read_bytes())
    assert not any(u.isfuzzy() for u in store.units) and not list(tmp_path.glob(".*"))  # no temporary file left


def test_a_refused_file_is_named_and_left_whole(server: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = tmp_path / "a.json", tmp_path / "b.po"
    good.write_text('{"a": "Hi"}')
    bad.write_bytes(b'msgid "x\nmsgstr')
    assert main([str(good), str(bad), "--target", "fr", "--server", server]) == 1
    err = capsys.readouterr().err
    assert f"error: {bad}: " in err and "not a valid gettext" in err
    assert json.loads(good.read_text()) == {"a": "HI"} and bad.read_bytes() == b'msgid "x\nmsgstr'
    assert main([str(good), "--target", "xx", "--server", server]) == 1
    assert "the server answered 400: language pair en->xx" in capsys.readouterr().err
    assert json.loads(good.read_text()) == {"a": "HI"}  # not touched by the refused run


def test_no_server_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "a.json"
    path.write_text('{"a": "Hi"}')
    assert main([str(path), "--target", "fr", "--server", "http://127.0.0.1:9"]) == 1
    assert "no answer from http://127.0.0.1:9/translate" in capsys.readouterr().err


def test_in_process_on_the_tiny_model(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "app.po"
    path.write_bytes(PO)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / model_dir.name).symlink_to(model_dir)
    assert main([str(path), "--target", "fr", "--source", "en", "--models-dir", str(folder), "--quiet"]) == 0
    store = pypo.pofile.parsestring(path.read_bytes())
    assert all(u.target for u in store.units if not u.isheader())


def test_a_glossary_goes_with_every_request(server: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, glossary = tmp_path / "a.json", tmp_path / "glossary.json"
    path.write_text('{"a": "Open the file", "b": "Save"}')
    glossary.write_text('{"file": "fichier"}')
    assert main([str(path), "--target", "fr", "--server", server, "--glossary", str(glossary), "--quiet"]) == 0
    assert StandIn.requests and all(r["glossary"] == {"file": "fichier"} for r in StandIn.requests)
    glossary.write_text('{" file": "fichier"}')
    assert main([str(path), "--target", "fr", "--server", server, "--glossary", str(glossary)]) == 1
    assert f"error: --glossary {glossary}: glossary: glossary term ' file': spaces around it" in capsys.readouterr().err
    glossary.write_text("file=fichier")
    assert main([str(path), "--target", "fr", "--server", server, "--glossary", str(glossary)]) == 1
    assert "a glossary in a form is a JSON object of terms" in capsys.readouterr().err
    assert main([str(path), "--target", "fr", "--server", server, "--glossary", str(tmp_path / "none.json")]) == 1
    assert "No such file or directory" in capsys.readouterr().err


def test_in_process_with_a_glossary(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, glossary = tmp_path / "app.po", tmp_path / "glossary.json"
    path.write_bytes(PO)
    glossary.write_text('{"file": "fichier"}')
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / model_dir.name).symlink_to(model_dir)
    glossaries = Glossaries(monkeypatch)
    args = [str(path), "--target", "fr", "--source", "en", "--models-dir", str(folder), "--glossary", str(glossary)]
    assert main([*args, "--quiet"]) == 0
    assert glossaries.seen == [{"file": "fichier"}]


def test_in_process_a_glossary_needs_the_models_placeholders(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path, glossary = tmp_path / "a.json", tmp_path / "glossary.json"
    path.write_text('{"a": "Hi"}')
    glossary.write_text('{"file": "fichier"}')
    monkeypatch.setenv("MT_MASK_SYMBOLS", "false")
    args = [str(path), "--target", "fr", "--source", "en", "--models-dir", str(model_dir.parent), "--glossary"]
    assert main([*args, str(glossary)]) == 1
    assert "no placeholders (MT_MASK_SYMBOLS=false), which a glossary needs" in capsys.readouterr().err
    assert path.read_text() == '{"a": "Hi"}'
