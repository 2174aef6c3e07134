"""A throwaway local `redis-server` for tests and benchmarks: free port, no persistence.

It can be stopped (or killed) and started again on the same port, which is how the fault
tests make Redis unreachable and then bring it back. With `append_only_dir` it keeps an AOF
there, fsynced on every write, so a restart (even after SIGKILL) keeps every acknowledged
write, as docs/STATE.md recommends for batches.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from laneway.errors import UsageError

READY_PATIENCE_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalRedis:
    """`redis-server --port N --save '' --appendonly no` on 127.0.0.1, started and stopped."""

    def __init__(
        self,
        port: int | None = None,
        password: str | None = None,
        append_only_dir: Path | None = None,
    ) -> None:
        self.executable = shutil.which("redis-server")
        if self.executable is None:
            raise UsageError("redis-server is not installed: run scripts/install-tools.sh")
        self.port = port or free_port()
        self.password = password
        self.append_only_dir = append_only_dir
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        assert self.executable is not None
        persistence = ["--appendonly", "no"]
        if self.append_only_dir is not None:
            persistence = ["--appendonly", "yes", "--appendfsync", "always"]
            persistence += ["--dir", str(self.append_only_dir)]
        self._process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--loglevel",
                "warning",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._wait_ready()

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()
        self._process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, no final write."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_PATIENCE_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                assert self._process.stderr is not None
                error = self._process.stderr.read().decode("utf-8", "replace").strip()
                raise RuntimeError(f"redis-server on port {self.port} exited: {error}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    if self.password:
                        conn.sendall(f"AUTH {self.password}\r\n".encode())
                        conn.recv(64)
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
