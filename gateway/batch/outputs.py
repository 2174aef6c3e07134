"""A finishing batch's output and error files, built from its results in pieces.

The results are read RESULT_CHUNK at a time; each chunk's lines of each kind become one
piece pushed to this finalizing run's own staging list, so no step holds the event loop
for more than a chunk. `commit` queues, on the transaction that closes the batch, the
renames of the staging lists to the files' pieces and the files' metadata. A second run
(the first one's lock expired, a sweep) stages its own lists and renames the same content
over them: the file ids are derived from the batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from laneway.gateway.batch.files import OUTPUT_PURPOSE, FileObject, FileStore, as_bytes
from laneway.gateway.batch.lines import ItemOutcome, Result

RESULT_CHUNK = 500  # result keys read per round trip, and the results in one piece
# A finalizing run's staging lists outlive any run (its lock holds for a minute).
STAGING_TTL_S = 3600
# The output file holds the completed items' lines, the error file every other's.
KINDS = {"output": "output_file_id", "errors": "error_file_id"}


@dataclass(frozen=True)
class Staged:
    kind: str  # a key of KINDS
    file_id: str
    staging: str  # the list this run pushed the file's pieces to
    bytes: int


def file_id(batch_id: str, kind: str) -> str:
    return f"file-{uuid.uuid5(uuid.NAMESPACE_URL, f'{batch_id}/{kind}').hex}"


async def stage(
    redis: Redis, files: FileStore, batch_id: str, result_keys: Sequence[str]
) -> list[Staged]:
    """The files of the kinds that have lines, staged."""
    run = uuid.uuid4().hex
    ids = {kind: file_id(batch_id, kind) for kind in KINDS}
    staging = {kind: f"{files.pieces_key(ids[kind])}:{run}" for kind in KINDS}
    sizes = dict.fromkeys(KINDS, 0)
    for start in range(0, len(result_keys), RESULT_CHUNK):
        chunk: dict[str, list[bytes]] = {kind: [] for kind in KINDS}
        for raw in await redis.mget(result_keys[start : start + RESULT_CHUNK]):
            encoded = as_bytes(raw)
            if encoded is None:
                continue  # a blank input line: no item
            outcome, line = Result.split(encoded)
            if line is not None:
                chunk["output" if outcome is ItemOutcome.COMPLETED else "errors"].append(line)
        async with redis.pipeline(transaction=False) as pipe:
            for kind, lines in chunk.items():
                if lines:
                    piece = b"".join(line + b"\n" for line in lines)
                    sizes[kind] += len(piece)
                    pipe.rpush(staging[kind], piece)
                    pipe.expire(staging[kind], STAGING_TTL_S)
            await pipe.execute()
    return [
        Staged(kind=kind, file_id=ids[kind], staging=staging[kind], bytes=sizes[kind])
        for kind in KINDS
        if sizes[kind]
    ]


def commit(
    tx: Pipeline, files: FileStore, staged: Staged, batch_id: str, owner: str, now: float
) -> None:
    """Queue the staged file's rename into place and its metadata on `tx`."""
    file = FileObject(
        id=staged.file_id,
        bytes=staged.bytes,
        created_at=int(now),
        filename=f"{batch_id}_{staged.kind}.jsonl",
        purpose=OUTPUT_PURPOSE,
        owner=owner,
        expires_at=int(now) + files.ttl_s,
    )
    pieces = files.pieces_key(file.id)
    tx.rename(staged.staging, pieces)
    tx.expire(pieces, files.ttl_s)
    files.put_in(tx, file)
