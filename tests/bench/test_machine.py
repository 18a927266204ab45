"""The machine a benchmark ran on, as its output's first line and its JSON's "machine": parsed from /proc's text
for Intel, AMD and ARM CPUs, and described for this machine."""

import importlib.metadata

import pytest

from bench import machine
from bench.machine import cache_sizes, cpu_family, cpu_fields, cpu_model, describe, headline, isa_features, memory_gib

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another model the first block hides
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD   EPYC
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd asimddp i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


@pytest.mark.parametrize(
    ("cpuinfo", "model", "family", "isa"),
    [
        (INTEL, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "", ["AVX2", "AVX-512", "AVX-512 VNNI",
                                                                       "AVX-512 BF16", "AMX-INT8"]),
        (AMD, "AMD EPYC", "family 26 model 2", ["AVX2", "AVX-512", "AVX-512 VNNI", "AVX-512 BF16"]),
        (ARM, "ARM implementer 0x41 part 0xd40", "", ["NEON dot product", "NEON int8 matmul"]),
    ],
)  # fmt: skip
def test_the_first_processors_model_and_kernel_instruction_sets_are_read(
    cpuinfo: str, model: str, family: str, isa: list
) -> None:
    fields = cpu_fields(cpuinfo)
    assert cpu_model(fields) == model
    assert cpu_family(fields) == family
    assert isa_features(fields) == isa


def test_cache_sizes_are_read_from_sysfs_without_the_instruction_cache(tmp_path) -> None:
    for index, (kind, level, size) in enumerate(
        [("Data", "1", "48K"), ("Instruction", "1", "32K"), ("Unified", "2", "1024K"), ("Unified", "3", "32768K")]
    ):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("type", kind), ("level", level), ("size", size)):
            (folder / name).write_text(value + "\n")
    assert cache_sizes(tmp_path) == {"L1d": 48, "L2": 1024, "L3": 32768}
    assert cache_sizes(tmp_path / "missing") == {}


def test_memory_is_read_in_gib() -> None:
    assert memory_gib("MemTotal:       24641536 kB\nMemFree: 1 kB\n") == 23.5
    assert memory_gib("") is None


def test_this_machine_is_described_and_fits_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.shutil, "which", lambda _: None)  # no nvidia-smi: no GPU listed, even for cuda
    described = describe("cuda")
    assert described["cores_usable"] >= 1 and described["cpus_online"] >= described["cores_usable"]
    assert described["cpu"] and described["gpus"] == []
    assert described["packages"]["onnxruntime"] == importlib.metadata.version("onnxruntime")
    line = headline(described)
    family = f", {described['family']}" if described["family"] else ""
    assert line.startswith(f"machine: {described['cpu']}{family} ({described['cores_usable']} of ")
    assert f"onnxruntime {described['packages']['onnxruntime']}" in line and "\n" not in line


def test_the_headline_names_the_gpus_when_there_are_some() -> None:
    described = {
        "cpu": "AMD EPYC", "isa": [], "cores_usable": 16, "cpus_online": 16, "memory_gib": 128.0,
        "gpus": ["NVIDIA H200"], "packages": {"onnxruntime-gpu": "1.31.1"}, "date": "2026-11-30 12:00 UTC",
    }  # fmt: skip
    assert headline(described) == (
        "machine: AMD EPYC (16 of 16 CPUs usable), 128 GiB; GPU: NVIDIA H200; onnxruntime-gpu 1.31.1; "
        "2026-11-30 12:00 UTC"
    )  # a description saved before family and caches were read still makes a headline
    described |= {"family": "family 26 model 2", "cache_kib": {"L1d": 48, "L2": 1024, "L3": 32768}}
    assert headline(described).startswith(
        "machine: AMD EPYC, family 26 model 2 (16 of 16 CPUs usable; L2 1 MiB, L3 32 MiB), 128 GiB;"
    )
