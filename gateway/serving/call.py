"""One completion request as the proxy sees it, and its way back to the client.

The proxy (`proxy.py`) needs little of an HTTP request: the app, when the request arrived,
two headers, who is asking, the body, and a way to answer (a whole response, or a stream
started, pushed chunk by chunk and ended). `Call` is that and no more, so the request path
runs the same under two shells: the gateway's own server (`server.py`), which serves the
completion routes on the connections it keeps, and `AiohttpCall` here, for completion
requests on connections handed over to aiohttp and for in-process test servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol

from aiohttp import HttpVersion11, web

from laneway.gateway.errors import ApiError, unreadable_body
from laneway.gateway.keys import ARRIVED
from laneway.gateway.serving.request_body import LANE_HEADER
from laneway.gateway.state.shared import Caller, caller_of

# Names the request's session for the sessionHash scorer (stickiness); ignored otherwise.
SESSION_HEADER = "x-laneway-session"


class Call(Protocol):
    """A completion request and its answer. The answer is given once: `answer`, or
    `start_stream` then `push`es and `end`.

    A stream's chunks are pushed, never awaited: the proxy writes them from the engine
    connection's callback as they arrive (no task woken per chunk), and holds the engine
    back itself while the client's buffer is full (`push` returns False, then
    `when_writable`)."""

    @property
    def app(self) -> web.Application: ...

    @property
    def arrived(self) -> float:
        """When its first bytes were read (the app's CLOCK): where its TTFT starts."""

    @property
    def lane(self) -> str | None:
        """The x-laneway-lane header."""

    @property
    def session(self) -> str | None:
        """The x-laneway-session header."""

    @property
    def caller(self) -> Caller | None:
        """Who asks; None when the state layer is not installed."""

    async def body(self, limit: int, deadline_s: float) -> bytes:
        """The whole body: ApiError 413 past `limit` bytes, 408 past `deadline_s`, 400 when
        it cannot be read."""

    def answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """A whole JSON response."""

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        """A 200 server-sent-event stream's head."""

    def push(self, chunk: bytes) -> bool:
        """Write one chunk of the stream now; False when the client's buffer is then over its
        high-water mark. ConnectionError when the client is gone."""

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the client's buffer is below its low-water mark again.
        A client lost meanwhile cancels the request where the shell cancels on disconnect;
        elsewhere the callback comes and the next push fails."""

    async def end(self) -> None:
        """The stream's end. ConnectionError when the client is gone."""

    def abort(self) -> None:
        """Drop the client's connection: a pending `send` fails."""


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than the limit of {limit} bytes", "body_too_large"
    )


def body_timed_out(deadline_s: float) -> ApiError:
    return ApiError(408, f"The request body did not arrive within {deadline_s:g} s", "body_timeout")


class AiohttpCall:
    """A `Call` on an aiohttp request; the handler returns `response` once it is answered."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.app = request.app
        self.arrived = request[ARRIVED]
        self.lane = request.headers.get(LANE_HEADER)
        self.session = request.headers.get(SESSION_HEADER)
        self.caller = caller_of(request)
        self._response: web.StreamResponse | None = None
        self._drain: asyncio.Task[None] | None = None

    @property
    def response(self) -> web.StreamResponse:
        assert self._response is not None, "the proxy answers every request"
        return self._response

    async def body(self, limit: int, deadline_s: float) -> bytes:
        request = self._request
        if request.content_length is not None and request.content_length > limit:
            raise body_too_large(limit)
        try:
            if request.content.is_eof():
                # The whole body came with the head (most requests): nothing to wait for.
                body = request.content.read_nowait()
            else:
                body = await self._read_chunks(limit, deadline_s)
        except web.RequestPayloadError as error:
            # A body that claims an encoding it does not have (a gzip header on plain text).
            raise unreadable_body(error) from None
        if len(body) > limit:
            raise body_too_large(limit)
        return body

    async def _read_chunks(self, limit: int, deadline_s: float) -> bytes:
        chunks, size = [], 0
        try:
            async with asyncio.timeout(deadline_s):
                async for chunk in self._request.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > limit:
                        raise body_too_large(limit)
                    chunks.append(chunk)
        except TimeoutError:
            raise body_timed_out(deadline_s) from None
        return b"".join(chunks)

    def answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self._response = web.Response(
            status=status, body=body, content_type="application/json", headers=headers
        )

    async def start_stream(self, headers: Mapping[str, str]) -> None:
        self._response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers},
        )
        if self._request.version >= HttpVersion11:  # `push` frames what it writes by this
            self._response.enable_chunked_encoding()
        await self._response.prepare(self._request)

    def push(self, chunk: bytes) -> bool:
        # Straight to the transport, framed as the prepared response frames (it sent its
        # head at `prepare`): aiohttp's own `write` is a coroutine to await per chunk.
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.response.chunked:
            transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
        else:
            transport.write(chunk)
        return not self._request.protocol.writing_paused

    def when_writable(self, callback: Callable[[], None]) -> None:
        async def drained() -> None:
            with contextlib.suppress(ConnectionError):  # the next push says it is gone
                await self._request.writer.drain()
            callback()

        self._drain = asyncio.get_running_loop().create_task(drained())

    async def end(self) -> None:
        await self.response.write_eof()

    def abort(self) -> None:
        if (transport := self._request.transport) is not None:
            transport.abort()
