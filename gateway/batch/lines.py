"""A batch's lines: its input file parsed into items and per-line errors, its output
lines built exactly as OpenAI writes them, and the create request checked. Pure: bytes and
JSON in, data out; `batches.py` keeps them in Redis."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from laneway.gateway.errors import bad_request
from laneway.gateway.serving.request_body import Endpoint

COMPLETION_WINDOW = "24h"
MAX_METADATA_PAIRS = 16


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


# ---- pure: input lines and result lines ----


@dataclass(frozen=True)
class Item:
    index: int  # 0-based line number in the input file
    custom_id: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class LineError:
    index: int
    custom_id: str | None
    code: str
    message: str


def parse_input(content: bytes, endpoint: str) -> tuple[list[Item], list[LineError]]:
    """Each non-blank line is one request `{custom_id, method, url, body}` for `endpoint`."""
    items: list[Item] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    for index, raw in enumerate(content.decode("utf-8").split("\n")):
        if not raw.strip():
            continue
        parsed = _parse_line(raw, index, endpoint)
        if isinstance(parsed, Item) and parsed.custom_id in seen:
            parsed = LineError(
                index,
                parsed.custom_id,
                "duplicate_custom_id",
                f"line {index + 1}: custom_id {parsed.custom_id!r} is used by an earlier line",
            )
        if isinstance(parsed, Item):
            seen.add(parsed.custom_id)
            items.append(parsed)
        else:
            errors.append(parsed)
    return items, errors


def _parse_line(raw: str, index: int, endpoint: str) -> Item | LineError:
    where = f"line {index + 1}"
    try:
        line = json.loads(raw)
        # The line's body is encoded again to be sent: what cannot be is refused here.
        json.dumps(line)
    except (ValueError, RecursionError) as error:
        message = f"{where}: not valid JSON: {error}"[:300]
        return LineError(index, None, "invalid_json", message)
    if not isinstance(line, dict):
        return LineError(index, None, "invalid_request", f"{where}: must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(
            index, None, "missing_custom_id", f"{where}: 'custom_id' must be a non-empty string"
        )
    if not _is_utf8(custom_id):
        # A lone surrogate (JSON allows "\ud800") cannot be stored or written back out.
        return LineError(
            index, None, "invalid_custom_id", f"{where}: 'custom_id' is not valid Unicode"
        )

    def fail(code: str, message: str) -> LineError:
        return LineError(index, custom_id, code, f"{where}: {message}")

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
    return Item(index, custom_id, body)


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
        return json.dumps({"outcome": self.outcome, "line": self.line}).encode()

    @staticmethod
    def decode(raw: bytes) -> Result:
        data = json.loads(raw)
        return Result(ItemOutcome(data["outcome"]), data["line"])


def jsonl(lines: Sequence[Mapping[str, object]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


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
    return CreateRequest(file_id, endpoint, metadata)


# ---- Redis ----

# KEYS: result key, batch key, the owner's enqueued tokens. ARGV: encoded result, outcome
# counter field, the item's token estimate. Writes the result only if none exists and the
# batch is still open, counts it and gives its tokens back to the owner's queue quota in
# the same step. Returns {written (0/1), settled, total}.


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
        "errors": None,
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
        "failed_at": None,
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
