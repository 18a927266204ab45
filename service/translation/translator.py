"""One served model and the text path around it: clean -> split into sentences -> token ids ->
scheduler -> ids -> text -> rejoin in order. Also the set of loaded models and how a request's
languages and model name select one. Knows languages and options; knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from service.engine.batches import TokenRules, ends
from service.engine.cpu import this_cpu_has_int8_dot_products
from service.engine.decoding import Hypothesis, SearchOptions, output_cap
from service.engine.runtime import DENSE_STEP_ROWS, OnnxRuntime, Runtime, SessionSettings, step_candidates
from service.errors import DeadlineExceeded, InvalidRequest, ModelFolderError, NotFound, SettingsError, TooLarge
from service.metrics import Metrics
from service.model.folder import MANIFEST, Architecture, ModelFolder, load_model_folder
from service.model.tokenizer import Tokenizer
from service.scheduling.engine_process import EngineProcess
from service.scheduling.placement import Cores, allowed_cores, claim, pin_process, plan
from service.scheduling.scheduler import BatchLimits, Scheduler, SentenceJob, Streams, Ticket, fits, new_scheduler
from service.settings import Settings, available_cores
from service.text import document as text
from service.text.glossary import Glossary, merged, read_glossary_file
from service.text.placeholders import Masked, mask

log = logging.getLogger(__name__)
T = TypeVar("T")

# Text this short is split, tokenised and detokenised on the event loop: a hop to a worker thread costs more
# than the work (default model, 32 clients: 3,338 vs 3,206 target tok/s, p99 356 vs 383 ms, 2 runs each). Longer
# text goes to a worker thread so that it cannot stall the other requests.
INLINE_CHARS = 2000
# HTML with inline tags costs ~5x plain text to split (2,000 characters of tagged sentences: 2.9 ms against 0.58)
INLINE_HTML_CHARS = 400
DEADLINE_GRACE_SECONDS = 5.0  # past a request's deadline, when the scheduler should have failed it long before
# A sentence whose best translation lost or repeated a placeholder is searched again with this many beams, each
# returning a hypothesis: the default model's greedy search lost one in 8 of 158 test sentences with a name masked,
# and 5 of those 8 had a hypothesis among 4 beams that kept it (4 of 8 among 8)
RESCUE_BEAM = 4


async def off_loop(inline: bool, function: Callable[..., T], *args: Any) -> T:
    return function(*args) if inline else await asyncio.to_thread(function, *args)


@dataclass(frozen=True)
class TranslateOptions:
    beam_size: int = 1
    alternatives: int = 0  # extra hypotheses per text, besides the best
    length_penalty: float = 1.0
    max_length: int | None = None  # generated tokens per sentence; None: the server's cap
    html: bool = False
    timeout: float | None = None  # seconds; None: the server's request timeout
    return_scores: bool = False  # as the API's: greedy sentences' scores not computed (Translation.scores NaN)
    glossary: Glossary | None = None  # terms given to the model as placeholders, put back as their translations


@dataclass
class Translation:
    texts: list[str]  # one per input text
    alternatives: list[list[str]]  # per input text, up to `alternatives` other translations
    scores: list[float]  # per input text, the mean normalised log-probability of its sentences
    input_tokens: int
    output_tokens: int
    queue_seconds: float
    seconds: float
    truncated_sentences: int = 0  # sentences whose best translation stopped at the length cap, without EOS


@dataclass
class Prepared:
    documents: list[text.Document]
    jobs: list[list[int]]  # source ids per sentence, documents concatenated
    options: list[SearchOptions]
    masks: list[Masked]  # per sentence, what the model read of it: its placeholders and the runs they stand for


class Translator:
    """`runtime` given: its scheduler runs in this process (tests, and `MT_ENGINE_PROCESS=false`); none: the
    model's scheduler and sessions run in an engine process of their own (see service/scheduling/engine_process.py)."""

    def __init__(
        self,
        folder: ModelFolder,
        settings: Settings,
        metrics: Metrics,
        runtime: Runtime | None = None,
        cores: Cores | None = None,
        glossaries: dict[str, Glossary] | None = None,
    ) -> None:
        manifest = folder.manifest
        self.glossaries = glossaries or {}  # by target language: the server's (MT_GLOSSARY_FILE)
        self.folder, self.runtime, self.settings, self.metrics = folder, runtime, settings, metrics
        self.name, self.version = manifest.name, manifest.version
        self.source_language, self.target_languages = manifest.source_language, list(manifest.target_languages)
        self.tokenizer = Tokenizer.from_folder(folder)
        ids = manifest.special_ids
        self.rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
        self.max_source_tokens = min(settings.max_sentence_tokens, manifest.config.max_positions)
        self.max_output_tokens = min(settings.max_output_tokens, manifest.config.max_positions)  # positions it has
        self.variant = chosen_variant(folder, settings)  # MT_VARIANT, or as the providers make it
        check_batch_invariant(folder, self.variant, settings)
        most = step_candidates(folder, folder.variant(self.variant)).most  # candidates per row, at most
        self.max_beam = (most - 1) // 2  # beam k takes 2k + 1 (decoding.candidates)
        limits = batch_limits(settings)
        self._check_longest_sentence_fits(limits)
        self.cores = cores  # where its decoding streams run, if pinned (service/scheduling/placement.py)
        metrics.add_model(self.name, settings.max_queue_sentences)
        self.scheduler: Scheduler | Streams | EngineProcess
        if runtime is not None:
            streams = decoder_streams(manifest.config, settings)
            self.scheduler = new_scheduler(runtime, self.rules, limits, metrics, self.name, streams, cores=cores)
        else:
            self.scheduler = EngineProcess(folder.path, settings, self.rules, limits, metrics, self.name, cores)
        # logged at load, listed by /v1/models
        self.warnings = weight_bits_warnings(folder, self.variant) + batch_variance_warnings(settings)

    def warm_up(self) -> None:
        """One real translation through both graphs before the server says it is ready."""
        self.scheduler.warm_up(self.tokenizer.encode("Hello world.", self.target_languages[0]))

    # -- preparing a request (in a worker thread when it is long: see INLINE_CHARS) ---------------

    def prepare(self, texts: list[str], target: str, options: TranslateOptions) -> Prepared:
        split = text.split_text
        if options.html:
            settings = self.settings
            split = partial(
                text.split_html, placeholders=settings.mask_symbols, attributes=settings.html_attributes,
                languages=(self.source_language, target),
            )  # fmt: skip
        documents = [split(text.clean(t)) for t in texts]
        attributes = sum(len(doc.attribute_texts) for doc in documents)  # HTML attribute values' sentences
        # before any token is counted
        self._check_sentences(sum(len(doc.sentences) for doc in documents) + attributes, attributes=attributes)
        documents = [doc.expand(self.tokenizer.count, self.max_source_tokens) for doc in documents]
        sentences = [s for doc in documents for s in doc.texts]
        attributes = sum(len(doc.attribute_texts) for doc in documents)  # (cut too)
        lazy = pieces = 0  # inline tags' pieces (text.Tagged): lazy ones in a second pass, if at all
        if options.html:
            lazy = sum(len(t.pieces.sentences) for doc in documents for t in doc.tagged.values() if not t.eager)
            pieces = len(sentences) + lazy - attributes - sum(len(doc.sentences) for doc in documents)
        self._check_sentences(len(sentences) + lazy, cut=True, pieces=pieces, attributes=attributes)
        return self._jobs([self.masked(s, options.glossary) for s in sentences], target, options, documents)

    def _jobs(
        self, masks: list[Masked], target: str, options: TranslateOptions, documents: list[text.Document] | None = None
    ) -> Prepared:
        """The sentences as the model reads them (`masks`), tokenised, each with its search options."""
        jobs = [self.tokenizer.encode(m.text, target) for m in masks]
        return Prepared(documents or [], jobs, [self.search_options(len(ids), options) for ids in jobs], masks)

    def glossary(self, target: str, terms: dict[str, str] | None) -> Glossary | None:
        """A request's glossary into `target`: the server's for the pair (MT_GLOSSARY_FILE), a request's `terms`
        over it (a term in both: the request's translation)."""
        base = self.glossaries.get(target)
        return merged(base, tuple(terms.items())) if terms else base

    def masked(self, sentence: str, glossary: Glossary | None = None) -> Masked:
        """The sentence as the model reads it (`text.model_input`): with MT_MASK_SYMBOLS, what it cannot read and
        the glossary's terms as placeholders (a glossary needs them: api.translate_options, `check_glossaries`)."""
        if not self.settings.mask_symbols:
            return Masked(text.model_input(sentence))
        return mask(text.model_input(sentence, keep_flags=True), self.tokenizer.readable, glossary)

    def _check_sentences(self, count: int, cut: bool = False, pieces: int = 0, attributes: int = 0) -> None:
        """413 for more sentences than a request may have, or than the whole queue holds (a 503 'retry later' for
        a request that can never fit would be retried forever). `cut`: counted once long sentences were cut;
        `pieces` of them are the text between inline HTML tags, translated besides their sentences, and
        `attributes` those of HTML attribute values (alt, title, ...)."""
        if count <= min(self.settings.max_request_sentences, self.settings.max_queue_sentences):
            return  # (every request: no message built)
        has = f"the request has {count} sentences" + (
            f" once its sentences are cut to {self.max_source_tokens} tokens (MT_MAX_SENTENCE_TOKENS)" if cut else ""
        )
        if pieces:
            has += f", {pieces} of them the text between inline tags, translated besides the sentences they are in"
        if attributes:
            has += f", {attributes} of them in attribute values (alt, title, ...; MT_HTML_ATTRIBUTES=false: none)"
        if count > self.settings.max_request_sentences:
            raise TooLarge(f"{has}; the limit is {self.settings.max_request_sentences}")
        if count > self.settings.max_queue_sentences:
            raise TooLarge(
                f"{has}; the queue holds at most {self.settings.max_queue_sentences} (MT_MAX_QUEUE_SENTENCES): "
                "send them in smaller requests"
            )

    def output_cap(self, src_len: int, max_length: int | None = None) -> int:
        """The most tokens a sentence of `src_len` tokens may generate: max_length, MT_MAX_OUTPUT_TOKENS (never
        past the model's positions) and MT_MAX_OUTPUT_RATIO, whichever is least."""
        most = min(max_length or self.max_output_tokens, self.max_output_tokens)
        return output_cap(src_len, most, self.settings.max_output_ratio)

    def _check_longest_sentence_fits(self, limits: BatchLimits) -> None:
        """SettingsError when the longest sentence the splitter lets through, with the default beam size and its
        output cap, could never join a batch: every such request would get 413."""
        longest, beam = self.max_source_tokens, self.settings.default_beam_size
        search = SearchOptions(beam, self.output_cap(longest))
        if not fits(limits, search, longest):
            raise SettingsError(
                f"MT_MAX_BATCH_TOKENS ({limits.max_tokens}) cannot hold model {self.name}'s longest sentence: "
                f"{longest} tokens (MT_MAX_SENTENCE_TOKENS) and up to {search.max_new_tokens} generated, with "
                f"MT_DEFAULT_BEAM_SIZE {beam}, need {beam * (longest + search.max_new_tokens)}; raise "
                "MT_MAX_BATCH_TOKENS or lower MT_MAX_SENTENCE_TOKENS"
            )

    def search_options(self, src_len: int, options: TranslateOptions) -> SearchOptions:
        """A sentence of `src_len` tokens: its search, capped as the settings say; errors for what cannot run."""
        beam = max(options.beam_size, options.alternatives + 1)
        if beam > self.max_beam:
            raise InvalidRequest(f"model {self.name} serves beam_size and alternatives + 1 up to {self.max_beam}")
        search = SearchOptions(
            beam,
            self.output_cap(src_len, options.max_length),
            options.length_penalty,
            options.alternatives + 1,
            scored=options.return_scores,
        )
        if not self.scheduler.fits(search, src_len):
            raise TooLarge(
                f"a sentence of {src_len} tokens with beam size {beam} does not fit the batch limits "
                f"(max_batch_rows {self.settings.max_batch_rows}, max_batch_tokens {self.settings.max_batch_tokens})"
            )
        return search

    # -- translating -----------------------------------------------------------------------------

    async def translate(self, texts: list[str], target: str, options: TranslateOptions) -> Translation:
        started = time.monotonic()
        inline = sum(len(t) for t in texts) <= (INLINE_HTML_CHARS if options.html else INLINE_CHARS)
        prepared = await off_loop(inline, self.prepare, texts, target, options)
        hypotheses, ticket = await self._translated(prepared, target, options, started, inline)
        decoded = await off_loop(inline, self._decoded, prepared, hypotheses)
        placed: list[dict[int, str]] = [{} for _ in prepared.documents]
        jobs, results = prepared.jobs, hypotheses  # both passes', for the usage
        if options.html and any(doc.tagged for doc in prepared.documents):  # inline elements (text.Tagged)
            pieces, places = await off_loop(inline, self._unplaced, prepared, decoded, target, options)
            if pieces.jobs:  # kept elements with no place in their sentence's translation: its pieces around them
                more, _ = await self._translated(pieces, target, options, started, inline)
                answers = await off_loop(inline, self._decoded, pieces, more)
                for d, i, first in places:
                    tagged = prepared.documents[d].tagged[i]
                    placed[d][i] = tagged.pieces.join([a[0] for a in answers[first:][: len(tagged.pieces.sentences)]])
                jobs, results = jobs + pieces.jobs, hypotheses + more
        texts, alternatives, scores = await off_loop(
            inline, self._assemble, prepared, hypotheses, decoded, placed, options
        )
        return Translation(
            texts,
            alternatives,
            scores,
            input_tokens=sum(len(ids) for ids in jobs),
            output_tokens=sum(len(h[0].tokens) for h in results),
            queue_seconds=ticket.queue_seconds,
            seconds=time.monotonic() - started,
            truncated_sentences=sum(not ends(h[0], self.rules) for h in results),
        )

    async def _translated(
        self, prepared: Prepared, target: str, options: TranslateOptions, started: float, inline: bool
    ) -> tuple[list[list[Hypothesis]], Ticket]:
        """Each job's hypotheses. A sentence whose placeholders did not come back goes again, in one pass, two ways:
        with them, searched with RESCUE_BEAM beams (`_rescue`), and as it is; the first of the beams' hypotheses
        that gives each placeholder back once is its translation, else its translation as it is."""
        ticket = await self._run(prepared, options, started)
        hypotheses: list[list[Hypothesis]] = [r for r in ticket.results if r is not None]
        unrestored = await off_loop(inline, self._unrestored, prepared, hypotheses)
        if unrestored:  # the model lost or repeated a placeholder: those sentences again
            again, beams = await off_loop(inline, self._rescue, prepared, unrestored, target, options)
            rerun = await self._run(again, options, started)
            for k, i in enumerate(unrestored):
                searched = rerun.results[beams[k]] if k in beams else None
                kept = self._restoring(prepared.masks[i], searched or [], prepared.options[i].n_best)
                if kept:
                    hypotheses[i] = kept
                else:
                    hypotheses[i] = rerun.results[k] or []
                    prepared.masks[i], prepared.jobs[i] = again.masks[k], again.jobs[k]
        return hypotheses, ticket

    async def _run(self, prepared: Prepared, options: TranslateOptions, started: float) -> Ticket:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Ticket] = loop.create_future()

        loop_thread = threading.get_ident()

        def on_done(ticket: Ticket) -> None:  # on the loop (an engine process's reader) or a scheduler's thread
            def settle() -> None:
                if not done.done():
                    done.set_result(ticket)

            if threading.get_ident() == loop_thread:
                settle()
            else:
                loop.call_soon_threadsafe(settle)

        timeout = min(options.timeout or self.settings.request_timeout_seconds, self.settings.request_timeout_seconds)
        ticket = Ticket(len(prepared.jobs), started + timeout, on_done)
        if not prepared.jobs:
            return ticket
        self.scheduler.submit(
            [
                SentenceJob(ids, o, ticket, i)
                for i, (ids, o) in enumerate(zip(prepared.jobs, prepared.options, strict=True))
            ]
        )
        try:
            await asyncio.wait_for(asyncio.shield(done), ticket.deadline - time.monotonic() + DEADLINE_GRACE_SECONDS)
        except asyncio.CancelledError:
            self.scheduler.cancel(ticket)  # the client went away: the scheduler drops its rows
            raise
        except TimeoutError:  # the scheduler fails a request at its deadline; this one is stuck past it
            self.scheduler.cancel(ticket)
            log.error("model %s did not answer a request %g s past its deadline", self.name, DEADLINE_GRACE_SECONDS)
            raise DeadlineExceeded("the request's deadline passed before its translation finished") from None
        if ticket.error is not None:
            raise ticket.error
        return ticket

    def _unrestored(self, prepared: Prepared, hypotheses: list[list[Hypothesis]]) -> list[int]:
        """The sentences none of whose hypotheses gives each placeholder back exactly once. One whose best does not
        but another does (a beam request's alternatives) gets that one first, in place."""
        missing = []
        for i, (masked, results) in enumerate(zip(prepared.masks, hypotheses, strict=True)):
            if masked.runs:
                kept = self._restoring(masked, results, len(results))
                if kept:
                    hypotheses[i] = kept
                else:
                    missing.append(i)
        return missing

    def _rescue(
        self, prepared: Prepared, indices: list[int], target: str, options: TranslateOptions
    ) -> tuple[Prepared, dict[int, int]]:
        """The sentences at `indices` as the model reads them without placeholders (the k-th is job k), then, where
        the server's beam limit and the batch limits allow, with them, searched with RESCUE_BEAM beams that each
        return a hypothesis; returns the jobs and, by k, where a sentence's beam job is."""
        masks = [Masked(text.model_input(prepared.masks[i].sentence)) for i in indices]  # as MT_MASK_SYMBOLS off
        again = self._jobs(masks, target, options)
        beams: dict[int, int] = {}
        beam = min(max(RESCUE_BEAM, options.beam_size), self.max_beam)
        wide = replace(options, beam_size=beam, alternatives=beam - 1)
        widened = indices if beam > options.beam_size else []  # no more beams than the first pass had: no search
        for k, i in enumerate(widened):
            try:
                search = self.search_options(len(prepared.jobs[i]), wide)
            except (InvalidRequest, TooLarge):  # a sentence whose beams the batch limits cannot hold
                continue
            beams[k] = len(again.jobs)
            again.jobs.append(prepared.jobs[i])
            again.options.append(search)
            again.masks.append(prepared.masks[i])
        log.debug("%d sentence(s) translated again (the model did not keep their placeholders)", len(indices))
        return again, beams

    def _restoring(self, masked: Masked, hypotheses: list[Hypothesis], count: int) -> list[Hypothesis]:
        """`count` of the hypotheses, the first that gives each of the sentence's placeholders back first; none
        when none does."""
        restored = (masked.restore(self.tokenizer.decode(h.tokens)) is not None for h in hypotheses)
        first = next((n for n, kept in enumerate(restored) if kept), None)  # decoded one by one, up to it
        if first is None:
            return []
        return [hypotheses[first], *hypotheses[:first], *hypotheses[first + 1 :]][:count]

    def _decoded(self, prepared: Prepared, hypotheses: list[list[Hypothesis]]) -> list[list[str]]:
        """Each job's hypotheses as text, placeholders given back."""
        return [
            [masked.unmask(self.tokenizer.decode(h.tokens)) for h in results]
            for results, masked in zip(hypotheses, prepared.masks, strict=True)
        ]

    def _unplaced(
        self, prepared: Prepared, decoded: list[list[str]], target: str, options: TranslateOptions
    ) -> tuple[Prepared, list[tuple[int, int, int]]]:
        """The pieces of the sentences whose best translation has no place for their kept elements
        (text.Document.unplaced), as jobs, and where each one's start among them: (document, sentence, first)."""
        sentences: list[str] = []
        places: list[tuple[int, int, int]] = []
        offset = 0
        for d, doc in enumerate(prepared.documents):
            best = [answers[0] for answers in decoded[offset : offset + len(doc.texts)]]
            offset += len(doc.texts)
            for i in doc.unplaced(best):
                places.append((d, i, len(sentences)))
                sentences += doc.tagged[i].pieces.sentences
        return self._jobs([self.masked(s) for s in sentences], target, options), places

    def _assemble(
        self,
        prepared: Prepared,
        hypotheses: list[list[Hypothesis]],
        decoded: list[list[str]],
        placed: list[dict[int, str]],
        options: TranslateOptions,
    ) -> tuple[list[str], list[list[str]], list[float]]:
        """Per document: its sentences' best translations joined; alternative k joins each sentence's k-th (a
        sentence's best where its k-th has no place for its kept elements)."""
        texts, alternatives, scores, offset = [], [], [], 0
        for d, doc in enumerate(prepared.documents):
            mine = decoded[offset : offset + len(doc.texts)]
            shown = [h[0].score for h in hypotheses[offset : offset + len(doc.sentences)]]  # not pieces', attributes'
            offset += len(doc.texts)
            best = [answers[0] for answers in mine]
            texts.append(doc.join(best, placed[d]))
            kept = dict(placed[d])  # an eager tagged sentence always renders: the lazy ones' best, for alternatives
            if options.alternatives:
                lazy = [i for i, tagged in doc.tagged.items() if not tagged.eager and i not in kept]
                kept.update({i: out for i in lazy if (out := doc.render(i, best)) is not None})
            alternatives.append(
                [doc.join([a[min(k, len(a) - 1)] for a in mine], kept) for k in range(1, options.alternatives + 1)]
            )
            scores.append(sum(shown) / len(shown) if shown else 0.0)
        return texts, alternatives, scores


class Registry:
    """The loaded models, and the rules that pick one for a request."""

    def __init__(self, translators: list[Translator]) -> None:
        self.translators = {t.name: t for t in translators}

    def pick(self, source: str, target: str, model: str | None) -> tuple[Translator, str]:
        """-> (translator, resolved source language). 'auto' resolves when one source language fits."""
        if model is not None:
            if model not in self.translators:
                raise NotFound(f"no model named {model!r}; loaded: {', '.join(sorted(self.translators))}")
            candidates = [self.translators[model]]
        else:
            candidates = list(self.translators.values())
        fitting = [t for t in candidates if target in t.target_languages and source in ("auto", t.source_language)]
        sources = sorted({t.source_language for t in fitting})
        if not fitting:
            pairs = sorted(f"{t.source_language}->{tl}" for t in candidates for tl in t.target_languages)
            raise InvalidRequest(f"language pair {source}->{target} is not supported; available: {', '.join(pairs)}")
        if len(sources) > 1:
            raise InvalidRequest(f"source 'auto' is ambiguous for target {target}: set source to one of {sources}")
        return fitting[0], sources[0]

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


LANGUAGE_NAMES = {
    "en": "English",
    "fr": "French",
    "de": "German",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
    "ru": "Russian",
    "zh": "Chinese",
    "ja": "Japanese",
    "ar": "Arabic",
    "pl": "Polish",
}


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


def batch_limits(settings: Settings) -> BatchLimits:
    return BatchLimits(
        static=settings.batching == "static",
        max_rows=settings.max_batch_rows,
        max_tokens=settings.max_batch_tokens,
        max_queue=settings.max_queue_sentences,
        overlap_encoder=settings.overlap_encoder,
    )


# Measured on 2 cores (docs/performance.md): the default model (4.8 M multiply-adds per decoder token) served at 32
# clients gives 90 % of its engine's batch-32 throughput with one intra-op thread and 77 % with two in one run (94 and
# 81 % in another): its steps of ~4 ms gain 5-14 % from a second thread alone and lose more to the server and the
# encoder passes on the same cores. The paper-size model (52.5 M) steps 1.43x faster with two, and served gives 93 %
# with two, 76 % with one. The threshold lies between the two, at their geometric mean.
SHARED_STEP_MACS = 16_000_000


def decoder_macs_per_token(cfg: Architecture) -> int:
    """Multiply-adds of one decoder step per row: the projections, the FFN and the vocabulary projection."""
    d = cfg.d_model
    return cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff) + d * cfg.tgt_vocab_size


# The most bytes the ragged step graph's own copy of the decoder's weights may take for the server to open it unasked
# (its session cannot share the step graph's prepacked weights): the default model's int8 graph is 5 MB, the paper
# size's 54 MB int8 and 333 MB fp32. Served at 32 clients of real text on the AMX Xeon, the paper size's int8 ran
# 1.07x faster with it (docs/performance.md, the change table), for ~53 MB more resident memory.
RAGGED_COPY_BYTES = 64 * 2**20


def ragged_graph_bytes(folder: ModelFolder, variant: str) -> int | None:
    """The size of the variant's ragged step graph file (format 5), None without one: what its session costs."""
    ragged = folder.variant(variant).decoder_step_ragged
    return None if ragged is None else folder.manifest.files[ragged.file].bytes


def ragged_step(graph_bytes: int | None, settings: Settings) -> bool:
    """Whether to open the ragged step graph's session (format 5), whose file is `graph_bytes` (None: the folder has
    none): as set, or when its own copy of the weights is at most RAGGED_COPY_BYTES. Its cross-attention reads each
    sentence's own source, where the step graph's reads the widest live one: on ragged real text the default model
    served at 32 clients ran 1.03-1.08x faster with it, the paper size's int8 1.07x."""
    if graph_bytes is None:
        return False
    return settings.ragged_step if settings.ragged_step is not None else graph_bytes <= RAGGED_COPY_BYTES


def single_row_rows(cfg: Architecture) -> int:
    """The most rows a step may have to run the one-row step graph (format 6). Its products (MatMulNBits) read the
    weights faster than DynamicQuantizeMatMul for one row; on a decoder of at least SHARED_STEP_MACS, whose weights
    stream from memory every step, for a few (measured on 2 cores with VNNI, the step graph's time over the one-row
    graph's: the paper-size model 1.40x at 2 rows, 1.23x at 3, 1.09x at 4, 0.95x at 6, 0.87x at 8; the default model
    1.28x at 1 row, 0.96x at 2, 0.83x at 3). On a CPU without VNNI (engine/cpu.py) MatMulNBits' int8 kernel is the
    slower from 2 rows (4 rows of the paper size's products 1.9-2.1x DynamicQuantizeMatMul's time, its beam 4 at
    batch 1 on one thread 0.7x the speed; at one row level with it, both models): one row only."""
    large = decoder_macs_per_token(cfg) >= SHARED_STEP_MACS
    return 4 if large and this_cpu_has_int8_dot_products() else 1


def weight_bits_warnings(folder: ModelFolder, variant: str) -> list[str]:
    """What an operator should change for the model to run as measured: an int8 variant whose products' weights
    take 8 bits (quantized before format 11) on a CPU without an int8 dot-product instruction (service/engine/cpu.py).
    There ONNX Runtime adds each two products in 16 bits, which such weights can overflow (on an AVX2-only Zen 3, 8
    bits against 7: the default model's encoder output 4.4 against 2.7 % RMS from fp32's, a tiny model's step
    log-probs 4.6 against under 1 off: docs/performance.md). Its products run on the CPU whatever the providers."""
    spec = folder.variant(variant)
    if spec.precision != "int8" or (spec.weight_bits or 8) <= 7 or this_cpu_has_int8_dot_products():
        return []
    return [
        f"variant {variant}'s int8 weights take 8 bits, which this CPU (without VNNI or AMX) multiplies in 16-bit "
        "sums that they can overflow: its translations can drift from fp32's; quantize the folder again for 7-bit "
        f"weights (python -m model_export quantize --model-dir {folder.path}) or run MT_VARIANT=fp32"
    ]


def check_batch_invariant(folder: ModelFolder, variant: str, settings: Settings) -> None:
    """ModelFolderError where MT_BATCH_INVARIANT holds and the variant's graphs were written before batch-invariant
    ones (format 12), with the commands that rebuild the folder and the setting that serves it as it is."""
    if not settings.batch_invariant or folder.variant(variant).batch_invariant:
        return
    path = folder.path
    raise ModelFolderError(
        f"{path}: variant {variant} was written before batch-invariant graphs (model folder format 12): its "
        "translations would change with what shares their batch. Rebuild the folder: python -m model_export "
        f"from-folder --model-dir {path} --out rebuilt.pt && python -m model_export export --checkpoint rebuilt.pt "
        f"--out {path}-rebuilt && python -m model_export quantize --model-dir {path}-rebuilt (for int8); or serve "
        "it as it is with MT_BATCH_INVARIANT=false"
    )


def batch_variance_warnings(settings: Settings) -> list[str]:
    """The warning of a server that runs its faster graphs (MT_BATCH_INVARIANT=false)."""
    if settings.batch_invariant:
        return []
    return [
        "MT_BATCH_INVARIANT=false: the ragged, one-row and dense step graphs run for some batches, so a sentence's "
        "translation can change with what shares its batch"
    ]


def step_graph_options(folder: ModelFolder, variant: str, settings: Settings) -> dict[str, bool | int]:
    """SessionSettings' step-graph fields as the server sets them (open_runtime; bench.engine measures the same):
    with MT_BATCH_INVARIANT (the default) none but the step graph, else the ragged graph (ragged_step), the one-row
    graph (MT_SINGLE_ROW_STEP) for steps of up to single_row_rows, and under static batching the dense step graph
    (format 10) in place of the ragged one, for steps of 8 rows or more (DENSE_STEP_ROWS): a static batch's rows all
    have the same length, which its self-attention reads faster (model_export/quantize.py, to_dense_self_attention);
    a continuous batch's rows each have their own, which the step graph reads alone, over a cache that reserves its
    time axis."""
    fast = not settings.batch_invariant  # each of these graphs gives a row other numbers than the step graph
    return {
        "ragged_step": fast and ragged_step(ragged_graph_bytes(folder, variant), settings),
        "single_row_step": fast and settings.single_row_step,
        "single_row_rows": single_row_rows(folder.manifest.config),
        "dense_step": fast and settings.batching == "static",
    }


def step_graphs(folder: ModelFolder, settings: Settings) -> list[str]:
    """The step graphs the model's engine opens, for its start-up line: the step graph, the ragged one (format 5,
    ragged_step), the one-row one (format 6, an int8 variant on CPU, MT_SINGLE_ROW_STEP); for an int8 folder from
    before format 6, the command that adds the one-row graph."""
    name = chosen_variant(folder, settings)
    variant = folder.variant(name)
    options = step_graph_options(folder, name, settings)  # what open_runtime gives the runtime
    graphs = ["step"]
    if variant.decoder_step_dense is not None and options["dense_step"] and not cuda_present(settings):
        graphs.append(f"dense (static batches of {DENSE_STEP_ROWS} rows or more)")  # (CPU-only sessions: OnnxRuntime)
    elif options["ragged_step"]:
        graphs.append("ragged")
    wanted = bool(options["single_row_step"]) and not cuda_present(settings)  # CUDA asked for but absent: CPU's
    if variant.decoder_step_single is not None and wanted:
        rows = single_row_rows(folder.manifest.config)
        graphs.append("one-row" if rows == 1 else f"one-row (steps of up to {rows} rows)")
    elif wanted and variant.precision == "int8":  # a folder from before format 6
        graphs.append(f"no one-row graph in the folder (`python -m model_export quantize --model-dir {folder.path}`)")
    return graphs


def intra_op_threads(cfg: Architecture, settings: Settings) -> int:
    """MT_INTRA_OP_THREADS, or for 0: a model whose steps are worth sharing gets every core, split between its
    decoding streams; a smaller one, one thread."""
    if settings.intra_op_threads:
        return settings.intra_op_threads
    if decoder_macs_per_token(cfg) < SHARED_STEP_MACS:
        return 1
    return max(1, available_cores() // decoder_streams(cfg, settings))


def decoder_streams(cfg: Architecture, settings: Settings) -> int:
    """MT_DECODER_STREAMS, or for 0: two for a model whose steps are worth sharing (measured on 2 cores, paper-size
    model served at 32 clients: 1.23x the throughput of one stream on both cores), else one (the default model:
    0.90x at 32 clients; the encoder thread and the HTTP side need the second core). One on a GPU (not measured);
    CUDA asked for on an onnxruntime without it runs on the CPU, and is laid out as the CPU is."""
    if settings.decoder_streams:
        return settings.decoder_streams
    large = decoder_macs_per_token(cfg) >= SHARED_STEP_MACS
    return 2 if large and available_cores() >= 2 and not cuda_present(settings) else 1


def chosen_variant(folder: ModelFolder, settings: Settings) -> str:
    """MT_VARIANT, or the manifest's default; but where CUDA is asked for and ONNX Runtime has it, an int8 default
    (whose products, DynamicQuantizeMatMul, have no CUDA kernel and run on the CPU) gives way to fp16 where it can
    run on CUDA (format 7, CuPy: runtime.gpu_array_module; 2.2x fp32's throughput on an H200, docs/performance.md
    "GPU"), else to fp32."""
    manifest = folder.manifest
    if settings.variant:
        return settings.variant
    default = manifest.default_variant
    if not cuda_present(settings) or manifest.variants[default].precision != "int8":
        return default
    fp16 = manifest.variants.get("fp16")
    if fp16 is not None and fp16.decoder_step.named("seqlens_k") and has_cupy():  # format 7, as the runtime asks
        return "fp16"
    return "fp32" if "fp32" in manifest.variants else default


def cuda_present(settings: Settings) -> bool:
    """CUDA is asked for (MT_PROVIDERS) and this onnxruntime build has it."""
    if "cuda" not in settings.providers:
        return False
    import onnxruntime as ort  # only here: a CPU server's own process never loads it (service/engine/runtime.py)

    return "CUDAExecutionProvider" in ort.get_available_providers()


def has_cupy() -> bool:
    return importlib.util.find_spec("cupy") is not None


def open_runtime(folder: ModelFolder, settings: Settings) -> OnnxRuntime:
    session = SessionSettings(
        settings.ort_providers(),
        intra_op_threads(folder.manifest.config, settings),
        settings.inter_op_threads,
        encoder_threads=settings.encoder_session_threads(),
        **step_graph_options(folder, variant := chosen_variant(folder, settings), settings),
    )
    return OnnxRuntime(folder, variant, session)


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
