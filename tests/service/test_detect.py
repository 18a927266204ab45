"""Language detection: lingua over the served languages (and MT_DETECT_LANGUAGES), POST /detect in LibreTranslate's
shape, and `source: "auto"`, which refuses a text confidently in a language no model translates into the target."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.errors import InvalidRequest
from service.settings import Settings
from service.text.detection import Candidate, Detector, auto_source, merged

FRENCH = "Le fichier est introuvable sur le disque, veuillez vérifier le chemin."
ENGLISH = "The file could not be found on the disk; please check the path."
GERMAN = "Die Datei wurde auf der Festplatte nicht gefunden, bitte überprüfen Sie den Pfad."


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector(["en", "fr", "de"])


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], intra_op_threads=1)
    with TestClient(create_app(settings)) as c:
        yield c


def test_the_detector_tells_the_languages_apart(detector: Detector) -> None:
    for text, language in ((FRENCH, "fr"), (ENGLISH, "en"), (GERMAN, "de"), ("Ouvrir le fichier", "fr")):
        found = detector.candidates(text)
        assert found[0].language == language, (text, found)
        assert found == sorted(found, key=lambda c: -c.confidence) and all(0 < c.confidence <= 1 for c in found)


def test_a_text_without_letters_has_no_language(detector: Detector) -> None:
    assert detector.candidates("12:30 — 42 %") == [] and detector.candidates("") == []


def test_languages_lingua_lacks_are_named_not_fatal() -> None:
    detector = Detector(["en", "xx", "fr", "EN"])
    assert detector.languages == ["en", "fr"] and detector.unknown == ["xx"]
    assert Detector(["en"]).candidates("anything at all") == [Candidate("en", 1.0)]  # one language: no comparison


def test_a_list_merges_by_length() -> None:
    long_fr, short_en = [Candidate("fr", 0.9), Candidate("en", 0.1)], [Candidate("en", 1.0)]
    assert [c.language for c in merged([long_fr, short_en], [90, 10])] == ["fr", "en"]
    assert merged([long_fr, short_en], [90, 10])[0].confidence == pytest.approx(0.81)
    assert [c.language for c in merged([long_fr, short_en], [10, 90])] == ["en", "fr"]


def test_auto_takes_the_served_source_and_refuses_a_confident_other(detector: Detector) -> None:
    source, chosen = auto_source([ENGLISH], ["en"], detector, 0.8, "fr", "en->fr")
    assert source == "en" and chosen[0].language == "en" and chosen[0].confidence > 0.5
    with pytest.raises(InvalidRequest, match=r"the text is in fr \(detected with confidence \d+ %\).*served: en->fr"):
        auto_source([FRENCH], ["en"], detector, 0.8, "fr", "en->fr")
    with pytest.raises(InvalidRequest, match="text 1 is in de"):
        auto_source([ENGLISH, GERMAN], ["en"], detector, 0.8, "fr", "en->fr")
    # below the confidence that refuses, a text goes to the served source, its own confidence reported
    source, chosen = auto_source([FRENCH], ["en"], detector, 1.01, "fr", "en->fr")
    assert source == "en" and chosen[0].language == "en" and chosen[0].confidence < 0.5
    # of two served sources, the one the texts are in
    assert auto_source([GERMAN], ["de", "en"], detector, 0.8, "fr", "de->fr, en->fr")[0] == "de"


def test_detect_answers_as_libretranslate(client: TestClient) -> None:
    for send in ({"json": {"q": FRENCH}}, {"data": {"q": FRENCH}}):
        response = client.post("/detect", **send)
        assert response.status_code == 200, response.text
        found = response.json()
        assert found[0]["language"] == "fr" and 50 < found[0]["confidence"] <= 100
        assert set(found[0]) == {"language", "confidence"}
    merged_list = client.post("/detect", json={"q": [ENGLISH, "Open"]}).json()
    assert merged_list[0]["language"] == "en"
    assert client.post("/detect", json={"q": "1234"}).json() == [{"language": "en", "confidence": 0.0}]


def test_detect_refuses_bad_input_clearly(client: TestClient) -> None:
    assert client.get("/detect").status_code == 405
    missing = client.post("/detect", json={})
    assert missing.status_code == 422 and "q" in missing.json()["error"]
    assert client.post("/detect", json={"q": "x" * 60_000}).status_code == 413
    assert client.post("/detect", content=b"q=1", headers={"content-type": "text/plain"}).status_code == 415


def test_auto_refuses_french_sent_to_an_english_to_french_server(client: TestClient) -> None:
    response = client.post("/translate", json={"q": FRENCH, "source": "auto", "target": "fr"})
    assert response.status_code == 400
    assert "is in fr" in response.json()["error"] and "en->fr" in response.json()["error"]
    translated = client.post("/translate", json={"q": ENGLISH, "source": "auto", "target": "fr"})
    assert translated.status_code == 200 and translated.json()["detectedLanguage"]["language"] == "en"


def test_detect_needs_a_key_where_translate_does(model_dir: Path) -> None:
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], intra_op_threads=1, api_keys=["k1"])
    with TestClient(create_app(settings)) as c:
        assert c.post("/detect", json={"q": ENGLISH}).status_code == 403
        assert c.post("/detect", json={"q": ENGLISH, "api_key": "k1"}).status_code == 200


def test_weblates_libretranslate_backend_requests_are_answered(client: TestClient) -> None:
    """What Weblate's LibreTranslate machinery sends: GET /languages for the codes, then a form POST /translate
    with its (possibly empty) key, and the newer JSON one with format html."""
    assert {lang["code"] for lang in client.get("/languages").json()} == {"en", "fr"}
    form = {"api_key": "", "q": "Open the file.", "source": "en", "target": "fr"}
    answer = client.post("/translate", data=form)
    assert answer.status_code == 200 and isinstance(answer.json()["translatedText"], str)
    html = {"api_key": None, "q": "Open <b>the file</b>.", "source": "en", "target": "fr", "format": "html"}
    answer = client.post("/translate", json=html)
    assert answer.status_code == 200 and "<b>" in answer.json()["translatedText"]
