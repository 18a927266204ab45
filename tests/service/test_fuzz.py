"""Hostile and malformed input, through the API with the tiny model: schemathesis fuzzes every operation of
the OpenAPI schema (no 5xx, answers within the schema), hypothesis drives the text path (any Unicode, control
characters, lone surrogates, long words, thousands of tiny sentences, HTML-looking text, blank texts), and
fixed cases cover deep and huge JSON, chunked bodies and wrong content types. Each input gets a defined
answer, and a normal request is answered afterwards. Deterministic: derandomised, no example database."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.api.app import create_app
from service.settings import Settings
from tests.service.test_api import settings_for

NORMAL = {"q": "Open the file.", "source": "en", "target": "fr"}
JSON = {"content-type": "application/json"}
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(model_dir))) as c:
        yield c


def answers_normally(client: TestClient) -> None:
    response = client.post("/translate", json=NORMAL)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"]


def post_json(client: TestClient, body: object) -> dict:
    """POST with ASCII-escaped JSON (lone surrogates travel as \\udxxx escapes); the answer must be JSON."""
    response = client.post("/translate", content=json.dumps(body).encode(), headers=JSON)
    return {"status": response.status_code, "body": response.json()}


def no_surrogates(text: str) -> bool:
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


# -- schemathesis: every operation of the OpenAPI schema ----------------------------------------------


# The schema does not depend on the models (they load in the app's lifespan), so it is read at import;
# schemathesis starts the lifespan of the app the cases are sent to (once, in-process, over ASGI).
schema = schemathesis.openapi.from_dict(
    create_app(Settings()).openapi(),
    config=schemathesis.Config.from_dict(
        {"generation": {"max-examples": 50, "deterministic": True, "database": "none", "mode": "all"}}
    ),
)


@schema.hook
def map_body(context: schemathesis.HookContext, body: object) -> object:
    """Aim most generated bodies at the loaded model, so that the text path is fuzzed and not only the language
    check: target fr, source en or auto, model tiny-en-fr, beams up to 8, up to 16 tokens (each only where the
    generated value has the right type; the rest, and invalid values, stay as generated), timeouts of 5 s or more.
    """
    if not isinstance(body, dict):
        return body
    body = dict(body)
    for name, value in (("target", "fr"), ("source", "en"), ("model", "tiny-en-fr")):
        if isinstance(body.get(name), str) and len(body[name]) % 4 != 3:  # one in four stays as generated
            body[name] = "auto" if name == "source" and len(body[name]) % 2 else value
    for name, cap in (("beam_size", 8), ("max_length", 16), ("alternatives", 3)):
        if type(body.get(name)) is int and body[name] > cap:
            body[name] = 1 + body[name] % cap
    if type(body.get("timeout")) in (int, float) and 0 < body["timeout"] < 5:  # a deadline it can meet: a 504
        body["timeout"] += 5  # for an impossible one is test_api.py's test_deadline_is_504_and_the_server_goes_on
    return body


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzzed_app(model_dir: Path) -> FastAPI:
    return create_app(settings_for(model_dir))


@pytest.mark.timeout(300)
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_generated_requests_within_its_schema(
    case: schemathesis.Case, fuzzed_app: FastAPI
) -> None:
    """Valid and invalid requests alike: never a 5xx; status, content type, headers and body as documented.
    Not checked: that every schema-valid request succeeds (a well-formed language code may be unsupported:
    400) or that every invalid one fails (values are coerced as LibreTranslate's form clients need: "2")."""
    response = case.call(app=fuzzed_app)
    case.validate_response(response, checks=CHECKS)


def test_the_fuzzed_app_still_answers(fuzzed_app: FastAPI) -> None:
    case = schema["/translate"]["POST"].Case(body=NORMAL, media_type="application/json")
    response = case.call(app=fuzzed_app)
    assert response.status_code == 200 and response.json()["translatedText"]


# -- hypothesis: the text path ------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)  # surrogates and controls too
BLANK = st.text(st.sampled_from(" \t\n\u00a0\u2003\u3000\u2028"), max_size=40)
WORD = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz"), min_size=1, max_size=12)
TAGS = ["<p>", "</p>", '<b class="x">', "</b>", "<br/>", "<!-- note -->", "<code>x = 1</code>", "&amp;", "&#233;"]
TAGS.append("<script>if (a < b) { go(); }</script>")
HTML = st.lists(st.one_of(WORD.map(lambda w: w.capitalize() + "."), WORD, st.sampled_from(TAGS)), max_size=30)


@FUZZ
@given(text=ANY_TEXT)
def test_any_unicode_gets_a_translation(client: TestClient, text: str) -> None:
    answer = post_json(client, {**NORMAL, "q": text, "max_length": 4})
    assert answer["status"] == 200, answer
    translated = answer["body"]["translatedText"]
    assert isinstance(translated, str) and no_surrogates(translated)


@settings(FUZZ, max_examples=15)
@given(texts=st.lists(ANY_TEXT, min_size=1, max_size=6))
def test_a_list_of_any_texts_keeps_its_length_and_order(client: TestClient, texts: list[str]) -> None:
    answer = post_json(client, {**NORMAL, "q": texts, "max_length": 4})
    assert answer["status"] == 200, answer
    translated = answer["body"]["translatedText"]
    assert len(translated) == len(texts) and all(isinstance(t, str) and no_surrogates(t) for t in translated)
    alone = [post_json(client, {**NORMAL, "q": text, "max_length": 4})["body"]["translatedText"] for text in texts]
    assert translated == alone  # in order, and each as if translated by itself


@FUZZ
@given(text=BLANK)
def test_blank_texts_come_back_unchanged(client: TestClient, text: str) -> None:
    answer = post_json(client, {**NORMAL, "q": text})
    assert answer["status"] == 200, answer
    assert answer["body"]["translatedText"] == text and answer["body"]["usage"]["output_tokens"] == 0


@settings(FUZZ, max_examples=10)
@given(word=st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_"), min_size=500, max_size=5000))
def test_a_very_long_word_is_cut_not_refused(client: TestClient, word: str) -> None:
    answer = post_json(client, {**NORMAL, "q": f"a{word}", "max_length": 2})  # a letter: text without is kept
    assert answer["status"] == 200, answer
    assert isinstance(answer["body"]["translatedText"], str) and answer["body"]["usage"]["input_tokens"] > 0


@settings(FUZZ, max_examples=10)
@given(n=st.integers(1, 3000))
def test_thousands_of_tiny_sentences_are_translated_or_refused_with_the_limit(client: TestClient, n: int) -> None:
    answer = post_json(client, {**NORMAL, "q": "A b. " * n, "max_length": 1})
    if n <= 512:
        assert answer["status"] == 200, answer
        assert answer["body"]["translatedText"].count(" ") >= n - 1
    else:
        assert answer == {"status": 413, "body": {"error": f"the request has {n} sentences; the limit is 512"}}


@FUZZ
@given(parts=HTML, fmt=st.sampled_from(["html", "text"]))
def test_html_looking_text_keeps_its_tags(client: TestClient, parts: list[str], fmt: str) -> None:
    text = " ".join(parts)
    answer = post_json(client, {**NORMAL, "q": text, "format": fmt, "max_length": 3})
    assert answer["status"] == 200, answer
    if fmt == "html":  # tags, comments and script are kept verbatim; translations are escaped
        tags = re.compile(r"<[^>]*>")
        assert tags.findall(answer["body"]["translatedText"]) == tags.findall(text)


@FUZZ
@given(text=ANY_TEXT, terms=st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=5), fmt=st.sampled_from(["html", "text"]))
def test_any_glossary_gets_a_defined_answer(client: TestClient, text: str, terms: dict[str, str], fmt: str) -> None:
    """Terms of any text: refused with 422 where one is no term (empty, spaced, a control character), else the
    text translated; and the text's own words as terms, kept as they are: always translated."""
    answer = post_json(client, {**NORMAL, "q": text, "format": fmt, "glossary": terms, "max_length": 3})
    assert answer["status"] in (200, 422), answer
    if answer["status"] == 422:
        assert answer["body"]["error"].startswith("invalid request: glossary"), answer
    else:
        assert isinstance(answer["body"]["translatedText"], str) and no_surrogates(answer["body"]["translatedText"])
    words = {w: w for w in re.findall(r"\w+", text)[:5] if no_surrogates(w)}
    answer = post_json(client, {**NORMAL, "q": text, "format": fmt, "glossary": words, "max_length": 3})
    assert answer["status"] == 200, answer


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
    max_leaves=20,
)
FIELDS = ["q", "source", "target", "format", "alternatives", "api_key", "beam_size", "max_length"]
FIELDS += ["length_penalty", "model", "timeout", "return_scores", "glossary"]


@FUZZ
@given(body=st.fixed_dictionaries({}, optional={name: JSON_VALUE for name in FIELDS}) | JSON_VALUE)
def test_any_json_value_in_any_field_gets_a_defined_answer(client: TestClient, body: object) -> None:
    response = client.post("/translate", content=json.dumps(body).encode(), headers=JSON)
    assert response.status_code in (200, 400, 404, 413, 422, 504), response.text
    if response.status_code != 200:
        assert list(response.json()) == ["error"] and isinstance(response.json()["error"], str)


def test_the_server_answers_after_the_fuzzing(client: TestClient) -> None:
    answers_normally(client)


# -- fixed hostile bodies -----------------------------------------------------------------------------


NESTED = b"[" * 100_000
CASES = [
    ("deep list", NESTED, JSON, 422, "invalid request: body: JSON nested too deeply"),
    ("deep q", b'{"q": ' + NESTED + b"]" * 100_000 + b', "target": "fr"}', JSON, 422, "JSON nested too deeply"),
    ("deep object", b'{"q": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}", JSON, 422, "nested too deeply"),
    ("nested q", b'{"q": ' + b"[" * 500 + b"]" * 500 + b', "target": "fr"}', JSON, 422, "q.str: Input should be"),
    ("huge", b'{"q": "' + b"x" * 1_000_001 + b'"}', JSON, 413, "the limit is 1000000"),
    ("huge number", b'{"q": "x", "target": "fr", "beam_size": ' + b"9" * 5000 + b"}", JSON, 422, "a number is too"),
    ("NaN", b'{"q": "x", "target": "fr", "timeout": NaN}', JSON, 422, "timeout: Input should be a finite number"),
    ("empty", b"", JSON, 422, "not valid JSON (Expecting value"),
    ("null", b"null", JSON, 422, "invalid request: body: expected a JSON object"),
    ("not utf-8", b'{"q": "\xff\xfe"}', JSON, 422, "not valid JSON"),
    ("text/plain", b"q=x", {"content-type": "text/plain"}, 415, "unsupported content type 'text/plain'"),
    ("xml", b"<q>x</q>", {"content-type": "application/xml"}, 415, "unsupported content type 'application/xml'"),
    ("no boundary", b"q=x", {"content-type": "multipart/form-data"}, 422, "not a valid form (Missing boundary"),
    (
        "2000 form fields",
        b"&".join(b"f%d=1" % i for i in range(2000)) + b"&q=x&target=fr",
        {"content-type": "application/x-www-form-urlencoded"},
        422,
        "not a valid form (Too many fields. Maximum number of fields is 1000.)",
    ),
    (
        "129 form texts",
        b"&".join([b"q=x"] * 129) + b"&target=fr",
        {"content-type": "application/x-www-form-urlencoded"},
        413,
        "q has 129 texts; the limit is 128",
    ),
]


@pytest.mark.parametrize(("body", "headers", "status", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_bodies_get_a_defined_answer(
    client: TestClient, body: bytes, headers: dict, status: int, message: str
) -> None:
    response = client.post("/translate", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and message in response.json()["error"], response.json()
    answers_normally(client)


def test_a_chunked_body_over_the_limit_is_refused_while_reading(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"q": "'
        for _ in range(200):
            yield b"x" * 10_000
        yield b'"}'

    response = client.post("/translate", content=chunks(), headers=JSON)
    assert response.status_code == 413
    assert response.json() == {"error": "the body is over 1000000 bytes; the limit is 1000000"}
    answers_normally(client)


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (json.dumps(NORMAL).encode(), {}),  # no content type: JSON
        (json.dumps(NORMAL).encode(), {"content-type": "application/json; charset=utf-8"}),
        (json.dumps(NORMAL).encode("utf-16"), {"content-type": "application/json; charset=utf-16"}),
        (b"q=Open+the+file.&source=en&target=fr", {"content-type": "application/x-www-form-urlencoded"}),
    ],
    ids=["none", "json-utf8", "json-utf16", "form"],
)
def test_accepted_content_types(client: TestClient, content: bytes, headers: dict) -> None:
    response = client.post("/translate", content=content, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"]


def test_an_echoed_lone_surrogate_is_escaped_not_a_500(client: TestClient) -> None:
    answer = post_json(client, {"q": "x", "source": "\ud800", "target": "fr"})
    assert answer == {"status": 400, "body": {"error": "language pair \ud800->fr is not supported; available: en->fr"}}
    answers_normally(client)
