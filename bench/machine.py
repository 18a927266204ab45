"""The machine a benchmark ran on: printed above its tables and saved with its figures (the issue asks for every
table with the machine it was measured on). On this project's small shared machines the CPU decides as much as
the code: CTranslate2 picks its int8 backend by vendor (Intel MKL on Intel, oneDNN elsewhere), ONNX Runtime its
int8 kernels by instruction set (AVX-512 VNNI, AVX-VNNI, AVX2), and a CPU quota or an affinity mask can leave a
process fewer cores than the machine has.

    python -m bench.machine          # the headline and the whole description, as JSON
    python -m bench.machine --cuda   # with the GPU ONNX Runtime and CUDA see
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from service.arguments import description_of
from service.engine.cpu import cpu_fields
from service.settings import available_cores

# The instruction sets the int8 and float kernels of ONNX Runtime and CTranslate2 choose between, as /proc/cpuinfo
# names them, and how the headline writes them
ISA = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_int8": "AMX-INT8",
    "asimddp": "NEON dot product",
    "i8mm": "NEON int8 matmul",
}
PACKAGES = ("onnxruntime", "onnxruntime-gpu", "ctranslate2", "torch", "transformers", "numpy")


def cpu_model(fields: dict[str, str]) -> str:
    """The model name ("AMD EPYC", "Intel(R) Xeon(R) ..."); on ARM, which has none, the implementer and part."""
    if fields.get("model name"):
        return " ".join(fields["model name"].split())
    if fields.get("CPU implementer"):
        return f"ARM implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    return platform.processor() or platform.machine()


def cpu_family(fields: dict[str, str]) -> str:
    """The x86 family and model numbers, which tell generations apart where the model name does not ("AMD EPYC":
    family 25 is Zen 3 or Zen 4, 26 Zen 5); empty on ARM."""
    if not fields.get("cpu family"):
        return ""
    return f"family {fields['cpu family']} model {fields.get('model', '?')}"


def cache_sizes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """The first CPU's data and unified caches in KiB by level ("L1d", "L2", "L3"), as sysfs lists them; empty where
    it does not. The int8 products' speed at the default model's size turns on whether a step's weights and caches
    stay in L2."""
    sizes: dict[str, int] = {}
    for index in sorted(root.glob("index*")):
        kind, level, size = (read(str(index / name)).strip() for name in ("type", "level", "size"))
        if kind == "Instruction" or not level.isdigit() or not size.endswith("K") or not size[:-1].isdigit():
            continue
        sizes[f"L{level}d" if kind == "Data" else f"L{level}"] = int(size[:-1])
    return sizes


def isa_features(fields: dict[str, str]) -> list[str]:
    """The kernels' instruction sets this CPU has, in ISA's order."""
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return [label for flag, label in ISA.items() if flag in flags]


def memory_gib(meminfo: str) -> float | None:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    return None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions, read from the packages' metadata (nothing is imported)."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def gpus() -> list[str]:
    """The NVIDIA GPUs nvidia-smi lists, by name; none where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def describe(device: str = "cpu") -> dict[str, Any]:
    """What a benchmark's figures depend on: the CPU and its instruction sets, the cores this process may use (its
    affinity and any cgroup quota) against the machine's, memory, the GPUs when `device` is cuda, the libraries'
    versions, and when."""
    fields = cpu_fields(read("/proc/cpuinfo"))
    return {
        "cpu": cpu_model(fields),
        "family": cpu_family(fields),
        "cache_kib": cache_sizes(),
        "vendor": fields.get("vendor_id", ""),
        "isa": isa_features(fields),
        "cores_usable": available_cores(),
        "cpus_online": os.cpu_count(),
        "memory_gib": memory_gib(read("/proc/meminfo")),
        "gpus": gpus() if device == "cuda" else [],
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": package_versions(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def headline(machine: dict[str, Any]) -> str:
    """One line for the top of a benchmark's output."""
    isa = f"; {', '.join(machine['isa'])}" if machine["isa"] else ""
    family = f", {machine['family']}" if machine.get("family") else ""
    sizes = [f"{level} {kib // 1024} MiB" if kib >= 1024 else f"{level} {kib} KiB"
             for level, kib in machine.get("cache_kib", {}).items() if level in ("L2", "L3")]  # fmt: skip
    caches = f"; {', '.join(sizes)}" if sizes else ""
    cores = f"{machine['cores_usable']} of {machine['cpus_online']} CPUs usable{isa}{caches}"
    memory = f", {machine['memory_gib']:g} GiB" if machine["memory_gib"] else ""
    gpu = f"; GPU: {', '.join(machine['gpus'])}" if machine["gpus"] else ""
    packages = ", ".join(f"{name} {version}" for name, version in machine["packages"].items())
    return f"machine: {machine['cpu']}{family} ({cores}){memory}{gpu}; {packages}; {machine['date']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.machine", description=description_of(__doc__))
    parser.add_argument("--cuda", action="store_true", help="describe the GPU too (ONNX Runtime's CUDA provider)")
    machine = describe("cuda" if parser.parse_args(argv).cuda else "cpu")
    print(headline(machine))
    print(json.dumps(machine, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
