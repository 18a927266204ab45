"""What the CPU offers the int8 kernels (engine/cpu.py), read from /proc/cpuinfo texts of the CPUs this project's
figures were measured on and of others."""

from pathlib import Path

import pytest

import service.engine.cpu
from service.engine.cpu import cpu_fields, int8_dot_products, this_cpu_has_int8_dot_products


def x86(flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: fpu\n"


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        (x86("fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_int8"), True),  # Intel Xeon with AMX
        (x86("fpu avx2 avx512f avx512_vnni avx512_bf16"), True),  # AMD EPYC Zen 4, Zen 5
        (x86("fpu avx2 avx_vnni"), True),  # AVX-VNNI without AVX-512 (Alder Lake and after)
        (x86("fpu sse2 avx avx2 fma"), False),  # AMD EPYC Zen 3: AVX2 alone
        (x86("fpu avx2 avx512f avx512bw avx512vl"), False),  # Skylake-SP: AVX-512 without VNNI
        ("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\nCPU implementer\t: 0x41\n", True),  # ARM
        ("", True),  # nothing to read: nothing assumed missing
    ],
)
def test_an_x86_cpu_without_vnni_or_amx_has_no_int8_dot_products(cpuinfo: str, expected: bool) -> None:
    assert int8_dot_products(cpuinfo) is expected


def test_only_the_first_processors_flags_count() -> None:
    assert cpu_fields(x86("avx2 avx_vnni"))["flags"] == "avx2 avx_vnni"  # not the second block's `fpu`


def test_an_unreadable_cpuinfo_counts_as_having_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    this_cpu_has_int8_dot_products.cache_clear()
    monkeypatch.setattr(service.engine.cpu, "CPUINFO", tmp_path / "missing")
    assert this_cpu_has_int8_dot_products() is True
    this_cpu_has_int8_dot_products.cache_clear()
    monkeypatch.setattr(service.engine.cpu, "CPUINFO", tmp_path / "cpuinfo")
    (tmp_path / "cpuinfo").write_text(x86("avx2"))
    assert this_cpu_has_int8_dot_products() is False
    this_cpu_has_int8_dot_products.cache_clear()  # the next caller reads this machine's own
