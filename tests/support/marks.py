"""Find the processes of a run (Linux /proc): by an environment marker they all inherit,
however deep, or as the children of one process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

MARKER_VARIABLE = "LANEWAY_TEST_RUN"
HANG_S = 240  # only a guard against a hang, under pytest-timeout's 300 s


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
    for entry, _ in _live_processes():
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    return [int(entry.name) for entry, fields in _live_processes() if int(fields[1]) == pid]


def alive(pid: int) -> bool:
    try:
        return _stat_fields(Path(f"/proc/{pid}"))[0] != "Z"
    except OSError:
        return False


def wait_for_children(bench: subprocess.Popen[str], count: int) -> list[int]:
    """The bench's children once at least `count` are running (engines, then the gateway)."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        assert bench.poll() is None, "the benchmark ended before its children started"
        found = children_of(bench.pid)
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} children appeared")


def assert_all_gone(children: list[int]) -> None:
    """The children die with their parent; a loaded machine may take a moment to reap."""
    deadline = time.monotonic() + HANG_S
    while survivors := [pid for pid in children if alive(pid)]:
        assert time.monotonic() < deadline, f"still running: {survivors}"
        time.sleep(0.1)


def _live_processes() -> Iterator[tuple[Path, list[str]]]:
    """Each process but zombies: its /proc folder and its stat fields."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry)
        except OSError:
            continue
        if fields[0] != "Z":
            yield entry, fields


def _stat_fields(process: Path) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces): state, ppid, ..."""
    return (process / "stat").read_text().rsplit(")", 1)[1].split()
