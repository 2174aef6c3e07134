"""The gateway's own HTTP/1.1 client to the engines, against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from laneway.gateway.serving.upstream import (
    BUFFER_BYTES,
    UpstreamError,
    UpstreamLimits,
    UpstreamPool,
    UpstreamResponse,
)

LIMITS = UpstreamLimits(connect_s=5.0, read_s=30.0)


class Engine:
    """A stand-in engine that notes what it saw: connections, bodies, streams cut off."""

    def __init__(self) -> None:
        self.peers: list[object] = []
        self.bodies: list[bytes] = []
        self.stream_cut = asyncio.Event()
        self.stall = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/stream", self.stream)
        app.router.add_post("/v1/stall", self.stalled)
        app.router.add_post("/v1/big", self.big)
        return app

    async def complete(self, request: web.Request) -> web.Response:
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        self.bodies.append(await request.read())
        return web.json_response({"model": "m", "choices": []})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(10_000):
                await response.write(f"data: {index}\n\n".encode())
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            self.stream_cut.set()
            raise
        return response

    async def stalled(self, request: web.Request) -> web.Response:
        await self.stall.wait()
        return web.json_response({})

    async def big(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (4 * BUFFER_BYTES))


@pytest.fixture
async def engine(aiohttp_server: AiohttpServer) -> tuple[Engine, str]:
    engine = Engine()
    server = await aiohttp_server(engine.app())
    return engine, f"http://127.0.0.1:{server.port}"


async def test_answers_are_read_and_connections_kept_alive(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    pool = UpstreamPool(LIMITS)
    for index in range(3):
        answer = await pool.post(url, "/v1/completions", b'{"n": %d}' % index)
        assert answer.status == 200
        assert await answer.read() == b'{"model": "m", "choices": []}'
        answer.release()
    pool.close()
    assert fake.bodies == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    # One connection (one client port) carried all three.
    assert len(set(fake.peers)) == 1


async def test_a_large_body_arrives_whole_through_the_paused_reads(
    engine: tuple[Engine, str],
) -> None:
    _, url = engine
    pool = UpstreamPool(LIMITS)
    answer = await pool.post(url, "/v1/big", b"{}")
    assert await answer.read() == b"x" * (4 * BUFFER_BYTES)
    answer.release()
    pool.close()


async def test_closing_a_stream_tells_the_engine(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    pool = UpstreamPool(LIMITS)
    answer = await pool.post(url, "/v1/stream", b"{}")
    assert (await answer.readany()).startswith(b"data: 0")
    answer.close()
    await asyncio.wait_for(fake.stream_cut.wait(), timeout=30)
    pool.close()


class HoldingSink:
    """A stream sink whose client is always full: it pauses the reads after each one, and
    resumes them only when told."""

    def __init__(self, answer: UpstreamResponse) -> None:
        self.answer = answer
        self.data: list[bytes] = []
        self.end: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.pushed = asyncio.Event()

    def received(self, data: bytes, at: float) -> None:
        self.data.append(data)
        self.answer.pause_reading()
        self.pushed.set()

    def ended(self, error: Exception | None) -> None:
        self.end.set_result(error)


async def test_a_pushed_answer_ends_whole_and_its_paused_connection_serves_the_next(
    engine: tuple[Engine, str],
) -> None:
    fake, url = engine
    pool = UpstreamPool(LIMITS)
    answer = await pool.post(url, "/v1/completions", b'{"n": 0}')
    sink = HoldingSink(answer)
    answer.push_to(sink)
    assert await asyncio.wait_for(sink.end, timeout=30) is None
    assert b"".join(sink.data) == b'{"model": "m", "choices": []}'
    answer.release()  # paused by the sink as the answer ended
    again = await asyncio.wait_for(pool.post(url, "/v1/completions", b'{"n": 1}'), timeout=30)
    assert await again.read() == b'{"model": "m", "choices": []}'
    again.release()
    pool.close()
    assert len(set(fake.peers)) == 1  # the same connection, reading again


async def test_a_pushed_stream_waits_while_paused_and_goes_on_when_resumed(
    engine: tuple[Engine, str],
) -> None:
    fake, url = engine
    pool = UpstreamPool(LIMITS)
    answer = await pool.post(url, "/v1/stream", b"{}")
    sink = HoldingSink(answer)
    answer.push_to(sink)
    for _ in range(3):
        await asyncio.wait_for(sink.pushed.wait(), timeout=30)
        sink.pushed.clear()
        answer.resume_reading()
    relayed = b"".join(sink.data)
    assert relayed.startswith(b"data: 0\n\ndata: 1\n\n")  # in order, nothing lost
    assert not sink.end.done()
    answer.close()
    await asyncio.wait_for(fake.stream_cut.wait(), timeout=30)
    pool.close()


async def test_an_engine_that_answers_nothing_times_out(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    pool = UpstreamPool(UpstreamLimits(connect_s=5.0, read_s=0.2))
    with pytest.raises(TimeoutError):
        await pool.post(url, "/v1/stall", b"{}")
    fake.stall.set()
    pool.close()


async def test_an_engine_that_is_not_there_is_an_upstream_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    pool = UpstreamPool(LIMITS)
    with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
        await pool.post(f"http://127.0.0.1:{port}", "/v1/completions", b"{}")


@contextlib.asynccontextmanager
async def raw_engine(answer: bytes, hang_up_first: bool) -> AsyncIterator[str]:
    """An engine on a bare socket that reads one request head and writes `answer`, then hangs
    up at once (`hang_up_first`) or once the client has; yields its URL."""
    served = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if not hang_up_first:
            await reader.read()  # until the client hangs up
        writer.close()
        await writer.wait_closed()
        served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        await served.wait()
    finally:
        server.close()
        await server.wait_closed()


async def test_an_answer_cut_short_is_an_upstream_error() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part"
    async with raw_engine(answer, hang_up_first=True) as url:
        pool = UpstreamPool(LIMITS)
        response = await pool.post(url, "/v1/completions", b"{}")
        with pytest.raises(UpstreamError, match="closed the connection mid-answer"):
            await response.read()
        response.release()


async def test_an_answer_that_is_not_http_is_an_upstream_error() -> None:
    async with raw_engine(b"SSH-2.0-OpenSSH\r\n\r\n", hang_up_first=False) as url:
        pool = UpstreamPool(LIMITS)
        with pytest.raises(UpstreamError, match="not valid HTTP"):
            await pool.post(url, "/v1/completions", b"{}")
