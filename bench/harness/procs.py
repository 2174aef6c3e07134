"""Child processes for tests, the demo and the benchmarks: `laneway sim` and `laneway gateway`.

A child is ready when it prints its contracted ready line on stdout; the URL at the end of
that line is what callers connect to. Every child runs in its own process group, so stopping
it (SIGTERM, then SIGKILL after a grace period) reaches anything it started, and a Ctrl-C in
the terminal reaches only the parent, which then stops the children in order.

Three layers make sure that no child outlives the parent:
1. `Children` stops what it started when its `with`/`async with` block ends, however it ends.
2. An atexit hook kills any child still registered (a parent that exits without closing).
3. On Linux, each child asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG),
   which covers a parent killed by a signal it cannot handle.

One implementation serves sync and async callers: pipes are drained by reader threads, so a
chatty child never blocks on a full pipe, and async callers wait in a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

from laneway.errors import ChildError

READY_PREFIXES = {
    "sim": "laneway sim: serving ",
    "gateway": "laneway gateway: listening on ",
    "epp": "laneway epp: listening on ",
}
DEFAULT_READY_TIMEOUT = 60.0
DEFAULT_STOP_GRACE = 5.0
TAIL_LINES = 40
TRACEBACK_HEAD = b"Traceback (most recent call last):"

_PR_SET_PDEATHSIG = 1

T = TypeVar("T")

# Every child not yet stopped, for the atexit hook.
_LIVE: set[ChildProcess] = set()


def laneway_argv(subcommand: str, *args: str) -> list[str]:
    """`laneway SUBCOMMAND ARGS...` through this interpreter, so no console script is needed.

    -P keeps the working directory off sys.path: run from the repository root, its operator/
    folder would otherwise shadow the standard library's operator module.
    """
    return [sys.executable, "-P", "-m", "laneway.cli", subcommand, *args]


class ChildProcess:
    """One running child: its ready URL, its output tails, and a clean stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        ready_prefix: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = tuple(argv)
        self._ready_prefix = ready_prefix
        self._url: str | None = None
        self._stdout_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        # Python tracebacks the child printed, per stream: each stream's reader counts its own.
        self._tracebacks = {"stdout": 0, "stderr": 0}
        # Set when the ready line arrives, stdout closes, or a stop begins: whatever
        # ends the wait for readiness.
        self._wake = threading.Event()
        self._stopping = False
        self._stop_lock = threading.Lock()
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=_DieWithParent(os.getpid()) if sys.platform == "linux" else None,
        )
        _LIVE.add(self)
        assert self._process.stdout is not None
        assert self._process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(self._process.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def url(self) -> str:
        if self._url is None:
            raise ChildError(f"{self.name} is not ready yet")
        return self._url

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def cpu_seconds(self) -> float:
        """User + system CPU time the child has used so far, all threads (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime and stime, the 14th and 15th fields of stat: 12th and 13th after the name.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail)

    def tracebacks(self) -> int:
        """Python tracebacks the child has printed so far, on stdout or stderr."""
        return sum(self._tracebacks.values())

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> str:
        """Block until the ready line; on death, timeout or stop raise ChildError."""
        self._wake.wait(timeout)
        if self._url is not None and not self._stopping:
            return self._url
        if self._stopping:
            raise ChildError(f"{self.name} was stopped before it got ready")
        code = self._process.poll()
        if self._wake.is_set() and code is None:
            # stdout closed first; give the exit status a moment to arrive.
            try:
                code = self._process.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None
        reason = (
            f"exited with status {code} before it got ready"
            if code is not None
            else f"printed no ready line ({self._ready_prefix.strip()!r}) within {timeout:g} s"
        )
        raise ChildError(self._describe(reason))

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> int | None:
        """SIGTERM the child's group, SIGKILL it after `grace` seconds; return the exit code."""
        with self._stop_lock:
            self._stopping = True
            self._wake.set()
            if self._process.poll() is None:
                _signal_group(self.pid, signal.SIGTERM)
                try:
                    self._process.wait(grace)
                except subprocess.TimeoutExpired:
                    _signal_group(self.pid, signal.SIGKILL)
                    self._process.wait()
            # Whatever the leader left behind in its group goes too.
            _signal_group(self.pid, signal.SIGKILL)
            for reader in self._readers:
                reader.join(grace)
            _LIVE.discard(self)
            return self._process.returncode

    def kill_now(self) -> None:
        _signal_group(self.pid, signal.SIGKILL)

    def describe_exit(self) -> str:
        """Why a child that was running has gone, with its stderr tail (for crash reports)."""
        return self._describe(f"exited with status {self.returncode}")

    def _describe(self, reason: str) -> str:
        tail = self.stderr_tail().strip() or "".join(self._stdout_tail).strip() or "(no output)"
        indented = "\n".join(f"    {line}" for line in tail.splitlines())
        return f"{self.name} ({self._command()}) {reason}; its last output:\n{indented}"

    def _command(self) -> str:
        """The command line as a person would type it: `laneway ...` for laneway children."""
        argv = list(self.argv)
        if "laneway.cli" in argv:
            argv = ["laneway", *argv[argv.index("laneway.cli") + 1 :]]
        return shlex.join(argv)

    def _read_stdout(self, stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace")
                self._stdout_tail.append(line)
                self._count_traceback("stdout", raw)
                if self._url is None and line.startswith(self._ready_prefix):
                    self._url = line.rstrip().rsplit(" ", 1)[-1]
                    self._wake.set()
        self._wake.set()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                self._stderr_tail.append(raw.decode("utf-8", "replace"))
                self._count_traceback("stderr", raw)

    def _count_traceback(self, stream: str, raw: bytes) -> None:
        if raw.lstrip().startswith(TRACEBACK_HEAD):
            self._tracebacks[stream] += 1


class Children:
    """Starts children and stops every one of them (last started, first stopped) on close.

    Use as `with Children() as children:` or `async with Children() as children:`.
    """

    def __init__(self, stop_grace: float = DEFAULT_STOP_GRACE) -> None:
        self._stop_grace = stop_grace
        self._children: list[ChildProcess] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def running(self) -> tuple[ChildProcess, ...]:
        return tuple(self._children)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        ready_prefix: str,
        timeout: float = DEFAULT_READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> ChildProcess:
        with self._lock:
            if self._closed:
                raise ChildError(f"cannot start {name}: these children are being stopped")
            child = ChildProcess(name, argv, ready_prefix=ready_prefix, env=env)
            self._children.append(child)
        try:
            child.wait_ready(timeout)
        except ChildError:
            child.stop(self._stop_grace)
            raise
        return child

    def start_laneway(
        self,
        subcommand: str,
        args: Sequence[str],
        name: str | None = None,
        timeout: float = DEFAULT_READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> ChildProcess:
        """Start `laneway sim ...` or `laneway gateway ...` and wait for its ready line;
        `env` adds to this process's environment."""
        return self.start(
            name or f"laneway {subcommand}",
            laneway_argv(subcommand, *args),
            READY_PREFIXES[subcommand],
            timeout,
            env,
        )

    async def start_laneway_async(
        self,
        subcommand: str,
        args: Sequence[str],
        name: str | None = None,
        ready_within: float = DEFAULT_READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> ChildProcess:
        return await asyncio.to_thread(
            self.start_laneway, subcommand, args, name, ready_within, env
        )

    def crashed(self) -> list[ChildProcess]:
        """Children that have exited on their own (none should, until close)."""
        return [c for c in self._children if c.returncode is not None]

    async def watch(self, awaitable: Awaitable[T], poll_s: float = 0.5) -> T:
        """Await `awaitable`, but if a child exits meanwhile cancel it and raise ChildError."""
        task = asyncio.ensure_future(awaitable)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=poll_s)
                crashed = self.crashed()
                if crashed and not task.done():
                    raise ChildError(crashed[0].describe_exit())
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children = list(reversed(self._children))
        for child in children:
            child.stop(self._stop_grace)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Children:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.aclose()
        except asyncio.CancelledError:
            # A cancelled parent (Ctrl-C) must still wait for its children to stop.
            self.close()
            raise


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class _DieWithParent:
    """Runs in the forked child before exec: SIGKILL me when my parent dies."""

    def __init__(self, parent_pid: int) -> None:
        self._parent_pid = parent_pid
        self._libc = ctypes.CDLL(None, use_errno=True)

    def __call__(self) -> None:
        self._libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl; then nobody would signal us.
        if os.getppid() != self._parent_pid:
            os._exit(1)


@atexit.register
def _kill_leftovers() -> None:
    for child in list(_LIVE):
        child.kill_now()
