"""The request path's HTTP/1.1 client to the engines, on asyncio protocols.

aiohttp's `ClientSession` builds a request object, a URL, header multidicts, a connector
lease, a response object and a stream reader per request, and wakes a reader task per
chunk: about a third of the gateway's CPU per request in the profile in docs/BENCHMARKS.md.
The engines speak one thing to the gateway (a JSON POST answered with JSON or with SSE), so
this client does only that: the request head is precomputed per endpoint and path and
written with the client's body bytes in one call; llhttp (via httptools) parses the answer
in the protocol's `data_received` and hands its body, de-chunked, to whoever waits; or, once
a stream's reader has pushed it to a `StreamSink`, straight to the sink from the callback,
all the body bytes of one read at once, with no task woken per chunk.

Connections are kept alive per endpoint and reused while they stay idle for less than
IDLE_S, under the 5 s idle timeout of uvicorn (vLLM's and SGLang's server), so the engine
never closes a connection just as a request is written on it. A connection whose response
did not end cleanly, or that its reader closed early, is aborted: the engine sees the
client go away and stops generating.

Flow control: past BUFFER_BYTES of unread body the protocol stops reading from the socket,
so a slow client holds back the engine by TCP, not the gateway's memory; a sink pauses and
resumes the reads itself (`pause_reading`, `resume_reading`) as its client's buffer fills.

Errors: `UpstreamError` for a connection that cannot be made or breaks, or an answer that is
not HTTP; `TimeoutError` when connecting, or waiting for the next bytes, takes too long.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0  # an idle connection is reused within this, closed after
BUFFER_BYTES = 256 * 1024  # unread body past which the engine's socket is not read


class UpstreamError(Exception):
    """The engine could not be reached, or its connection broke, or its answer was not HTTP."""


class StreamSink(Protocol):
    """Where a pushed answer's body goes, from the connection's callbacks."""

    def received(self, data: bytes, at: float) -> None:
        """The body bytes (de-chunked) that one read of the socket brought, read at `at`
        (the pool's clock)."""

    def ended(self, error: Exception | None) -> None:
        """The answer is over: whole (None), broken, or silent for longer than `read_s`
        (TimeoutError). Called once; nothing is received after it."""


@dataclass(frozen=True)
class UpstreamLimits:
    connect_s: float
    read_s: float  # the longest wait for the head or for the body's next bytes


@dataclass(frozen=True)
class _Origin:
    host: str
    port: int
    tls: bool
    host_header: bytes


@functools.lru_cache(maxsize=4096)
def _origin(url: str) -> _Origin:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    return _Origin(host, port, tls, parts.netloc.encode("idna"))


@functools.lru_cache(maxsize=4096)
def _head_prefix(url: str, path: str) -> bytes:
    """Everything of a request's head but its length, built once per endpoint and path."""
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + _origin(url).host_header + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
    )


class UpstreamResponse(asyncio.Protocol):
    """One connection to an engine and the answer being read on it (one at a time)."""

    def __init__(self, pool: UpstreamPool, origin: _Origin) -> None:
        self._pool = pool
        self.origin = origin
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._chunks: deque[bytes] = deque()
        self._sink: StreamSink | None = None
        self._batch: list[bytes] = []  # a pushed answer's body bytes from the current read
        # When the oldest body bytes not yet read arrived (the pool's clock): the gateway's
        # relay time of a chunk runs from here, through any wait for the loop to wake it.
        self.received_at = 0.0
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._silent_since = 0.0  # when the engine last sent bytes, or a wait began
        self._silence_timer: asyncio.TimerHandle | None = None
        self._error: Exception | None = None
        self._length_known = False  # Content-Length or chunked: the end is in the stream
        self.idle_since = 0.0
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.reusable = False  # the answer ended and the engine keeps the connection open

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._silent_since = self._loop.time()
        if self._sink is not None:
            self.received_at = self._pool.clock()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(UpstreamError(f"the engine's answer is not valid HTTP: {error}"))
            self._abort()
        self._deliver()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pool.forget(self)
        if self.headers_done and not self._length_known and not self.complete:
            self.complete = True  # a body delimited by the connection's end
            self._wake()
        elif not self.complete:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"the engine closed the connection mid-answer{why}"))
        self._deliver()

    # -- llhttp callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or (
            lower == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._length_known = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._batch.append(body)
            return
        if not self._chunks:
            self.received_at = self._pool.clock()
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > BUFFER_BYTES:
            self.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # llhttp forgets the answer's keep-alive once this callback returns: ask now.
        self.reusable = self._parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- the reader's side ------------------------------------------------------------------

    def send(self, path: str, url: str, body: bytes) -> None:
        assert self._transport is not None
        self.status, self.headers_done, self.complete, self.reusable = 0, False, False, False
        self._length_known = False
        head = _head_prefix(url, path) + str(len(body)).encode() + b"\r\n\r\n"
        self._transport.writelines((head, body))

    async def head(self) -> None:
        """Wait for the answer's status line and headers."""
        while not self.headers_done:
            await self._wait()

    async def readany(self) -> bytes:
        """The body bytes that have arrived, waiting for some; b"" once the answer ended."""
        while not self._chunks:
            if self.complete:
                return b""
            await self._wait()
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self.resume_reading()
        return chunk

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def push_to(self, sink: StreamSink) -> None:
        """From now on the body goes to `sink` as it arrives, starting with what came with
        the head; until the answer ends, or `release` or `close`."""
        self._sink = sink
        if self._chunks:
            self._batch.extend(self._chunks)
            self._chunks.clear()
            self._buffered = 0
        self.resume_reading()
        self._deliver()

    def pause_reading(self) -> None:
        """Stop reading from the engine (the sink's client reads too slowly)."""
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Read from the engine again; the read timeout runs from now."""
        self._silent_since = self._loop.time()
        if self._sink is not None and self._silence_timer is None:
            self._arm(self._silent_since)
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def release(self) -> None:
        """Done with the answer: the connection goes back to its pool if it ended cleanly,
        and is aborted otherwise (the engine then stops work on it)."""
        self._sink = None
        self._stop_timer()
        if self.complete and self.reusable and not self._chunks:
            self.resume_reading()  # a sink may have paused it as the answer ended
            self.idle_since = self._loop.time()
            self._pool.put_back(self)
        else:
            self._abort()

    def close(self) -> None:
        """Abort the answer: the engine sees its client go away."""
        self._sink = None
        self._stop_timer()
        self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _stop_timer(self) -> None:
        if self._silence_timer is not None:
            self._silence_timer.cancel()
            self._silence_timer = None

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._loop.create_future()
        self._waiter = waiter
        self._silent_since = self._loop.time()
        if self._silence_timer is None:
            self._arm(self._silent_since)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _arm(self, since: float) -> None:
        self._silence_timer = self._loop.call_at(since + self._pool.limits.read_s, self._check)

    def _check(self) -> None:
        """The read timeout: one timer per answer, re-armed at most once per `read_s`, where
        one per wait cost a timer per relayed chunk."""
        self._silence_timer = None
        waiter = self._waiter
        pushing = self._sink is not None and not self._paused
        if not pushing and (waiter is None or waiter.done()):
            return  # nobody waits: the next wait (or resumed push) arms it again
        if self._loop.time() - self._silent_since < self._pool.limits.read_s:
            self._arm(self._silent_since)
        elif waiter is not None:
            waiter.set_exception(TimeoutError())
        else:
            self._fail(TimeoutError())
            self._deliver()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _deliver(self) -> None:
        """Hand a pushed answer's sink what this read brought, then its end if it came."""
        sink = self._sink
        if sink is None:
            return
        if self._batch:
            batch = self._batch
            self._batch = []
            sink.received(batch[0] if len(batch) == 1 else b"".join(batch), self.received_at)
        if self._sink is sink and (self.complete or self._error is not None):
            self._sink = None
            self._stop_timer()
            sink.ended(self._error)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()


class UpstreamPool:
    """Keep-alive connections to every engine, and `post` to send a request on one."""

    def __init__(self, limits: UpstreamLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._idle: dict[_Origin, list[UpstreamResponse]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, path: str, body: bytes) -> UpstreamResponse:
        """Send `body` to `url` + `path`; return once the answer's head is in. The caller
        must `release()` (or `close()`) the answer."""
        origin = _origin(url)
        connection = self._idle_connection(origin) or await self._connect(origin)
        try:
            connection.send(path, url, body)
            await connection.head()
        except BaseException:
            connection.close()
            raise
        return connection

    def put_back(self, connection: UpstreamResponse) -> None:
        self._idle.setdefault(connection.origin, []).append(connection)

    def forget(self, connection: UpstreamResponse) -> None:
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def _idle_connection(self, origin: _Origin) -> UpstreamResponse | None:
        idle = self._idle.get(origin)
        oldest_usable = asyncio.get_running_loop().time() - IDLE_S
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closed
            if connection.open and connection.idle_since >= oldest_usable:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: _Origin) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.tls:
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.limits.connect_s):
                _, connection = await loop.create_connection(
                    lambda: UpstreamResponse(self, origin), origin.host, origin.port, ssl=tls
                )
        except OSError as error:
            raise UpstreamError(
                f"cannot connect to {origin.host}:{origin.port}: {error.strerror or error}"
            ) from None
        return connection
