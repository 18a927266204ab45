"""What the CPU offers ONNX Runtime's int8 kernels, read from /proc/cpuinfo (Linux; elsewhere nothing is assumed
missing).

An x86 CPU with VNNI (AVX-512 VNNI, AVX-VNNI) or AMX adds four 8-bit products into a 32-bit sum in one instruction;
one without (AVX2 alone, or AVX-512 without VNNI) goes through 16-bit pairs (VPMADDUBSW), which is why the int8
weights take 7 bits (model_export/quantize.py, REDUCED_RANGE), and there ONNX Runtime's MatMulNBits, the one-row
step graph's products, is slower than DynamicQuantizeMatMul from two rows up (service/translation/translator.py,
single_row_rows).
"""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# /proc/cpuinfo's flags of an x86 CPU that multiplies int8 into 32-bit sums in one instruction
DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo text, by name."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block ends
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def int8_dot_products(cpuinfo: str) -> bool:
    """False only for an x86 CPU (its cpuinfo lists `flags`) without VNNI or AMX; ARM's (`Features`: its dot
    product and int8 matrix instructions, which ONNX Runtime's kernels use) and an unreadable cpuinfo count as
    having them, the case every measurement before this check was made in."""
    flags = cpu_fields(cpuinfo).get("flags")
    return flags is None or bool(DOT_PRODUCT_FLAGS & set(flags.split()))


@functools.cache
def this_cpu_has_int8_dot_products() -> bool:
    """int8_dot_products of this machine's CPU."""
    try:
        return int8_dot_products(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return True
