"""The OpenAI Files API, for batch input and output: files kept in Redis, owned by a tenant.

A file is one hash, `{prefix}:file:{id}`: its metadata fields and its bytes. Each tenant
sees only its own files; another tenant's id answers 404 like an unknown one.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass

from aiohttp import BodyPartReader, web
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from laneway.gateway.errors import ApiError, bad_request, not_found

INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
READ_CHUNK = 256 * 1024
LIST_CHUNK = 100  # file ids read per round trip when listing


@dataclass(frozen=True)
class FileObject:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    owner: str  # the tenant; not part of OpenAI's shape

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


async def page_start(redis: Redis, index: str, after: str | None, kind: str) -> int:
    """Where a newest-first page of `index` begins: just past `after`, the last id seen."""
    if after is None:
        return 0
    rank = await redis.zrevrank(index, after)
    if not isinstance(rank, int):
        raise not_found(kind, after)
    return rank + 1


def list_json(page: list[dict[str, object]], has_more: bool) -> dict[str, object]:
    """OpenAI's list envelope around one page of objects."""
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }


class FileStore:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    def key(self, file_id: str) -> str:
        return f"{self._prefix}:file:{file_id}"

    async def put(self, file: FileObject, content: bytes) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            self.put_in(pipe, file, content)
            await pipe.execute()

    def put_in(self, pipe: Pipeline, file: FileObject, content: bytes) -> None:
        """Queue the write on a transaction (a batch's output files go with its status)."""
        pipe.hset(self.key(file.id), mapping={"meta": json.dumps(asdict(file)), "content": content})
        pipe.zadd(self._index(file.owner), {file.id: file.created_at})

    def _index(self, owner: str) -> str:
        return f"{self._prefix}:files:{owner}"

    async def list_page(
        self, owner: str, after: str | None, limit: int, purpose: str | None
    ) -> dict[str, object]:
        """Newest first, OpenAI's cursor pagination: `after` is the last id already seen."""
        index = self._index(owner)
        cursor = await page_start(self._redis, index, after, "file")
        page: list[dict[str, object]] = []
        has_more = False
        while not has_more:
            ids = await self._redis.zrevrange(index, cursor, cursor + LIST_CHUNK - 1)
            for raw in ids:
                cursor += 1
                meta = as_bytes(await self._redis.hget(self.key(as_text(raw)), "meta"))
                file = None if meta is None else FileObject(**json.loads(meta))
                if file is None or purpose not in (None, file.purpose):
                    continue
                if len(page) == limit:
                    has_more = True
                    break
                page.append(file.to_json())
            if len(ids) < LIST_CHUNK:
                break
        return list_json(page, has_more)

    async def delete(self, file_id: str, owner: str) -> dict[str, object]:
        await self.get(file_id, owner)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.delete(self.key(file_id))
            tx.zrem(self._index(owner), file_id)
            await tx.execute()
        return {"id": file_id, "object": "file", "deleted": True}

    async def get(self, file_id: str, owner: str) -> FileObject:
        """The file's metadata; ApiError 404 when unknown or another tenant's."""
        meta = as_bytes(await self._redis.hget(self.key(file_id), "meta"))
        file = None if meta is None else FileObject(**json.loads(meta))
        if file is None or file.owner != owner:
            raise not_found("file", file_id)
        return file

    async def content(self, file_id: str, owner: str) -> bytes:
        await self.get(file_id, owner)
        data = as_bytes(await self._redis.hget(self.key(file_id), "content"))
        if data is None:
            raise not_found("file", file_id)
        return data


def as_text(value: object) -> str:
    raw = as_bytes(value)
    assert raw is not None
    return raw.decode()


def as_bytes(value: object) -> bytes | None:
    """A reply from a client that does not decode responses: bytes, or None for a nil."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    assert isinstance(value, bytes), f"unexpected Redis reply {value!r}"
    return value


async def read_upload(request: web.Request, max_bytes: int) -> tuple[str, str, bytes]:
    """(purpose, filename, content) from a multipart upload; ApiError 400/413 when wrong."""
    if not request.content_type.startswith("multipart/"):
        raise bad_request("Upload a file as multipart/form-data")
    if request.content_length is not None and request.content_length > max_bytes + 64 * 1024:
        raise too_large(max_bytes)
    reader = await request.multipart()
    purpose: str | None = None
    filename: str | None = None
    content: bytes | None = None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise bad_request("Nested multipart bodies are not supported")
        if part.name == "purpose":
            purpose = (await part.text()).strip()
        elif part.name == "file":
            filename = part.filename or "upload.jsonl"
            content = await _read_limited(part, max_bytes)
        else:
            await part.release()
    if content is None:
        raise bad_request("The upload has no 'file' part", "file")
    if purpose != INPUT_PURPOSE:
        raise bad_request(
            f"'purpose' must be {INPUT_PURPOSE!r} (only batch input files are stored here), "
            f"got {purpose!r}",
            "purpose",
        )
    if not content.strip():
        raise bad_request("The file is empty", "file")
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise bad_request(f"The file is not UTF-8 text: {error}", "file") from None
    assert filename is not None
    return purpose, filename, content


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The file is larger than the limit of {max_bytes} bytes", "file_too_large", "file"
    )


async def _read_limited(part: BodyPartReader, max_bytes: int) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk(READ_CHUNK):
        data += chunk
        if len(data) > max_bytes:
            raise too_large(max_bytes)
    return bytes(data)


def file_object(file_id: str, size: int, filename: str, purpose: str, owner: str) -> FileObject:
    return FileObject(file_id, size, int(time.time()), filename, purpose, owner)
