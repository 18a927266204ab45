"""A 2,000-entry gettext catalogue through POST /translate_file against the same strings through POST /translate,
on the real server with the default model, the two alternated: what the file path costs over the strings' own
translation (parsing, placeholder markup, HTML mode, writing the file back).

The strings are the corpus's test sentences. /translate gets them as a client that batches would send them: lists of
64 texts, 4 requests in flight (what /translate_file does inside), in text mode; /translate_file gets the catalogue,
its answer in the response (`response=file`). Prints each round's seconds and the median ratio."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx

from bench.server import free_port, sentences, start_server, stop_server
from service.arguments import description_of, positive_int

CHUNK, IN_FLIGHT = 64, 4


def catalogue(texts: list[str]) -> bytes:
    header = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    entries = "".join(f'#: src/app.c:{i}\nmsgid "{_quoted(text)}"\nmsgstr ""\n\n' for i, text in enumerate(texts))
    return (header + entries).encode("utf-8")


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")


async def strings_through_translate(url: str, texts: list[str]) -> float:
    gate = asyncio.Semaphore(IN_FLIGHT)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(chunk: list[str]) -> None:
            async with gate:
                answer = await client.post(f"{url}/translate", json={"q": chunk, "source": "en", "target": "fr"})
                answer.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(one(texts[i : i + CHUNK]) for i in range(0, len(texts), CHUNK)))
        return time.perf_counter() - started


def file_through_translate_file(url: str, data: bytes) -> float:
    started = time.perf_counter()
    answer = httpx.post(
        f"{url}/translate_file",
        files={"file": ("app.po", data)},
        data={"source": "en", "target": "fr", "response": "file"},
        timeout=600,
    )
    answer.raise_for_status()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description_of(__doc__))
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--entries", type=positive_int, default=2000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args(argv)
    texts = sentences(args.corpus, args.entries)
    data = catalogue(texts)
    port = free_port()
    env = {"MT_LOG_LEVEL": "WARNING", "MT_MAX_FILE_BYTES": str(max(10_000_000, 2 * len(data)))}
    server = start_server(args.models_dir, port, env)
    url = f"http://127.0.0.1:{port}"
    try:
        file_through_translate_file(url, catalogue(texts[:50]))  # warm both paths
        asyncio.run(strings_through_translate(url, texts[:50]))
        ratios = []
        print(f"{len(texts)} entries, {len(data):,} bytes; seconds per round")
        print("round  /translate  /translate_file  ratio")
        for round_ in range(1, args.rounds + 1):
            strings = asyncio.run(strings_through_translate(url, texts))
            whole = file_through_translate_file(url, data)
            ratios.append(whole / strings)
            print(f"{round_:>5}  {strings:>10.2f}  {whole:>15.2f}  {whole / strings:>5.2f}")
        print(f"median ratio /translate_file / /translate: {statistics.median(ratios):.2f}")
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
