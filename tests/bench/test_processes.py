"""The server's processes from /proc: its children (the engine processes), their memory and CPU time."""

import os
import subprocess
import sys
import time

from bench.processes import children, cpu_seconds, own_cpu_seconds, rss_mb


def test_a_child_is_found_and_its_cpu_time_and_memory_count_with_its_parents() -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds(os.getpid()) - time.process_time() < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has burnt its 0.3 s
        assert child.pid in children(os.getpid())
        assert cpu_seconds(os.getpid()) - time.process_time() >= 0.25  # the child's time on top of this process's
        assert own_cpu_seconds(os.getpid()) < cpu_seconds(os.getpid()) - 0.2  # this process's alone
        assert own_cpu_seconds(child.pid) >= 0.25
        assert rss_mb(os.getpid()) > rss_mb(child.pid) > 0
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children(os.getpid())
