"""A served model's processes as Linux's /proc shows them: the server and its children (the engine processes),
their resident memory and their CPU time. Used by the server, overload and soak benchmarks."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def rss_mb(pid: int) -> float:
    """The server's resident memory (VmRSS), in MB: its own and its children's (the engine processes)."""
    total = sum(status_mb(Path(f"/proc/{process}/status"), "VmRSS") for process in [pid, *children(pid)])
    return total if total else float("nan")


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (VmHWM), in MB."""
    return status_mb(Path("/proc/self/status"), "VmHWM")


def status_mb(status: Path, field: str) -> float:
    """A memory field (kB) of a /proc status file, in MB; 0.0 if the process is gone (it just exited)."""
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith(f"{field}:")), 0.0)


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) that `pid` and its children have used so far, in seconds; a process that just
    exited counts nothing."""
    return sum(own_cpu_seconds(process) for process in [pid, *children(pid)])


def own_cpu_seconds(pid: int) -> float:
    """CPU time (user and system) that `pid` itself has used so far (not its children), in seconds; 0.0 for a
    process that is gone."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(native_id: int) -> float:
    """CPU time (user and system) that one thread of this process has used so far, in seconds; 0.0 once it has
    ended."""
    return stat_cpu_seconds(Path(f"/proc/self/task/{native_id}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """utime + stime of a /proc stat file (fields 14 and 15 of proc(5), in ticks), in seconds; 0.0 if it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
