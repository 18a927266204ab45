"""Execution providers: CUDA when asked and present, CPU with a warning when it is not; thread counts."""

import logging
from pathlib import Path

import onnxruntime as ort
import pytest

from service.metrics import Metrics
from service.model_folder import load_model_folder
from service.runtime import OnnxRuntime, SessionSettings, usable_providers
from service.settings import Settings
from service.translator import load_translators


def test_cpu_is_always_the_fallback() -> None:
    assert usable_providers(("CPUExecutionProvider",)) == ["CPUExecutionProvider"]
    assert usable_providers(()) == ["CPUExecutionProvider"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this build has CUDA")
def test_cuda_requested_without_cuda_falls_back_to_cpu_with_a_warning(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.runtime"):
        runtime = OnnxRuntime(
            load_model_folder(model_dir), settings=SessionSettings(("CUDAExecutionProvider", "CPUExecutionProvider"))
        )
    assert runtime.providers == ["CPUExecutionProvider"]
    assert "execution provider CUDAExecutionProvider is not available" in caplog.text


@pytest.mark.parametrize(("batching", "encoder_threads"), [("continuous", 1), ("static", 2)])
def test_the_encoder_runs_on_one_thread_beside_continuous_decoder_steps(
    model_dir: Path, batching: str, encoder_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MT_MODELS_DIR", str(model_dir.parent))
    monkeypatch.setenv("MT_MODELS", model_dir.name)
    settings = Settings(batching=batching, intra_op_threads=2, engine_process=False)  # to reach the sessions
    [translator] = load_translators(settings, Metrics())
    runtime = translator.runtime
    assert runtime.encoder.get_session_options().intra_op_num_threads == encoder_threads
    assert runtime.decoder.get_session_options().intra_op_num_threads == 2
    assert (translator.scheduler._encoder is not None) == (batching == "continuous")
    translator.scheduler.stop()
