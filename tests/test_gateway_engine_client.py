"""The gateway's requests to its engines: one aiohttp session, connections kept alive, a
stream cut when its client leaves, and every way an engine can fail answered as a 503
before the client has seen a byte.

In-process: the gateway's app factory behind aiohttp's test server, stand-in engines that
note what they saw on loopback (aiohttp apps, or bare sockets for answers that are not HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler
from support.engines import engine_app
from support.pools import simulated_pool

from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, ScrapeSettings, UpstreamSettings
from laneway.gateway.pools.sources import StaticPoolSource

BIG_BYTES = 1024 * 1024  # past any one read of the engine's socket
TEXT = {"model": "m", "prompt": "hi", "max_tokens": 3}


class Engine:
    """A stand-in engine that notes what it saw: connections, bodies, streams cut off."""

    def __init__(self) -> None:
        self.peers: list[object] = []
        self.bodies: list[dict[str, Any]] = []
        self.stream_cut = asyncio.Event()
        self.scraped = asyncio.Event()
        self.stall = asyncio.Event()
        self.big = False

    def app(self) -> web.Application:
        app = engine_app(self.generate)
        app.middlewares.append(self.note_peer)
        return app

    @web.middleware
    async def note_peer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request's client port, the gateway's scrapes and probes too."""
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        if request.path == "/metrics":
            self.scraped.set()
        return await handler(request)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        if self.bodies[-1].get("user") == "stall":
            await self.stall.wait()
        if not self.bodies[-1].get("stream"):
            text = "x" * BIG_BYTES if self.big else "ok"
            return web.json_response({"model": "m", "choices": [{"index": 0, "text": text}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(10_000):
                await response.write(
                    b'data: {"choices": [{"index": 0, "text": " t%d"}]}\n\n' % index
                )
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            self.stream_cut.set()
            raise
        return response


@contextlib.asynccontextmanager
async def gateway(url: str, **upstream: Any) -> AsyncIterator[TestClient[Any, Any]]:
    """The gateway in-process, one pool for model "m" on the engine at `url`, which it
    scrapes once as it starts and then not for ten minutes."""
    settings = GatewaySettings(
        upstream=replace(UpstreamSettings(), **upstream),
        scrape=ScrapeSettings(interval_millis=600_000),
    )
    pool = simulated_pool("solo", [url], routing={"models": ["m"]})
    async with TestClient(TestServer(create_app(settings, StaticPoolSource([pool])))) as client:
        yield client


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    fake = Engine()
    async with TestServer(fake.app()) as server:
        yield fake, f"http://127.0.0.1:{server.port}"


async def test_answers_are_relayed_and_connections_kept_alive(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    async with gateway(url) as client:
        await asyncio.wait_for(fake.scraped.wait(), timeout=30)
        for index in range(3):
            response = await client.post("/v1/completions", json={**TEXT, "max_tokens": index + 1})
            assert response.status == 200
            assert (await response.json())["choices"][0]["text"] == "ok"
    assert [body["max_tokens"] for body in fake.bodies] == [1, 2, 3]
    # One connection (one client port) carried the scrape and all three.
    assert len(fake.peers) == 4
    assert len(set(fake.peers)) == 1


async def test_a_large_answer_arrives_whole(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    fake.big = True
    async with gateway(url) as client:
        response = await client.post("/v1/completions", json=TEXT)
        assert response.status == 200
        assert (await response.json())["choices"][0]["text"] == "x" * BIG_BYTES


async def test_a_client_that_leaves_a_stream_cuts_it_at_the_engine(
    engine: tuple[Engine, str],
) -> None:
    fake, url = engine
    async with gateway(url) as client:
        response = await client.post("/v1/completions", json={**TEXT, "stream": True})
        assert response.status == 200
        assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
        response.close()
        await asyncio.wait_for(fake.stream_cut.wait(), timeout=30)


async def test_an_engine_that_answers_nothing_times_out(engine: tuple[Engine, str]) -> None:
    fake, url = engine
    async with gateway(url, read_timeout_millis=200, health_timeout_millis=200) as client:
        response = await client.post("/v1/completions", json={**TEXT, "user": "stall"})
        fake.stall.set()
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == "no_healthy_endpoint"
        assert "Timeout" in error["message"]


def unused_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port: int = unused.getsockname()[1]
        return port


async def test_an_engine_that_is_not_there_is_a_503_naming_it() -> None:
    port = unused_port()
    async with gateway(f"http://127.0.0.1:{port}") as client:
        response = await client.post("/v1/completions", json=TEXT)
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == "no_healthy_endpoint"
        assert f"127.0.0.1:{port}" in error["message"]
        assert "Cannot connect" in error["message"]


@contextlib.asynccontextmanager
async def raw_engine(answer: bytes, hang_up_first: bool) -> AsyncIterator[str]:
    """An engine on a bare socket that reads one request head and writes `answer`, then hangs
    up at once (`hang_up_first`) or once the client has; yields its URL. Its health probe
    and scrape get the same answer."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            if not hang_up_first:
                await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("answer", "hang_up_first", "said"),
    [
        # (what the engine writes, whether it hangs up before the gateway does, the message)
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", True, "ClientPayloadError"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", False, "ClientResponseError"),
    ],
    ids=["cut-short", "not-http"],
)
async def test_an_answer_that_breaks_is_a_503(
    answer: bytes, hang_up_first: bool, said: str
) -> None:
    async with raw_engine(answer, hang_up_first) as url, gateway(url) as client:
        response = await client.post("/v1/completions", json=TEXT)
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == "no_healthy_endpoint"
        assert said in error["message"]
