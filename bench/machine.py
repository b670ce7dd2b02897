"""What the benchmark reports say about the machine they were measured on."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def python_loop_seconds(n: int = 10_000_000) -> float:
    """CPU seconds this interpreter takes to sum ``n`` integers in a plain loop: a yardstick
    for comparing reports from machines (or moments of a shared virtual machine) that differ
    in speed. Best of three."""
    import time

    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        total = 0
        for i in range(n):
            total += i
        best = min(best, time.process_time() - start)
    return best
