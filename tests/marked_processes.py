"""Find every process of one run, however deep, by an environment marker they all inherit."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

MARKER_VARIABLE = "LANEWAY_TEST_RUN"


@contextlib.contextmanager
def marked_run() -> Iterator[str]:
    """A fresh marker; whatever still carries it at the end is killed."""
    mark = uuid.uuid4().hex
    try:
        yield mark
    finally:
        for pid in processes_marked(mark):
            os.kill(pid, signal.SIGKILL)


def marked_environment(mark: str) -> dict[str, str]:
    return {**os.environ, MARKER_VARIABLE: mark}


def processes_marked(mark: str) -> list[int]:
    """Live processes (zombies excluded) whose environment carries `mark`."""
    wanted = f"{MARKER_VARIABLE}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ.split(b"\0") and state != "Z":
            pids.append(int(entry.name))
    return pids
