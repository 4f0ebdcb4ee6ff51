"""What the benchmarks share: run N looping threads for a fixed time, percentiles,
a process's CPU time, the command line of the binlake CLI."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable


def run_threads(count: int, seconds: float, loop: Callable[[int, threading.Event], None]) -> float:
    """Start ``loop(i, stop)`` in ``count`` threads, set ``stop`` after ``seconds``,
    join them, and return the elapsed wall time."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(i, stop)) for i in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * q) - 1))]


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the live process ``pid`` has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def binlake_cmd(*args: str) -> list[str]:
    """The command line of ``binlake ARGS`` in a process of its own (this interpreter)."""
    return [sys.executable, "-m", "binlake.cli", *args]
