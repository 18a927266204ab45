"""Execution providers: CUDA when asked and present, CPU with a warning when it is not."""

import logging
from pathlib import Path

import onnxruntime as ort
import pytest

from service.model_folder import load_model_folder
from service.runtime import OnnxRuntime, SessionSettings, usable_providers


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
