"""A batch's lines, pure: its input parsed, its result lines, and the batch in OpenAI's shape.

`parse_input` turns a JSONL input file into items and per-line errors; the result lines
are built exactly as OpenAI writes them, one per item, into the output or the error file;
`batch_json` is the batch object the API answers with, built from the record the store
keeps (batches.py). Nothing here touches Redis or the network.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from laneway.gateway.errors import bad_request
from laneway.gateway.serving.request_body import Endpoint

COMPLETION_WINDOW = "24h"
WINDOW_SECONDS = 24 * 3600
MAX_METADATA_PAIRS = 16
# OpenAI's Batch API takes at most 50,000 requests and 200 MB of input per batch.
MAX_BATCH_LINES = 50_000
MAX_BATCH_BYTES = 200 * 1000 * 1000


class Status(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


FINISHED = (Status.COMPLETED, Status.CANCELLED, Status.FAILED, Status.EXPIRED)


@dataclass(frozen=True, slots=True)
class Entry:
    """A good line: its request, to be queued."""

    index: int  # 0-based line number in the input file
    custom_id: str
    body: bytes  # the request body, encoded once here, as it will be sent

    @property
    def cost(self) -> int:
        return item_cost(self.body)


def item_cost(body: bytes) -> int:
    """An item's token estimate, for fair share and the queue quota: ~4 bytes of JSON each."""
    return max(1, len(body) // 4)


@dataclass(frozen=True)
class LineError:
    index: int
    custom_id: str | None
    code: str
    message: str


class LineParser:
    """Parses a batch's input lines a slice at a time, in order: a custom_id used by an
    earlier slice's line is a duplicate too."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._seen: set[str] = set()

    def parse(self, lines: Sequence[bytes], first: int) -> tuple[list[Entry], list[LineError]]:
        """Lines numbered from `first`: each non-blank one is a request `{custom_id, method,
        url, body}` for the batch's endpoint."""
        entries: list[Entry] = []
        errors: list[LineError] = []
        for index, raw in enumerate(lines, start=first):
            if not raw.strip():
                continue
            parsed = _parse_line(raw, index, self._endpoint)
            if isinstance(parsed, Entry) and parsed.custom_id in self._seen:
                used = f"custom_id {parsed.custom_id!r} is used by an earlier line"
                parsed = LineError(
                    index=index,
                    custom_id=parsed.custom_id,
                    code="duplicate_custom_id",
                    message=f"line {index + 1}: {used}",
                )
            if isinstance(parsed, Entry):
                self._seen.add(parsed.custom_id)
                entries.append(parsed)
            else:
                errors.append(parsed)
        return entries, errors


def slices(content: bytes, max_lines: int, max_bytes: int) -> Iterator[tuple[int, list[bytes]]]:
    """The file's lines in slices of at most `max_lines` lines and about `max_bytes` bytes
    (the line that crosses it ends the slice; no line is cut), each with its first line's
    index."""
    index, position = 0, 0
    while position < len(content):
        first, size = index, 0
        lines: list[bytes] = []
        while position < len(content) and len(lines) < max_lines and size < max_bytes:
            end = content.find(b"\n", position)
            end = len(content) if end < 0 else end
            lines.append(content[position:end])
            size += end - position
            position, index = end + 1, index + 1
        yield first, lines


def parse_input(content: bytes, endpoint: str) -> tuple[list[Entry], list[LineError]]:
    """A whole input file at once (a small one; creation parses slices)."""
    return LineParser(endpoint).parse(content.split(b"\n"), 0)


def line_count(content: bytes) -> int:
    """Lines in an input file, blank ones included, a final newline ending the last."""
    return content.count(b"\n") + (0 if content.endswith(b"\n") else 1)


def _parse_line(raw: bytes, index: int, endpoint: str) -> Entry | LineError:
    where = f"line {index + 1}"
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError) as error:
        message = f"{where}: not valid JSON: {error}"[:300]
        return LineError(index=index, custom_id=None, code="invalid_json", message=message)
    if not isinstance(line, dict):
        return LineError(
            index=index,
            custom_id=None,
            code="invalid_request",
            message=f"{where}: must be a JSON object",
        )
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(
            index=index,
            custom_id=None,
            code="missing_custom_id",
            message=f"{where}: 'custom_id' must be a non-empty string",
        )
    if not _is_utf8(custom_id):
        # A lone surrogate (JSON allows "\ud800") cannot be stored or written back out.
        return LineError(
            index=index,
            custom_id=None,
            code="invalid_custom_id",
            message=f"{where}: 'custom_id' is not valid Unicode",
        )

    def fail(code: str, message: str) -> LineError:
        return LineError(index=index, custom_id=custom_id, code=code, message=f"{where}: {message}")

    if line.get("method") != "POST":
        return fail("invalid_method", f"'method' must be 'POST', got {line.get('method')!r}")
    if line.get("url") != endpoint:
        return fail(
            "mismatched_url",
            f"'url' must be the batch's endpoint {endpoint!r}, got {line.get('url')!r}",
        )
    body = line.get("body")
    if not isinstance(body, dict):
        return fail("invalid_body", "'body' must be a JSON object")
    if body.get("stream"):
        return fail("invalid_body", "'stream' is not supported in a batch")
    try:
        # Encoded again to be sent: what cannot be (a lone surrogate) is refused here.
        encoded = json.dumps(body).encode()
    except (ValueError, RecursionError) as error:
        return fail("invalid_body", f"'body' cannot be encoded: {error}"[:300])
    return Entry(index=index, custom_id=custom_id, body=encoded)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def request_id(batch_id: str, index: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


def response_line(
    batch_id: str, item_index: int, custom_id: str, status: int, body: object
) -> dict[str, object]:
    """A line as OpenAI writes it for a request that got an HTTP answer (2xx or not)."""
    return {
        "id": request_id(batch_id, item_index),
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": request_id(batch_id, item_index),
            "body": body,
        },
        "error": None,
    }


def error_line(batch_id: str, error: LineError) -> dict[str, object]:
    """A line for a request that never got an HTTP answer (bad line, unreachable lane)."""
    return {
        "id": request_id(batch_id, error.index),
        "custom_id": error.custom_id,
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.index + 1},
    }


class ItemOutcome(StrEnum):
    COMPLETED = "completed"  # a 2xx answer: goes to the output file
    FAILED = "failed"  # anything else: goes to the error file
    SKIPPED = "skipped"  # the batch was cancelled before the item ran: in neither file
    EXPIRED = "expired"  # its completion window closed before it ran: to the error file


@dataclass(frozen=True)
class Result:
    outcome: ItemOutcome
    line: Mapping[str, object] | None  # None for skipped items

    def encode(self) -> bytes:
        """The outcome, a newline, the line's JSON: finalizing joins the lines into files
        without decoding them."""
        return f"{self.outcome.value}\n".encode() + json.dumps(self.line).encode()

    @staticmethod
    def split(raw: bytes) -> tuple[ItemOutcome, bytes | None]:
        """The outcome and the line, still encoded (None for a skipped item)."""
        outcome, _, line = raw.partition(b"\n")
        return ItemOutcome(outcome.decode()), None if line == b"null" else line


@dataclass(frozen=True)
class CreateRequest:
    input_file_id: str
    endpoint: str
    metadata: Mapping[str, str] | None


def parse_create(payload: object) -> CreateRequest:
    """The body of POST /v1/batches; ApiError 400 naming the field when wrong."""
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object")
    file_id = payload.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise bad_request("'input_file_id' must be a file id", "input_file_id")
    endpoint = payload.get("endpoint")
    allowed = [e.value for e in Endpoint]
    if endpoint not in allowed:
        raise bad_request(
            f"'endpoint' must be one of {', '.join(allowed)}, got {endpoint!r}", "endpoint"
        )
    window = payload.get("completion_window")
    if window != COMPLETION_WINDOW:
        raise bad_request(
            f"'completion_window' must be {COMPLETION_WINDOW!r}, got {window!r}",
            "completion_window",
        )
    metadata = payload.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_PAIRS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise bad_request(
            f"'metadata' must map at most {MAX_METADATA_PAIRS} strings to strings", "metadata"
        )
    assert isinstance(endpoint, str)
    return CreateRequest(input_file_id=file_id, endpoint=endpoint, metadata=metadata)


def final_status(record: Mapping[str, Any]) -> tuple[Status, str]:
    """How a batch ends, and the timestamp field that says when."""
    if record["status"] == Status.CANCELLING:
        return Status.CANCELLED, "cancelled_at"
    if int(record.get("expired", 0)):
        return Status.EXPIRED, "expired_at"
    return Status.COMPLETED, "completed_at"


def batch_json(record: Mapping[str, Any]) -> dict[str, object]:
    meta = record["meta"]

    def stamp(name: str) -> int | None:
        value = record.get(name)
        return None if value is None else int(value)

    return {
        "id": meta["id"],
        "object": "batch",
        "endpoint": meta["endpoint"],
        # Why the batch failed, when it did: OpenAI's list of {code, message, line}.
        "errors": json.loads(record["errors"]) if "errors" in record else None,
        "input_file_id": meta["input_file_id"],
        "completion_window": COMPLETION_WINDOW,
        "status": record["status"],
        "output_file_id": record.get("output_file_id"),
        "error_file_id": record.get("error_file_id"),
        "created_at": meta["created_at"],
        "in_progress_at": stamp("in_progress_at"),
        "expires_at": meta["expires_at"],
        "finalizing_at": stamp("finalizing_at"),
        "completed_at": stamp("completed_at"),
        "failed_at": stamp("failed_at"),
        "expired_at": stamp("expired_at"),
        "cancelling_at": stamp("cancelling_at"),
        "cancelled_at": stamp("cancelled_at"),
        "request_counts": {
            "total": int(record["total"]),
            "completed": int(record["completed"]),
            "failed": int(record["failed"]) + int(record.get("expired", 0)),
        },
        "metadata": meta["metadata"],
    }


@dataclass(frozen=True)
class QueuedItem:
    """An item as a dispatcher claims it from its tenant's stream."""

    stream: str
    entry_id: str
    tenant: str
    batch_id: str
    index: int
    custom_id: str
    endpoint: str
    body: bytes

    @property
    def cost(self) -> int:
        return item_cost(self.body)

    @staticmethod
    def from_entry(
        stream: str, tenant: str, entry_id: str, fields: Mapping[bytes, bytes]
    ) -> QueuedItem:
        """An item from its tenant's stream: the entry's fields as Redis returns them."""
        return QueuedItem(
            stream=stream,
            entry_id=entry_id,
            tenant=tenant,
            batch_id=fields[b"batch"].decode(),
            index=int(fields[b"index"]),
            custom_id=fields[b"custom_id"].decode(),
            endpoint=fields[b"endpoint"].decode(),
            body=fields[b"body"] or b"{}",
        )


def give_up(item: QueuedItem, outcome: ItemOutcome, code: str, message: str) -> Result:
    """The result of an item that never got an HTTP answer it could keep."""
    error = LineError(index=item.index, custom_id=item.custom_id, code=code, message=message)
    return Result(outcome=outcome, line=error_line(item.batch_id, error))


def quota_exceeded(item: QueuedItem) -> Result:
    """The failure of an item whose result would not fit its owner's file quota."""
    message = (
        f"line {item.index + 1}: its result would take tenant {item.tenant}'s file "
        "storage past its quota (a batch's output and error files count in it): "
        "delete files, or raise the tenant's maxFileBytes"
    )
    return give_up(item, ItemOutcome.FAILED, "file_quota_exceeded", message)


# What bounds a result line's size before its item runs: the line's JSON around the
# completion (ids, usage, finish reason: about 500 bytes from vLLM or the simulator, with
# room), and at most max_tokens tokens of text per choice at about 4 bytes each (a token's
# text is 4 characters on average in English; longer tokens or escapes make it an
# estimate, which settling backs by the real size).
RESULT_ENVELOPE_BYTES = 800
BYTES_PER_TOKEN = 4
MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def result_bound(item: QueuedItem) -> int:
    """About the most bytes the item's result line takes: its envelope, and its request's
    max_tokens bound (times `n` choices); without a bound, the envelope alone."""
    try:
        body = json.loads(item.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return RESULT_ENVELOPE_BYTES
    limits = [v for f in MAX_TOKENS_FIELDS if isinstance(v := body.get(f), int) and v > 0]
    choices = body.get("n")
    choices = choices if isinstance(choices, int) and choices > 0 else 1
    tokens = min(limits) * choices if limits else 0
    return RESULT_ENVELOPE_BYTES + 2 * len(item.custom_id.encode()) + tokens * BYTES_PER_TOKEN
