"""The request log: one JSON line per request, batched so the event loop pays microseconds.

Going through `logging` means a LogRecord, handler locks and a synchronous write per request
on the event loop, and handing the records to a thread means GIL hand-offs per request.
Here a request's fields are kept as a dict; a flush scheduled a moment later serialises the
batch with orjson and writes it in one call. The line's fields and its stream (stderr) are
those of a logging line; the logger `laneway.gateway.requests` still switches it off
(`setLevel(WARNING)`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

log = logging.getLogger("laneway.gateway.requests")

FLUSH_AFTER_S = 0.05  # a line reaches the stream at most this long after its request ends
FLUSH_AT_LINES = 512  # or as soon as this many wait


class AccessLog:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._pending: list[Mapping[str, Any]] = []
        self._flush_scheduled: asyncio.TimerHandle | None = None

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
        lines = b"".join(orjson.dumps(fields) + b"\n" for fields in self._pending)
        self._pending.clear()
        stream = self._stream or sys.stderr  # looked up late: tests and the CLI redirect it
        stream.write(lines.decode())
        stream.flush()
