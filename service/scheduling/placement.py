"""Which cores the server's threads run on (`MT_PIN_CORES`, on by default; Linux), and how the engine's threads share
them with HTTP (`MT_ENGINE_BATCH_SCHEDULING`: `run_as_batch`).

A decoding stream steps without pause while there is work, one ONNX Runtime thread per stream on a small model.
Beside it run the HTTP side, the encoder passes and the engine's outbox: on 2 cores at 32 clients they want ~0.9 of
a core, and wherever the kernel puts them they preempt a step or evict its weights from the core's caches. When
every stream runs on one thread and the streams leave at least one core free, each stream gets a core of its own
and every other thread of the server and its engine processes is kept to the cores left. Measured on the default
model at 32 clients, 2 cores (docs/performance.md): 7,431 -> 7,774 target tok/s (means of 8 alternating pairs,
pinned faster in each), p99/p50 3.12-3.46 -> 2.98-3.22. Otherwise (streams of several threads, as many streams as
cores, a CPU quota smaller than the cores the process may run on, or CUDA) the kernel places every thread, as
before. Several servers on one machine claim their streams' cores with a lock file each (`claim`, in
/dev/shm/transformer-mt-cores/): a second server pins its streams to the next free cores, or not at all when
none is left for its other threads.

Pinning is a whole-process change, so only `python -m service` asks for it (`load_translators(pin=True)`): it pins
its own threads to the others' cores before starting the engine processes, which inherit that, and each stream's
thread pins itself to its core when it starts. Threads a pinned thread starts inherit its core, so a stream's
encoder thread (`EncoderThread`) pins itself back to the others' cores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
SHARED_MEMORY = Path("/dev/shm")
CLAIMS = (SHARED_MEMORY if SHARED_MEMORY.is_dir() else Path(tempfile.gettempdir())) / "transformer-mt-cores"
_claimed: dict[int, int] = {}  # core -> the descriptor whose lock claims it for this process


@dataclass(frozen=True)
class Cores:
    """One model's share of the machine: a core for each of its decoding streams, and the cores of its other
    threads (encoder passes, the engine process's main thread and outbox)."""

    streams: tuple[int, ...]
    others: frozenset[int]

    def stream(self, index: int) -> frozenset[int]:
        return frozenset({self.streams[index]})


def allowed_cores() -> frozenset[int]:
    """The CPUs this process may run on; empty where the OS does not say (not Linux)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset()


def plan(
    layouts: list[tuple[int, int]], allowed: frozenset[int], usable: int, taken: frozenset[int] = frozenset()
) -> list[Cores] | None:
    """Per model, from its (decoding streams, intra-op threads per stream): a core of its own for each stream, the
    highest-numbered ones not `taken` (by another server's streams), and the rest for everything else; None (the
    kernel places every thread) unless every stream runs one thread and the streams leave at least one free core
    for the rest. None too under a CPU quota smaller than the allowed cores (`usable`: a container's `cpus:` limit
    without a cpuset): the cores are then shared with other containers, which cannot see each other's claims."""
    streams = sum(count for count, _ in layouts)
    cores = sorted(allowed - taken)
    if any(threads != 1 for _, threads in layouts) or streams >= len(cores) or usable < len(allowed):
        return None
    reserved, others = cores[len(cores) - streams :], frozenset(cores[: len(cores) - streams])
    placed, start = [], 0
    for count, _ in layouts:
        placed.append(Cores(tuple(reserved[start : start + count]), others))
        start += count
    return placed


def claim(cores: list[int], directory: Path = CLAIMS) -> frozenset[int]:
    """Claim `cores` for this process's streams, for as long as it lives, with a lock file each (`flock`: the
    kernel drops it when the process ends, however it ends); returns those another process holds, claiming none
    of the others then. So two servers on one machine put their streams on different cores."""
    refused, held = set(), []
    for core in cores:
        descriptor = _lock(directory / f"core-{core}.lock")
        if descriptor is None:
            refused.add(core)
        else:
            held.append((core, descriptor))
    if refused:
        for _, descriptor in held:
            os.close(descriptor)  # closing the file drops its lock
    else:
        _claimed.update(held)
    return frozenset(refused)


def release(cores: list[int]) -> None:
    """Drop this process's claims on `cores` (tests; a server keeps its claims until it exits)."""
    for core in cores:
        descriptor = _claimed.pop(core, None)
        if descriptor is not None:
            os.close(descriptor)


def _lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive lock on `path`, or None if another process holds it (or the file
    cannot be opened: taken, to be safe)."""
    try:
        path.parent.mkdir(mode=0o777, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another user's directory: theirs to open up
            path.parent.chmod(0o1777)  # every user's servers claim cores in it, like /tmp
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: any user can lock it
    except OSError as error:
        log.warning(
            "cannot claim a core with %s (%s): counted as taken, not as another server's; check MT_PIN_CLAIMS_DIR",
            path,
            error.strerror or error,
        )
        return None
    import fcntl  # POSIX only: nothing is pinned elsewhere

    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def pin_thread(cores: frozenset[int]) -> None:
    """Keep the calling thread (and the threads it starts from now on) to `cores`; where the OS refuses (a cpuset
    changed since the plan, a sandbox without the call), a warning, and the thread runs where it did."""
    try:
        os.sched_setaffinity(0, cores)  # on Linux, pid 0 is the calling thread
    except OSError as error:
        log.warning("could not pin a thread to cores %s (%s): it runs where the kernel puts it", sorted(cores), error)


def run_as_batch() -> bool:
    """The calling thread, and the threads it starts from now on, under SCHED_BATCH (Linux; returns whether it
    applied). The kernel then never lets one of them that wakes preempt the thread running on its core, only take
    the core when that thread's slice ends or it sleeps: the engine process's threads (its pipe reader, encoder
    thread, outbox) wake at every request and every finished sentence, on the core the HTTP process's event loop
    shares with them, which then lost the core in the middle of a turn (a pipe write, a socket write) to a thread
    whose work could wait a moment. A decoding stream alone on its core is not affected. Measured on 2 cores
    (docs/performance.md): the default model at 32 clients 1.09x the throughput, p50 and p99 lower; the paper size
    1.05x; 1 client unchanged. Where the OS refuses (a sandbox without the call), a warning, and nothing changes."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:  # pragma: no cover - not Linux
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # on Linux, pid 0 is the calling thread
    except OSError as error:
        log.warning("could not run the engine's threads under SCHED_BATCH (%s): the kernel's default policy", error)
        return False
    return True


def pin_process(cores: frozenset[int]) -> None:
    """Keep every thread of this process, and the processes and threads it starts from now on, to `cores` (as
    pin_thread: a warning where the OS refuses)."""
    try:
        tasks = [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except OSError as error:
        log.warning("could not list this process's threads to pin them (%s)", error)
        return
    for task in tasks:
        try:
            os.sched_setaffinity(task, cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except OSError as error:
            log.warning("could not pin thread %d to cores %s (%s)", task, sorted(cores), error)
