"""Many strings through one Translator: requests of a bounded size, a few of them queued at once so that they share
the engine's batches, a request with too many sentences split until it fits; the first failure fails them all."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from service.errors import TooLarge
from service.files.formats import Translated
from service.settings import Settings
from service.translation.translator import TranslateOptions, Translator

CHUNK_TEXTS = 64  # a file's strings go to the translator in requests of this many at most ...
CHUNK_CHARS = 16_000  # ... and of this many characters
CHUNKS_IN_FLIGHT = 4  # requests of one file in the queue at once: enough to fill a batch, not to fill the queue


async def translated_texts(
    translator: Translator,
    texts: list[str],
    target: str,
    html: bool,
    settings: Settings,
    glossary: dict[str, str] | None = None,
) -> Translated:
    """`texts` translated in requests of CHUNK_TEXTS texts and CHUNK_CHARS characters at most, CHUNKS_IN_FLIGHT of
    them queued at once, so that a file's strings share the engine's batches; a request with more sentences than a
    request may have is split in two until it fits. The first failure fails the whole file. The server's glossary
    for the pair applies, `glossary`'s terms over it (a term in both: `glossary`'s translation). Each text comes
    with its confidence."""
    options = TranslateOptions(
        beam_size=settings.default_beam_size, length_penalty=settings.default_length_penalty, html=html
    )
    options = replace(options, glossary=translator.glossary(target, glossary))
    gate = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

    async def one(chunk: list[str]) -> Translated:
        async with gate:
            return await fitted(translator, chunk, target, options)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(chunk)) for chunk in chunked(texts)]
    done = [task.result() for task in tasks]
    return Translated([t for d in done for t in d.texts], [c for d in done for c in d.confidences])


async def fitted(translator: Translator, texts: list[str], target: str, options: TranslateOptions) -> Translated:
    try:
        result = await translator.translate(texts, target, options)
        return Translated(result.texts, result.confidences)
    except TooLarge:
        if len(texts) == 1:
            raise
        half = len(texts) // 2
        first = await fitted(translator, texts[:half], target, options)
        second = await fitted(translator, texts[half:], target, options)
        return Translated(first.texts + second.texts, first.confidences + second.confidences)


def chunked(texts: list[str]) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    chars = 0
    for text in texts:
        if chunks[-1] and (len(chunks[-1]) >= CHUNK_TEXTS or chars + len(text) > CHUNK_CHARS):
            chunks.append([])
            chars = 0
        chunks[-1].append(text)
        chars += len(text)
    return [chunk for chunk in chunks if chunk]
