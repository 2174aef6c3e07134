"""An admitted request carried to its endpoints and back: the plan's first endpoint, the
next on a failure before the client has seen a byte, and the answer relayed (whole, or as a
stream timed on the way) through the app's one client session. The ledger is told each
step (sent, answered, first token, failed) and decides what follows. An unstreamed chat or
completion on the batch lane is read from its engine as a stream and answered whole
(`whole_stream.py`), so that its first token is seen as a streamed request's is."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from laneway.gateway.errors import ApiError, error_body
from laneway.gateway.pools.scrape import probe_health
from laneway.gateway.serving.admitting import no_endpoint
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.engine_body import engine_body
from laneway.gateway.serving.engine_usage import NO_USAGE, StreamUsageWatch, engine_usage
from laneway.gateway.serving.first_token import FirstTokenWatch, content_events_of
from laneway.gateway.serving.model_name import ModelNameRewriter, rewriter
from laneway.gateway.serving.outcome import CLIENT_CLOSED, Outcome
from laneway.gateway.serving.request_body import Endpoint, ParsedRequest
from laneway.gateway.serving.responses import MadeResponse, TerminalEventWatch, made_by_answer
from laneway.gateway.serving.routing import PromptCount
from laneway.gateway.serving.whole_stream import StreamIncomplete, WholeAnswer, streams_whole
from laneway.ledger import NO_BLOCKS, FirstToken, PromptBlocks, Sent, Ticket
from laneway.routing.plan import PlannedEndpoint, RoutingPlan
from laneway.routing.priority import engine_priority
from laneway.routing.slo import within_slo

log = logging.getLogger("laneway.gateway.requests")

STREAM_END = b"data: [DONE]"
SSE_TAIL = len(STREAM_END) + 2  # bytes of the stream kept to spot its end and event breaks
JSON_CONTENT = {"Content-Type": "application/json"}
EVENT_STREAM = "text/event-stream"


class UpstreamFailed(Exception):
    """An endpoint failed before the client saw a byte: the request may go elsewhere."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass(slots=True)  # not frozen: a reclaimed request is planned anew (`plan`)
class Exchange:
    """One admitted request on its way to an endpoint: what every attempt needs."""

    path: RequestPath
    request: web.Request
    ticket: Ticket
    parsed: ParsedRequest
    body: bytes  # as the client sent it: forwarded unchanged unless `engine_body` changes it
    level: int  # the request's priority level, lower first (`laneway.routing.priority`)
    plan: RoutingPlan
    count: PromptCount
    outcome: Outcome
    blocks: PromptBlocks = NO_BLOCKS  # the prompt's, for planning it again after a reclaim
    # A stream's writes to its client once its head went out: a stream whose request was
    # taken off a reclaimed replica goes on with them on its next attempt.
    writes: _ClientWrites | None = None


async def forward(exchange: Exchange) -> web.StreamResponse:
    path, plan = exchange.path, exchange.plan
    parsed = exchange.parsed
    bodies: dict[str, tuple[str, bytes]] = {}  # engine pool key -> its model name and body

    def for_engine(url: str) -> tuple[str, bytes]:
        # A lent replica runs its lender's engine: the lender's model name and scheduling.
        engine = path.ledger.engine_pool(plan.pool, url)
        if engine.key not in bodies:
            served = engine.spec.served_model_name
            priority = engine_priority(engine, exchange.level)
            body = engine_body(
                parsed.payload,
                parsed.endpoint.value,
                exchange.body,
                served,
                priority,
                stream_whole=streams_whole(parsed, plan.lane),
            )
            bodies[engine.key] = served, body
        return bodies[engine.key]

    failures = []
    candidate = plan.endpoints[0] if plan.endpoints else None
    while candidate is not None:
        served, body = for_engine(candidate.url)
        sent = path.ledger.sent(exchange.ticket, path.clock(), candidate)
        path.load_changed()
        if exchange.outcome.reclaimed:
            exchange.outcome.resends += 1
        try:
            return await _reclaimable(exchange, _attempt(exchange, sent, served, body))
        except UpstreamFailed as failure:
            timed_out = failure.kind == "timeout"
            retry = await _note_failure(exchange, candidate.url, str(failure), timed_out)
            path.metrics.upstream_errors.labels(plan.pool.name, candidate.url, failure.kind).inc()
            failures.append(f"{candidate.url}: {failure}")
            candidate = retry
    why = "; ".join(failures) if failures else "every endpoint was ejected while it waited"
    raise no_endpoint(path, plan.pool, why)


async def _reclaimable(
    exchange: Exchange, attempt: Coroutine[Any, Any, web.StreamResponse]
) -> web.StreamResponse:
    """The attempt, where a reclaim can end it when its pool borrows lent replicas
    (`lending.py`: `Reclaimed`)."""
    lending = exchange.path.lending
    if not exchange.path.ledger.borrows(exchange.plan.pool):
        return await attempt
    return await lending.attempt(exchange.ticket, attempt)


def resumable(exchange: Exchange) -> bool:
    """Whether a request taken off a reclaimed replica can be sent again without its client
    noticing: it has seen nothing, or only a stream's head."""
    return not exchange.outcome.streamed


async def end_stream(exchange: Exchange, error: ApiError) -> web.StreamResponse:
    """End a stream whose head went out with `error` as its last event (a reclaimed request
    that cannot go on)."""
    writes, outcome = exchange.writes, exchange.outcome
    assert writes is not None
    assert outcome.stream is not None
    outcome.error = error.code
    event = b"\n\ndata: " + error.encoded() + b"\n\n"
    if await writes.write(event):
        await writes.end()
    writes.close()
    return outcome.stream


async def _attempt(exchange: Exchange, sent: Sent, served: str, body: bytes) -> web.StreamResponse:
    """One try on one endpoint; UpstreamFailed while the client has seen nothing yet."""
    path, url = exchange.path, sent.endpoint.url
    try:
        upstream = await path.session.post(
            url + exchange.parsed.endpoint.value, data=body, headers=JSON_CONTENT
        )
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _upstream_failed(error) from None
    try:
        if upstream.status != 200 and exchange.writes is not None:
            # A resent stream's head went out as a 200: another answer can only fail it.
            raise UpstreamFailed("http_error", f"HTTP {upstream.status} on a resent stream")
        if (
            upstream.status == 200
            and streams_whole(exchange.parsed, exchange.plan.lane)
            and upstream.content_type == EVENT_STREAM  # not an engine that answered whole
        ):
            return await _assembled_answer(exchange, upstream, served, sent)
        if upstream.status != 200 or not exchange.parsed.stream:
            return await _whole_answer(exchange, upstream, served, sent)
        path.metrics.overhead.request.observe(sent.own_s)
        path.ledger.answered(exchange.ticket)
        rename = rewriter(served, exchange.parsed.model)
        return await _relay_stream(exchange, upstream, sent, rename)
    finally:
        # Back to the session's pool if the answer ended; closed otherwise, so the engine
        # sees its client go away and stops.
        upstream.release()


def _upstream_failed(error: aiohttp.ClientError | TimeoutError) -> UpstreamFailed:
    kind = "timeout" if isinstance(error, TimeoutError) else "connection"
    return UpstreamFailed(kind, f"{type(error).__name__}: {error}")


async def _whole_answer(
    exchange: Exchange, upstream: aiohttp.ClientResponse, served: str, sent: Sent
) -> web.Response:
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _upstream_failed(error) from None
    return await _answer(exchange, upstream.status, body, served, sent)


async def _assembled_answer(
    exchange: Exchange, upstream: aiohttp.ClientResponse, served: str, sent: Sent
) -> web.Response:
    """An unstreamed request's answer read as a stream: its first token noted as it comes
    (read from the engine: its client's clock has nothing to show before the end), its
    client answered with the whole once the stream ends."""
    answer = WholeAnswer(exchange.parsed.endpoint)
    first_token = FirstTokenWatch()
    clock = exchange.path.clock
    try:
        async for data in upstream.content.iter_any():
            answer.feed(data)
            if not first_token.seen and first_token.feed(data):
                now = clock()
                _note_first_token(exchange, now, now)
        assembled = answer.result()
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _upstream_failed(error) from None
    except StreamIncomplete as incomplete:
        raise UpstreamFailed("mid_stream", str(incomplete)) from None
    return await _answer(exchange, assembled.status, assembled.body, served, sent)


async def _answer(
    exchange: Exchange, status: int, body: bytes, served: str, sent: Sent
) -> web.Response:
    """The client's answer for an engine's whole `body`; UpstreamFailed for a 5xx, which
    may go elsewhere."""
    path, outcome = exchange.path, exchange.outcome
    if status >= 500:
        detail = body[:300].decode("utf-8", "replace")
        raise UpstreamFailed("http_5xx", f"HTTP {status}: {detail}")
    path.metrics.overhead.request.observe(sent.own_s)
    usage = engine_usage(body) if status == 200 else NO_USAGE
    engine_count = usage.prompt_tokens if exchange.parsed.sequences == 1 else None
    outcome.cached_tokens = usage.cached_tokens
    if status == 200 and exchange.parsed.endpoint is Endpoint.RESPONSES:
        outcome.made = made_by_answer(body)
    if rename := rewriter(served, exchange.parsed.model):
        body = rename.whole(body)
    path.ledger.answered(exchange.ticket)
    outcome.prompt_tokens = await exchange.count if engine_count is None else engine_count
    outcome.status = status
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        headers=outcome.routing_headers(),
    )


async def _relay_stream(
    exchange: Exchange,
    upstream: aiohttp.ClientResponse,
    sent: Sent,
    rename: ModelNameRewriter | None,
) -> web.StreamResponse:
    """Relay SSE as it arrives; after the first byte there is no retry.

    Each read of the engine is written to the client before the next read: while the
    client's buffer is full the write waits, the engine's socket is not read, and TCP holds
    the engine back; the write deadline runs meanwhile (`_ClientWrites`).
    """
    path, outcome = exchange.path, exchange.outcome
    outcome.prompt_tokens = await exchange.count
    writes = exchange.writes
    if writes is None:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **outcome.routing_headers(),
            },
        )
        writes = exchange.writes = _ClientWrites(exchange, response)
        # Sent at once: the client learns the route (and its openai call returns) before
        # the first token, which may be seconds away.
        if not await writes.start():
            upstream.close()
            return response
        outcome.stream = response
        outcome.status = 200
    else:  # resent after a reclaim: its client has the head only
        response = writes.response
    relay = _StreamRelay(exchange, sent, rename)
    try:
        try:
            async for data in upstream.content.iter_any():
                chunk, read_at = relay.received(data)
                if not chunk:
                    continue
                outcome.streamed = True  # before the write: a reclaim may end it midway
                if not await writes.write(chunk):
                    upstream.close()  # the engine sees its client go away
                    return response
                if relay.written(chunk, read_at):
                    _note_first_token(exchange, read_at, relay.now)
        except (aiohttp.ClientError, TimeoutError) as error:
            rest = rename.flush() if rename else b""
            why = f"mid-stream: {type(error).__name__}: {error}"
            url = sent.endpoint.url
            await _note_failure(exchange, url, why, isinstance(error, TimeoutError))
            path.metrics.upstream_errors.labels(exchange.plan.pool.name, url, "mid_stream").inc()
            outcome.error = "upstream_failed_mid_stream"
            await _end_with_error(writes, error, rest, relay.tail)
            return response
        rest = rename.flush() if rename else b""
        if rest and not await writes.write(rest):
            return response
        outcome.made = relay.made
        outcome.cached_tokens = relay.cached_tokens
        outcome.complete = True  # all the engine sent, whether or not it ended with [DONE]
        await writes.end()
        return response
    finally:
        writes.close()


class _StreamRelay:
    """A stream's bookkeeping per relayed read: renamed, parsed for its first token until it
    comes, timed once written (TBT, the gateway's own time), watched for its end."""

    def __init__(self, exchange: Exchange, sent: Sent, rename: ModelNameRewriter | None) -> None:
        path, plan = exchange.path, exchange.plan
        metrics = path.metrics
        self._rename = rename
        self._outcome = exchange.outcome
        self._clock = path.clock
        self._overhead = metrics.overhead
        self._gaps = metrics.tbt.labels(plan.pool.name, plan.lane.value)
        self._tbt_slo_millis = plan.pool.spec.slo.tbt_millis
        self._sent_overhead_s = sent.own_s
        self._first_token = FirstTokenWatch()
        self._content_events = content_events_of(exchange.parsed.endpoint)
        # A response's stream ends with the response it made (its id, store, usage).
        self._terminal = (
            TerminalEventWatch() if exchange.parsed.endpoint is Endpoint.RESPONSES else None
        )
        # A resent stream's usage event, where its client asked for one: what its engine
        # found cached, for the count of prefill computed twice (`recompute.py`).
        self._usage = StreamUsageWatch() if exchange.outcome.reclaimed else None
        self._first = False  # the chunk being relayed completes the first token
        self._ends = False  # it holds the end marker
        self._last_event: float | None = None
        # The end of what the client has: enough to tell an event boundary and the end marker.
        self.tail = b"\n\n"
        self.now = 0.0  # when the last chunk was written

    def received(self, data: bytes) -> tuple[bytes, float]:
        """What of `data` to write to the client now (whole lines, renamed), and when it was
        read."""
        read_at = self._clock()
        # Only the chunks up to the first token are parsed for it; none after.
        self._first = not self._first_token.seen and self._first_token.feed(data)
        # A Responses stream's end is its terminal event, not a `[DONE]`.
        terminal = self._terminal
        ended = terminal is not None and terminal.made is None and terminal.feed(data)
        if self._usage is not None:
            self._usage.feed(data)
        chunk = self._rename.feed(data) if self._rename else data
        ending = self.tail + chunk[-SSE_TAIL:]
        self._ends = bool(chunk) and not self._outcome.complete and (ended or STREAM_END in ending)
        if self._ends:
            # Taken before the write that sends the end: the client, once it has it, may
            # ask /metrics for it at once.
            self._overhead.stream.observe(self._sent_overhead_s + self._clock() - read_at)
        return chunk, read_at

    def written(self, chunk: bytes, read_at: float) -> bool:
        """`chunk` is on its way to the client: time it; True when it held the first token
        (TTFT and TBT are taken as the client's clock runs: once written)."""
        self.now = now = self._clock()
        self._overhead.chunk.observe(now - read_at)
        first = self._first
        if first:
            self._last_event = now
        elif self._last_event is not None and self._content_events(chunk):
            gap = now - self._last_event
            self._gaps.observe(gap, within_slo(gap, self._tbt_slo_millis))
            self._last_event = now
        self.tail = (self.tail + chunk[-SSE_TAIL:])[-SSE_TAIL:]
        if self._ends:
            self._outcome.complete = True
        return first

    @property
    def made(self) -> MadeResponse | None:
        """The response a Responses stream's terminal event says the engine made."""
        return self._terminal.made if self._terminal is not None else None

    @property
    def cached_tokens(self) -> int | None:
        """The prompt tokens a resent stream's engine says it found cached, if it said."""
        return self._usage.usage.cached_tokens if self._usage is not None else None


def _note_first_token(exchange: Exchange, read_at: float, written_at: float) -> None:
    note_first_token(
        exchange.path, exchange.plan, exchange.ticket, read_at=read_at, written_at=written_at
    )


def note_first_token(
    path: RequestPath, plan: RoutingPlan, ticket: Ticket, *, read_at: float, written_at: float
) -> FirstToken:
    """The stream's first content token: the ledger learns the endpoint's prefill rate from
    it (read from the engine, as the engine's clock runs) and takes its TTFT against the SLO
    (written to the client, as the client's clock runs). Both shells, the gateway's relay and
    the endpoint picker, end a first token here."""
    first = path.ledger.first_token(ticket, read_at=read_at, written_at=written_at)
    path.wake(first.wakes)  # a fed batch replica's prefill is free for the next document
    path.load_changed()
    labels = (plan.pool.name, plan.lane.value)
    path.metrics.ttft_of(*labels).observe(first.ttft_ms / 1000)
    path.metrics.ttft_slo_of(*labels, "true" if first.met_slo else "false").inc()
    if first.reclaim_ms is not None:
        path.metrics.reclaim.labels(plan.pool.name).observe(first.reclaim_ms / 1000)
    return first


class _ClientWrites:
    """A stream's writes to its client, under the write deadline (issue 14), and what a
    client that left means.

    A client that reads nothing fills the socket's buffer and then blocks the stream's
    write: after the deadline it is cut off, so it holds neither the engine nor the pool's
    slot. One timer watches the whole stream, re-armed at most once per deadline, rather
    than a timeout per relayed chunk.
    """

    def __init__(self, exchange: Exchange, response: web.StreamResponse) -> None:
        self._outcome = exchange.outcome
        self._request = exchange.request
        self.response = response
        self._loop = asyncio.get_running_loop()
        self._deadline_s = exchange.path.settings.clients.write_timeout_millis / 1000
        self._blocked_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._cut_off = False

    async def start(self) -> bool:
        """Send the stream's head; False when the client is gone."""
        return await self._under_deadline(self.response.prepare(self._request))

    async def write(self, chunk: bytes) -> bool:
        """Write `chunk`, waiting while the client's buffer is full; False when it is gone."""
        return await self._under_deadline(self.response.write(chunk))

    async def end(self) -> None:
        """The stream's end, under the deadline while it waits for the client to read."""
        await self._under_deadline(self.response.write_eof())

    async def _under_deadline(self, write: Awaitable[object]) -> bool:
        self._blocked_since = now = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._deadline_s, self._check)
        try:
            await write
        except ConnectionError:
            self.gone()
            return False
        finally:
            self._blocked_since = None
        return True

    def gone(self) -> None:
        """The client's connection is gone: cut off, or closed by the client."""
        if self._cut_off:
            self._outcome.status, self._outcome.error = CLIENT_CLOSED, "client_not_reading"
        else:
            self._outcome.client_gone()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        since = self._blocked_since
        if since is None:
            return  # no write waits: the next one arms the timer again
        if self._loop.time() - since < self._deadline_s:
            self._timer = self._loop.call_at(since + self._deadline_s, self._check)
            return
        self._cut_off = True
        self.gone()  # before the abort, which may cancel the request (handler_cancellation)
        # A close would wait for the buffer to drain, which it never does; the aborted
        # connection fails the waiting write, or cancels the request.
        if (transport := self._request.transport) is not None:
            transport.abort()


async def _end_with_error(
    writes: _ClientWrites, error: BaseException, pending: bytes, written: bytes
) -> None:
    """End the stream with an error event after `pending`, the rest of a partial event."""
    body = error_body(
        502, f"The engine failed mid-stream: {type(error).__name__}: {error}", "upstream_failed"
    )
    # A half-written event would swallow ours: close it first.
    at_boundary = (written + pending).endswith(b"\n\n")
    event = (
        pending
        + (b"" if at_boundary else b"\n\n")
        + b"data: "
        + json.dumps(body).encode()
        + b"\n\n"
    )
    if await writes.write(event):
        await writes.end()


async def _note_failure(
    exchange: Exchange, url: str, why: str, timed_out: bool
) -> PlannedEndpoint | None:
    """Tell the ledger the attempt failed; the endpoint to try next, if any.

    A read timeout is what a long generation and a hung engine have in common: the engine
    answering its health probe tells them apart, so a slow answer never counts against it.
    """
    path = exchange.path
    counts = True
    if timed_out:
        limit = aiohttp.ClientTimeout(total=path.settings.upstream.health_timeout_millis / 1000)
        counts = not await probe_health(path.session, url, limit)
    failed = path.ledger.failed(exchange.ticket, path.clock(), counts=counts)
    path.load_changed()
    if failed.ejected:
        event = {"event": "endpoint_ejected", "endpoint": failed.endpoint, "after": why}
        log.warning(json.dumps(event))
    return failed.retry
