"""The Files and Batches APIs plugged into a gateway app, on top of the state layer.

`create_app(..., shared=options)` adds it right after the state layer
(`state/shared.py`), with the Redis connection that layer opened: the Files and Batches
routes always (without Redis they say that they need it), and with Redis the file and
batch stores and the dispatcher, a background task that runs this replica's share of
batch items through its own batch lane on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from laneway.gateway.batch.api import add_routes
from laneway.gateway.batch.batches import BatchStore
from laneway.gateway.batch.dispatcher import Dispatcher
from laneway.gateway.batch.files import FileStore
from laneway.gateway.keys import (
    BATCH_STORE,
    BATCH_TOKEN_LIMIT,
    DISPATCHING,
    FILE_QUOTA,
    FILE_SIZE_LIMIT,
    FILE_STORE,
    INTERNAL_SECRET,
    LOOPBACK,
    SESSION,
    SETTINGS,
    STATE_METRICS,
)
from laneway.gateway.lifecycle import background
from laneway.gateway.state.shared import SharedRedis, SharedStateOptions


def install(app: web.Application, options: SharedStateOptions, redis: SharedRedis | None) -> None:
    """Add the Files and Batches APIs; `redis` is what the state layer's `install` returned."""
    app[FILE_SIZE_LIMIT] = options.max_file_bytes
    app[FILE_QUOTA] = options.file_quota
    app[BATCH_TOKEN_LIMIT] = options.batch_tokens
    add_routes(app)
    if redis is None:
        return
    files = FileStore(redis.client, redis.prefix, options.file_ttl_s)
    app[FILE_STORE] = files
    app[BATCH_STORE] = BatchStore(redis.client, files, redis.prefix)
    app[DISPATCHING] = []
    app.cleanup_ctx.append(_dispatching(options, consumer=redis.replica))
    # Stop claiming batch items as soon as shutdown begins: this replica's listener has
    # closed, so an item that needs another try goes to the other replicas instead.
    app.on_shutdown.append(_stop_dispatching)


def _dispatching(
    options: SharedStateOptions, consumer: str
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        keys = options.tenants

        def weight(name: str) -> float:
            found = keys.directory.named(name) if keys else None
            return found.weight if found else 1.0

        loopback = app[LOOPBACK]
        dispatcher = Dispatcher(
            app[BATCH_STORE],
            app[SESSION],
            target=lambda: loopback.url,
            secret=app[INTERNAL_SECRET],
            consumer=consumer,
            settings=options.dispatch,
            weight=weight,
            metrics=app[STATE_METRICS],
        )
        dispatching = asyncio.create_task(dispatcher.run(), name="batch-dispatcher")
        app[DISPATCHING].append((dispatcher, dispatching))
        async with background(dispatching):
            yield

    return run


async def _stop_dispatching(app: web.Application) -> None:
    """Let the items running now finish while the server drains; hand the rest over."""
    drain_s = app[SETTINGS].drain_timeout_millis / 1000
    for dispatcher, task in app[DISPATCHING]:
        dispatcher.stop()
        try:
            async with asyncio.timeout(drain_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
