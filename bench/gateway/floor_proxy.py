"""The least a Python proxy can do per request: the floor `bench gateway --against` measures.

`python -m laneway.bench.gateway.floor_proxy --port P --worker-urls URL...` forwards each POST
to the next engine in turn, its body untouched, over kept-alive connections, and hands the answer
back: a JSON answer whole, with its length; an SSE answer chunk by chunk, each written to the
client from the engine connection's callback. It parses nothing but HTTP (llhttp, through
httptools, on the gateway's event loop: what its own server and client use), so its CPU per request
is what the event loop and the system calls cost, and laneway's excess over it is the cost of
its own work: parsing, counting, routing, admission, metrics, the log.

It is a measuring stick, not a router: no errors are answered, no timeouts kept, nothing
retried. A client that goes away mid-answer aborts the engine's connection.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Iterator, Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from laneway.gateway.cli import event_loop_factory

READY_LINE = "floor proxy: listening on "


class _Engine:
    """One engine's address and its idle connections."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode()
        self.idle: list[_EngineConnection] = []


class _EngineConnection(asyncio.Protocol):
    """A kept-alive connection to an engine, reading one answer at a time for one client."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.client: _ClientConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._chunked = False
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self in self.engine.idle:
            self.engine.idle.remove(self)
        if self.client is not None:
            self.client.abort()

    def send(self, client: _ClientConnection, path: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.client = client
        self.transport.writelines(
            (
                b"POST " + path + b" HTTP/1.1\r\nHost: " + self.engine.host_header
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n",
                body,
            )
        )  # fmt: skip

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            self._chunked = True

    def on_headers_complete(self) -> None:
        if self._chunked and self.client is not None:
            self.client.start_stream(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if not self._chunked:
            self._body.append(body)
        elif self.client is not None:
            self.client.write_chunk(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            if self._chunked:
                client.end_stream()
            else:
                client.answer(self._parser.get_status_code(), b"".join(self._body))
        self._chunked, self._body = False, []
        self.engine.idle.append(self)


class _ClientConnection(asyncio.Protocol):
    """A client's kept-alive connection: one request at a time, forwarded as it completes."""

    def __init__(self, engines: Iterator[_Engine]) -> None:
        self._engines = engines
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._path = b"/"
        self._body: list[bytes] = []
        self._upstream: _EngineConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        upstream, self._upstream = self._upstream, None
        if upstream is not None and upstream.client is self and upstream.transport is not None:
            upstream.transport.abort()

    def on_url(self, url: bytes) -> None:
        self._path = url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body, self._body = b"".join(self._body), []
        engine = next(self._engines)
        if engine.idle:
            self._forward(engine.idle.pop(), body)
        else:
            asyncio.get_running_loop().create_task(self._connect_and_forward(engine, body))

    async def _connect_and_forward(self, engine: _Engine, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _EngineConnection(engine), engine.host, engine.port
            )
        except OSError:
            self.abort()
            return
        self._forward(connection, body)

    def _forward(self, connection: _EngineConnection, body: bytes) -> None:
        self._upstream = connection
        connection.send(self, self._path, body)

    def answer(self, status: int, body: bytes) -> None:
        self._upstream = None
        if self._transport is not None:
            self._transport.writelines(
                (
                    b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d"
                    b"\r\n\r\n" % (status, len(body)),
                    body,
                )
            )

    def start_stream(self, status: int) -> None:
        if self._transport is not None:
            self._transport.write(
                b"HTTP/1.1 %d OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" % status
            )

    def write_chunk(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))

    def end_stream(self) -> None:
        self._upstream = None
        if self._transport is not None:
            self._transport.write(b"0\r\n\r\n")

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


def argv(worker_urls: Sequence[str], port: int = 0) -> list[str]:
    """The command that starts this proxy in front of `worker_urls`, by this Python."""
    module = [sys.executable, "-P", "-m", "laneway.bench.gateway.floor_proxy"]
    return [*module, "--port", str(port), "--worker-urls", *worker_urls]


async def serve(host: str, port: int, worker_urls: Sequence[str]) -> None:
    engines = itertools.cycle([_Engine(url) for url in worker_urls])
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _ClientConnection(engines), host, port)
    bound = server.sockets[0].getsockname()[1]
    print(f"{READY_LINE}http://{host}:{bound}", flush=True)
    await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m laneway.bench.gateway.floor_proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(args.host, args.port, args.worker_urls))


if __name__ == "__main__":
    main()
