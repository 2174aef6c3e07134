"""The request log: one JSON line per request, batched so the event loop pays microseconds.

Going through `logging` means a LogRecord, handler locks and a synchronous write per request
on the event loop, and handing the records to a thread means GIL hand-offs per request.
Here a request's fields are kept as a dict; a flush scheduled a moment later serialises the
batch with orjson and writes it in one call. The line's fields and its stream (stderr) are
those of a logging line; the logger `laneway.gateway.requests` still switches it off
(`setLevel(WARNING)`).

The gateway writes off the event loop (`off_loop=True`): a write to a pipe nobody drains
blocks until it is read, and a gateway whose stderr pipe filled held every request,
`/healthz` included, until then (a probe waited over 30 s with the reader stopped). A
thread writes each batch; while the stream stays blocked, at most MAX_QUEUED_BATCHES wait
and the lines past them are dropped and counted, the count written as a line of its own
once the stream takes writes again. The gateway's other log records go the same way
(`OffLoopLogging`): a thread writes them, and a full queue drops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

log = logging.getLogger("laneway.gateway.requests")

FLUSH_AFTER_S = 0.05  # a line reaches the stream at most this long after its request ends
FLUSH_AT_LINES = 512  # or as soon as this many wait
MAX_QUEUED_BATCHES = 256  # off the loop: batches waiting for a blocked stream, at most
CLOSE_WAIT_S = 5.0  # how long closing waits for the writer (a stream may never unblock)
MAX_QUEUED_RECORDS = 10_000  # other log records waiting for a blocked stream, at most


class AccessLog:
    def __init__(self, stream: TextIO | None = None, *, off_loop: bool = False) -> None:
        self._stream = stream
        self._pending: list[Mapping[str, Any]] = []
        self._flush_scheduled: asyncio.TimerHandle | None = None
        self._queue: queue.Queue[str | None] | None = None
        self._writer: threading.Thread | None = None
        self.dropped = 0  # lines dropped, not yet reported
        if off_loop:
            self._queue = queue.Queue(MAX_QUEUED_BATCHES)
            self._writer = threading.Thread(
                target=self._write_queued, name="access-log", daemon=True
            )
            self._writer.start()

    @property
    def enabled(self) -> bool:
        """Whether lines are written at all: a caller skips building one when they are not."""
        return log.isEnabledFor(logging.INFO)

    def write(self, fields: Mapping[str, Any]) -> None:
        """Queue one line; it is written within FLUSH_AFTER_S (at once with no loop running)."""
        if not log.isEnabledFor(logging.INFO):
            return
        self._pending.append(fields)
        if len(self._pending) >= FLUSH_AT_LINES:
            self.flush()
            return
        if self._flush_scheduled is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._flush_scheduled = loop.call_later(FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        if self._flush_scheduled is not None:
            self._flush_scheduled.cancel()
            self._flush_scheduled = None
        if not self._pending:
            return
        count = len(self._pending)
        lines = b"".join(orjson.dumps(fields) + b"\n" for fields in self._pending)
        self._pending.clear()
        if self._queue is None:
            self._write(lines.decode())
            return
        if self.dropped:
            note = {"msg": "access log lines dropped: the log stream was blocked"}
            lines = orjson.dumps({**note, "dropped": self.dropped}) + b"\n" + lines
        try:
            self._queue.put_nowait(lines.decode())
        except queue.Full:
            self.dropped += count
        else:
            self.dropped = 0

    def close(self) -> None:
        """Write what is left; off the loop, wait a moment for the writer to finish."""
        self.flush()
        if self._queue is None or self._writer is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._writer.join(CLOSE_WAIT_S)

    def _write_queued(self) -> None:
        assert self._queue is not None
        while (text := self._queue.get()) is not None:
            self._write(text)

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr  # looked up late: tests and the CLI redirect it
        stream.write(text)
        stream.flush()


class _DroppingHandler(logging.handlers.QueueHandler):
    """Queues a record for the writer thread; drops it when the queue is full (the stream
    blocked) rather than block the loop or report an error on that same stream."""

    def enqueue(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(record)


class OffLoopLogging:
    """The root logger's records, formatted `%(message)s` (tracebacks included), written to
    `stream` by a thread of their own."""

    def __init__(self, stream: TextIO, level: int = logging.INFO) -> None:
        self._records: queue.Queue[logging.LogRecord] = queue.Queue(MAX_QUEUED_RECORDS)
        writer = logging.StreamHandler(stream)
        writer.setFormatter(logging.Formatter("%(message)s"))
        self._listener = logging.handlers.QueueListener(self._records, writer)
        self._handler = _DroppingHandler(self._records)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        root = logging.getLogger()
        root.setLevel(level)
        root.addHandler(self._handler)
        self._listener.start()

    def close(self) -> None:
        """Wait a moment for what is queued to be written (the writer is a daemon thread:
        a stream that stays blocked does not keep the process from exiting)."""
        logging.getLogger().removeHandler(self._handler)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while not self._records.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(queue.Full):
            self._listener.enqueue_sentinel()
