"""The gateway's own HTTP/1.1 server for the completion routes, on asyncio protocols.

aiohttp's server builds a `Request` with header multidicts, runs a task per connection, a
middleware chain, a `Response` whose headers are prepared and written through a
`StreamWriter`, and for a stream one writer call per relayed chunk: 15-20 % of the gateway's
CPU per non-streaming request, and most of the rest after the engine's chunks are parsed in
a streamed one (docs/BENCHMARKS.md, "The hot path, fourth pass"). The two completion routes
are the traffic, so this server serves them itself: llhttp (via httptools) parses each
request in the protocol's `data_received`, the proxy runs as one task per request, and its
answer is written as framed bytes straight to the transport (a stream's chunks pushed
from the engine connection's callback, one `writelines` per chunk).

Everything else goes to aiohttp, unchanged: a request for another route (or one this server
leaves to it: an Upgrade, a Content-Encoding to decode, an unusual Expect) hands the whole
connection over, with the raw bytes of that request and all after it, to the protocol of the
aiohttp runner's server, behind `ArrivalStamps` as before. A completion request on a
connection already handed over is served by aiohttp's routes (the proxy behind `AiohttpCall`).
Only a request whose first byte began a read can be handed over (its bytes are known from
there; the normal case, as a client sends its next request after reading the answer); one
pipelined behind another in the same read gets the connection closed after the answers
before it (RFC 9112 9.3.2), and the client retries it.

What aiohttp gave the completion routes, kept here:
- the arrival stamp: a request's first bytes (`Call.arrived`), where its TTFT starts;
- the idle timeout: a connection that sends no whole request head within
  `clients.idleTimeoutMillis` of connecting or of its last answer is closed (a head sent a
  byte at a time too);
- limits on the head: a request target over 8190 bytes is a 400, a header field over 8190
  bytes, more than 128 fields or a head over 64 KiB a 431 (aiohttp's field limits), then the
  connection closes; a request llhttp cannot parse is a 400 and the connection closes;
- `maxBodyBytes` (413 from Content-Length before reading; 413 once a chunked body passes
  it) and the body deadline (`clients.bodyTimeoutMillis`, 408), the connection then closed;
- `Expect: 100-continue`, keep-alive, `Connection: close`, HTTP/1.0 (a stream to an HTTP/1.0
  client ends with the connection), pipelined completion requests answered in order;
- flow control: while the transport's buffer is over its high-water mark (`pause_writing`)
  a stream's push says so and the proxy stops reading from the engine until
  `resume_writing`; no more requests are read meanwhile; the write deadline is the proxy's
  (`_ClientWrites`);
- a client that disconnects cancels its request (the upstream is closed, so the engine
  stops), as aiohttp's `handler_cancellation=True` did;
- the tenant check (`identify`, the same function as aiohttp's tenant middleware), OpenAI-
  shaped errors for everything, a bug logged and answered 500 `internal_error`;
- a graceful drain: `begin_drain` closes idle connections and lets in-flight requests finish
  (their connections close after), `drained` waits for them up to the deadline and cancels
  the rest.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from http import HTTPStatus
from typing import cast

import httptools
from aiohttp import web

from laneway.gateway.errors import ApiError, bad_request, unreadable_body
from laneway.gateway.keys import CLOCK, INTERNAL_SECRET, SETTINGS
from laneway.gateway.serving.arrival import ArrivalStamps, ProtocolFactory
from laneway.gateway.serving.call import SESSION_HEADER, body_timed_out, body_too_large
from laneway.gateway.serving.proxy import handle_completion
from laneway.gateway.serving.request_body import LANE_HEADER, Endpoint
from laneway.gateway.state.shared import Caller, identify

log = logging.getLogger("laneway.gateway")

ROUTES = {b"/v1/chat/completions": Endpoint.CHAT, b"/v1/completions": Endpoint.COMPLETIONS}
MAX_TARGET_BYTES = 8190  # the request target (aiohttp's max_line_size)
MAX_FIELD_BYTES = 8190  # one header field, name and value (aiohttp's max_field_size)
MAX_FIELDS = 128  # aiohttp's max_headers
# A head's fields may hold this many bytes in all; and a head not complete this many bytes
# past the read it began in is refused too (a field that never ends): llhttp itself has no
# limit, and httptools keeps a field's bytes until the field ends.
MAX_HEAD_BYTES = 64 * 1024
# The headers the completion routes read, by lower-case name; the rest are skipped.
_READ = frozenset(
    {
        b"content-length",
        b"content-encoding",
        b"expect",
        b"authorization",
        b"x-laneway-internal",
        b"x-laneway-tenant",
        LANE_HEADER.encode(),
        SESSION_HEADER.encode(),
    }
)
# Past this many unsent bytes a stream's writes wait (pause_writing), as aiohttp's did.
WRITE_BUFFER_BYTES = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# How long a connection closed with its client still sending keeps reading (and dropping)
# what comes: a socket closed with unread bytes is reset, and the reset can destroy the
# answer before the client reads it (a 413 sent while the body still arrives). aiohttp's
# lingering close did the same, for as long.
LINGER_S = 10.0
_LAST_CHUNK = b"0\r\n\r\n"


class CompletionServer:
    """The listener's protocol factory and the registry of its connections."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.aiohttp_protocols: ProtocolFactory | None = None  # set once the runner is up
        self.clock: Callable[[], float] = app[CLOCK]
        settings = app[SETTINGS]
        self.max_body_bytes = settings.max_body_bytes
        self.idle_s = settings.clients.idle_timeout_millis / 1000
        # Asked once: a lookup that misses on an aiohttp app costs microseconds.
        self.tenants_installed = INTERNAL_SECRET in app
        self.connections: set[_Connection] = set()
        self.draining = False

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def hand_over_to(self, aiohttp_protocols: ProtocolFactory) -> None:
        """Where connections go for the other routes: an aiohttp runner's server."""
        self.aiohttp_protocols = aiohttp_protocols

    def begin_drain(self) -> None:
        """Close idle connections; busy ones close once their answer is written."""
        self.draining = True
        for connection in list(self.connections):
            connection.drain()

    async def drained(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the requests in flight, then cancel what is left."""
        tasks = {c.task for c in self.connections if c.task is not None}
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for connection in list(self.connections):
            connection.close()


async def listen(server: CompletionServer, host: str, port: int) -> asyncio.Server:
    return await asyncio.get_running_loop().create_server(server, host, port)


def drain_with(app: web.Application, server: CompletionServer, drain_s: float) -> None:
    """Drain `server` while the app's aiohttp runner drains its own connections: it begins
    first thing on shutdown and ends before the app's cleanup closes what requests use."""
    deadline = [0.0]

    async def begin(_: web.Application) -> None:
        deadline[0] = asyncio.get_running_loop().time() + drain_s
        server.begin_drain()

    async def end(_: web.Application) -> AsyncIterator[None]:
        yield
        await server.drained(max(0.0, deadline[0] - asyncio.get_running_loop().time()))

    app.on_shutdown.insert(0, begin)
    app.cleanup_ctx.append(end)  # the last one set up is the first torn down


class _Date:
    """The Date header's value, formatted at most once a second."""

    second = 0
    value = ""

    @classmethod
    def now(cls) -> str:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, email.utils.formatdate(second, usegmt=True)
        return cls.value


def _status_line(status: int) -> str:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return f"HTTP/1.1 {status} {reason}\r\n"


_STATUS_LINES = {status.value: _status_line(status.value) for status in HTTPStatus}


_CLOSE = "Connection: close\r\n"
_KEEP_ALIVE = "Connection: keep-alive\r\n"  # said only to HTTP/1.0 clients that asked


def _head(
    status: int, content_type: str, framing: str, headers: Mapping[str, str], connection: str
) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"{_STATUS_LINES.get(status) or _status_line(status)}Content-Type: {content_type}\r\n"
        f"{framing}{extra}Date: {_Date.now()}\r\nServer: laneway\r\n{connection}\r\n"
    ).encode()


class _Request:
    """One request: its head and body as parsed, and (as a `Call`) its answer."""

    __slots__ = (
        "_connection",
        "_waiter",
        "answered",
        "app",
        "arrived",
        "caller",
        "chunks",
        "closes",
        "complete",
        "endpoint",
        "error",
        "field_bytes",
        "fields",
        "headers",
        "http_1_0",
        "keep_alive",
        "raw",
        "size",
        "streaming",
        "target",
        "target_bytes",
        "too_large",
    )

    def __init__(self, connection: _Connection, arrived: float, raw: list[bytes] | None) -> None:
        self._connection = connection
        self.app = connection.server.app
        self.arrived = arrived
        self.raw = raw  # its bytes from its first, while its head is read; None: unknown
        self.target: list[bytes] = []
        self.target_bytes = 0
        self.fields = 0
        self.field_bytes = 0
        self.headers: dict[bytes, bytes] = {}
        self.endpoint = Endpoint.CHAT
        self.keep_alive = True
        self.http_1_0 = False
        self.caller: Caller | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.complete = False
        self.error: ApiError | None = None  # the body could not be read
        self._waiter: asyncio.Future[None] | None = None
        self.streaming = False
        self.answered = False  # the whole answer is written
        self.closes = False  # the connection closes after the answer

    # -- what the request says ------------------------------------------------------------

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.encode())
        return None if value is None else value.decode("utf-8", "surrogateescape")

    @property
    def lane(self) -> str | None:
        return self.header(LANE_HEADER)

    @property
    def session(self) -> str | None:
        return self.header(SESSION_HEADER)

    @property
    def content_length(self) -> int | None:
        value = self.headers.get(b"content-length")
        return None if value is None else int(value)  # llhttp took only digits

    # -- the body, as the parser delivers it ----------------------------------------------

    def add_body(self, data: bytes, limit: int) -> None:
        if self.too_large:
            return
        self.size += len(data)
        if self.size > limit:
            self.too_large, self.chunks = True, []
            self._wake()
        else:
            self.chunks.append(data)

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: ApiError) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def body(self, limit: int, deadline_s: float) -> bytes:
        length = self.content_length
        if length is not None and length > limit:
            raise body_too_large(limit)
        if not (self.complete or self.too_large or self.error):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(deadline_s):
                    await self._waiter
            except TimeoutError:
                raise body_timed_out(deadline_s) from None
            finally:
                self._waiter = None
        if self.error is not None:
            raise self.error
        if self.too_large or self.size > limit:
            raise body_too_large(limit)
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)

    # -- the answer -----------------------------------------------------------------------

    def _connection_header(self) -> str:
        self.closes = (
            self.closes
            or not self.keep_alive
            or not self.complete  # unread body bytes would be read as the next request
            or self._connection.server.draining
        )
        if self.closes:
            return _CLOSE
        return _KEEP_ALIVE if self.http_1_0 else ""

    def answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        framing = f"Content-Length: {len(body)}\r\n"
        head = _head(status, "application/json", framing, headers, self._connection_header())
        self.answered = True
        self._connection.write((head, body))

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        if self.http_1_0:
            self.closes = True  # no chunked framing: the stream ends with the connection
            framing = ""
        else:
            framing = "Transfer-Encoding: chunked\r\n"
        stream_headers = {"Cache-Control": "no-cache", **headers}
        # Sent at once, as aiohttp's StreamResponse does: the client learns the route (and
        # its openai call returns) before the first token, which may be seconds away.
        head = _head(200, "text/event-stream", framing, stream_headers, self._connection_header())
        self.streaming = True
        await self._connection.send((head,))

    def push(self, chunk: bytes) -> bool:
        connection = self._connection
        connection.write_now(
            (chunk,) if self.http_1_0 else (b"%x\r\n" % len(chunk), chunk, b"\r\n")
        )
        return not connection.writing_paused

    def when_writable(self, callback: Callable[[], None]) -> None:
        if self._connection.writing_paused:
            self._connection.on_writable = callback
        else:
            callback()

    async def end(self) -> None:
        if not self.http_1_0:
            await self._connection.send((_LAST_CHUNK,))
        self.answered = True

    def abort(self) -> None:
        self._connection.abort()


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: the rest is not this server's."""


class _Connection(asyncio.Protocol):
    """One client connection, until it closes or is handed over to aiohttp."""

    def __init__(self, server: CompletionServer) -> None:
        self.server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parsing: _Request | None = None  # the request whose bytes are being read
        self._serving: _Request | None = None  # the request whose answer is being made
        self.task: asyncio.Task[None] | None = None  # the proxy serving it
        self._queue: deque[_Request] = deque()  # pipelined requests, read and waiting
        self._chunk = b""  # the read being parsed
        self._fresh = False  # it began between two requests
        self._in_head = False  # a request's head is being read
        self._head_began_here = False  # in the read being parsed
        self._head_bytes = 0  # read since the read the head began in
        # Once the answers owed are written: hand over, refuse, or close. Nothing more is
        # parsed meanwhile; `_held` keeps what is read for a handover.
        self._then: Callable[[], None] | None = None
        self._held: list[bytes] | None = None
        self._draining = False
        self._lingering = False  # answered and closing: what still arrives is dropped
        self._reading_paused = False
        self.writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self.on_writable: Callable[[], None] | None = None  # a stream's, once writes resume
        self._idle_since: float | None = None  # waiting for a head since then
        self._idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # as aiohttp does
        self.server.connections.add(self)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.server.connections.discard(self)
        self._stop_idle_timer()
        self._queue.clear()
        self.on_writable = None  # the task is cancelled below: nothing is pushed any more
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            # The stream's pending write fails: the proxy sees its client gone.
            waiter.set_exception(ConnectionResetError("the client closed the connection"))
        elif self.task is not None and self._serving is not None and not self._serving.answered:
            self.task.cancel()  # the client left: the proxy closes the upstream

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        callback, self.on_writable = self.on_writable, None
        if callback is not None:
            callback()
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._then is not None:
            if self._held is not None:
                self._held.append(data)
            return
        parsing = self._parsing
        self._fresh = parsing is None
        if parsing is not None and parsing.raw is not None:
            parsing.raw.append(data)  # more of a head whose bytes are kept
        self._chunk, self._head_began_here = data, False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            if self._then is None:  # else a callback stopped it (an Upgrade goes to aiohttp)
                self._parse_error(error)
        finally:
            self._chunk = b""
        if self._in_head and self._then is None:
            if not self._head_began_here:
                self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, f"The request head is over {MAX_HEAD_BYTES} bytes")
        self._follow_up()
        self._update_reading()

    # -- llhttp callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        raw = [self._chunk] if self._fresh else None
        self._fresh = False
        self._in_head, self._head_began_here, self._head_bytes = True, True, 0
        self._parsing = _Request(self, self.server.clock(), raw)

    def on_url(self, url: bytes) -> None:
        request = self._parsing
        assert request is not None
        request.target_bytes += len(url)
        if request.target_bytes > MAX_TARGET_BYTES:
            self._refuse(400, f"The request target is over {MAX_TARGET_BYTES} bytes")
            raise _Stop
        request.target.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        request.fields += 1
        request.field_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if request.field_bytes > MAX_HEAD_BYTES:
            self._refuse(431, f"The request head is over {MAX_HEAD_BYTES} bytes")
            raise _Stop
        if len(name) + len(value) > MAX_FIELD_BYTES or request.fields > MAX_FIELDS:
            self._refuse(
                431,
                f"A request header is over {MAX_FIELD_BYTES} bytes, or there are over "
                f"{MAX_FIELDS} of them",
            )
            raise _Stop
        lower = name.lower()
        if lower in _READ:
            request.headers[lower] = value

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        self._in_head = False
        self._idle_since = None  # a whole head came
        target = request.target[0] if len(request.target) == 1 else b"".join(request.target)
        endpoint = ROUTES.get(target.partition(b"?")[0])
        parser = self._parser
        expect = request.headers.get(b"expect")
        if (
            endpoint is None
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
            or request.headers.get(b"content-encoding", b"identity").lower() != b"identity"
            or (expect is not None and expect.lower() != b"100-continue")
        ):
            self._hand_over(request)
            raise _Stop
        assert endpoint is not None
        request.endpoint = endpoint
        request.keep_alive = parser.should_keep_alive()
        request.http_1_0 = parser.get_http_version() == "1.0"
        request.raw = None
        if self._serving is None:
            self._serve(request)
        else:
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        assert self._parsing is not None
        self._parsing.add_body(body, self.server.max_body_bytes)

    def on_message_complete(self) -> None:
        assert self._parsing is not None
        self._parsing.finish()
        self._parsing = None

    # -- serving --------------------------------------------------------------------------

    def _serve(self, request: _Request) -> None:
        self._serving = request
        if (
            request.headers.get(b"expect") is not None
            and not request.http_1_0  # RFC 9110 15.2.1: no 1xx to an HTTP/1.0 client
            and not request.complete
            and not request.too_large
            and not (request.content_length or 0) > self.server.max_body_bytes
        ):
            self.write((_CONTINUE,))
        self.task = self._loop.create_task(self._run(request))

    async def _run(self, request: _Request) -> None:
        try:
            if self.server.tenants_installed:
                request.caller = identify(request.app, request.header)
            await handle_completion(request, request.endpoint)
        except ApiError as error:
            request.answer(error.status, error.encoded(), error.headers())
        except Exception:
            log.exception("unhandled error on POST %s", request.endpoint.value)
            if request.streaming:
                self.abort()
            else:
                bug = ApiError(500, "The gateway failed on this request", "internal_error")
                request.closes = True
                request.answer(bug.status, bug.encoded(), {})
        finally:
            self.task = None
            self._serving = None
            if self._transport is not None:
                self._answered(request)

    def _answered(self, request: _Request) -> None:
        """The answer is written: serve the next request, or do what waits, or rest."""
        if request.answered and not request.complete:
            self.close_lingering()  # answered before its whole body came (a 413, a 401)
        elif request.closes or self._draining or not request.answered:
            self.close()
        elif self._queue:
            self._serve(self._queue.popleft())
        elif self._then is not None:
            self._follow_up()
        else:
            self._await_head()
        self._update_reading()

    def _follow_up(self) -> None:
        """Do what waits (hand over, refuse, close) once no answer is owed any more."""
        then = self._then
        if then is None or self._serving is not None or self._queue:
            return
        self._then = None
        then()

    # -- handing over, refusing -----------------------------------------------------------

    def _hand_over(self, request: _Request) -> None:
        if request.raw is None:
            # Pipelined in one read behind another request: where it starts is unknown.
            self._then = self.close
            return
        self._held = request.raw
        self._then = self._give_to_aiohttp

    def _give_to_aiohttp(self) -> None:
        transport, held = self._transport, self._held
        protocols = self.server.aiohttp_protocols
        assert transport is not None
        assert held is not None
        assert protocols is not None
        if self.server.draining:
            self.close()
            return
        self._stop_idle_timer()
        self._transport, self._held = None, None
        self.server.connections.discard(self)
        inner = ArrivalStamps(protocols(), self.server.clock)
        transport.set_protocol(inner)
        inner.connection_made(transport)
        if self.writing_paused:
            inner.pause_writing()
        if self._reading_paused:
            transport.resume_reading()
        inner.data_received(b"".join(held))

    def _refuse(self, status: int, message: str) -> None:
        code = "request_header_fields_too_large" if status == 431 else "invalid_request"
        self._then = lambda: self._answer_and_close(ApiError(status, message, code))

    def _parse_error(self, error: httptools.HttpParserError) -> None:
        refusal = bad_request(f"The request is not valid HTTP/1.1: {error}")
        parsing = self._parsing
        if parsing is not None and not self._in_head:
            # The head was read (the request is served or queued): its body is broken.
            parsing.fail(unreadable_body(error))
            self._then = self.close
        else:
            self._then = lambda: self._answer_and_close(refusal)

    def _answer_and_close(self, error: ApiError) -> None:
        head = _head(
            error.status,
            "application/json",
            f"Content-Length: {len(error.encoded())}\r\n",
            error.headers(),
            _CLOSE,
        )
        self.write((head, error.encoded()))
        self.close_lingering()

    # -- writing --------------------------------------------------------------------------

    def write(self, data: tuple[bytes, ...]) -> None:
        if self._transport is not None:
            self._transport.writelines(data)

    async def send(self, data: tuple[bytes, ...]) -> None:
        self.write_now(data)
        if self.writing_paused:
            await self.drained()

    def write_now(self, data: tuple[bytes, ...]) -> None:
        """Write `data` to a client that is still there; ConnectionResetError if it is not."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.writelines(data)

    async def drained(self) -> None:
        """Until the transport's buffer is below its low-water mark again."""
        self._drain_waiter = self._loop.create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def close_lingering(self) -> None:
        """Close after the answer, reading what the client still sends for up to LINGER_S."""
        transport = self._transport
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            self.close()
            return
        self._lingering = True
        transport.write_eof()  # the client reads the answer, then the end of the connection
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._loop.call_later(LINGER_S, self.close)

    def drain(self) -> None:
        self._draining = True
        if self._serving is None:
            self.close()

    # -- reading and idling ---------------------------------------------------------------

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._lingering:
            return
        pause = bool(self._queue) or self._then is not None or self.writing_paused
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _await_head(self) -> None:
        self._idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(
                self._idle_since + self.server.idle_s, self._check_idle
            )

    def _check_idle(self) -> None:
        """The idle timeout: one timer per connection, re-armed at most once per timeout,
        where one per request cost a timer per keep-alive request."""
        self._idle_timer = None
        since = self._idle_since
        if since is None or self._transport is None:
            return  # a head came: the next wait arms it again
        if self._loop.time() - since >= self.server.idle_s:
            self.close()
        else:
            self._idle_timer = self._loop.call_at(since + self.server.idle_s, self._check_idle)

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
