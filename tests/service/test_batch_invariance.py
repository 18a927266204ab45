"""Batch invariance: a sentence's output (tokens, scores, alternatives) is the same whatever shares its batch.

Real ONNX Runtime sessions opened as the server opens them (open_runtime, MT_BATCH_INVARIANT's default), int8 and
fp32, on the tiny test model, a random model of the paper's size and the shipped default model: each sentence decoded
alone is the reference; then random compositions with long and short neighbours, greedy and beam 4 with
alternatives mixed in one batch, static batches and continuous ones that sentences join at random steps. Last, the
real server: the same texts one request at a time and from concurrent clients give identical answers, confidences
included, and a text's confidence is the same alone and in a list.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from model_export.export import export_folder
from model_export.quantize import add_int8_variant
from service.engine.batches import TokenRules, decode_batch
from service.engine.decoding import Hypothesis, SearchOptions
from service.engine.runtime import OnnxRuntime
from service.engine.sessions import open_runtime
from service.metrics import Metrics
from service.model.folder import ModelFolder, load_model_folder
from service.model.tokenizer import Tokenizer
from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
from service.scheduling.scheduler import Scheduler
from service.settings import Settings
from tests.factories import add_tiny_shortlist, tiny_checkpoint
from tests.service.test_e2e import running_server

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "en-fr"
TEXTS = [
    "The disk is full.", "Password must be at least eight characters long.", "Save changes before closing?",
    "Could not connect to the server.", "File not found: %s", "Delete the selected items?", "Open recent",
    "An unknown error occurred while reading the file.", "Print", "Your session has expired. Please log in again.",
    "Show hidden files", "The operation was cancelled by the user.", "Check for updates automatically",
    "Select a folder to import from", "Network connection lost.", "Undo", "Copy the link to the clipboard",
    "This action cannot be undone.", "Settings saved.", "Enter your email address to reset your password.",
    "Download failed: not enough free space on the device.", "Quit", "Add a new account",
    "Sort by name, date or size, then open the first file of the list and print every page of it twice.",
]  # fmt: skip
GREEDY = SearchOptions(max_new_tokens=24)  # scored: its log-probs are compared too
BEAM = SearchOptions(beam_size=4, n_best=3, max_new_tokens=24)  # with alternatives


@pytest.fixture(scope="module")
def paper_size(spm_model: bytes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model of the paper's base size (d_model 512, 8 heads, d_ff 2,048, 6 + 6 layers; the tiny
    tokenizer's vocabulary) with its int8 variant."""
    checkpoint = tiny_checkpoint(
        spm_model, seed=3, d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6
    )
    folder = export_folder(checkpoint, tmp_path_factory.mktemp("paper") / "paper-size", "paper-size", "0.0.1")
    add_int8_variant(folder)
    return folder


@pytest.fixture(scope="module")
def paper_size_shortlisted(paper_size: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The paper-size model with the tiny model's kind of shortlist (64 candidates of 96 ids) and its shortlist step
    graphs."""
    folder = Path(shutil.copytree(paper_size, tmp_path_factory.mktemp("paper-sl") / "paper-size"))
    add_tiny_shortlist(folder, tmp_path_factory.mktemp("paper-corpus"))
    return folder


def runtime_of(folder: ModelFolder, variant: str, shortlist: bool = False) -> OnnxRuntime:
    return open_runtime(folder, Settings(variant=variant, intra_op_threads=1, shortlist=shortlist))


def rules_of(folder: ModelFolder) -> TokenRules:
    ids = folder.manifest.special_ids
    return TokenRules(ids.decoder_start, ids.eos, ids.pad)


def sentences(folder: ModelFolder) -> list[list[int]]:
    """TEXTS as the model's tokens, and random token strings of 1 to 60 tokens (long neighbours) after them."""
    tokenizer = Tokenizer.from_folder(folder)
    texts = [tokenizer.encode(t, folder.manifest.target_languages[0]) for t in TEXTS]
    rng, vocab, eos = random.Random(7), folder.manifest.config.src_vocab_size, folder.manifest.special_ids.eos
    noise = [[rng.randrange(4, vocab) for _ in range(rng.randint(1, 60))] + [eos] for _ in range(8)]
    return texts + noise


def pad_masks(sources: list[list[int]]) -> tuple:
    width = max(map(len, sources))
    ids = np.array([s + [0] * (width - len(s)) for s in sources])  # (b, S)
    return ids, np.array([[True] * len(s) + [False] * (width - len(s)) for s in sources])  # (b, S) each


def alone(runtime: OnnxRuntime, rules: TokenRules, source: list[int], options: SearchOptions) -> list[Hypothesis]:
    return decode_batch(runtime, [source], [options], rules)[0]


def check_compositions(folder_path: Path, variant: str, compositions: int, shortlist: bool = False) -> None:
    folder = load_model_folder(folder_path)
    runtime, rules, srcs = runtime_of(folder, variant, shortlist), rules_of(folder), sentences(folder)
    options = [GREEDY, BEAM]
    reference = {(i, o): alone(runtime, rules, s, options[o]) for i, s in enumerate(srcs) for o in (0, 1)}
    rng = random.Random(f"{folder_path.name}-{variant}")
    for _ in range(compositions):  # static batches: a random set, each sentence greedy or beam 4
        picked = rng.sample(range(len(srcs)), rng.randint(2, len(srcs)))
        chosen = [rng.randint(0, 1) for _ in picked]
        results = decode_batch(runtime, [srcs[i] for i in picked], [options[o] for o in chosen], rules)
        for i, o, result in zip(picked, chosen, results, strict=True):
            assert result == reference[(i, o)], f"sentence {i} ({'beam 4' if o else 'greedy'}) in a batch of {picked}"
    scheduler = Scheduler(runtime, rules, BatchLimits(max_rows=128), Metrics(), folder.manifest.name)
    order = rng.sample(range(len(srcs)), len(srcs)) * 2
    tickets: list[tuple[int, int, Ticket]] = []
    for i in order:  # continuous batching: each joins after a random number of steps of those before it
        o = rng.randint(0, 1)
        ticket = Ticket(1, 1e12, lambda _: None)
        scheduler.submit([SentenceJob(srcs[i], options[o], ticket, 0)])
        tickets.append((i, o, ticket))
        for _ in range(rng.randint(0, 3)):
            scheduler.run_once()
    while not scheduler.idle:
        scheduler.run_once()
    for i, o, ticket in tickets:
        assert ticket.error is None and ticket.results[0] == reference[(i, o)], f"sentence {i} joining mid-flight"


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_the_tiny_models_outputs_do_not_depend_on_their_batch(quantized: Path, variant: str) -> None:
    check_compositions(quantized, variant, compositions=12)


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_with_a_shortlist_each_sentence_scores_its_own_candidates_whatever_its_batchs(
    shortlisted: Path, variant: str
) -> None:
    """MT_SHORTLIST: the tiny model's sentences, whose candidate sets differ (the random ones' most), alone and among
    neighbours, static and continuous batches."""
    runtime = runtime_of(load_model_folder(shortlisted), variant, shortlist=True)
    sets = {tuple(row) for row in runtime.shortlist.candidates(*pad_masks(sentences(load_model_folder(shortlisted))))}
    assert len(sets) > len(TEXTS) // 2
    check_compositions(shortlisted, variant, compositions=12, shortlist=True)


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_a_paper_size_models_outputs_do_not_depend_on_their_batch(paper_size: Path, variant: str) -> None:
    check_compositions(paper_size, variant, compositions=3)


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_a_paper_size_model_with_a_shortlist_scores_each_sentences_own_candidates_whatever_its_batchs(
    paper_size_shortlisted: Path, variant: str
) -> None:
    check_compositions(paper_size_shortlisted, variant, compositions=3, shortlist=True)


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_the_default_models_outputs_do_not_depend_on_their_batch(variant: str) -> None:
    check_compositions(DEFAULT_MODEL, variant, compositions=4)


def test_the_fast_graphs_are_only_behind_the_setting(quantized: Path) -> None:
    """MT_BATCH_INVARIANT (the default) opens the step graph alone; off, the faster graphs whose numbers differ."""
    folder = load_model_folder(quantized)
    invariant = runtime_of(folder, "int8")
    assert invariant.ragged is None and invariant.single is None and invariant.dense_decoder is None
    fast = open_runtime(folder, Settings(variant="int8", batch_invariant=False, batching="static"))
    assert fast.single is not None and fast.dense_decoder is not None


def test_a_folder_from_before_batch_invariant_graphs_is_refused_with_the_commands_that_rebuild_it(
    quantized: Path, tmp_path: Path
) -> None:
    import json

    from service.engine.sessions import check_batch_invariant
    from service.errors import ModelFolderError

    folder_path = Path(shutil.copytree(quantized, tmp_path / "old"))
    manifest = json.loads((folder_path / "manifest.json").read_text())
    for spec in manifest["variants"].values():
        spec.pop("batch_invariant")
    (folder_path / "manifest.json").write_text(json.dumps(manifest))
    old = load_model_folder(folder_path)
    with pytest.raises(ModelFolderError) as refused:
        check_batch_invariant(old, "int8", Settings())
    message = str(refused.value)
    assert "batch-invariant" in message and "python -m model_export from-folder" in message
    assert "python -m model_export quantize" in message and "MT_BATCH_INVARIANT=false" in message
    check_batch_invariant(old, "int8", Settings(batch_invariant=False))  # served as it is when asked


@pytest.mark.parametrize(
    "layout",
    [{}, {"MT_DECODER_STREAMS": "2", "MT_ENGINE_PROCESS": "false", "MT_INTRA_OP_THREADS": "1"}],
    ids=["defaults", "two-streams-in-process"],
)
def test_the_server_answers_the_same_alone_and_among_concurrent_clients(layout: dict[str, str]) -> None:
    """The shipped default model through the real server: each text one request at a time, then all at once from
    as many clients (greedy with scores, and beam 4 with alternatives); in the default layout (an engine process,
    one decoding stream) and in two streams in the server's own process."""
    bodies = [{"q": t, "source": "en", "target": "fr", "return_scores": True} for t in TEXTS]
    bodies += [{"q": t, "source": "en", "target": "fr", "beam_size": 4, "alternatives": 2} for t in TEXTS[::3]]
    bodies.append({"q": TEXTS[:8], "source": "en", "target": "fr"})  # in one request: each text's confidence its own

    async def concurrently(url: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            answers = await asyncio.gather(*(client.post("/translate", json=b) for b in bodies))
        assert all(a.status_code == 200 for a in answers)
        return [a.json() for a in answers]

    def step_rows(url: str) -> tuple[float, float]:
        """mt_decoder_step_rows' (sum, count) so far: the rows of every decoder step and how many steps ran."""
        families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
        samples = {s.name: s.value for f in families if f.name == "mt_decoder_step_rows" for s in f.samples}
        return samples["mt_decoder_step_rows_sum"], samples["mt_decoder_step_rows_count"]

    with running_server(DEFAULT_MODEL, MT_MAX_QUEUE_WAIT_SECONDS="0", **layout) as url:
        one_at_a_time = [httpx.post(f"{url}/translate", json=b, timeout=120).json() for b in bodies]
        rows_before, steps_before = step_rows(url)
        together = asyncio.run(concurrently(url))
        rows_after, steps_after = step_rows(url)
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
    assert (rows_after - rows_before) / (steps_after - steps_before) > 2  # the concurrent ones shared their steps
    for answer in one_at_a_time + together:
        del answer["usage"]  # its timings
    assert together == one_at_a_time  # translations, scores, alternatives and confidences
    assert one_at_a_time[-1]["confidence"] == [answer["confidence"] for answer in one_at_a_time[:8]]
    assert all(0.0 <= answer["confidence"] <= 1.0 for answer in one_at_a_time[:-1])
    assert all(m["batch_invariant"] for m in models["models"])
