"""The push relay: what the engine streams reaches the client whole, in order, and no faster
than the client reads it.

`laneway gateway` runs against scripted engines on loopback that record what they managed to
write: one floods a stream far larger than the sockets between them can buffer, one sends
its events in bursts (many events in one write, so the gateway reads them in one go). Both
serve under another name than the client asks for, so every event is renamed on the way.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from support.client import requests_by_status, scrape, total
from support.engines import scripted_engine
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.procs import ChildProcess, Children

in_the_rigs_loop = pytest.mark.asyncio(loop_scope="module")

FLOOD_EVENTS = 10_000
PADDING = "x" * 4000  # ~4 KB an event: ~40 MB in all, far over any socket buffers on the way
BURSTS = 20
EVENTS_PER_BURST = 100
PATIENCE_S = 120.0


def event(served: str, index: int, padding: str = "") -> bytes:
    choice = {"index": 0, "delta": {"content": f" token-{index}{padding}"}, "finish_reason": None}
    document = {"id": "x", "object": "chat.completion.chunk", "model": served, "choices": [choice]}
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass
class Written:
    """How many events a scripted engine has written (its writes wait while the gateway
    does not read)."""

    events: int = 0
    sent: list[bytes] = field(default_factory=list)


def engine(script: str, written: Written) -> web.Application:
    async def stream(response: web.StreamResponse) -> None:
        if script == "flood":
            for index in range(FLOOD_EVENTS):
                await response.write(event("served-flood", index, PADDING))
                written.events += 1
        else:
            for burst in range(BURSTS):
                first = burst * EVENTS_PER_BURST
                data = b"".join(event("served-burst", i) for i in range(first, first + 100))
                written.sent.append(data)
                await response.write(data)  # one write: the gateway reads it in one go
                written.events += EVENTS_PER_BURST
                await asyncio.sleep(0.01)
        await response.write(DONE)

    return scripted_engine(stream)


WHOLE_EVENTS = 3


async def answer_whole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine whose whole streamed answer leaves in one write with its head."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    body = b"".join(event("served-whole", i) for i in range(WHOLE_EVENTS)) + DONE
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await reader.read()  # until the gateway closes or reuses it no more
    writer.close()


@dataclass(frozen=True)
class Rig:
    gateway: ChildProcess
    written: dict[str, Written]


@pytest_asyncio.fixture(loop_scope="module")
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    runners, documents, written = [], [], {}
    whole: asyncio.Server | None = None
    try:
        for script in ("flood", "burst"):
            written[script] = Written()
            runner = web.AppRunner(engine(script, written[script]), handler_cancellation=True)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            served = f"served-{script}"
            documents.append(
                pool_doc(script, "interactive", served, [url], routing={"models": [script]})
            )
        whole = await asyncio.start_server(answer_whole, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{whole.sockets[0].getsockname()[1]}"
        documents.append(
            pool_doc("whole", "interactive", "served-whole", [url], routing={"models": ["whole"]})
        )
        # The flood's client pauses for as long as the test takes to see the engine stop.
        config = gateway_doc(clients={"writeTimeoutMillis": 600_000})
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump_all([*documents, config]))
        with Children() as children:
            args = ["--config", str(path), "--host", "127.0.0.1", "--port", "0"]
            yield Rig(await children.start_laneway_async("gateway", args), written)
    finally:
        for runner in runners:
            await runner.cleanup()
        if whole is not None:
            whole.close()


def request_bytes(gateway: ChildProcess, model: str) -> bytes:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "go"}], "stream": True}
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 answer."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body: list[bytes] = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return b"".join(body)
        body.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


async def settled(written: Written) -> int:
    """The engine's count of written events once it stops changing: the engine is either
    done or held back by the sockets."""
    async with asyncio.timeout(PATIENCE_S):
        last, still = -1, 0
        while still < 10:  # unchanged over ten polls in a row
            await asyncio.sleep(0.2)
            still = still + 1 if written.events == last else 0
            last = written.events
    return last


@in_the_rigs_loop
async def test_a_client_that_stops_reading_holds_the_engine_back_and_then_gets_it_all(
    rig: Rig,
) -> None:
    written = rig.written["flood"]
    host, port = rig.gateway.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    # A reader that buffers little before it stops reading from the socket.
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    try:
        writer.write(request_bytes(rig.gateway, "flood"))
        await writer.drain()
        async with asyncio.timeout(PATIENCE_S):
            while written.events == 0:  # noqa: ASYNC110 (the engine's own count)
                await asyncio.sleep(0.05)
        held_at = await settled(written)
        # Had the gateway kept reading, the engine would have written all of it.
        assert held_at < FLOOD_EVENTS
        parts: list[bytes] = []
        async with asyncio.timeout(PATIENCE_S):
            while not b"".join(parts[-2:]).endswith(b"\r\n0\r\n\r\n"):
                parts.append(await reader.read(1 << 20))
                assert parts[-1], "the gateway closed the stream"
        raw = b"".join(parts)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.1 200")
    assert written.events == FLOOD_EVENTS
    expected = b"".join(event("flood", i, PADDING) for i in range(FLOOD_EVENTS)) + DONE
    assert dechunk(raw) == expected  # renamed, whole, in order
    async with asyncio.timeout(PATIENCE_S):
        while not (counted := await requests_by_status(rig.gateway, "flood")):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert counted == {"200": 1}


@in_the_rigs_loop
@pytest.mark.parametrize("server", ["gateway's own", "handed over to aiohttp"])
async def test_bursts_of_events_read_in_one_go_are_relayed_intact_and_in_order(
    rig: Rig, server: str
) -> None:
    written = rig.written["burst"]
    written.sent.clear()
    connector = aiohttp.TCPConnector(limit=1)  # one connection: the stream reuses it
    async with aiohttp.ClientSession(connector=connector) as session:
        if server == "handed over to aiohttp":
            async with session.get(f"{rig.gateway.url}/healthz") as health:
                assert health.status == 200
        body: dict[str, Any] = {
            "model": "burst",
            "messages": [{"role": "user", "content": "go"}],
            "stream": True,
        }
        async with session.post(f"{rig.gateway.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["x-laneway-pool"] == "burst"
            relayed = await response.read()
    sent = b"".join(written.sent) + DONE
    assert sent.count(b'"model":"served-burst"') == BURSTS * EVENTS_PER_BURST
    assert relayed == sent.replace(b'"model":"served-burst"', b'"model":"burst"')


@in_the_rigs_loop
async def test_a_stream_that_arrives_whole_with_its_head_is_relayed_and_timed(rig: Rig) -> None:
    """Its first token, end and all are pushed before the relay task first waits."""
    body = {"model": "whole", "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rig.gateway.url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        relayed = await response.read()
    expected = b"".join(event("whole", i) for i in range(WHOLE_EVENTS)) + DONE
    assert relayed == expected
    samples = await scrape(rig.gateway.url)
    labels = {"pool": "whole", "lane": "interactive"}
    assert total(samples, "laneway_gateway_ttft_seconds_count", **labels) == 1
    assert await requests_by_status(rig.gateway, "whole") == {"200": 1}
