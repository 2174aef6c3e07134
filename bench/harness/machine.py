"""Where a benchmark runs: the machine's description for its report, and CPU pinning."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path


def pin(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of `pid` on `cpus` (affinity is per thread; new ones inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus))


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
