"""mt-translate-files: localisation files (or folders of them) translated in place or into --out, through a running
server (--server, its POST /translate) or through the models in-process (--models-dir). Each file is written whole
or not at all (a temporary file beside it, then renamed); the exit status is 1 if any file could not be translated,
each such file named with the reason. `--glossary` adds a JSON object of terms and their translations over the
server's MT_GLOSSARY_FILE, as /translate's `glossary` does."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from service.arguments import description_of, fraction
from service.errors import ServiceError
from service.files.catalogue import FileError, FileOptions
from service.files.formats import Translate, Translated, formats, translate_file

SERVER_CHUNK = 64  # strings in one POST /translate
EXIT_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    files = list(_files(args.paths))
    if not files:
        print(f"error: no file of a supported format ({', '.join(formats())}) in {args.paths}", file=sys.stderr)
        return EXIT_FAILED
    try:
        args.terms = _glossary(args.glossary) if args.glossary else None
    except (OSError, ValueError) as error:
        print(f"error: --glossary {args.glossary}: {error}", file=sys.stderr)
        return EXIT_FAILED
    options = FileOptions(fuzzy=args.fuzzy, low_confidence=args.low_confidence, only_untranslated=not args.overwrite)
    try:
        translate = _through_server(args) if args.server else _in_process(args)
    except ServiceError as error:  # settings or model folders the models cannot be served with
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    failed = 0
    for path in tqdm(files, unit="file", disable=args.quiet or len(files) < 2):
        try:
            written = _translated(path, args, translate, options)
        except (FileError, ServiceError, OSError, RuntimeError, ValueError) as error:
            failed += 1
            tqdm.write(f"error: {path}: {error}", file=sys.stderr)
        else:
            if not args.quiet:
                tqdm.write(f"{path} -> {written}", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mt-translate-files", description=description_of(__doc__))
    parser.add_argument("paths", nargs="+", type=Path, help="files, or folders searched for supported files")
    parser.add_argument("--target", required=True, help="target language code")
    parser.add_argument("--source", default="auto", help="source language code (default: auto)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="a running server's URL, e.g. http://127.0.0.1:8000")
    where.add_argument("--models-dir", type=Path, help="translate in this process with the model folders here")
    parser.add_argument("--api-key", help="a key of the server's MT_API_KEYS, where it has them")
    parser.add_argument("--glossary", type=Path, help='a JSON file of terms and their translations, {"file": '
                        '"fichier"}, over the server\'s MT_GLOSSARY_FILE')
    parser.add_argument("--out", type=Path, help="write here (a folder for several files) instead of in place")
    parser.add_argument("--fuzzy", action=argparse.BooleanOptionalAction, default=True,
                        help="mark machine translations for review where the format can (default: yes)")
    parser.add_argument("--low-confidence", type=fraction, default=0.0,
                        help="also mark for review, even with --no-fuzzy, translations of a confidence below this "
                        "(the server's MT_LOW_CONFIDENCE; default 0: none)")
    parser.add_argument("--overwrite", action="store_true", help="translate entries that are already translated")
    parser.add_argument("--quiet", action="store_true", help="no progress, errors only")
    return parser


def _glossary(path: Path) -> dict[str, str] | None:
    """The --glossary file's terms, checked as /translate checks a request's; ValueError saying what to change."""
    from pydantic import ValidationError

    from service.api.answers import describe_validation
    from service.api.schemas import GLOSSARY

    try:
        return GLOSSARY.validate_python(path.read_text(encoding="utf-8")) or None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text: save it as UTF-8") from None
    except ValidationError as error:
        errors = [{**e, "loc": ("glossary", *e["loc"])} for e in error.errors()]
        raise ValueError(describe_validation(errors).removeprefix("invalid request: ")) from None


def _files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        found += [p for p in candidates if not path.is_dir() or any(p.name.lower().endswith(s) for s in formats())]
    return found


def _translated(path: Path, args: argparse.Namespace, translate: Translate, options: FileOptions) -> Path:
    result = translate_file(path.read_bytes(), path.name, args.target, translate, options)
    destination = _destination(path, result.filename, args)
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(result.data)
        os.chmod(staged, destination.stat().st_mode if destination.exists() else 0o666 & ~_umask())
        os.replace(staged, destination)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
    return destination


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _destination(path: Path, name: str, args: argparse.Namespace) -> Path:
    if args.out is None:
        return path.with_name(name)
    if len(args.paths) == 1 and not args.paths[0].is_dir() and args.out.suffix:
        return args.out  # one file to one file
    base = args.paths[0] if args.paths[0].is_dir() else path.parent
    relative = path.parent.relative_to(base) if path.is_relative_to(base) else Path()
    return args.out / relative / name


def _through_server(args: argparse.Namespace) -> Translate:
    url = args.server.rstrip("/") + "/translate"

    def translate(texts: list[str], fmt: str) -> list[str] | Translated:
        out: list[str] = []
        confidences: list[float] = []
        for start in range(0, len(texts), SERVER_CHUNK):
            body = {"q": texts[start : start + SERVER_CHUNK], "source": args.source, "target": args.target,
                    "format": fmt}
            if args.api_key:
                body["api_key"] = args.api_key
            if args.terms:
                body["glossary"] = args.terms
            answer = _posted(url, body)
            out += answer["translatedText"]
            confidences += answer.get("confidence") or []  # a server without confidences sends none
        return Translated(out, confidences) if len(confidences) == len(out) else out

    return translate


def _posted(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers={"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310 - the URL the user gave
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            reason = json.loads(error.read()).get("error", error.reason)
        except ValueError:
            reason = error.reason
        raise RuntimeError(f"the server answered {error.code}: {reason}") from None
    except urllib.error.URLError as error:
        raise RuntimeError(f"no answer from {url}: {error.reason}") from None


def _in_process(args: argparse.Namespace) -> Translate:
    """The model folders of --models-dir loaded here, as the server loads them (its settings from MT_* variables),
    each file's strings through them; with --source auto, the language detected from the file's strings."""
    from service.api.translate import check_glossary
    from service.files.segments import Segment
    from service.metrics import Metrics
    from service.settings import Settings
    from service.text.detection import Detector, auto_source
    from service.translation.bulk import translated_texts
    from service.translation.registry import Registry, load_translators

    settings = Settings(models_dir=args.models_dir, engine_process=False, pin_cores=False)
    check_glossary(settings, args.terms)
    translators = load_translators(settings, Metrics())
    registry = Registry(translators)
    detector = Detector([*registry.languages_served(), *settings.detect_languages], settings.detect_accuracy)
    loop = asyncio.new_event_loop()
    for translator in translators:
        translator.warm_up()
        translator.scheduler.start()
    atexit.register(lambda: [translator.scheduler.stop(5.0) for translator in translators])

    def translate(texts: list[str], fmt: str) -> Translated:
        source = args.source
        if source == "auto":
            sample = ["\n".join(Segment("").text(text) for text in texts[:200])]
            sources, pairs = registry.sources_into(args.target, None), registry.pairs()
            source, _ = auto_source(sample, sources, detector, settings.detect_refuse_confidence, args.target, pairs)
        translator = registry.pick(source, args.target, None)
        return loop.run_until_complete(
            translated_texts(translator, texts, args.target, fmt == "html", settings, args.terms)
        )

    return translate


if __name__ == "__main__":
    raise SystemExit(main())
