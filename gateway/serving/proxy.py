"""One completion request through the gateway: read, classify, admit, pick, relay.

The decisions are made by the pure cores (`request_body`, `lanes`, `picker`, `admission`);
this module does the I/O around them and keeps one `RequestOutcome` per request for the metrics
and the one structured log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from laneway.api import InferencePool, Lane
from laneway.gateway.errors import ApiError, error_body
from laneway.gateway.keys import (
    CLOCK,
    METRICS,
    PROFILE,
    REGISTRY,
    RNG,
    SESSION,
    SETTINGS,
    TOKENIZER,
    TRACKER,
)
from laneway.gateway.serving.admission import AdmissionRefused
from laneway.gateway.serving.model_name import ModelNameRewriter, rewriter
from laneway.gateway.serving.request_body import (
    LANE_HEADER,
    Endpoint,
    ParsedRequest,
    parse_lane,
    parse_request,
)
from laneway.gateway.state.memory import Lease
from laneway.gateway.state.shared import admit_tenant, tenant_name
from laneway.routing.lanes import (
    Decision,
    NeedsExactCount,
    NoFit,
    Route,
    RouteRequest,
    UnknownModel,
    classify,
)
from laneway.routing.picker import rank
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import within_slo
from laneway.tokens import TokenBounds

log = logging.getLogger("laneway.gateway.requests")

# A body this small holds little enough text to count exactly in well under a millisecond:
# do it inline, so the x-laneway-prompt-tokens header is exact without the thread pool.
INLINE_COUNT_BYTES = 16 * 1024
UPSTREAM_ATTEMPTS = 2  # the first pick, and one retry on another endpoint
CLIENT_CLOSED = 499  # nginx's status for a client that went away; only in logs and metrics


@dataclass
class RequestOutcome:
    """What happened to one request, filled in as it goes; becomes its log line."""

    path: str
    status: int = 0
    model: str = ""
    pool: str = ""
    lane: str = ""
    endpoint: str = ""
    prompt_tokens: int | None = None
    stream: bool = False
    attempts: int = 0
    queue_ms: float | None = None
    predicted_ttft_ms: float | None = None  # on the endpoint tried last, when it was picked
    ttft_ms: float | None = None
    total_ms: float | None = None
    error: str | None = None

    def routing_headers(self) -> dict[str, str]:
        if not self.pool:
            return {}
        headers = {"x-laneway-pool": self.pool, "x-laneway-lane": self.lane}
        if self.prompt_tokens is not None:
            headers["x-laneway-prompt-tokens"] = str(self.prompt_tokens)
        return headers


class UpstreamFailed(Exception):
    """An endpoint failed before the client saw a byte: the request may go elsewhere."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


async def handle_completion(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    clock = request.app[CLOCK]
    started = clock()
    outcome = RequestOutcome(path=endpoint.value)
    try:
        response = await _serve(request, endpoint, started, outcome)
    except ApiError as error:
        outcome.status, outcome.error = error.status, error.code
        return error.response(outcome.routing_headers())
    except asyncio.CancelledError:
        outcome.status, outcome.error = CLIENT_CLOSED, "client_disconnected"
        raise
    finally:
        outcome.total_ms = (clock() - started) * 1000
        _record(request.app, outcome)
    return response


async def _serve(
    request: web.Request, endpoint: Endpoint, started: float, outcome: RequestOutcome
) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    parsed = parse_request(body, endpoint)
    outcome.model, outcome.stream = parsed.model, parsed.stream
    pinned = parse_lane(request.headers.get(LANE_HEADER))

    route, bounds, count = await _route(app, parsed, len(body), pinned, outcome)
    await admit_tenant(request, _prefill_estimate(bounds, count) + (parsed.max_tokens or 0))
    pool = route.pool
    outcome.pool, outcome.lane = pool.name, route.lane.value
    try:
        registry = app[REGISTRY]
        if registry.current(pool) is None:
            raise _no_endpoint(app, pool, "the pool was removed while the request was routed")
        if not registry.available(pool):
            raise _no_endpoint(app, pool, "every endpoint is ejected or none is known")
        gate = registry.gate(pool)
        waiting_since = app[CLOCK]()
        try:
            async with asyncio.timeout(settings.queue.timeout_millis / 1000):
                await gate.acquire(
                    route.priority, tenant_name(request), _prefill_estimate(bounds, count)
                )
        except (AdmissionRefused, TimeoutError) as refused:
            raise _refused(app, pool, refused, gate.active, gate.waiting) from None
        waited = app[CLOCK]() - waiting_since
        outcome.queue_ms = waited * 1000
        app[METRICS].queue_wait.labels(pool.name, route.lane.value).observe(waited)
        try:
            prefill = _prefill_estimate(bounds, count)
            return await _forward(
                _Exchange(request, parsed, route, count, prefill, started, outcome)
            )
        finally:
            gate.release()
    finally:
        if not count.done():
            count.cancel()


async def read_body(request: web.Request, limit: int) -> bytes:
    too_large = ApiError(
        413, f"The request body is larger than the limit of {limit} bytes", "body_too_large"
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _route(
    app: web.Application,
    parsed: ParsedRequest,
    body_bytes: int,
    pinned: Lane | None,
    outcome: RequestOutcome,
) -> tuple[Route, TokenBounds, asyncio.Future[int]]:
    """Classify from bounds where they decide; the exact count follows off the loop."""
    tokenizer, metrics, clock = app[TOKENIZER], app[METRICS], app[CLOCK]
    begun = clock()
    if body_bytes <= INLINE_COUNT_BYTES:
        exact = parsed.count(tokenizer)
        bounds = TokenBounds(exact, exact)
        metrics.tokenize.labels("inline").observe(clock() - begun)
    else:
        bounds = parsed.bounds(tokenizer)
        metrics.tokenize.labels("bounds").observe(clock() - begun)

    def decide(prompt_tokens: TokenBounds) -> Decision:
        return classify(
            RouteRequest(parsed.model, prompt_tokens, parsed.max_tokens, pinned),
            app[REGISTRY].pools(),
        )

    decision = decide(bounds)
    if isinstance(decision, NeedsExactCount):
        exact = await _count_off_loop(app, parsed)
        bounds = TokenBounds(exact, exact)
        decision = decide(bounds)
    if isinstance(decision, UnknownModel):
        raise ApiError(404, decision.message, "model_not_found", "model")
    if isinstance(decision, NoFit):
        outcome.prompt_tokens = decision.prompt_tokens
        code = "context_length_exceeded" if decision.context_exceeded else "no_lane_fits"
        param = "messages" if parsed.endpoint is Endpoint.CHAT else "prompt"
        raise ApiError(400, decision.message, code, param)
    assert isinstance(decision, Route)

    count: asyncio.Future[int]
    if bounds.exact:
        count = asyncio.get_running_loop().create_future()
        count.set_result(bounds.low)
    else:
        # The route is settled; count for the header and metrics while the engine works.
        count = asyncio.ensure_future(_count_off_loop(app, parsed))
    return decision, bounds, count


async def _count_off_loop(app: web.Application, parsed: ParsedRequest) -> int:
    clock = app[CLOCK]
    begun = clock()
    loop = asyncio.get_running_loop()
    count = await loop.run_in_executor(None, parsed.count, app[TOKENIZER])
    app[METRICS].tokenize.labels("offloop").observe(clock() - begun)
    return count


def _retry_after(app: web.Application) -> int:
    return app[SETTINGS].queue.retry_after_seconds


def _no_endpoint(app: web.Application, pool: InferencePool, why: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy endpoint in pool {pool.name}: {why}",
        "no_healthy_endpoint",
        retry_after=_retry_after(app),
    )


def _refused(
    app: web.Application,
    pool: InferencePool,
    refused: AdmissionRefused | TimeoutError,
    active: int,
    waiting: int,
) -> ApiError:
    if isinstance(refused, TimeoutError):
        why = f"no slot freed within {app[SETTINGS].queue.timeout_millis} ms"
    elif refused.reason == "pool_removed":
        return _no_endpoint(app, pool, "the pool was removed while the request waited")
    elif refused.reason == "shutting_down":
        return ApiError(
            503,
            f"This gateway replica is shutting down before pool {pool.name} had a free slot; "
            "retry, and another replica will take the request",
            "gateway_draining",
            retry_after=_retry_after(app),
        )
    else:
        why = f"the line is full ({waiting} waiting)"
    return ApiError(
        429,
        f"Pool {pool.name} is saturated ({active} requests running): {why}; retry later",
        "pool_saturated",
        retry_after=_retry_after(app),
    )


def _prefill_estimate(bounds: TokenBounds, count: asyncio.Future[int]) -> int:
    if count.done() and not count.cancelled():
        return count.result()
    # Prose runs about four bytes per token; the bounds keep the guess honest elsewhere.
    return min(max(bounds.low, bounds.high // 4), bounds.high)


@dataclass
class _Exchange:
    """One admitted request on its way to an endpoint: what every attempt needs."""

    request: web.Request
    parsed: ParsedRequest
    route: Route
    count: asyncio.Future[int]  # the exact prompt count, maybe still being computed
    prefill: int  # the prompt tokens this request adds to an endpoint's load
    started: float
    outcome: RequestOutcome

    @property
    def app(self) -> web.Application:
        return self.request.app


async def _forward(exchange: _Exchange) -> web.StreamResponse:
    app, outcome = exchange.app, exchange.outcome
    registry, metrics = app[REGISTRY], app[METRICS]
    pool = registry.current(exchange.route.pool) or exchange.route.pool
    available = registry.available(pool)
    loads = await app[TRACKER].loads(available)
    # The prompt tokens each endpoint would have to work through before this request's
    # first token, and so its predicted TTFT there, counted from the request's arrival.
    backlogs = {url: loads[url].prefill_tokens + exchange.prefill for url in available}
    elapsed_ms = (app[CLOCK]() - exchange.started) * 1000
    predicted = {
        url: elapsed_ms + registry.prefill_rate(url).predict_ttft_ms(backlogs[url])
        for url in available
    }
    slo_ms = pool.spec.slo.ttft_millis
    views = [
        EndpointView(
            url,
            loads[url].in_flight,
            loads[url].prefill_tokens,
            registry.fresh_metrics(url),
            predicted[url],
            slo_ms,
        )
        for url in available
    ]
    profile = app[PROFILE]
    ranked = rank(views, profile, app[RNG])
    payload = {**exchange.parsed.payload, "model": pool.spec.served_model_name}
    failures = []
    for candidate in ranked[:UPSTREAM_ATTEMPTS]:
        outcome.endpoint = candidate.url
        outcome.attempts += 1
        outcome.predicted_ttft_ms = predicted[candidate.url]
        try:
            return await _attempt(exchange, candidate.url, payload, backlogs[candidate.url])
        except UpstreamFailed as failure:
            _note_failure(app, candidate.url, str(failure))
            metrics.upstream_errors.labels(pool.name, candidate.url, failure.kind).inc()
            failures.append(f"{candidate.url}: {failure}")
    why = "; ".join(failures) if failures else "every endpoint was ejected while it waited"
    raise _no_endpoint(app, pool, why)


async def _attempt(
    exchange: _Exchange, url: str, payload: dict[str, Any], backlog_tokens: int
) -> web.StreamResponse:
    """One try on one endpoint; UpstreamFailed while the client has seen nothing yet."""
    app, outcome = exchange.app, exchange.outcome
    limits = app[SETTINGS].upstream
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=limits.connect_timeout_millis / 1000,
        sock_read=limits.read_timeout_millis / 1000,
    )
    tracker = app[TRACKER]
    lease = await tracker.start(url, exchange.prefill)
    progress = _Progress()
    sent = _Sent(backlog_tokens, app[CLOCK]())
    try:
        async with app[SESSION].post(
            f"{url}{exchange.parsed.endpoint.value}", json=payload, timeout=timeout
        ) as upstream:
            if upstream.status >= 500:
                detail = (await upstream.read())[:300].decode("utf-8", "replace")
                raise UpstreamFailed("http_5xx", f"HTTP {upstream.status}: {detail}")
            if upstream.status != 200 or not exchange.parsed.stream:
                body = await upstream.read()
                if rename := rewriter(payload["model"], exchange.parsed.model):
                    body = rename.whole(body)
                app[REGISTRY].record_success(url)
                outcome.prompt_tokens = await exchange.count
                outcome.status = upstream.status
                return web.Response(
                    status=upstream.status,
                    body=body,
                    content_type="application/json",
                    headers=outcome.routing_headers(),
                )
            app[REGISTRY].record_success(url)
            rename = rewriter(payload["model"], exchange.parsed.model)
            return await _relay_stream(exchange, upstream, lease, progress, sent, rename)
    except (aiohttp.ClientError, TimeoutError) as error:
        kind = "timeout" if isinstance(error, TimeoutError) else "connection"
        raise UpstreamFailed(kind, f"{type(error).__name__}: {error}") from None
    finally:
        await tracker.finish(lease, progress.first_token)


@dataclass
class _Progress:
    first_token: bool = False


@dataclass(frozen=True)
class _Sent:
    """When a request went to its endpoint, and the prefill backlog it joined there."""

    backlog_tokens: int
    at: float


async def _relay_stream(
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    lease: Lease,
    progress: _Progress,
    sent: _Sent,
    rename: ModelNameRewriter | None,
) -> web.StreamResponse:
    """Relay SSE chunk by chunk as it arrives; after the first byte there is no retry."""
    app, outcome, started = exchange.app, exchange.outcome, exchange.started
    clock, metrics, tracker = app[CLOCK], app[METRICS], app[TRACKER]
    labels = (exchange.route.pool.name, exchange.route.lane.value)
    outcome.prompt_tokens = await exchange.count
    client = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **outcome.routing_headers(),
        },
    )
    await client.prepare(exchange.request)
    outcome.status = 200
    tbt = metrics.tbt.labels(*labels)
    slo = exchange.route.pool.spec.slo
    tbt_met, tbt_missed = (metrics.tbt_slo.labels(*labels, met) for met in ("true", "false"))
    last_event: float | None = None
    written = b"\n\n"  # the end of what the client has, enough to tell an event boundary
    while True:
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as error:
            _note_failure(app, lease.endpoint, f"mid-stream: {type(error).__name__}: {error}")
            metrics.upstream_errors.labels(labels[0], lease.endpoint, "mid_stream").inc()
            outcome.error = "upstream_failed_mid_stream"
            await _end_with_error(client, error, rename.flush() if rename else b"", written)
            return client
        if not chunk:
            break
        now = clock()
        events = chunk.count(b"data:") - chunk.count(b"data: [DONE]")
        if events > 0:
            if last_event is None:
                ttft = now - started
                metrics.ttft.labels(*labels).observe(ttft)
                met = "true" if within_slo(ttft, slo.ttft_millis) else "false"
                metrics.ttft_slo.labels(*labels, met).inc()
                outcome.ttft_ms = ttft * 1000
                progress.first_token = True
                await tracker.prefill_done(lease)
                app[REGISTRY].record_first_token(
                    lease.endpoint, sent.backlog_tokens, (now - sent.at) * 1000
                )
            else:
                gap = now - last_event
                tbt.observe(gap)
                (tbt_met if within_slo(gap, slo.tbt_millis) else tbt_missed).inc()
            last_event = now
        if rename:
            chunk = rename.feed(chunk)
            if not chunk:
                continue
        try:
            await client.write(chunk)
        except ConnectionError:
            # The client went away: closing the upstream response tells the engine.
            outcome.status, outcome.error = CLIENT_CLOSED, "client_disconnected"
            upstream.close()
            return client
        written = (written + chunk[-2:])[-2:]
    try:
        if rename and (rest := rename.flush()):
            await client.write(rest)
        await client.write_eof()
    except ConnectionError:
        outcome.status, outcome.error = CLIENT_CLOSED, "client_disconnected"
    return client


async def _end_with_error(
    client: web.StreamResponse, error: BaseException, pending: bytes, written: bytes
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
    try:
        await client.write(event)
        await client.write_eof()
    except ConnectionError:
        return


def _note_failure(app: web.Application, url: str, why: str) -> None:
    if app[REGISTRY].record_failure(url):
        log.warning(json.dumps({"event": "endpoint_ejected", "endpoint": url, "after": why}))


def _record(app: web.Application, outcome: RequestOutcome) -> None:
    metrics = app[METRICS]
    metrics.requests.labels(outcome.pool, outcome.lane, str(outcome.status)).inc()
    if outcome.pool and outcome.status == 200 and outcome.total_ms is not None:
        metrics.e2e.labels(outcome.pool, outcome.lane).observe(outcome.total_ms / 1000)
    if outcome.lane and outcome.prompt_tokens is not None:
        metrics.prompt_tokens.labels(outcome.lane).observe(outcome.prompt_tokens)
    record = {
        "ts": round(time.time(), 3),
        **{k: v for k, v in vars(outcome).items() if v is not None and v != ""},
    }
    for key in ("queue_ms", "predicted_ttft_ms", "ttft_ms", "total_ms"):
        if key in record:
            record[key] = round(record[key], 2)
    log.info(json.dumps(record))
