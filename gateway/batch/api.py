"""HTTP handlers of the OpenAI Files and Batches APIs; storage lives in files.py, batches.py,
and what a batch's lines mean in lines.py."""

from __future__ import annotations

import json
import time

from aiohttp import web

from laneway.gateway.batch.batches import BatchStore
from laneway.gateway.batch.creation import IDEMPOTENCY_HEADER
from laneway.gateway.batch.creation import create_batch as create_batch_in
from laneway.gateway.batch.files import FileStore, read_upload
from laneway.gateway.batch.lines import parse_create
from laneway.gateway.errors import ApiError, bad_request
from laneway.gateway.keys import (
    BATCH_STORE,
    BATCH_TOKEN_LIMIT,
    FILE_QUOTA,
    FILE_SIZE_LIMIT,
    FILE_STORE,
    SETTINGS,
    TENANT,
)
from laneway.gateway.serving.incoming import read_body
from laneway.gateway.state.redis_store import needs_redis
from laneway.gateway.state.settings import FileQuota

DEFAULT_PAGE = 20
MAX_PAGE = 100
MAX_IDEMPOTENCY_KEY = 255


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", needs_redis(upload_file))
    app.router.add_get("/v1/files", needs_redis(list_files))
    app.router.add_get("/v1/files/{file_id}", needs_redis(get_file))
    app.router.add_delete("/v1/files/{file_id}", needs_redis(delete_file))
    app.router.add_get("/v1/files/{file_id}/content", needs_redis(file_content))
    app.router.add_post("/v1/batches", needs_redis(create_batch))
    app.router.add_get("/v1/batches", needs_redis(list_batches))
    app.router.add_get("/v1/batches/{batch_id}", needs_redis(get_batch))
    app.router.add_post("/v1/batches/{batch_id}/cancel", needs_redis(cancel_batch))


def _owner(request: web.Request) -> str:
    # The tenant middleware sets it on every request; without auth it is the anonymous one.
    return request[TENANT].name


def _files(request: web.Request) -> FileStore:
    if FILE_STORE not in request.app:
        raise ApiError(
            501,
            "The Files and Batches APIs keep their state in Redis: start the gateway with "
            "--redis-url",
            "batches_need_redis",
        )
    return request.app[FILE_STORE]


def _batches(request: web.Request) -> BatchStore:
    _files(request)
    return request.app[BATCH_STORE]


async def upload_file(request: web.Request) -> web.Response:
    store = _files(request)
    deadline_s = request.app[SETTINGS].clients.upload_timeout_millis / 1000
    purpose, filename, content = await read_upload(
        request, request.app[FILE_SIZE_LIMIT], deadline_s
    )
    tenant = request[TENANT]
    file = store.new_file(len(content), filename, purpose, tenant.name)
    await store.put(file, content, _file_quota(request))
    return web.json_response(file.to_json())


def _file_quota(request: web.Request) -> FileQuota:
    tenant, defaults = request[TENANT], request.app[FILE_QUOTA]
    return FileQuota(
        files=tenant.max_files or defaults.files, bytes=tenant.max_file_bytes or defaults.bytes
    )


async def get_file(request: web.Request) -> web.Response:
    file = await _files(request).get(request.match_info["file_id"], _owner(request))
    return web.json_response(file.to_json())


async def list_files(request: web.Request) -> web.Response:
    page = await _files(request).list_page(
        _owner(request), request.query.get("after"), _limit(request), request.query.get("purpose")
    )
    return web.json_response(page)


async def delete_file(request: web.Request) -> web.Response:
    deleted = await _files(request).delete(request.match_info["file_id"], _owner(request))
    return web.json_response(deleted)


async def file_content(request: web.Request) -> web.StreamResponse:
    """The file's bytes streamed a stored piece at a time: a 30 MB output file is never
    copied whole on the event loop."""
    store = _files(request)
    file = await store.get(request.match_info["file_id"], _owner(request))
    pieces = store.read(file)
    first = await anext(pieces)  # a 404 still goes out as one, before the head
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = file.bytes
    await response.prepare(request)
    await response.write(first)
    async for piece in pieces:
        await response.write(piece)
    await response.write_eof()
    return response


async def create_batch(request: web.Request) -> web.Response:
    store = _batches(request)
    settings = request.app[SETTINGS]
    body = await read_body(
        request, settings.max_body_bytes, settings.clients.body_timeout_millis / 1000
    )
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise ApiError(
            400, f"The request body is not valid JSON: {error}"[:300], "invalid_json"
        ) from None
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise bad_request(
            f"'{IDEMPOTENCY_HEADER}' must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            IDEMPOTENCY_HEADER,
        )
    tenant = request[TENANT]
    batch = await create_batch_in(
        store,
        parse_create(payload),
        tenant.name,
        time.time(),
        token_limit=tenant.max_batch_tokens or request.app[BATCH_TOKEN_LIMIT],
        file_quota=_file_quota(request),
        idempotency_key=key,
    )
    return web.json_response(batch)


async def get_batch(request: web.Request) -> web.Response:
    batch = await _batches(request).get(request.match_info["batch_id"], _owner(request))
    return web.json_response(batch)


async def list_batches(request: web.Request) -> web.Response:
    page = await _batches(request).list_page(
        _owner(request), request.query.get("after"), _limit(request)
    )
    return web.json_response(page)


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(DEFAULT_PAGE))
    # isdigit alone admits digits int() refuses ("²"): ASCII ones only.
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise bad_request(f"'limit' must be a whole number from 1 to {MAX_PAGE}", "limit")
    return int(raw)


async def cancel_batch(request: web.Request) -> web.Response:
    batch = await _batches(request).cancel(
        request.match_info["batch_id"], _owner(request), time.time()
    )
    return web.json_response(batch)
