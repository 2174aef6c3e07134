"""The OpenAI Files API, for batch input and output: files kept in Redis, owned by a tenant.

A file is a hash, `{prefix}:file:{id}`, of its metadata, and a list, `{prefix}:file:{id}:
pieces`, of its bytes in pieces of at most about a MiB: written, read and served a piece at
a time, no step copies a whole file (a 50,000-line batch's output is 30 MB) on the event
loop. Each tenant sees only its own files; another tenant's id answers 404 like an unknown
one.

Every file expires (Redis drops its hash) a fixed time after it was made. A tenant's index
(`{prefix}:files:{owner}`, ids scored by creation time) and sizes (`{prefix}:filebytes:
{owner}`) are pruned of expired ids by the same script that checks the tenant's quota of
files and bytes before an upload is stored, so the check holds across replicas.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

import aiohttp
from aiohttp import BodyPartReader, web
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from laneway.gateway.errors import ApiError, bad_request, not_found
from laneway.gateway.serving.incoming import body_timed_out, closing
from laneway.gateway.state.settings import FileQuota

INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
READ_CHUNK = 256 * 1024
PIECE_BYTES = 1024 * 1024  # an upload's bytes per stored piece
LIST_CHUNK = 100  # file ids read per round trip when listing
# The only ids this gateway hands out; anything else is refused before it becomes a Redis
# key, so no string a client sends can reach another kind of key or fail to encode.
ID_PATTERNS = {"file": re.compile(r"file-[0-9a-f]{32}"), "batch": re.compile(r"batch_[0-9a-f]{32}")}


@dataclass(frozen=True)
class FileObject:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    owner: str  # the tenant; not part of OpenAI's shape
    expires_at: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def valid_id(kind: str, value: str) -> str:
    """`value` when it is an id of `kind` ("file" or "batch"); else the 404 of an unknown id."""
    if ID_PATTERNS[kind].fullmatch(value) is None:
        raise not_found(kind, value[:80].encode("utf-8", "backslashreplace").decode())
    return value


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


async def page_start(redis: Redis, index: str, after: str | None, kind: str) -> int:
    """Where a newest-first page of `index` begins: just past `after`, the last id seen."""
    if after is None:
        return 0
    valid_id(kind, after)
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


# KEYS: the tenant's index, its sizes. ARGV: the newest creation time (whole seconds)
# that has expired, the quota's files and bytes, then the new file's id, size and creation
# time. Redis expires a file up to a second after that: the quota counts it gone first.
RESERVE_LUA = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(expired) do
  redis.call('HDEL', KEYS[2], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local count = redis.call('ZCARD', KEYS[1])
if count + 1 > tonumber(ARGV[2]) then
  return {'files', count}
end
local used = 0
for _, size in ipairs(redis.call('HVALS', KEYS[2])) do
  used = used + tonumber(size)
end
if used + tonumber(ARGV[5]) > tonumber(ARGV[3]) then
  return {'bytes', used}
end
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
return {'ok', 0}
"""


class FileStore:
    def __init__(self, redis: Redis, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = prefix
        self.ttl_s = ttl_s
        self._reserve = redis.register_script(RESERVE_LUA)

    def key(self, file_id: str) -> str:
        return f"{self._prefix}:file:{file_id}"

    async def put(self, file: FileObject, content: bytes, quota: FileQuota) -> None:
        """Store an upload; ApiError 429 when it would take its owner past `quota`."""
        keys = [self._index(file.owner), self.sizes_key(file.owner)]
        args = [file.created_at - self.ttl_s, quota.files, quota.bytes]
        verdict, used = await self._reserve(
            keys=keys, args=[*args, file.id, file.bytes, file.created_at]
        )
        if as_text(verdict) != "ok":
            over = (
                f"{used} files of {quota.files}"
                if as_text(verdict) == "files"
                else f"{used} + {file.bytes} bytes, over {quota.bytes}"
            )
            raise ApiError(
                429,
                f"Tenant {file.owner}'s file storage is full ({over}): delete files first",
                "file_quota_exceeded",
            )

        async with self._redis.pipeline(transaction=True) as pipe:
            pieces = self.pieces_key(file.id)
            pipe.rpush(pieces, *_pieces(content, PIECE_BYTES))
            pipe.expire(pieces, self.ttl_s)
            self.put_in(pipe, file)
            await pipe.execute()

    def put_in(self, pipe: Pipeline, file: FileObject) -> None:
        """Queue the metadata's write on a transaction whose pieces key holds the bytes
        (a batch's output files go with its status).

        Output files skip the quota (a batch must be able to finish) but count in it.
        """
        key = self.key(file.id)
        pipe.hset(key, mapping={"meta": json.dumps(asdict(file))})
        pipe.expire(key, self.ttl_s)
        pipe.zadd(self._index(file.owner), {file.id: file.created_at})
        pipe.hset(self.sizes_key(file.owner), file.id, file.bytes)

    def pieces_key(self, file_id: str) -> str:
        return f"{self.key(file_id)}:pieces"

    def _index(self, owner: str) -> str:
        return f"{self._prefix}:files:{owner}"

    def sizes_key(self, owner: str) -> str:
        return f"{self._prefix}:filebytes:{owner}"

    def new_file(self, size: int, filename: str, purpose: str, owner: str) -> FileObject:
        created = int(time.time())
        return FileObject(
            id=new_file_id(),
            bytes=size,
            created_at=created,
            filename=filename,
            purpose=purpose,
            owner=owner,
            expires_at=created + self.ttl_s,
        )

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
            tx.delete(self.key(file_id), self.pieces_key(file_id))
            tx.zrem(self._index(owner), file_id)
            tx.hdel(self.sizes_key(owner), file_id)
            await tx.execute()
        return {"id": file_id, "object": "file", "deleted": True}

    async def get(self, file_id: str, owner: str) -> FileObject:
        """The file's metadata; ApiError 404 when unknown or another tenant's."""
        meta = as_bytes(await self._redis.hget(self.key(valid_id("file", file_id)), "meta"))
        file = None if meta is None else FileObject(**json.loads(meta))
        if file is None or file.owner != owner:
            raise not_found("file", file_id)
        return file

    async def content(self, file_id: str, owner: str) -> bytes:
        """A whole file (a batch's input, parsed whole anyway)."""
        return b"".join([piece async for piece in self.read(await self.get(file_id, owner))])

    async def read(self, file: FileObject) -> AsyncIterator[bytes]:
        """The file's bytes, one piece per round trip; ApiError 404 before the first when
        they are gone (they expire with the metadata)."""
        pieces = self.pieces_key(file.id)
        count = await self._redis.llen(pieces)
        if count == 0:
            # A file stored by laneway 0.1 keeps its bytes in its hash.
            legacy = as_bytes(await self._redis.hget(self.key(file.id), "content"))
            if legacy is None:
                raise not_found("file", file.id)
            yield legacy
            return
        for index in range(count):
            piece = as_bytes(await self._redis.lindex(pieces, index))
            if piece is None:
                return  # expired meanwhile: the answer ends short
            yield piece


def _pieces(content: bytes, size: int) -> list[bytes]:
    view = memoryview(content)
    return [bytes(view[start : start + size]) for start in range(0, len(content), size)] or [b""]


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


async def read_upload(
    request: web.Request, max_bytes: int, deadline_s: float
) -> tuple[str, str, bytes]:
    """(purpose, filename, content) from a multipart upload; ApiError 400/413 when wrong,
    408 when it has not all arrived within `deadline_s` (what was read is dropped)."""
    if not request.content_type.startswith("multipart/"):
        raise bad_request("Upload a file as multipart/form-data")
    if request.content_length is not None and request.content_length > max_bytes + 64 * 1024:
        raise too_large(max_bytes)
    try:
        async with asyncio.timeout(deadline_s):
            purpose, filename, content = await _read_parts(request, max_bytes)
    except TimeoutError:
        raise closing(body_timed_out(deadline_s)) from None
    except (
        ValueError,
        LookupError,
        AssertionError,
        RuntimeError,
        aiohttp.ClientPayloadError,
    ) as error:
        # aiohttp's multipart reader raises these on a missing boundary, a part that never
        # ends, text that does not decode (UnicodeDecodeError is a ValueError) or a part's
        # charset that names no codec (LookupError).
        raise bad_request(f"The multipart upload is malformed: {error}"[:300]) from None
    if content is None:
        raise bad_request("The upload has no 'file' part", "file")
    if purpose != INPUT_PURPOSE:
        given = "none was given" if purpose is None else f"got {purpose[:80]!r}"
        raise bad_request(
            f"'purpose' must be {INPUT_PURPOSE!r} (only batch input files are stored here); "
            + given,
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


async def _read_parts(
    request: web.Request, max_bytes: int
) -> tuple[str | None, str | None, bytes | None]:
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
