"""Engines whose answers a test scripts: aiohttp apps on the routes the gateway calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Generate = Callable[[web.Request], Awaitable[web.StreamResponse]]
Script = Callable[[web.StreamResponse], Awaitable[None]]


def engine_app(generate: Generate) -> web.Application:
    """`generate` answers both completion routes; /health and /metrics answer an empty 200."""

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", health)
    return app


def scripted_engine(script: Script) -> web.Application:
    """An engine streaming SSE: `script` writes the events, the stream then ends."""

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await script(response)
        await response.write_eof()
        return response

    return engine_app(generate)
