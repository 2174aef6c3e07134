"""The least a Python proxy can do per request: the floor `bench gateway --against` measures.

`python -m laneway.bench.gateway.floor_proxy --port P --worker-urls URL...` forwards each POST
to the next engine in turn, its body untouched, through one `aiohttp.ClientSession` (kept-alive
connections, no cap on them), and hands the answer back: a whole answer with its status and
body, an SSE answer read by read as it arrives. It runs on the stack the gateway runs on:
aiohttp's low-level server (`web.Server`, no application, router or middleware) and aiohttp's
client, on the gateway's event loop, with the gateway's connection settings (no access log, a
client that leaves cancels its request). So its CPU per request is what that stack costs to
carry a request there and back, and laneway's excess over it is laneway's own work: parsing,
counting, routing, admission, metrics, the log.

It is a measuring stick, not a router: it reads nothing in a body, keeps no timeouts and
retries nothing; an engine that cannot be reached is answered with a bare 502.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Iterator, Sequence

import aiohttp
from aiohttp import web

from laneway.gateway.cli import event_loop_factory

READY_LINE = "floor proxy: listening on "
JSON_CONTENT = {"Content-Type": "application/json"}


class Floor:
    """The forwarding handler: each request to the next engine, the answer back."""

    def __init__(self, session: aiohttp.ClientSession, worker_urls: Sequence[str]) -> None:
        self._session = session
        self._engines: Iterator[str] = itertools.cycle([url.rstrip("/") for url in worker_urls])

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        url = next(self._engines) + request.raw_path
        try:
            upstream = await self._session.post(url, data=body, headers=JSON_CONTENT)
        except aiohttp.ClientError:
            return web.Response(status=502)
        try:
            content_type = upstream.headers.get("Content-Type", "")
            if not content_type.startswith("text/event-stream"):
                return web.Response(
                    status=upstream.status, body=await upstream.read(), headers=JSON_CONTENT
                )
            response = web.StreamResponse(
                status=upstream.status, headers={"Content-Type": content_type}
            )
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response
        finally:
            upstream.release()


def argv(worker_urls: Sequence[str], port: int = 0) -> list[str]:
    """The command that starts this proxy in front of `worker_urls`, by this Python."""
    module = [sys.executable, "-P", "-m", "laneway.bench.gateway.floor_proxy"]
    return [*module, "--port", str(port), "--worker-urls", *worker_urls]


async def serve(host: str, port: int, worker_urls: Sequence[str]) -> None:
    # As the gateway's own session: no cap on connections, no cookies kept.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as session:
        server = web.Server(Floor(session, worker_urls), handler_cancellation=True, access_log=None)
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(server, host, port)
        bound = listener.sockets[0].getsockname()[1]
        print(f"{READY_LINE}http://{host}:{bound}", flush=True)
        try:
            await listener.serve_forever()
        finally:
            await server.shutdown(1.0)


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
