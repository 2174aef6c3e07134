"""The access log's lines: JSON formatted and written on the listener thread, all flushed."""

from __future__ import annotations

import io
import json
import logging
import threading

from laneway.gateway.access_log import JsonLine, log_on_a_thread


class _ThreadRecordingStream(io.StringIO):
    """A stream that remembers which threads wrote to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: set[str] = set()

    def write(self, text: str) -> int:
        self.writers.add(threading.current_thread().name)
        return super().write(text)


def test_lines_are_json_written_off_the_calling_thread_and_flushed_on_exit() -> None:
    stream = _ThreadRecordingStream()
    log = logging.getLogger("laneway.gateway.requests")
    with log_on_a_thread(stream):
        for index in range(50):
            log.info("%s", JsonLine({"path": "/v1/completions", "status": 200, "n": index}))
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["n"] for line in lines] == list(range(50))
    assert json.loads(lines[0]) == {"path": "/v1/completions", "status": 200, "n": 0}
    assert threading.current_thread().name not in stream.writers


def test_leaving_removes_the_queue_so_later_records_do_not_pile_up() -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    with log_on_a_thread(io.StringIO()):
        assert len(root.handlers) == len(handlers) + 1
    assert root.handlers == handlers
