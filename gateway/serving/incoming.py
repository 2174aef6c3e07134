"""A request as aiohttp hands it over: its body under the gateway's limits and deadline, a
`Content-Encoding` the gateway cannot decode refused, and `Expect: 100-continue` refused
for a body that would be refused anyway."""

from __future__ import annotations

import asyncio

from aiohttp import HttpVersion11, web

from laneway.gateway.errors import ApiError, unreadable_body
from laneway.gateway.keys import SETTINGS

# Names the request's session for the sessionHash scorer (stickiness); ignored otherwise.
SESSION_HEADER = "x-laneway-session"
CHUNK_BYTES = 64 * 1024
# The codings aiohttp's parser decodes (br and zstd only with their libraries; without
# them the parser itself answers 400). Any other value, a list of codings included, it
# would pass through undecoded as if it were identity.
DECODED_CODINGS = frozenset({"identity", "gzip", "deflate", "br", "zstd"})


def unsupported_coding(request: web.Request) -> ApiError | None:
    """415 (RFC 9110 15.5.16) for a body in a coding the gateway cannot decode."""
    coding = request.headers.get("Content-Encoding")
    if coding is None or (coding.isascii() and coding.strip().lower() in DECODED_CODINGS):
        return None
    shown = coding[:40].encode("ascii", "backslashreplace").decode()
    return closing(
        ApiError(
            415,
            f"Content-Encoding {shown!r} is not supported: send the body uncompressed, "
            "or as gzip or deflate",
            "unsupported_content_encoding",
        )
    )


async def drop_undecodable(request: web.Request, response: web.StreamResponse) -> None:
    """Answer, then close, a connection whose compressed body was left unread or failed to
    decode. aiohttp would read the rest itself once the handler returns, and log the decode
    error it meets there as an unhandled exception."""
    content = request.content
    undecodable = content.exception() is not None
    if not undecodable and not (request.headers.get("Content-Encoding") and not content.is_eof()):
        return
    await response.prepare(request)
    await response.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()  # the answer is in the transport's buffer: it still goes


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than the limit of {limit} bytes", "body_too_large"
    )


def body_timed_out(deadline_s: float) -> ApiError:
    return ApiError(408, f"The request body did not arrive within {deadline_s:g} s", "body_timeout")


async def read_body(request: web.Request, limit: int, deadline_s: float) -> bytes:
    """The whole body: ApiError 413 past `limit` bytes (from Content-Length before reading),
    408 past `deadline_s`, 400 when it cannot be read (a bad chunk, a gzip header on plain
    text). A refused body's connection closes once answered: its unread bytes are no
    request."""
    if request.content_length is not None and request.content_length > limit:
        raise closing(body_too_large(limit))
    try:
        if request.content.is_eof():
            # The whole body came with the head (most requests): nothing to wait for.
            body = request.content.read_nowait()
        else:
            body = await _read_chunks(request, limit, deadline_s)
    except web.RequestPayloadError as error:
        raise closing(unreadable_body(error)) from None
    if len(body) > limit:
        raise closing(body_too_large(limit))
    return body


async def _read_chunks(request: web.Request, limit: int, deadline_s: float) -> bytes:
    chunks, size = [], 0
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.content.iter_chunked(CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise closing(body_too_large(limit))
                chunks.append(chunk)
    except TimeoutError:
        raise closing(body_timed_out(deadline_s)) from None
    return b"".join(chunks)


def closing(error: ApiError) -> ApiError:
    """`error`, answered on a connection that then closes: what the client still sends of
    a refused body is no request."""
    error.closes = True
    return error


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's `Expect: 100-continue` handling, except that a body declared past the limit
    gets its 413 at once instead of an invitation to send it."""
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return closing(body_too_large(limit)).response()
    if request.version != HttpVersion11:
        return None  # RFC 9110 15.2.1: no 1xx to an HTTP/1.0 client
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return closing(
            ApiError(417, f"Unknown Expect: {expect[:100]}", "expectation_failed")
        ).response()
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer's own bytes are still to come
    return None
