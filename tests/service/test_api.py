"""The HTTP API with a real tiny model folder and real ONNX Runtime sessions: LibreTranslate
compatibility, our extras, and every error path with its status and message."""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import service.engine.sessions
from service.api.app import create_app
from service.engine.batches import TokenRules, decode_batch
from service.engine.decoding import SearchOptions
from service.engine.runtime import OnnxRuntime
from service.files import formats
from service.model.folder import load_model_folder
from service.model.tokenizer import Tokenizer
from service.settings import Settings


def settings_for(model_dir: Path, **changes: object) -> Settings:
    return Settings(models_dir=model_dir.parent, models=[model_dir.name], intra_op_threads=1, **changes)


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(model_dir))) as c:
        yield c


@pytest.fixture(scope="module")
def unguarded(model_dir: Path) -> Iterator[TestClient]:
    """MT_GUARDS off: a request's usage is its sentences' alone, without the random model's loops searched again."""
    with TestClient(create_app(settings_for(model_dir, guards=False))) as c:
        yield c


def solo(model_dir: Path, text: str, beam_size: int = 1) -> str:
    """The sentence translated alone, outside the server: tokenizer + the plain decoding loop."""
    folder = load_model_folder(model_dir)
    return Tokenizer.from_folder(folder).decode(solo_ids(model_dir, text, beam_size))


def solo_ids(model_dir: Path, text: str, beam_size: int = 1, max_length: int = 256) -> tuple[int, ...]:
    """The ids of solo's translation, EOS included when the model ended it within the caps."""
    folder = load_model_folder(model_dir)
    tokenizer, ids = Tokenizer.from_folder(folder), folder.manifest.special_ids
    src = tokenizer.encode(text, "fr")
    options = SearchOptions(beam_size=beam_size, max_new_tokens=min(max_length, int(2.0 * len(src)) + 10))
    hyps = decode_batch(OnnxRuntime(folder), [src], [options], TokenRules(ids.decoder_start, ids.eos, ids.pad))
    return hyps[0][0].tokens


def test_translate_a_string(client: TestClient, model_dir: Path) -> None:
    response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["translatedText"] == solo(model_dir, "Open the file.")
    assert body["alternatives"] == []
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["model"] == "tiny-en-fr"
    assert "detectedLanguage" not in body
    assert response.headers["x-request-id"]


def test_translate_a_list_with_beam_and_alternatives(client: TestClient, model_dir: Path) -> None:
    q = ["Save the document as %s.", "Delete %d items?"]
    response = client.post(
        "/translate",
        json={"q": q, "source": "en", "target": "fr", "beam_size": 3, "alternatives": 2, "return_scores": True},
    )
    body = response.json()
    assert body["translatedText"] == [solo(model_dir, s, beam_size=3) for s in q]
    assert len(body["alternatives"]) == 2 and all(len(a) == 2 for a in body["alternatives"])
    assert len(body["scores"]) == 2 and all(s <= 0 for s in body["scores"])


def test_a_greedy_translation_is_scored_only_when_asked(client: TestClient, model_dir: Path) -> None:
    """Without return_scores the greedy steps skip the log-softmax (format 8) and no score is computed or sent; with
    it, the same text and its mean normalised log-probability, as the plain decoding loop scores it alone."""
    q = "Save the document as %s."
    plain = client.post("/translate", json={"q": q, "source": "en", "target": "fr"}).json()
    scored = client.post("/translate", json={"q": q, "source": "en", "target": "fr", "return_scores": True}).json()
    assert plain["translatedText"] == scored["translatedText"] == solo(model_dir, q) and "scores" not in plain
    folder = load_model_folder(model_dir)
    tokenizer, ids = Tokenizer.from_folder(folder), folder.manifest.special_ids
    src = tokenizer.encode(q, "fr")
    options = SearchOptions(max_new_tokens=min(256, int(2.0 * len(src)) + 10))
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    expected = decode_batch(OnnxRuntime(folder), [src], [options], rules)[0][0].score
    assert scored["scores"] < 0 and abs(scored["scores"] - expected) < 1e-4


def test_sentences_a_length_cap_stopped_are_counted(model_dir: Path) -> None:
    """usage.truncated_sentences and mt_truncated_sentences_total: the sentences whose translation has no EOS."""
    texts = ["Open the file.", "Hi. Go.", "No."]  # the tiny model ends "Hi.", "Go." and "No." in 8-20 tokens
    sentences = ["Open the file.", "Hi.", "Go.", "No."]
    eos = load_model_folder(model_dir).manifest.special_ids.eos
    expected = {n: sum(solo_ids(model_dir, s, max_length=n)[-1] != eos for s in sentences) for n in (1, 2, 256)}
    assert expected[1] == 4 and expected[256] == 1  # every one stopped at 1 token, the first alone at 256
    with TestClient(create_app(settings_for(model_dir, guards=False))) as c:  # no loop searched again with beams
        for max_length, truncated in expected.items():
            body = {"q": texts, "source": "en", "target": "fr", "max_length": max_length}
            assert c.post("/translate", json=body).json()["usage"]["truncated_sentences"] == truncated, max_length
        metric = 'mt_truncated_sentences_total{model="tiny-en-fr"}'
        assert f"{metric} {float(sum(expected.values()))}" in c.get("/metrics").text


def test_form_encoded_body_and_auto_source(client: TestClient, model_dir: Path) -> None:
    response = client.post("/translate", data={"q": "Open the file.", "source": "auto", "target": "fr"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == solo(model_dir, "Open the file.")
    detected = response.json()["detectedLanguage"]
    assert detected["language"] == "en" and 50 < detected["confidence"] <= 100  # lingua's, on LibreTranslate's scale
    # a list q: one detected language a text, as LibreTranslate answers (Mastodon's client reads it so)
    texts = {"q": ["Open the file.", "Delete %d items?"], "source": "auto", "target": "fr"}
    listed = client.post("/translate", json=texts).json()
    assert [d["language"] for d in listed["detectedLanguage"]] == ["en", "en"]


@pytest.mark.parametrize("given", [None, ""])
def test_a_format_of_null_or_empty_is_text(client: TestClient, model_dir: Path, given: str | None) -> None:
    """LibreTranslate takes a missing, null or empty format as text."""
    response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr", "format": given})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == solo(model_dir, "Open the file.")


def test_paragraphs_and_sentences_are_kept_in_order(client: TestClient, model_dir: Path) -> None:
    text = "Open the file. Delete %d items?\n\nCannot connect to the server."
    body = client.post("/translate", json={"q": text, "source": "en", "target": "fr"}).json()
    expected = (
        f"{solo(model_dir, 'Open the file.')} {solo(model_dir, 'Delete %d items?')}\n\n"
        f"{solo(model_dir, 'Cannot connect to the server.')}"
    )
    assert body["translatedText"] == expected


def test_html_code_inside_a_sentence_comes_back_as_written(unguarded: TestClient, model_dir: Path) -> None:
    """The sentence goes to the model with a placeholder for the element; the tiny random model does not copy
    it, so the answer is the pieces' translations around the element, as written."""
    q = "<p>Open <code>settings.json</code> now.</p>"
    body = unguarded.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html"}).json()
    answer = body["translatedText"]
    assert answer.count("<code>settings.json</code>") == 1 and answer.startswith("<p>") and answer.endswith("</p>")
    whole, *pieces = (html.escape(solo(model_dir, s), quote=False) for s in ("Open %1 now.", "Open", "now."))
    assert answer in (
        "<p>" + whole.replace("%1", "<code>settings.json</code>") + "</p>",
        f"<p>{pieces[0]} <code>settings.json</code> {pieces[1]}</p>",
    ), answer
    read = ["Open %1 now."] + (["Open", "now."] if whole.count("%1") != 1 else [])  # the pieces: a second pass
    tokenizer = Tokenizer.from_folder(load_model_folder(model_dir))
    assert body["usage"]["input_tokens"] == sum(len(tokenizer.encode(s, "fr")) for s in read)


def test_html_keeps_tags(client: TestClient, model_dir: Path) -> None:
    body = client.post(
        "/translate",
        json={"q": "<p>Open the file.</p><code>x = 1</code>", "source": "en", "target": "fr", "format": "html"},
    ).json()
    assert body["translatedText"].startswith("<p>") and body["translatedText"].endswith("</p><code>x = 1</code>")


def test_html_a_sentence_runs_through_its_inline_tags(unguarded: TestClient, model_dir: Path) -> None:
    """The sentence is translated whole, its pieces between tags too: the answer is the whole translation with
    the tags around its words, or, where the tiny random model's words do not allow it, the pieces' translations
    between the tags, as written."""
    q = "<p>Open the <b>file</b> now.</p>"
    body = unguarded.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html"}).json()
    answer = body["translatedText"]
    assert answer.startswith("<p>") and answer.endswith("</p>")
    assert answer.count("<b>") == answer.count("</b>") == 1 and answer.index("<b>") < answer.index("</b>")
    words = html.unescape(re.sub("</?[pb]>", "", answer))
    pieces = [solo(model_dir, s) for s in ("Open the", "file", "now.")]
    assert words in (solo(model_dir, "Open the file now."), " ".join(pieces)), answer
    assert body["usage"]["input_tokens"] == sum(
        len(Tokenizer.from_folder(load_model_folder(model_dir)).encode(s, "fr"))
        for s in ("Open the file now.", "Open the", "file", "now.")
    )


def test_html_attributes_people_read_are_translated(unguarded: TestClient, model_dir: Path) -> None:
    """alt and title go to the model as sentences of their own, after the text, and come back escaped for their
    quotes; lang says the target; MT_HTML_ATTRIBUTES=false keeps them all."""
    q = '<p title="Delete %d items?">Open the file. <img src="a.png" alt=\'Cannot connect to the server.\'></p>'
    body = unguarded.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html"}).json()
    page = unguarded.post("/translate", json={"q": '<html lang="en-US"><p>x</p>', "target": "fr", "format": "html"})
    assert page.json()["translatedText"].startswith('<html lang="fr"><p>')  # the page's language is the target's
    quoted = '<p>The word <i lang="de">Zeitgeist</i> is German.</p><blockquote lang=de>Guten Tag.</blockquote>'
    kept = unguarded.post("/translate", json={"q": quoted, "target": "fr", "format": "html"}).json()["translatedText"]
    assert kept.count('<i lang="de">Zeitgeist</i>') == 1  # another language's text is kept as written
    assert kept.endswith("<blockquote lang=de>Guten Tag.</blockquote>")
    title, alt = (solo(model_dir, s) for s in ("Delete %d items?", "Cannot connect to the server."))
    title = html.escape(title, quote=False).replace('"', "&quot;")
    alt = html.escape(alt, quote=False).replace("'", "&#39;")
    answer = body["translatedText"]
    assert answer.startswith(f'<p title="{title}">') and answer.endswith(f"<img src=\"a.png\" alt='{alt}'></p>"), answer
    tokens = Tokenizer.from_folder(load_model_folder(model_dir)).encode
    read = sum(len(tokens(s, "fr")) for s in ("Open the file. %1", "Delete %d items?", "Cannot connect to the server."))
    again = len(tokens("Open the file.", "fr"))  # the image's sentence's text alone, if the model lost its %1
    assert body["usage"]["input_tokens"] in (read, read + again)
    with TestClient(create_app(settings_for(model_dir, html_attributes=False))) as c:
        body = c.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html"}).json()
    kept = body["translatedText"]
    assert kept.startswith('<p title="Delete %d items?">') and "alt='Cannot connect to the server.'" in kept


@pytest.mark.parametrize("q", ["", "   ", "\n\n", "\r\n", "\x0b\x85\u2028", " \u2060\u202a\u202c "])
def test_empty_and_blank_text_come_back_unchanged(client: TestClient, q: str) -> None:
    """Whitespace of any kind, line breaks as written (CRLF too) and invisible format characters alone."""
    body = client.post("/translate", json={"q": q, "source": "en", "target": "fr"}).json()
    assert body["translatedText"] == q and body["usage"]["output_tokens"] == 0


def test_line_breaks_come_back_as_written_and_format_characters_stay_out_of_the_model(
    client: TestClient, model_dir: Path
) -> None:
    """A CRLF resource string keeps its CRLFs; a word joiner or bidi marks around a sentence are not the model's
    to read (they derailed the default model's translation)."""
    text = "Open the file.\r\nDelete %d items?\r\n"
    body = client.post("/translate", json={"q": text, "source": "en", "target": "fr"}).json()
    assert body["translatedText"] == f"{solo(model_dir, 'Open the file.')}\r\n{solo(model_dir, 'Delete %d items?')}\r\n"
    marked = client.post("/translate", json={"q": "\u2060\u202aOpen the file.\u202c", "target": "fr"}).json()
    assert marked["translatedText"] == f"\u2060\u202a{solo(model_dir, 'Open the file.')}\u202c"


def test_html_outside_the_sentences_comes_back_as_written(client: TestClient) -> None:
    """pre, script, comments and attributes not for reading keep their characters: CRLFs, decomposed accents."""
    kept = '<pre>line1\r\nline2</pre><script>var s = "\u212b";</script><!-- \r\n --><a data-x="Cafe\u0301"></a>'
    body = client.post("/translate", json={"q": kept, "source": "en", "target": "fr", "format": "html"}).json()
    assert body["translatedText"] == kept


def test_languages_models_health_ready_metrics(client: TestClient) -> None:
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["fr"]},
        {"code": "fr", "name": "French", "targets": []},
    ]
    model = client.get("/v1/models").json()["models"][0]
    assert model["name"] == "tiny-en-fr" and model["variant"] == "fp32" and model["config"]["d_model"] == 32
    assert model["decoder_streams"] == 1 and model["intra_op_threads"] == 1  # a tiny model: one stream, one thread
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"
    assert client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200
    metrics = client.get("/metrics").text  # (a step's duration, whichever test ran before)
    assert (
        'mt_model_info{model="tiny-en-fr",provider="CPUExecutionProvider",variant="fp32",version="0.0.1"} 1.0'
        in metrics
    )
    assert "mt_decoder_step_duration_seconds_bucket" in metrics and "mt_ready 1.0" in metrics


def test_the_counts_alerts_read_are_there_at_0_from_the_start(model_dir: Path) -> None:
    """A series that first appears at 6 has no increase to Prometheus: the first errors after a start went unseen.
    The queue's depth (0) and capacity are exported, for an alert on how full it is."""
    with TestClient(create_app(settings_for(model_dir, max_queue_sentences=100))) as c:
        families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}

    def value(family: str, **labels: str) -> float | None:
        return next((s.value for s in families[family].samples if s.labels == labels), None)

    model = "tiny-en-fr"
    for reason in ("queue_full", "too_many_requests", "too_large", "not_ready", "shutting_down"):
        assert value("mt_rejected_requests", reason=reason) == 0.0, reason
    for status in ("500", "503", "504"):
        assert value("mt_http_requests", route="/translate", method="POST", status=status) == 0.0, status
    for counter in ("mt_deadline_expired", "mt_inference_errors", "mt_cancelled_requests", "mt_truncated_sentences"):
        assert value(counter, model=model) == 0.0, counter
    assert value("mt_queue_capacity_sentences", model=model) == 100.0
    assert value("mt_queue_depth", model=model) == 0.0


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"q": "x", "source": "en", "target": "de"}, 400, "language pair en->de is not supported; available: en->fr"),
        ({"q": "x", "source": "de", "target": "fr"}, 400, "language pair de->fr is not supported"),
        ({"q": "x", "source": "en", "target": "fr", "beam_size": 9}, 400, "beam_size and alternatives \\+ 1 may be"),
        ({"q": "x", "source": "en", "target": "fr", "max_length": 100000}, 400, "max_length may be at most 512"),
        ({"q": "x", "source": "en", "target": "fr", "model": "nope"}, 404, "no model named 'nope'; loaded: tiny-en-fr"),
        ({"q": "x", "source": "en"}, 422, "invalid request: target: Field required"),
        ({"q": 5, "source": "en", "target": "fr"}, 422, "invalid request: q"),
        ({"q": "x", "source": "en", "target": "fr", "format": "pdf"}, 422, "format: Input should be 'text' or 'html'"),
        ({"q": "x", "source": "en", "target": "fr", "beam_size": 0}, 422, "beam_size: Input should be greater"),
        ({"q": ["x"] * 129, "source": "en", "target": "fr"}, 413, "q has 129 texts; the limit is 128"),
        ({"q": "x" * 50_001, "source": "en", "target": "fr"}, 413, "q has 50001 characters; the limit is 50000"),
        ({"q": "x", "target": "fr", "glossary": {f"t{i}": "x" for i in range(1001)}}, 413, "glossary has 1001 terms"),
        ({"q": "x", "target": "fr", "glossary": ["Files"]}, 422, "glossary: Input should be a valid dictionary"),
        ({"q": "x", "target": "fr", "glossary": {"a": 5}}, 422, "glossary.a: Input should be a valid string"),
        ({"q": "x", "target": "fr", "glossary": {"": "x"}}, 422, "glossary term '': empty: a term is a word"),
        ({"q": "x", "target": "fr", "glossary": {" Files": "x"}}, 422, "' Files': spaces around it: a term is match"),
        ({"q": "x", "target": "fr", "glossary": {"Files": " "}}, 422, "'Files': an empty translation: give the term"),
        ({"q": "x", "target": "fr", "glossary": {"a\nb": "x"}}, 422, "a control or format character or a line br"),
        ({"q": "x", "target": "fr", "glossary": {"a": "b\u2028c"}}, 422, "a control or format character or a line br"),
        ({"q": "x", "target": "fr", "glossary": {"x" * 201: "x"}}, 422, "over 200 characters, the term or its trans"),
    ],
)
def test_bad_requests(client: TestClient, body: dict, status: int, message: str) -> None:
    response = client.post("/translate", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}
    assert pytest.importorskip("re").search(message, response.json()["error"]), response.json()["error"]


def test_a_glossary_term_goes_to_the_model_as_a_placeholder_and_comes_back_as_its_translation(
    client: TestClient, model_dir: Path
) -> None:
    """The tiny model, random, never gives %1 back: the sentence goes again without it and the answer is its
    translation as it is; a sentence without the term is translated as without a glossary. The default model's
    answers: tests/test_default_model.py."""
    glossary = {"file": "document", "Open": "Open"}
    body = {"q": ["Open the file.", "Save the document as %s."], "source": "en", "target": "fr", "glossary": glossary}
    answer = client.post("/translate", json=body)
    assert answer.status_code == 200, answer.text
    expected = [solo(model_dir, "Open the file."), solo(model_dir, "Save the document as %s.")]
    assert answer.json()["translatedText"] == expected
    form = {"q": "Open the file.", "target": "fr", "glossary": json.dumps(glossary)}  # in a form: a JSON object
    assert client.post("/translate", data=form).json()["translatedText"] == solo(model_dir, "Open the file.")
    form["glossary"] = "file=document"
    refused = client.post("/translate", data=form)
    assert refused.status_code == 422 and "a glossary in a form is a JSON object" in refused.json()["error"]
    off = settings_for(model_dir, mask_symbols=False)
    with TestClient(create_app(off)) as c:
        refused = c.post("/translate", json=body)
        assert refused.status_code == 400, refused.text
        assert "no placeholders (MT_MASK_SYMBOLS=false), which a glossary needs" in refused.json()["error"]
        assert c.post("/translate", json={**body, "glossary": {}}).status_code == 200  # an empty one: none


def test_bodies_that_are_not_json(client: TestClient) -> None:
    response = client.post("/translate", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]
    response = client.post("/translate", content=b"\xff\xfe", headers={"content-type": "application/json"})
    assert response.status_code == 422
    response = client.post("/translate", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "expected a JSON object" in response.json()["error"]
    response = client.post("/translate", content=b"q=x", headers={"content-type": "text/plain"})
    assert response.status_code == 415 and "unsupported content type 'text/plain'" in response.json()["error"]


def test_oversized_body_is_refused_before_reading(client: TestClient) -> None:
    counted = 'mt_http_requests_total{method="POST",route="/translate",status="413"}'
    before = metric_value(client.get("/metrics").text, counted)
    response = client.post("/translate", content=b"x" * 1_000_001, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "the limit is 1000000" in response.json()["error"]
    assert metric_value(client.get("/metrics").text, counted) == before + 1  # its route's, though refused unrouted


def metric_value(text: str, sample: str) -> float:
    line = next((line for line in text.splitlines() if line.startswith(sample + " ")), None)
    return float(line.split()[-1]) if line else 0.0


def test_unknown_route_and_method(client: TestClient) -> None:
    assert client.get("/nope").json() == {"error": "Not Found"}
    wrong = client.get("/translate")
    assert wrong.status_code == 405 and wrong.json() == {"error": "use POST for /translate"}
    assert wrong.headers["allow"] == "POST"
    for path in ("/health", "/ready", "/languages", "/metrics", "/v1/models"):  # uptime probes that send HEAD
        probe = client.head(path)
        assert probe.status_code == 200 and probe.content == b"", path
    assert "head" not in client.get("/openapi.json").json()["paths"]["/health"]


def test_a_forms_empty_options_are_options_not_given(client: TestClient, model_dir: Path) -> None:
    """An HTML form sends every field, the ones left empty too."""
    form = {"q": "Open the file.", "source": "en", "target": "fr", "beam_size": "", "alternatives": "", "model": ""}
    response = client.post("/translate", data=form)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == solo(model_dir, "Open the file.")
    assert client.post("/translate", data={**form, "q": ""}).json()["translatedText"] == ""
    broken = client.post("/translate", content=b"q=x", headers={"content-type": "multipart/form-data"})
    assert broken.status_code == 422 and broken.json()["error"].startswith("invalid request: body: not a valid form")


@pytest.mark.parametrize(("field", "value"), [("length_penalty", "NaN"), ("timeout", "NaN"), ("timeout", "Infinity")])
def test_numbers_that_are_not_finite_are_named(client: TestClient, field: str, value: str) -> None:
    body = f'{{"q": "Hi.", "target": "fr", "{field}": {value}}}'.encode()
    response = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json() == {"error": f"invalid request: {field}: Input should be a finite number"}


def test_alternatives_are_bounded_by_the_servers_beam_limit_alone(client: TestClient) -> None:
    """The schema does not cap them (MT_MAX_BEAM_SIZE may be 16): the server's limit answers, naming it."""
    response = client.post("/translate", json={"q": "Hi.", "target": "fr", "alternatives": 9})
    assert response.status_code == 400 and response.json()["error"] == "beam_size and alternatives + 1 may be at most 8"
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert "maximum" not in schema["TranslateRequest"]["properties"]["alternatives"]
    assert "usage" in schema["TranslateResponse"]["required"]  # every answer has it


def test_api_keys(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, api_keys=["s3cret", "other"]))) as c:
        body = {"q": "Open the file.", "source": "en", "target": "fr"}
        missing = c.post("/translate", json=body)
        assert missing.status_code == 403 and missing.json() == {"error": "this server needs an api_key"}
        wrong = c.post("/translate", json={**body, "api_key": "guess"})
        assert wrong.status_code == 403 and wrong.json() == {"error": "a valid api_key is required"}
        lone_surrogate = b'{"q": "Hi.", "target": "fr", "api_key": "k\\ud800"}'
        lone = c.post("/translate", content=lone_surrogate, headers={"content-type": "application/json"})
        assert lone.status_code == 403 and lone.json() == {"error": "a valid api_key is required"}  # not a 500
        assert c.post("/translate", json={**body, "api_key": "other"}).status_code == 200
        assert c.post("/translate", json=body, headers={"x-api-key": "s3cret"}).status_code == 200
        assert c.post("/translate", json=body, headers={"authorization": "Bearer s3cret"}).status_code == 200
        assert c.post("/translate", json={**body, "api_key": ""}, headers={"x-api-key": "other"}).status_code == 200
        # the key before the body's size and fields: a client without one learns nothing of them
        for unkeyed in ({**body, "q": ["x"] * 1000}, {**body, "beam_size": 0}, {"api_key": 7}):
            refused = c.post("/translate", json=unkeyed)
            assert refused.status_code == 403, unkeyed
        assert c.post("/translate", json={"api_key": False}).json() == {"error": "a valid api_key is required"}
        # a body key that is no text gives way to a header's; then the body's field is what to fix
        odd = c.post("/translate", json={**body, "api_key": False}, headers={"x-api-key": "other"})
        assert odd.status_code == 422 and "api_key: Input should be a valid string" in odd.json()["error"]
        assert c.post("/translate", json={**body, "beam_size": 0, "api_key": "s3cret"}).status_code == 422


def test_a_request_the_queue_can_never_hold_is_413(model_dir: Path) -> None:
    """More sentences than MT_MAX_QUEUE_SENTENCES: 413 naming the setting, counted as too large (a 503 'retry
    later' would be retried forever). A full queue's 503 is tests/service/test_scheduler.py's and
    test_reliability.py's."""
    with TestClient(create_app(settings_for(model_dir, max_queue_sentences=1))) as c:
        response = c.post(
            "/translate", json={"q": ["Open the file.", "Delete %d items?"], "source": "en", "target": "fr"}
        )
        assert response.status_code == 413 and "retry-after" not in response.headers
        assert "the queue holds at most 1 (MT_MAX_QUEUE_SENTENCES)" in response.json()["error"]
        assert c.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200
        assert 'mt_rejected_requests_total{reason="too_large"} 1.0' in c.get("/metrics").text


def test_deadline_is_504_and_the_server_goes_on(client: TestClient) -> None:
    response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr", "timeout": 1e-6})
    assert response.status_code == 504
    assert response.json() == {"error": "the request's deadline passed before its translation finished"}
    assert client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200


def fail_first_call(function: Callable[..., object]) -> Callable[..., object]:
    """`function`, except that its first call raises as a failing ONNX Runtime run would."""
    calls: list[int] = []

    def failing(*args: object, **kwargs: object) -> object:
        if not calls:
            calls.append(1)
            raise RuntimeError("simulated ONNX Runtime failure")
        return function(*args, **kwargs)

    return failing


def test_inference_failure_is_500_for_that_batch_only(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, engine_process=False))) as client:  # to reach the runtime
        translator = client.app.state.service.registry.translators["tiny-en-fr"]
        translator.runtime.step = fail_first_call(translator.runtime.step)
        response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"})
        assert response.status_code == 500 and response.json() == {"error": "inference failed: RuntimeError"}
        assert (
            client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200
        )


def test_openapi_documents_translate_beside_the_fastapi_routes(client: TestClient) -> None:
    """/translate is not a FastAPI route (TranslateEndpoint); the schema documents its body, answer and errors."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]

    def resolved(content: dict) -> dict:
        return schemas[content["schema"]["$ref"].rsplit("/", 1)[1]]

    operation = spec["paths"]["/translate"]["post"]
    body = operation["requestBody"]["content"]
    assert {"application/json", "application/x-www-form-urlencoded"} <= set(body)
    assert {"q", "source", "target", "beam_size"} <= set(resolved(body["application/json"])["properties"])
    answer = resolved(operation["responses"]["200"]["content"]["application/json"])
    assert {"translatedText", "alternatives", "usage"} <= set(answer["properties"])
    assert resolved(operation["responses"]["503"]["content"]["application/json"])["required"] == ["error"]
    assert {"/languages", "/v1/models", "/health", "/ready", "/metrics"} <= set(spec["paths"])


def test_short_text_is_prepared_on_the_event_loop_and_long_text_in_a_thread() -> None:
    import asyncio
    import threading

    from service.translation.translator import off_loop

    async def where(inline: bool) -> int:
        return await off_loop(inline, threading.get_ident)

    assert asyncio.run(where(True)) == threading.get_ident()
    assert asyncio.run(where(False)) != threading.get_ident()


@pytest.mark.parametrize(
    ("weight_bits", "dot_products", "warned"),
    [(None, False, True), (8, False, True), (7, False, False), (None, True, False)],
)
def test_an_int8_folder_of_8_bit_weights_on_a_cpu_without_vnni_is_flagged_at_load_and_in_its_card(
    quantized: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    weight_bits: int | None,
    dot_products: bool,
    warned: bool,
) -> None:
    """A folder quantized before format 11 (no `weight_bits`: 8 bits) or saying 8, on a CPU whose int8 products go
    through 16-bit pair sums: the log and /v1/models say what to do; it still serves."""
    folder = Path(shutil.copytree(quantized, tmp_path / "tiny-en-fr"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["variants"]["int8"]["weight_bits"] = weight_bits  # (None: as a format 10 folder's, which has none)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(service.engine.sessions, "this_cpu_has_int8_dot_products", lambda: dot_products)
    settings = settings_for(folder, variant="int8", engine_process=False)
    with caplog.at_level("WARNING", logger="service.translation.registry"), TestClient(create_app(settings)) as c:
        model = c.get("/v1/models").json()["models"][0]
        assert c.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200
    assert model["variant"] == "int8" and model["weight_bits"] == weight_bits
    logged = [r.getMessage() for r in caplog.records if "8 bits" in r.getMessage()]
    if not warned:
        assert model["warnings"] == [] and logged == []
        return
    [warning] = model["warnings"]
    assert "int8 weights take 8 bits" in warning and "without VNNI" in warning
    assert f"python -m model_export quantize --model-dir {folder}" in warning and "MT_VARIANT=fp32" in warning
    assert logged == [f"model tiny-en-fr: {warning}"]


def test_two_streams_in_the_server_process_answer_as_one(model_dir: Path) -> None:
    settings = settings_for(model_dir, engine_process=False, decoder_streams=2)
    q = ["Open the file.", "Delete %d items?", "Save the document as %s.", "The file was saved."]
    with TestClient(create_app(settings)) as c:
        assert c.get("/v1/models").json()["models"][0]["decoder_streams"] == 2
        body = c.post("/translate", json={"q": q, "source": "en", "target": "fr"}).json()
    assert body["translatedText"] == [solo(model_dir, text) for text in q]  # its sentences on either stream


@pytest.mark.parametrize("penalty", [-3.0, 5.5])
def test_a_default_length_penalty_no_request_may_give_is_refused_at_start(penalty: float) -> None:
    with pytest.raises(ValueError, match="default_length_penalty"):
        Settings(default_length_penalty=penalty)


def test_a_request_that_has_too_many_sentences_once_cut_says_so(model_dir: Path) -> None:
    """One long sentence cut into pieces past the request's limit: the message says where the pieces came from."""
    with TestClient(create_app(settings_for(model_dir, max_sentence_tokens=8, max_request_sentences=3))) as c:
        response = c.post("/translate", json={"q": "open the file " * 20, "source": "en", "target": "fr"})
    assert response.status_code == 413
    error = response.json()["error"]
    assert " sentences once its sentences are cut to 8 tokens (MT_MAX_SENTENCE_TOKENS); the limit is 3" in error


def test_a_request_whose_inline_tags_make_too_many_sentences_says_so(model_dir: Path) -> None:
    """Two sentences, each translated besides its three pieces between tags: 8 against a limit of 4."""
    q = "<p>Open the <b>file</b> now.</p><p>Save <i>it</i> too.</p>"
    with TestClient(create_app(settings_for(model_dir, max_request_sentences=4))) as c:
        response = c.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html"})
        assert response.status_code == 413
        assert response.json()["error"] == (
            "the request has 8 sentences once its sentences are cut to 200 tokens (MT_MAX_SENTENCE_TOKENS), 6 of "
            "them the text between inline tags, translated besides the sentences they are in; the limit is 4"
        )
        assert c.post("/translate", json={"q": q, "source": "en", "target": "fr"}).status_code == 200  # as text
        titled = '<p title="A tip.">Open the file.</p><img alt="A car."><img alt="A bus."><img alt="A van.">'
        response = c.post("/translate", json={"q": titled, "source": "en", "target": "fr", "format": "html"})
        assert response.status_code == 413
        assert response.json()["error"] == (
            "the request has 5 sentences, 4 of them in attribute values (alt, title, ...; MT_HTML_ATTRIBUTES=false: "
            "none); the limit is 4"
        )


def test_frontend_settings_answer_in_libretranslates_shape(model_dir: Path) -> None:
    """GET /frontend/settings as LibreTranslate's front-ends read it: the limits come from the settings, a key is
    required when MT_API_KEYS is set, file translation is offered with the formats service/files reads, and the
    default pair is one the server has."""
    with TestClient(create_app(settings_for(model_dir, max_request_chars=1234, request_timeout_seconds=2.5))) as c:
        answer = c.get("/frontend/settings")
    assert answer.status_code == 200
    assert answer.json() == {
        "charLimit": 1234,
        "frontendTimeout": 2500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": formats(),
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "fr", "name": "French"}},
    }
    with TestClient(create_app(settings_for(model_dir, api_keys=["k1"]))) as c:
        keyed = c.get("/frontend/settings").json()
    assert keyed["apiKeys"] and keyed["keyRequired"]  # and the route itself needs none, as LibreTranslate's


def test_each_text_has_a_confidence_that_is_its_own(client: TestClient) -> None:
    """`confidence`: a number in [0, 1] for a string q, a list of them for a list, each text's the same alone and
    among others; a folder without calibration says so in /v1/models (exp of the mean token log-probability)."""
    q = ["Open the file.", "Save the document before closing it. Print", "Delete the selected items?"]
    listed = client.post("/translate", json={"q": q, "source": "en", "target": "fr"}).json()["confidence"]
    alone = [client.post("/translate", json={"q": t, "source": "en", "target": "fr"}).json()["confidence"] for t in q]
    assert isinstance(listed, list) and listed == alone
    assert all(isinstance(c, float) and 0.0 <= c <= 1.0 for c in alone)
    empty = client.post("/translate", json={"q": "***", "source": "en", "target": "fr"}).json()
    assert empty["confidence"] == 1.0  # nothing the model read: kept as it is
    [card] = client.get("/v1/models").json()["models"]
    assert card["confidence"] == {"calibrated": False, "method": "exp(mean_token_logprob)"}
