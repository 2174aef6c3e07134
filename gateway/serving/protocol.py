"""aiohttp's connection protocol with the two things the gateway adds: when a request really
arrived, and OpenAI-shaped answers to requests aiohttp cannot parse.

Arrival: aiohttp reads a request's bytes in `data_received`, parses the head, wakes the
connection's task and only then starts the handler: a loop iteration or two later, tens of
milliseconds on a busy loop. A client's clock runs through all of that, so the gateway's TTFT
starts at the first bytes read while no request is being handled, and the `stamp_arrival`
middleware hands that stamp to the request (`ARRIVED`). Bytes read while a request is
handled (the rest of its body) belong to it; the next request's first bytes come after its
response, so a stamp never outlives the request it belongs to. A request pipelined before
the previous response has ended gets no stamp and is timed from its handler's start: later,
never earlier. Where the gateway is served without this protocol (an in-process test
server), every request is timed from its handler's start.

Refusals: a head aiohttp's parser refuses (a target or a field over 8190 bytes, more than
128 fields, not HTTP at all) is answered by `handle_error`, which aiohttp writes as plain
text; here it is an OpenAI error, and the connection closes as aiohttp closes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from laneway.gateway.errors import ApiError
from laneway.gateway.keys import ARRIVED, CLOCK

log = logging.getLogger("laneway.gateway")


class GatewayProtocol(web.RequestHandler):
    """One client connection: aiohttp's, noting when each request's first bytes came."""

    def __init__(self, manager: web.Server, *, clock: Callable[[], float], **options: Any) -> None:
        super().__init__(manager, **options)
        self._clock = clock
        self._first_bytes_at: float | None = None
        self._handling = False

    def data_received(self, data: bytes) -> None:
        if self._first_bytes_at is None and not self._handling and data:
            self._first_bytes_at = self._clock()
        super().data_received(data)

    def claim(self) -> float | None:
        """The stamp of the request whose handling starts now; None when there is none."""
        stamp, self._first_bytes_at, self._handling = self._first_bytes_at, None, True
        return stamp

    def release(self) -> None:
        """The request's handling is over: the next bytes read start the next request."""
        self._handling = False

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status == 500:
            # Reached only by a bug below the middleware that answers every error.
            log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
            error = ApiError(500, "The gateway failed on this request", "internal_error")
        else:
            detail = " ".join((message or str(exc) or "malformed request").split())
            message = f"The request is not valid HTTP/1.1: {detail}"[:300]
            error = ApiError(status, message, "invalid_request")
        response = error.response()
        response.force_close()
        return response


async def listen(
    runner: web.AppRunner, host: str, port: int, options: dict[str, Any]
) -> asyncio.Server:
    """Serve `runner`'s application on `host`:`port` through `GatewayProtocol`; `options` are
    the connection settings the runner was given (keep-alive, access log)."""
    server = runner.server
    assert server is not None, "the runner is set up"
    loop = asyncio.get_running_loop()
    clock = runner.app[CLOCK]

    def connection() -> GatewayProtocol:
        return GatewayProtocol(server, clock=clock, loop=loop, **options)

    return await loop.create_server(connection, host, port)


@web.middleware
async def stamp_arrival(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request its arrival; every request, so no stamp is left for the next one."""
    protocol = request.protocol
    if not isinstance(protocol, GatewayProtocol):
        request[ARRIVED] = request.app[CLOCK]()
        return await handler(request)
    arrived = protocol.claim()
    request[ARRIVED] = request.app[CLOCK]() if arrived is None else arrived
    try:
        return await handler(request)
    finally:
        protocol.release()
