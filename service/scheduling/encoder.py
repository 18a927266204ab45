"""The encoder thread: sentences' encoder passes off the decoding loop, merged from its backlog into passes of
similar lengths, each pass's memory handed back through a future."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from service.engine.batches import (
    pad_batch,
)
from service.engine.runtime import Memory
from service.scheduling.placement import pin_thread

MERGED_PASS_SENTENCES = 16  # the most sentences the encoder thread merges into one pass from its backlog




def mergeable(shortest: int, longest: int, ratio: float) -> bool:
    """Whether sources from `shortest` to `longest` tokens long pad little enough to share an encoder pass."""
    return longest <= ratio * shortest + 2


class EncoderThread:
    """Encoder passes on a thread of their own, beside the decoder steps (`overlap_encoder`). The decoding thread
    hands over one length bucket at a time and gets a Future of its memory. Whenever the thread turns to its
    queue it takes every bucket waiting there and merges those of similar length (`mergeable`, up to
    MERGED_PASS_SENTENCES) into one pass: under load the queue is seldom empty (at 32 clients on the default
    model, 2 cores, a submission found 1-15 passes queued ahead of it in 6 of 10 cases, ~2 sentences each), and a
    pass costs less per sentence the more it holds (int8, one thread, 12 tokens: 459 us alone, 386 a sentence
    for 2, 345 for 4), with one hand-over of the GIL instead of several. Each bucket gets its own rows of the
    merged memory, as wide as its own sources; a merged pass that fails fails every bucket in it."""

    def __init__(
        self,
        encode: Callable[[np.ndarray, np.ndarray], Memory],
        pad_id: int,
        ratio: float,
        name: str,
        cores: frozenset[int] | None = None,
    ) -> None:
        self.encode, self.pad_id, self.ratio, self.name, self.cores = encode, pad_id, ratio, name, cores
        self._queue: list[tuple[list[list[int]], Future[Memory]]] = []  # (a bucket's sources, its memory)
        self._ready = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None  # started with the first bucket, from the decoding thread

    def submit(self, sources: list[list[int]]) -> Future[Memory]:
        memory: Future[Memory] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the encoder thread has been shut down")
            self._queue.append((sources, memory))
            self._ready.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return memory

    def shutdown(self) -> None:
        """Cancel what is queued, let the pass in progress end, end the thread."""
        with self._ready:
            self._closed, queued, self._queue = True, self._queue, []
            self._ready.notify()
        for _, memory in queued:
            memory.cancel()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        if self.cores is not None:  # started by the decoding thread, pinned to its own core: back to the others'
            pin_thread(self.cores)
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                taken, self._queue = self._queue, []
            try:
                groups = self._merged(taken)
            except Exception as error:  # noqa: BLE001 - a bug here fails these buckets, not the thread
                for _, memory in taken:
                    if memory.set_running_or_notify_cancel():
                        memory.set_exception(error)
                continue
            for group in groups:
                self._pass(group)

    def _merged(
        self, taken: list[tuple[list[list[int]], Future[Memory]]]
    ) -> list[list[tuple[list[list[int]], Future[Memory]]]]:
        """The queued buckets as passes: taken shortest first, a bucket joining the pass before it while the pass's
        shortest and the bucket's longest source stay mergeable and the pass stays within MERGED_PASS_SENTENCES;
        the passes then run in the order their first bucket was queued."""
        groups: list[list[int]] = []  # indexes into `taken`
        shortest = sentences = 0
        for index in sorted(range(len(taken)), key=lambda i: min(len(s) for s in taken[i][0])):
            sources = taken[index][0]
            room = sentences + len(sources) <= MERGED_PASS_SENTENCES
            if groups and room and mergeable(shortest, max(map(len, sources)), self.ratio):
                groups[-1].append(index)
                sentences += len(sources)
            else:
                groups.append([index])
                shortest, sentences = min(map(len, sources)), len(sources)
        return [[taken[i] for i in sorted(group)] for group in sorted(groups, key=min)]

    def _pass(self, group: list[tuple[list[list[int]], Future[Memory]]]) -> None:
        running = [(sources, memory) for sources, memory in group if memory.set_running_or_notify_cancel()]
        if not running:
            return
        try:
            src_ids, src_mask = pad_batch([s for sources, _ in running for s in sources], self.pad_id)  # (b, S) each
            merged = self.encode(src_ids, src_mask)  # (L, b, H, S, Dh) twice
        except Exception as error:  # noqa: BLE001 - handed to the decoding thread, which fails these buckets
            for _, memory in running:
                memory.set_exception(error)
            return
        first = 0
        for sources, memory in running:
            rows, width = slice(first, first + len(sources)), max(len(s) for s in sources)
            candidates = None if merged.candidates is None else merged.candidates[rows]  # (b, C) each its own
            memory.set_result(Memory(merged.keys[:, rows, :, :width], merged.values[:, rows, :, :width], candidates))
            first += len(sources)
