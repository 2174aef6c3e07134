"""The request log: every line written, as JSON, batched, and silenced by its logger."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from laneway.gateway.access_log import (
    FLUSH_AT_LINES,
    MAX_QUEUED_BATCHES,
    MAX_QUEUED_RECORDS,
    AccessLog,
    OffLoopLogging,
)

REQUESTS = logging.getLogger("laneway.gateway.requests")


@pytest.fixture(autouse=True)
def requests_logged() -> Iterator[None]:
    """As `laneway gateway` configures logging; pytest's root logger says WARNING."""
    level = REQUESTS.level
    REQUESTS.setLevel(logging.INFO)  # setLevel, not the attribute: it clears the cache
    yield
    REQUESTS.setLevel(level)


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.written = asyncio.Event()

    def write(self, text: str) -> int:
        self.writes += 1
        self.written.set()
        return super().write(text)


async def test_lines_written_in_one_batch_after_the_requests_end() -> None:
    stream = _CountingStream()
    access = AccessLog(stream)
    for index in range(20):
        access.write({"path": "/v1/completions", "status": 200, "n": index})
    assert stream.getvalue() == ""  # nothing written on the request's own turn of the loop
    await asyncio.wait_for(stream.written.wait(), 30)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["n"] for line in lines] == list(range(20))
    assert lines[0] == {"path": "/v1/completions", "status": 200, "n": 0}
    assert stream.writes == 1


async def test_a_full_batch_is_written_at_once_and_flush_writes_the_rest() -> None:
    stream = io.StringIO()
    access = AccessLog(stream)
    for index in range(FLUSH_AT_LINES + 3):
        access.write({"n": index})
    assert len(stream.getvalue().splitlines()) == FLUSH_AT_LINES
    access.flush()
    assert len(stream.getvalue().splitlines()) == FLUSH_AT_LINES + 3


def test_without_a_running_loop_lines_are_written_at_once() -> None:
    stream = io.StringIO()
    AccessLog(stream).write({"status": 404})
    assert json.loads(stream.getvalue()) == {"status": 404}


def test_the_requests_logger_switches_it_off() -> None:
    REQUESTS.setLevel(logging.WARNING)
    stream = io.StringIO()
    access = AccessLog(stream)
    access.write({"status": 200})
    access.flush()
    assert stream.getvalue() == ""


class _BlockedStream(io.StringIO):
    """A pipe nobody reads: every write waits until it is let go."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = threading.Event()
        self.waiting = threading.Event()  # a write has begun to wait

    def write(self, text: str) -> int:
        self.waiting.set()
        self.let_go.wait(60)
        return super().write(text)


async def test_off_the_loop_a_blocked_stream_holds_nothing_and_drops_are_counted() -> None:
    stream = _BlockedStream()
    access = AccessLog(stream, off_loop=True)
    # One batch is taken by the blocked writer, MAX_QUEUED_BATCHES wait, the rest drop.
    batches = MAX_QUEUED_BATCHES + 4
    for index in range(FLUSH_AT_LINES):
        access.write({"n": index})
    assert stream.waiting.wait(60)  # the writer holds the first batch, blocked
    for index in range(FLUSH_AT_LINES, batches * FLUSH_AT_LINES):
        access.write({"n": index})  # returns at once: the writer thread is the one waiting
    assert stream.getvalue() == ""
    assert access.dropped >= 2 * FLUSH_AT_LINES
    dropped = access.dropped
    stream.let_go.set()
    queued = (MAX_QUEUED_BATCHES + 1) * FLUSH_AT_LINES
    async with asyncio.timeout(60):
        while len(stream.getvalue().splitlines()) < queued:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    access.write({"n": -1})  # the next batch reports the count
    access.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    notes = [line for line in lines if "dropped" in line]
    assert [note["dropped"] for note in notes] == [dropped]
    kept = [line["n"] for line in lines if "n" in line and line["n"] >= 0]
    assert kept == list(range(len(kept)))  # in order, the dropped ones at the end
    assert len(kept) + dropped == batches * FLUSH_AT_LINES


def test_other_records_are_written_by_a_thread_and_dropped_when_the_stream_blocks() -> None:
    stream = _BlockedStream()
    logs = OffLoopLogging(stream)
    try:
        noisy = logging.getLogger("laneway.test.noisy")
        noisy.warning("record 0")
        assert stream.waiting.wait(60)  # the writer holds it, blocked
        for index in range(1, MAX_QUEUED_RECORDS + 500):
            noisy.warning("record %d", index)  # returns at once: the thread waits instead
        try:
            raise ValueError("boom")
        except ValueError:
            noisy.exception("the last one")  # dropped too: the queue is still full
        assert stream.getvalue() == ""
        stream.let_go.set()
    finally:
        logs.close()
    lines = stream.getvalue().splitlines()
    # The one the blocked writer held and the queue's worth after it; the rest dropped.
    assert lines == [f"record {index}" for index in range(MAX_QUEUED_RECORDS + 1)]


def test_a_traceback_still_reaches_the_stream() -> None:
    stream = io.StringIO()
    logs = OffLoopLogging(stream)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("laneway.test").exception("handling failed")
    finally:
        logs.close()
    assert "handling failed\nTraceback (most recent call last):" in stream.getvalue()
    assert "ValueError: boom" in stream.getvalue()
