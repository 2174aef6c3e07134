"""The Responses API's state on one replica: which endpoint stored a response, the requests
that must go there, and what the engine's answer says it stored.

A response made with `store` lives in the memory of the engine that made it (vLLM's
`response_store`), so `previous_response_id`, `GET /v1/responses/{id}` and
`POST /v1/responses/{id}/cancel` go to that endpoint. The ledger records the holder when
the answer says `store: true` (`laneway sim` says `false` where its store is disabled), or,
where the answer has no `store` (vLLM 0.32's has none), when the request asked for it, with the
answer's input + output tokens: the history the next turn's prompt starts with, which the
lane decision counts. With Redis the holder is shared (state/responses.py).

A response id no endpoint holds for the caller (unknown, expired, another tenant's, or
made by an endpoint since gone) is OpenAI's "not found": for `previous_response_id` a 400
`previous_response_not_found` on `param: previous_response_id`, for GET and cancel a 404
`invalid_request_error`. Never a 5xx, and never the turn answered without its history.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from laneway.api import InferencePool
from laneway.gateway.errors import ApiError
from laneway.gateway.keys import REQUEST_PATH
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.model_name import rewriter
from laneway.gateway.state.callers import caller_of, tenant_name
from laneway.ledger import StoredResponse, Ticket

# The events that end a response's stream, each carrying the whole response (its usage).
TERMINAL_EVENTS = (b"response.completed", b"response.incomplete", b"response.failed")
EVENT_LINE = b"event: "
TAIL_BYTES = 64  # of the previous chunk: an event line split across two reads is still seen
JSON_CONTENT = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class MadeResponse:
    """What an engine's answer says of the response it made."""

    response_id: str
    # What the answer's `store` says; None where it has none: vLLM 0.32's response object
    # carries no `store` field (ResponsesResponse, vllm/entrypoints/openai/responses/
    # protocol.py), so only the request says what was asked (`kept`).
    stored: bool | None
    input_tokens: int | None
    output_tokens: int | None

    def kept(self, asked: bool) -> bool:
        """Whether the engine holds it: the answer's word, else the request's `store`. An
        engine whose store is off answers a continuation 404, which the gateway turns into
        OpenAI's unknown-id error and forgets the holder."""
        return asked if self.stored is None else self.stored

    @property
    def context_tokens(self) -> int | None:
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return self.input_tokens + self.output_tokens


def made_response(response: object) -> MadeResponse | None:
    """A decoded response object's id, `store` and usage; None where it is none."""
    if not isinstance(response, dict) or not isinstance(response.get("id"), str):
        return None
    usage = response.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return MadeResponse(
        response_id=response["id"],
        stored=store if isinstance(store := response.get("store"), bool) else None,
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
    )


def made_by_answer(body: bytes) -> MadeResponse | None:
    """A non-streaming answer's response."""
    try:
        return made_response(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class TerminalEventWatch:
    """Fed a Responses stream's chunks; keeps the response its terminal event carries
    (`response.completed`, `.incomplete` or `.failed`). Only the chunks from that event's
    name on are buffered and parsed."""

    def __init__(self) -> None:
        self.made: MadeResponse | None = None
        self._tail = b""
        self._event: bytearray | None = None  # from the terminal event's line on

    def feed(self, chunk: bytes) -> bool:
        """True for the chunk that completes the terminal event."""
        if self.made is not None:
            return False
        if self._event is None:
            seen = self._tail + chunk
            self._tail = seen[-TAIL_BYTES:]
            at = _terminal_event_at(seen)
            if at < 0:
                return False
            self._event = bytearray(seen[at:])
        else:
            self._event += chunk
        end = self._event.find(b"\n\n")
        if end < 0:
            return False
        for line in bytes(self._event[:end]).split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    event = orjson.loads(line[len(b"data:") :])
                except orjson.JSONDecodeError:
                    break
                if isinstance(event, dict):
                    self.made = made_response(event.get("response"))
        self._event = None
        return True


def _terminal_event_at(data: bytes) -> int:
    found = [data.find(EVENT_LINE + name) for name in TERMINAL_EVENTS]
    return min((at for at in found if at >= 0), default=-1)


def previous_not_found(response_id: str) -> ApiError:
    return ApiError(
        400,
        f"Previous response with id '{response_id}' not found.",
        "previous_response_not_found",
        "previous_response_id",
    )


def response_not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id}' not found.",
        None,
        error_type="invalid_request_error",
    )


async def holder(
    path: RequestPath, response_id: str, tenant: str
) -> tuple[StoredResponse, InferencePool] | None:
    """Where `response_id` is stored for `tenant`: this replica's ledger, else a peer's
    record through Redis (adopted into the ledger)."""
    now = path.clock()
    found = path.ledger.response_holder(response_id, tenant, now)
    if found is None and path.response_share is not None:
        shared = await path.response_share.lookup(response_id, now)
        if shared is not None:
            path.ledger.adopt_response(response_id, shared)
            found = path.ledger.response_holder(response_id, tenant, now)
    return found


async def remember(path: RequestPath, ticket: Ticket, made: MadeResponse) -> None:
    """The engine the request went to stored `made`: the ledger learns it, and the peers."""
    now = path.clock()
    stored = path.ledger.record_response(ticket, made.response_id, now, made.context_tokens)
    if path.response_share is not None:
        await path.response_share.publish(made.response_id, stored, now)


async def retrieve(request: web.Request) -> web.StreamResponse:
    """`GET /v1/responses/{id}`: relayed to the endpoint that stored it, naming the model
    the client asked for when it made the response, as its create's answer did."""
    return await _relay_to_holder(request, "GET", "")


async def cancel(request: web.Request) -> web.StreamResponse:
    """`POST /v1/responses/{id}/cancel`: relayed to the endpoint that stored it (its answer,
    the response, renamed as a GET's is)."""
    return await _relay_to_holder(request, "POST", "/cancel")


async def _relay_to_holder(request: web.Request, method: str, suffix: str) -> web.Response:
    path = request.app[REQUEST_PATH]
    response_id = request.match_info["response_id"]
    found = await holder(path, response_id, tenant_name(caller_of(request)))
    if found is None:
        raise response_not_found(response_id)
    stored, pool = found
    if stored.endpoint not in path.ledger.available(pool):
        raise ApiError(
            503,
            f"The endpoint that stored response '{response_id}' is ejected (failing its "
            "health checks); try again shortly",
            "endpoint_unavailable",
            retry_after=path.settings.queue.retry_after_seconds,
        )
    url = f"{stored.endpoint}/v1/responses/{response_id}{suffix}"
    try:
        async with path.session.request(
            method, url, params=request.query, headers=JSON_CONTENT
        ) as upstream:
            body = await upstream.read()
            status = upstream.status
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _unreachable(response_id, f"{type(error).__name__}: {error}") from None
    if status >= 500:
        raise _unreachable(response_id, f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
    if stored.model and (rename := rewriter(pool.spec.served_model_name, stored.model)):
        body = rename.whole(body)  # a JSON response, or a whole resumed event stream
    headers = {"x-laneway-pool": pool.name, "x-laneway-lane": pool.spec.lane.value}
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _unreachable(response_id: str, why: str) -> ApiError:
    return ApiError(
        502,
        f"The endpoint that stored response '{response_id}' did not answer: {why}",
        "upstream_failed",
    )
