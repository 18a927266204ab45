"""One served model and the text path around it: clean -> split into sentences -> token ids ->
scheduler -> ids -> guards (a degenerate greedy sentence searched again with beams) -> text -> rejoin in order,
with each text's confidence. Knows languages and options; knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from service.engine.batches import TokenRules, ends
from service.engine.decoding import Hypothesis, SearchOptions, output_cap
from service.engine.guards import GuardLimits, degenerate
from service.engine.runtime import Runtime, step_candidates
from service.engine.sessions import (
    batch_variance_warnings,
    check_batch_invariant,
    chosen_variant,
    decoder_streams,
    weight_bits_warnings,
)
from service.errors import DeadlineExceeded, InvalidRequest, SettingsError, TooLarge
from service.metrics import Metrics
from service.model.folder import ModelFolder
from service.model.tokenizer import Tokenizer
from service.scheduling.engine_process import EngineProcess
from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket, fits
from service.scheduling.placement import Cores
from service.scheduling.scheduler import Scheduler, Streams, new_scheduler
from service.settings import Settings
from service.text import document as text
from service.text import markup
from service.text.glossary import Glossary, merged
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
# A greedy sentence whose translation the guards find degenerate (MT_GUARDS) is searched again with this many beams
RETRY_BEAM = 4


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
    return_scores: bool = False  # as the API's: whether the answer shows Translation.scores
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
    # per input text, in [0, 1]: its sentences' confidences (Manifest.confidence_of), weighted by their tokens
    confidences: list[float] = field(default_factory=list)


@dataclass
class Prepared:
    documents: list[text.Document]
    jobs: list[list[int]]  # source ids per sentence, documents concatenated
    options: list[SearchOptions]
    masks: list[Masked]  # per sentence, what the model read of it: its placeholders and the runs they stand for


@dataclass
class Retried:
    """What the guards' retries decoded: their jobs' source ids and each one's best hypothesis."""

    jobs: list[list[int]]
    best: list[Hypothesis]


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
        self.guard_limits = GuardLimits() if settings.guards else None
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
                markup.split_html, placeholders=settings.mask_symbols, attributes=settings.html_attributes,
                languages=(self.source_language, target),
            )  # fmt: skip
        documents = [split(text.clean(t)) for t in texts]
        attributes = sum(len(doc.attribute_texts) for doc in documents)  # HTML attribute values' sentences
        # before any token is counted
        self._check_sentences(sum(len(doc.sentences) for doc in documents) + attributes, attributes=attributes)
        documents = [doc.expand(self.tokenizer.count, self.max_source_tokens) for doc in documents]
        sentences = [s for doc in documents for s in doc.texts]
        attributes = sum(len(doc.attribute_texts) for doc in documents)  # (cut too)
        lazy = pieces = 0  # inline tags' pieces (text.inline.Tagged): lazy ones in a second pass, if at all
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
            scored=True,  # every sentence's log-probability: its confidence
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
        searched = [h[0] for h in hypotheses]  # as decoded: the usage counts the guards' retries besides them
        retried = await self._guarded(prepared, hypotheses, target, options, started, inline)
        decoded = await off_loop(inline, self._decoded, prepared, hypotheses)
        placed: list[dict[int, str]] = [{} for _ in prepared.documents]
        jobs, results = prepared.jobs + retried.jobs, searched + retried.best  # every pass's, for the usage
        final = [h[0] for h in hypotheses]  # the translations, for the truncated ones
        if options.html and any(doc.tagged for doc in prepared.documents):  # inline elements (text.inline.Tagged)
            pieces, places = await off_loop(inline, self._unplaced, prepared, decoded, target, options)
            if pieces.jobs:  # kept elements with no place in their sentence's translation: its pieces around them
                more, _ = await self._translated(pieces, target, options, started, inline)
                answers = await off_loop(inline, self._decoded, pieces, more)
                for d, i, first in places:
                    tagged = prepared.documents[d].tagged[i]
                    placed[d][i] = tagged.pieces.join([a[0] for a in answers[first:][: len(tagged.pieces.sentences)]])
                pieces_best = [h[0] for h in more]
                jobs, results, final = jobs + pieces.jobs, results + pieces_best, final + pieces_best
        texts, alternatives, scores, confidences = await off_loop(
            inline, self._assemble, prepared, hypotheses, decoded, placed, options
        )
        if self.settings.low_confidence > 0:
            low = sum(c < self.settings.low_confidence for c in confidences)
            self.metrics.low_confidence.labels(self.name).inc(low)
        return Translation(
            texts,
            alternatives,
            scores,
            input_tokens=sum(len(ids) for ids in jobs),
            output_tokens=sum(len(h.tokens) for h in results),
            queue_seconds=ticket.queue_seconds,
            seconds=time.monotonic() - started,
            truncated_sentences=sum(not ends(h, self.rules) for h in final),
            confidences=confidences,
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

    async def _guarded(
        self,
        prepared: Prepared,
        hypotheses: list[list[Hypothesis]],
        target: str,
        options: TranslateOptions,
        started: float,
        inline: bool,
    ) -> Retried:
        """Each sentence's best hypothesis through the guards (MT_GUARDS, service/engine/guards.py). A degenerate
        greedy one is searched again with RETRY_BEAM beams, its retry a function of the sentence alone, and takes the
        beams' best where the guards pass it (and it gives its placeholders back); each one found is counted.
        Returns what the retries decoded, for the usage."""
        found = await off_loop(inline, self._degenerate, prepared, hypotheses, target)
        if not found:
            return Retried([], [])
        again, retried = await off_loop(inline, self._retries, prepared, found, options)
        fixed: set[int] = set()
        best: list[Hypothesis] = []
        if again.jobs:
            rerun = await self._run(again, options, started)
            best = [r[0] for r in rerun.results if r]
            for k, i in enumerate(retried):
                results = self._restoring(prepared.masks[i], rerun.results[k] or [], 1)
                if results and self._kind(prepared, i, results[0], target) is None:
                    hypotheses[i] = results
                    fixed.add(i)
        for i, kind in found.items():
            outcome = "retried_fixed" if i in fixed else "retried_kept" if i in retried else "not_retried"
            self.metrics.degenerate.labels(self.name, kind, outcome).inc()
        return Retried(again.jobs, best)

    def _degenerate(self, prepared: Prepared, hypotheses: list[list[Hypothesis]], target: str) -> dict[int, str]:
        """The sentences whose best hypothesis a guard finds degenerate, and what it found; none without MT_GUARDS."""
        if self.guard_limits is None:
            return {}
        kinds = {i: self._kind(prepared, i, results[0], target) for i, results in enumerate(hypotheses) if results}
        return {i: kind for i, kind in kinds.items() if kind is not None}

    def _kind(self, prepared: Prepared, i: int, hypothesis: Hypothesis, target: str) -> str | None:
        """What a guard finds in sentence i's hypothesis; a copy is none into the source's own language."""
        copy = target != self.source_language
        texts = (prepared.masks[i].text, self.tokenizer.decode(hypothesis.tokens)) if copy else None
        ended, limits = ends(hypothesis, self.rules), self.guard_limits or GuardLimits()
        return degenerate(prepared.jobs[i], hypothesis.tokens, ended, texts, limits)

    def _retries(
        self, prepared: Prepared, found: dict[int, str], options: TranslateOptions
    ) -> tuple[Prepared, list[int]]:
        """The degenerate greedy sentences as jobs of RETRY_BEAM beams (where the beam limit and the batch limits
        allow), and the sentence each job is."""
        beams = replace(options, beam_size=min(RETRY_BEAM, self.max_beam), alternatives=0)
        again, retried = Prepared([], [], [], []), []
        for i in found:
            if prepared.options[i].beam_size > 1 or beams.beam_size <= 1:
                continue
            try:
                search = self.search_options(len(prepared.jobs[i]), beams)
            except (InvalidRequest, TooLarge):
                continue
            again.jobs.append(prepared.jobs[i])
            again.options.append(search)
            again.masks.append(prepared.masks[i])
            retried.append(i)
        return again, retried

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
    ) -> tuple[list[str], list[list[str]], list[float], list[float]]:
        """Per document: its sentences' best translations joined; alternative k joins each sentence's k-th (a
        sentence's best where its k-th has no place for its kept elements); its score and its confidence."""
        texts, alternatives, scores, confidences, offset = [], [], [], [], 0
        for d, doc in enumerate(prepared.documents):
            mine = decoded[offset : offset + len(doc.texts)]
            best_of = [h[0] for h in hypotheses[offset : offset + len(doc.sentences)]]  # not pieces', attributes'
            shown = [h.score for h in best_of]
            confidences.append(self.confidence(best_of))
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
        return texts, alternatives, scores, confidences

    def confidence(self, best: list[Hypothesis]) -> float:
        """A text's confidence from its sentences' best hypotheses: each sentence's (the manifest's calibration of
        its mean token log-probability), weighted by its tokens; 1.0 for a text the model read none of (no letter:
        kept as it is)."""
        manifest, tokens = self.folder.manifest, sum(len(h.tokens) for h in best)
        if not tokens:
            return 1.0
        weighted = (len(h.tokens) * manifest.confidence_of(h.log_prob / len(h.tokens)) for h in best if h.tokens)
        return sum(weighted) / tokens




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


def batch_limits(settings: Settings) -> BatchLimits:
    return BatchLimits(
        static=settings.batching == "static",
        max_rows=settings.max_batch_rows,
        max_tokens=settings.max_batch_tokens,
        max_queue=settings.max_queue_sentences,
        overlap_encoder=settings.overlap_encoder,
    )
