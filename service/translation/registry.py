"""The loaded models: each model folder's Translator, how a request's languages and model name pick one, and the
checks that the folders, glossaries and core placement fit together."""

from __future__ import annotations

import logging
from pathlib import Path

from service.engine.sessions import (
    cuda_present,
    decoder_streams,
    intra_op_threads,
    open_runtime,
    step_graphs,
)
from service.errors import InvalidRequest, ModelFolderError, NotFound, SettingsError
from service.metrics import Metrics
from service.model.folder import MANIFEST, ModelFolder, load_model_folder
from service.scheduling.placement import Cores, allowed_cores, claim, pin_process, plan
from service.settings import Settings, available_cores
from service.text.glossary import Glossary, read_glossary_file
from service.translation.translator import (
    LANGUAGE_NAMES,
    Translator,
)

log = logging.getLogger(__name__)


class Registry:
    """The loaded models, and the rules that pick one for a request."""

    def __init__(self, translators: list[Translator]) -> None:
        self.translators = {t.name: t for t in translators}

    def _candidates(self, model: str | None) -> list[Translator]:
        if model is None:
            return list(self.translators.values())
        if model not in self.translators:
            raise NotFound(f"no model named {model!r}; loaded: {', '.join(sorted(self.translators))}")
        return [self.translators[model]]

    def pairs(self, model: str | None = None) -> str:
        """The language pairs served (by `model`), for messages: "en->fr, de->fr"."""
        served = (f"{t.source_language}->{target}" for t in self._candidates(model) for target in t.target_languages)
        return ", ".join(sorted(served))

    def sources_into(self, target: str, model: str | None) -> list[str]:
        """The source languages a model (`model`, if given) translates into `target`; InvalidRequest if none."""
        sources = sorted({t.source_language for t in self._candidates(model) if target in t.target_languages})
        if not sources:
            raise InvalidRequest(f"no loaded model translates into {target}; available: {self.pairs(model)}")
        return sources

    def languages_served(self) -> list[str]:
        """Every language a loaded model translates from or into."""
        codes = {t.source_language for t in self.translators.values()}
        return sorted(codes | {tl for t in self.translators.values() for tl in t.target_languages})

    def pick(self, source: str, target: str, model: str | None) -> Translator:
        """The model (`model`, if given) that translates `source` into `target`; InvalidRequest naming the pairs
        served when none does."""
        candidates = self._candidates(model)
        fitting = [t for t in candidates if target in t.target_languages and source == t.source_language]
        if not fitting:
            raise InvalidRequest(
                f"language pair {source}->{target} is not supported; available: {self.pairs(model)}"
            )
        return fitting[0]

    def languages(self) -> list[dict[str, object]]:
        """LibreTranslate's /languages: one entry per language with the targets it can go to."""
        targets: dict[str, set[str]] = {}
        for t in self.translators.values():
            targets.setdefault(t.source_language, set()).update(t.target_languages)
            for target in t.target_languages:
                targets.setdefault(target, set())
        return [
            {"code": code, "name": language_name(code), "targets": sorted(ts)} for code, ts in sorted(targets.items())
        ]


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def model_folders(settings: Settings) -> list[Path]:
    root = settings.models_dir
    if not root.is_dir():
        raise ModelFolderError(f"MT_MODELS_DIR {root} is not a folder")
    if settings.models:
        return [root / name for name in settings.models]
    found = sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
    if not found:
        raise ModelFolderError(f"no model folders (subfolders with {MANIFEST}) in {root}")
    return found


def load_translators(settings: Settings, metrics: Metrics, pin: bool = False) -> list[Translator]:
    """Every model folder's Translator (with its engine process, unless MT_ENGINE_PROCESS is false). `pin`: this
    process is the server's own (`python -m service`), whose threads may be pinned (service/scheduling/placement.py)."""
    translators = []
    glossaries = read_glossary_file(settings.glossary_file) if settings.glossary_file else {}
    folders = [load_model_folder(path, settings.verify_checksums) for path in model_folders(settings)]
    check_names(folders)
    check_glossaries(glossaries, folders, settings)
    placed = place(folders, settings) if pin else None
    for index, folder in enumerate(folders):
        path = folder.path
        runtime = None if settings.engine_process else open_runtime(folder, settings)
        source = folder.manifest.source_language
        own = {target: glossary for (src, target), glossary in glossaries.items() if src == source}
        translator = Translator(folder, settings, metrics, runtime, placed[index] if placed else None, own)
        variant = translator.variant
        provider = translator.scheduler.providers[0]
        metrics.model_info.labels(translator.name, translator.version, variant, provider).set(1)
        where = "an engine process" if settings.engine_process else "the server process"
        name, version = translator.name, translator.version
        cfg = folder.manifest.config
        streams, threads = decoder_streams(cfg, settings), intra_op_threads(cfg, settings)
        cores = f" on core(s) {list(translator.cores.streams)}" if translator.cores else ""
        graphs = ", ".join(step_graphs(folder, settings))
        log.info(
            "loaded model %s %s (%s, %s) in %s from %s: %d decoding stream(s) of %d thread(s)%s; step graphs: %s",
            *(name, version, variant, provider, where, path, streams, threads, cores, graphs),
        )
        for warning in translator.warnings:
            log.warning("model %s: %s", name, warning)
        translators.append(translator)
    return translators


def check_glossaries(
    glossaries: dict[tuple[str, str], Glossary], folders: list[ModelFolder], settings: Settings
) -> None:
    """The glossary file's language pairs are pairs a loaded model translates, and its model reads placeholders."""
    if glossaries and not settings.mask_symbols:
        raise SettingsError(
            "MT_GLOSSARY_FILE needs placeholders, which MT_MASK_SYMBOLS=false turns off: unset one of them"
        )
    pairs = {(f.manifest.source_language, t) for f in folders for t in f.manifest.target_languages}
    unserved = sorted(set(glossaries) - pairs)
    if unserved:
        (source, target), served = unserved[0], ", ".join(f"{s}->{t}" for s, t in sorted(pairs))
        raise SettingsError(
            f"MT_GLOSSARY_FILE={str(settings.glossary_file)!r}: {source}->{target}: no loaded model translates "
            f"{source} into {target} (loaded: {served}); fix the language codes or load a model for them"
        )


def check_names(folders: list[ModelFolder]) -> None:
    """Each loaded model has a name of its own: requests pick models by name (`model`, /v1/models), so of two
    folders with one name, one could never be used."""
    by_name: dict[str, list[str]] = {}
    for folder in folders:
        by_name.setdefault(folder.manifest.name, []).append(str(folder.path))
    for name, paths in by_name.items():
        if len(paths) > 1:
            raise ModelFolderError(
                f"{' and '.join(paths)} are both model {name!r} (their manifests' name): each loaded model needs a "
                "name of its own; choose one with MT_MODELS, or rename the other in its manifest"
            )


def place(folders: list[ModelFolder], settings: Settings) -> list[Cores] | None:
    """MT_PIN_CORES: a core for each model's decoding streams, if service/scheduling/placement.py's plan has one, this
    process's threads (and so its engine processes) pinned to the cores left; None where nothing is pinned."""
    if not settings.pin_cores or cuda_present(settings):
        return None
    layouts = [
        (decoder_streams(f.manifest.config, settings), intra_op_threads(f.manifest.config, settings)) for f in folders
    ]
    allowed, usable, taken = allowed_cores(), available_cores(), frozenset[int]()
    while (placed := plan(layouts, allowed, usable, taken)) is not None:
        refused = claim([core for cores in placed for core in cores.streams], settings.pin_claims_dir)
        if not refused:
            break
        taken |= refused  # another server holds these: plan again without them
    if placed is None:
        log.info(
            "threads not pinned: (decoding streams, threads each) per model %s on %d core(s), %d claimed by other "
            "servers",
            *(layouts, len(allowed), len(taken)),
        )
        return None
    pin_process(placed[0].others)
    log.info(
        "decoding streams pinned to core(s) %s; every other thread to %s",
        [list(c.streams) for c in placed],
        sorted(placed[0].others),
    )
    return placed
