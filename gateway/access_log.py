"""Log lines that cost the event loop almost nothing: formatted and written on a thread.

A request's log line is a dict of its fields; `JsonLine` defers turning it into JSON until a
handler formats the record, and `log_on_a_thread` makes that happen on a listener thread
that also does the (blocking) write, so a slow stderr never stalls the loop.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import queue
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import orjson


class JsonLine:
    """A mapping that becomes one compact JSON line when (and where) it is formatted."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return orjson.dumps(self.fields).decode()


class _DeferringQueueHandler(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The stock handler formats here, on the caller's thread, so that the record can
        # cross a process boundary; ours stays in this process, so the listener formats.
        return record


@contextlib.contextmanager
def log_on_a_thread(stream: TextIO, level: int = logging.INFO) -> Iterator[None]:
    """Route the root logger through a queue to `stream` while inside; flushed on exit."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    writer = logging.StreamHandler(stream)
    writer.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.setLevel(level)
    enqueue = _DeferringQueueHandler(records)
    root.addHandler(enqueue)
    listener = logging.handlers.QueueListener(records, writer, respect_handler_level=True)
    listener.start()
    try:
        yield
    finally:
        root.removeHandler(enqueue)
        listener.stop()
