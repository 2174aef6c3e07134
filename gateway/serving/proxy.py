"""One completion request through the gateway: read, classify, admit, plan, relay.

The decisions are the routing library's, made once each as data: `lanes.classify` gives the
request's `Route` (pool, queue class, prefill estimate, reason) before it joins the pool's
line, and `plan.make_plan` its `RoutingPlan` (the endpoints best first, each with its
predicted TTFT) once it holds a slot. This module executes them, notes what it sees as it
goes (`_Outcome`: a client that leaves mid-way still gets its line), and at the end builds
the request's one `RequestLog` for the metrics and the structured log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from laneway.api import InferencePool, Lane
from laneway.gateway.errors import ApiError, error_body
from laneway.gateway.keys import (
    ACCESS_LOG,
    ARRIVED,
    CLOCK,
    DEMAND,
    METRICS,
    POOL_TOKENIZERS,
    PREFIX_INDEX,
    PROFILE,
    REGISTRY,
    RNG,
    SESSION,
    SETTINGS,
    TRACKER,
)
from laneway.gateway.pools.admission import AdmissionRefused
from laneway.gateway.pools.scrape import probe_health
from laneway.gateway.serving.counting import LocalCount, PromptCounter
from laneway.gateway.serving.engine_usage import engine_prompt_tokens
from laneway.gateway.serving.first_token import FirstTokenWatch
from laneway.gateway.serving.incoming import SESSION_HEADER, read_body
from laneway.gateway.serving.model_name import ModelNameRewriter, rewriter
from laneway.gateway.serving.request_body import (
    LANE_HEADER,
    Endpoint,
    ParsedRequest,
    json_values,
    parse_lane,
    parse_request,
    parse_scanned,
)
from laneway.gateway.state.callers import admit_tenant, caller_of, routing_tenant, tenant_name
from laneway.gateway.state.memory import Lease
from laneway.prompt_ids import chat_token_ids
from laneway.routing.kv_events import cached_tokens, token_block_keys
from laneway.routing.lanes import (
    Decision,
    NeedsExactCount,
    NoFit,
    Route,
    RouteRequest,
    UnknownModel,
    classify,
)
from laneway.routing.plan import PlannedEndpoint, RoutingPlan, make_plan
from laneway.routing.prefix_index import estimated_cached_tokens, text_block_hashes
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import within_slo
from laneway.tokens import TokenBounds

log = logging.getLogger("laneway.gateway.requests")

# A body this small holds little enough text to count exactly in well under a millisecond:
# do it inline, so the x-laneway-prompt-tokens header is exact without the thread pool.
INLINE_COUNT_BYTES = 16 * 1024
# A body up to this size, with few JSON values, is parsed and its token bounds taken on the
# loop too: about 2 ms for a 128k-token prompt (~650 KB) and 3-4 ms at the limit, where a
# worker thread's hop costs more than the work on a busy machine (it waits for the
# interpreter lock the loop holds). Parsing costs by value count more than by bytes, so a
# body with many values (up to MAX_JSON_VALUES) still goes to the thread.
INLINE_PARSE_BYTES = 1024 * 1024
INLINE_PARSE_VALUES = 2048
UPSTREAM_ATTEMPTS = 2  # the first pick, and one retry on another endpoint
CLIENT_CLOSED = 499  # nginx's status for a client that went away; only in logs and metrics
STREAM_END = b"data: [DONE]"
SSE_TAIL = len(STREAM_END) + 2  # bytes of the stream kept to spot its end and event breaks


@dataclass
class _Outcome:
    """What the shell has seen of one request so far: the decisions as they were made (by
    reference, never copied) and what executing them showed."""

    parsed: ParsedRequest | None = None
    route: Route | None = None
    tried: PlannedEndpoint | None = None  # the endpoint tried last
    attempts: int = 0
    prompt_tokens: int | None = None  # the exact count, once known
    queue_ms: float | None = None
    ttft_ms: float | None = None
    status: int = 0
    error: str | None = None
    # The client has the whole response: a client that leaves after this is no 499.
    complete: bool = False
    # The stream whose head went out: past it, an error can only end the connection.
    stream: web.StreamResponse | None = None

    def routing_headers(self) -> dict[str, str]:
        if self.route is None:
            return {}
        headers = {"x-laneway-pool": self.route.pool.name, "x-laneway-lane": self.route.lane.value}
        if self.prompt_tokens is not None:
            headers["x-laneway-prompt-tokens"] = str(self.prompt_tokens)
        return headers


# Slotted, not frozen: one per request, and fifteen fields through a frozen dataclass's
# __init__ cost several times more. Nothing assigns to one after it is built.
@dataclass(slots=True)
class RequestLog:
    """One request as its log line and metrics tell it, built once when it ends."""

    path: str
    status: int
    total_ms: float
    model: str = ""
    pool: str = ""
    lane: str = ""
    reason: str = ""  # why this pool
    endpoint: str = ""
    prompt_tokens: int | None = None
    stream: bool = False
    attempts: int = 0
    queue_ms: float | None = None
    predicted_ttft_ms: float | None = None  # on the endpoint tried last, when it was picked
    ttft_ms: float | None = None
    error: str | None = None

    @classmethod
    def of(cls, endpoint: Endpoint, outcome: _Outcome, total_ms: float) -> RequestLog:
        parsed, route, tried = outcome.parsed, outcome.route, outcome.tried
        # By position: a frozen dataclass's keywords cost more, on every request.
        return cls(
            endpoint.value,
            outcome.status,
            total_ms,
            parsed.model if parsed else "",
            route.pool.name if route else "",
            route.lane.value if route else "",
            route.reason if route else "",
            tried.url if tried else "",
            outcome.prompt_tokens,
            parsed.stream if parsed else False,
            outcome.attempts,
            outcome.queue_ms,
            tried.predicted_ttft_ms if tried else None,
            outcome.ttft_ms,
            outcome.error,
        )

    def line(self, at: float) -> dict[str, object]:
        """The log line's fields, `at` its wall-clock time: empty and unknown ones left out,
        times in milliseconds to two places."""
        line: dict[str, object] = {
            "ts": round(at, 3),
            "path": self.path,
            "status": self.status,
            "total_ms": round(self.total_ms, 2),
        }
        # One test per optional field: a comprehension over all of them, then rounding,
        # cost several times more per request.
        if self.model:
            line["model"] = self.model
        if self.pool:
            line["pool"] = self.pool
        if self.lane:
            line["lane"] = self.lane
        if self.reason:
            line["reason"] = self.reason
        if self.endpoint:
            line["endpoint"] = self.endpoint
        if self.prompt_tokens is not None:
            line["prompt_tokens"] = self.prompt_tokens
        line["stream"] = self.stream
        line["attempts"] = self.attempts
        if self.queue_ms is not None:
            line["queue_ms"] = round(self.queue_ms, 2)
        if self.predicted_ttft_ms is not None:
            line["predicted_ttft_ms"] = round(self.predicted_ttft_ms, 2)
        if self.ttft_ms is not None:
            line["ttft_ms"] = round(self.ttft_ms, 2)
        if self.error:
            line["error"] = self.error
        return line


class UpstreamFailed(Exception):
    """An endpoint failed before the client saw a byte: the request may go elsewhere."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


async def handle_completion(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """Serve one completion request. A bug before a stream's head propagates (the error
    middleware answers 500 and logs it); one after it is logged and ends the connection."""
    app = request.app
    clock = app[CLOCK]
    started = request[ARRIVED]  # when its first bytes were read, as the client's clock runs
    outcome = _Outcome()
    try:
        return await _serve(request, endpoint, started, outcome)
    except ApiError as error:
        outcome.status, outcome.error = error.status, error.code
        return error.response(outcome.routing_headers())
    except asyncio.CancelledError:
        _client_gone(outcome)
        raise
    except Exception:
        outcome.status, outcome.error = 500, "internal_error"
        if outcome.stream is None:
            raise
        log.exception("unhandled error on POST %s mid-stream", endpoint.value)
        if request.transport is not None:
            request.transport.abort()
        return outcome.stream
    finally:
        total_ms = (clock() - started) * 1000
        _record(app, RequestLog.of(endpoint, outcome, total_ms))


async def _serve(
    request: web.Request, endpoint: Endpoint, started: float, outcome: _Outcome
) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    caller = caller_of(request)
    deadline_s = settings.clients.body_timeout_millis / 1000
    body = await read_body(request, settings.max_body_bytes, deadline_s)
    if len(body) <= INLINE_COUNT_BYTES:
        parsed, inline = parse_request(body, endpoint), True
    elif len(body) <= INLINE_PARSE_BYTES and json_values(body) <= INLINE_PARSE_VALUES:
        parsed, inline = parse_scanned(body, endpoint), True
    else:
        inline = False
        # Parsing is linear in the body, but a few MB of tiny strings still take a while.
        parsed = await asyncio.to_thread(parse_request, body, endpoint)
    outcome.parsed = parsed
    pinned = parse_lane(request.headers.get(LANE_HEADER))

    route, count = await _route(
        app, parsed, len(body), inline, pinned, routing_tenant(caller), outcome
    )
    pool = route.pool
    context = pool.spec.limits.max_context_tokens
    await admit_tenant(app, caller, parsed.charge(route.prefill_tokens, context))
    outcome.route = route
    try:
        registry = app[REGISTRY]
        if registry.current(pool) is None:
            raise _no_endpoint(app, pool, "the pool was removed while the request was routed")
        # A pool with no endpoint at all is at zero or starting: its gate admits nobody, so
        # the request waits in line (and counts as demand) for a first replica. One whose
        # endpoints all failed is broken, not scaling: that is said at once.
        if pool.endpoints and not registry.available(pool):
            raise _no_endpoint(app, pool, "every endpoint is ejected")
        gate, demand = registry.gate(pool), app[DEMAND]
        waiting_since = app[CLOCK]()
        # A free slot is taken at once: no timer, no count in the line, for the usual case.
        if not gate.admit_now():
            limit_ms = settings.queue.wait_limit_millis(bool(pool.endpoints))
            try:
                with demand.waiting(pool.key, route.prefill_tokens):
                    async with asyncio.timeout(limit_ms / 1000):
                        await gate.acquire(
                            route.priority,
                            tenant_name(caller),
                            parsed.sequences * route.prefill_tokens,
                        )
            except (AdmissionRefused, TimeoutError) as refused:
                raise _refused(app, pool, refused, limit_ms, gate.active, gate.waiting) from None
        waited = app[CLOCK]() - waiting_since
        outcome.queue_ms = waited * 1000
        app[METRICS].queue_wait_of(pool.name, route.lane.value).observe(waited)
        try:
            with demand.running(pool.key, route.prefill_tokens):
                blocks = await _prompt_blocks(app, parsed, pool)
                session = (request.headers.get(SESSION_HEADER) or "").strip() or None
                plan = await _plan(app, route, started, blocks, session)
                exchange = _Exchange(request, parsed, body, plan, blocks, count, started, outcome)
                return await _forward(exchange)
        finally:
            gate.release()
    finally:
        count.cancel()


async def _route(
    app: web.Application,
    parsed: ParsedRequest,
    body_bytes: int,
    inline: bool,
    pinned: Lane | None,
    tenant: str | None,
    outcome: _Outcome,
) -> tuple[Route, _PromptCount]:
    """Classify from bounds where they decide; the exact count follows off the loop.

    Each pool's prompt is counted with its own tokenizer (once per distinct tokenizer);
    with one tokenizer everywhere, as by default, that is a single count.
    """
    metrics, clock = app[METRICS], app[CLOCK]
    pools = app[REGISTRY].pools()
    counters = app[POOL_TOKENIZERS].serving(pools, parsed.model)
    by_pool, distinct = counters.by_pool, counters.distinct

    def ask(counted: dict[int, TokenBounds]) -> RouteRequest:
        if len(distinct) == 1:  # one tokenizer counts for every pool, as by default
            (only,) = counted.values()
            return RouteRequest(parsed.model, only, parsed.max_tokens, pinned, tenant)
        spanning = TokenBounds(
            min(b.low for b in counted.values()), max(b.high for b in counted.values())
        )
        per_pool = {key: counted[id(t)] for key, t in by_pool.items()}
        return RouteRequest(
            parsed.model,
            spanning,
            parsed.max_tokens,
            pinned,
            tenant,
            pool_prompt_tokens=per_pool,
        )

    async def exactly() -> RouteRequest:
        counts = await asyncio.gather(*(_count_exactly(app, parsed, t) for t in distinct))
        return ask({id(t): _exact(n) for t, n in zip(distinct, counts, strict=True)})

    # A non-streaming answer carries the engine's own count (engine_usage.py): its prompt is
    # counted only where the bounds do not decide the route. A stream's header goes out
    # before the engine's usage, so a small one is counted here, where it is cheap.
    decision: Decision
    if body_bytes <= INLINE_COUNT_BYTES and parsed.stream:
        begun = clock()
        exact = {id(t): t.inline(parsed) for t in distinct}
        metrics.tokenize_of("inline").observe(clock() - begun)
        decision = await settle_route(ask(exact), pools, exactly)
    else:
        # The texts' lengths alone route most prompts; the bounds that scan them next, and
        # the exact count last, only where those do not.
        loose = {id(t): b for t in distinct if (b := t.length_bounds(parsed)) is not None}
        decision = classify(ask(loose), pools) if len(loose) == len(distinct) else NeedsExactCount()
        if isinstance(decision, NeedsExactCount):
            begun = clock()
            if inline:
                bounds = {id(t): t.bounds(parsed) for t in distinct}
            else:
                # Bounds of a body past INLINE_PARSE_BYTES cost milliseconds per tokenizer.
                bounds = await asyncio.to_thread(
                    lambda: {id(t): t.bounds(parsed) for t in distinct}
                )
            metrics.tokenize_of("bounds").observe(clock() - begun)
            decision = await settle_route(ask(bounds), pools, exactly)
    if isinstance(decision, UnknownModel):
        raise ApiError(404, decision.message, "model_not_found", "model")
    if isinstance(decision, NoFit):
        outcome.prompt_tokens = decision.prompt_tokens
        code = "context_length_exceeded" if decision.context_exceeded else "no_lane_fits"
        param = "messages" if parsed.endpoint is Endpoint.CHAT else "prompt"
        raise ApiError(400, decision.message, code, param)
    assert isinstance(decision, Route)

    count = _PromptCount(app, parsed, by_pool[decision.pool.key].once_routed)
    if decision.prompt_tokens.exact:
        count.known = decision.prompt_tokens.low
    elif parsed.stream:
        # The route is settled; count for the header and metrics while the engine works.
        count.counting = asyncio.ensure_future(_count_exactly(app, parsed, count.counter))
    return decision, count


@dataclass
class _PromptCount:
    """The prompt's exact count, for the header, the prompt-token metric and the log line:
    known where routing needed it, else being counted (a stream), else counted only when it
    is awaited (a non-streaming answer that does not carry the engine's count)."""

    app: web.Application
    parsed: ParsedRequest
    counter: PromptCounter  # the routed pool's
    known: int | None = None
    counting: asyncio.Future[int] | None = None

    def __await__(self) -> Generator[Any, None, int]:
        return self._exact().__await__()

    async def _exact(self) -> int:
        if self.known is None:
            if self.counting is None:
                self.known = await _count_exactly(self.app, self.parsed, self.counter)
            else:
                self.known = await self.counting
        return self.known

    def cancel(self) -> None:
        if self.counting is not None and not self.counting.done():
            self.counting.cancel()


async def settle_route(
    ask: RouteRequest,
    pools: Sequence[InferencePool],
    exactly: Callable[[], Awaitable[RouteRequest]],
) -> Decision:
    """Classify `ask` by its token bounds; where they do not decide, count and classify again.

    `exactly` counts the prompt and returns `ask` with exact counts in place of the bounds.
    """
    decision = classify(ask, pools)
    if isinstance(decision, NeedsExactCount):
        decision = classify(await exactly(), pools)
    return decision


def _exact(count: int) -> TokenBounds:
    return TokenBounds(count, count)


async def _count_exactly(
    app: web.Application, parsed: ParsedRequest, counter: PromptCounter
) -> int:
    clock = app[CLOCK]
    begun = clock()
    count = await counter.count(parsed)
    app[METRICS].tokenize_of(counter.method).observe(clock() - begun)
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
    waited_ms: int,
    active: int,
    waiting: int,
) -> ApiError:
    now = app[REGISTRY].current(pool)
    if isinstance(refused, TimeoutError) and now is not None and not now.endpoints:
        return _no_endpoint(
            app, pool, f"no replica is ready (scaled to zero or starting) after {waited_ms} ms"
        )
    if isinstance(refused, TimeoutError):
        why = f"no slot freed within {waited_ms} ms"
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


async def _plan(
    app: web.Application,
    route: Route,
    started: float,
    blocks: _PromptBlocks,
    session_key: str | None,
) -> RoutingPlan:
    """The request's endpoints best first, by their load now that it holds a slot."""
    registry = app[REGISTRY]
    # The pool as configured now: its endpoints may have changed while the request waited.
    pool = registry.current(route.pool) or route.pool
    if pool is not route.pool:
        route = replace(route, pool=pool)
    available = registry.available(pool)
    loads = await app[TRACKER].loads(available)
    matched = app[PREFIX_INDEX].matched_blocks(blocks.hashes) if blocks.hashes else {}
    views = []
    for url in available:
        load = loads[url]
        cached = blocks.cached_tokens(matched.get(url, 0), route.prefill_tokens)
        engine = registry.fresh_metrics(url)
        # By position: keywords cost a frozen dataclass's __init__ more, once per endpoint.
        views.append(
            EndpointView(
                url, load.in_flight, load.prefill_tokens, engine, None, None, cached, session_key
            )
        )
    elapsed_ms = (app[CLOCK]() - started) * 1000
    profile = app[PROFILE]
    return make_plan(route, views, registry.prefill_rates, profile, app[RNG], elapsed_ms)


@dataclass(frozen=True)
class _PromptBlocks:
    """The prompt's prefix blocks as the prefix index keys them."""

    hashes: tuple[int, ...]  # empty when no scorer uses them (hashing is the cost)
    # The engines' block size where their KV events feed the index (exact: token-id blocks
    # that the gateway never records itself); None where the gateway estimates from text.
    exact_block_size: int | None = None

    def cached_tokens(self, matched: int, prompt_tokens: int) -> int | None:
        if not self.hashes:
            return None
        if self.exact_block_size is not None:
            return cached_tokens(matched, self.exact_block_size, prompt_tokens)
        return estimated_cached_tokens(matched, len(self.hashes), prompt_tokens)


NO_BLOCKS = _PromptBlocks(())


async def _prompt_blocks(
    app: web.Application, parsed: ParsedRequest, pool: InferencePool
) -> _PromptBlocks:
    if not any(s.name == "prefixAffinity" for s in app[PROFILE]):
        return NO_BLOCKS
    prefix = app[SETTINGS].picking.prefix
    source = prefix.kv_events_of(pool.name)
    if source is None:
        return _PromptBlocks(
            text_block_hashes(parsed.prefix_text(), prefix.block_chars, prefix.max_blocks)
        )
    # The engine's token ids, as the pool's tokenizer renders them: a chat through the
    # model's chat template where the pool has one (else the simulator's framing), a text
    # prompt with the tokenizer's specials. Matches exactly where those are the engine's own.
    counter = app[POOL_TOKENIZERS].of(pool)
    if not isinstance(counter, LocalCount):
        # Counted by the engine's /tokenize: the gateway holds no tokenizer to render with.
        return _PromptBlocks((), source.block_size)
    tokenizer = counter.tokenizer

    def keys() -> tuple[int, ...]:
        template = tokenizer.chat_template
        if parsed.endpoint is Endpoint.CHAT and template is not None:
            ids = tokenizer.encode(template.render(parsed.template_chat()))
        elif parsed.endpoint is Endpoint.CHAT:
            ids = chat_token_ids(tokenizer, parsed.messages)
        elif len(parsed.prompts) == 1:
            ids = tokenizer.encode_prompt(parsed.prompts[0])
        else:
            return ()
        return token_block_keys(ids, source.block_size)

    long = sum(len(m.content) for m in parsed.messages) + sum(map(len, parsed.prompts))
    hashes = await asyncio.to_thread(keys) if long > INLINE_COUNT_BYTES else keys()
    return _PromptBlocks(hashes, source.block_size)


@dataclass(slots=True)  # not frozen: one per request; nothing assigns to one once built
class _Exchange:
    """One admitted request on its way to an endpoint: what every attempt needs."""

    request: web.Request
    parsed: ParsedRequest
    body: bytes  # as the client sent it: forwarded unchanged unless the model is renamed
    plan: RoutingPlan
    prefix: _PromptBlocks
    count: _PromptCount
    started: float
    outcome: _Outcome

    @property
    def app(self) -> web.Application:
        return self.request.app


async def _forward(exchange: _Exchange) -> web.StreamResponse:
    app, outcome, plan = exchange.app, exchange.outcome, exchange.plan
    metrics = app[METRICS]
    served = plan.pool.spec.served_model_name
    body = (
        exchange.body
        if served == exchange.parsed.model
        else orjson.dumps({**exchange.parsed.payload, "model": served})
    )
    failures = []
    for candidate in plan.endpoints[:UPSTREAM_ATTEMPTS]:
        outcome.tried = candidate
        outcome.attempts += 1
        if exchange.prefix.hashes and exchange.prefix.exact_block_size is None:
            app[PREFIX_INDEX].record(candidate.url, exchange.prefix.hashes)
        try:
            return await _attempt(exchange, candidate, served, body)
        except UpstreamFailed as failure:
            await _note_failure(app, candidate.url, str(failure), failure.kind == "timeout")
            metrics.upstream_errors.labels(plan.pool.name, candidate.url, failure.kind).inc()
            failures.append(f"{candidate.url}: {failure}")
    why = "; ".join(failures) if failures else "every endpoint was ejected while it waited"
    raise _no_endpoint(app, plan.pool, why)


async def _attempt(
    exchange: _Exchange, endpoint: PlannedEndpoint, served: str, body: bytes
) -> web.StreamResponse:
    """One try on one endpoint; UpstreamFailed while the client has seen nothing yet."""
    app, outcome, url = exchange.app, exchange.outcome, endpoint.url
    tracker = app[TRACKER]
    # What this endpoint will prefill: the prompt less the prefix its cache likely holds.
    lease = await tracker.start(url, endpoint.prefill_tokens)
    progress = _Progress()
    now = app[CLOCK]()
    own_s = now - exchange.started - (outcome.queue_ms or 0.0) / 1000
    sent = _Sent(endpoint.backlog_tokens, now, own_s)
    try:
        try:
            upstream = await app[SESSION].post(
                url + exchange.parsed.endpoint.value, data=body, headers=JSON_CONTENT
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _upstream_failed(error) from None
        try:
            if upstream.status >= 500 or upstream.status != 200 or not exchange.parsed.stream:
                return await _whole_answer(exchange, upstream, url, served, own_s)
            app[METRICS].overhead.request.observe(own_s)
            app[REGISTRY].record_success(url)
            rename = rewriter(served, exchange.parsed.model)
            return await _relay_stream(exchange, upstream, lease, progress, sent, rename)
        finally:
            # Back to the session's pool if the answer ended; closed otherwise, so the
            # engine sees its client go away and stops.
            upstream.release()
    finally:
        await tracker.finish(lease, progress.first_token)


JSON_CONTENT = {"Content-Type": "application/json"}


def _upstream_failed(error: aiohttp.ClientError | TimeoutError) -> UpstreamFailed:
    kind = "timeout" if isinstance(error, TimeoutError) else "connection"
    return UpstreamFailed(kind, f"{type(error).__name__}: {error}")


async def _whole_answer(
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    url: str,
    served: str,
    own_s: float,
) -> web.Response:
    app, outcome = exchange.app, exchange.outcome
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _upstream_failed(error) from None
    if upstream.status >= 500:
        detail = body[:300].decode("utf-8", "replace")
        raise UpstreamFailed("http_5xx", f"HTTP {upstream.status}: {detail}")
    app[METRICS].overhead.request.observe(own_s)
    engine_count = (
        engine_prompt_tokens(body)
        if upstream.status == 200 and exchange.parsed.sequences == 1
        else None
    )
    if rename := rewriter(served, exchange.parsed.model):
        body = rename.whole(body)
    app[REGISTRY].record_success(url)
    outcome.prompt_tokens = await exchange.count if engine_count is None else engine_count
    outcome.status = upstream.status
    return web.Response(
        status=upstream.status,
        body=body,
        content_type="application/json",
        headers=outcome.routing_headers(),
    )


@dataclass
class _Progress:
    first_token: bool = False


@dataclass(frozen=True)
class _Sent:
    """When a request went to its endpoint, and the prefill backlog it joined there."""

    backlog_tokens: int
    at: float
    overhead_s: float  # the gateway's own time before it: since arrival, less the queue wait


async def _relay_stream(
    exchange: _Exchange,
    upstream: aiohttp.ClientResponse,
    lease: Lease,
    progress: _Progress,
    sent: _Sent,
    rename: ModelNameRewriter | None,
) -> web.StreamResponse:
    """Relay SSE as it arrives; after the first byte there is no retry.

    Each read of the engine is written to the client before the next read: while the
    client's buffer is full the write waits, the engine's socket is not read, and TCP holds
    the engine back; the write deadline runs meanwhile (`_ClientWrites`).
    """
    app, outcome = exchange.app, exchange.outcome
    outcome.prompt_tokens = await exchange.count
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **outcome.routing_headers(),
        },
    )
    writes = _ClientWrites(exchange, response)
    # Sent at once: the client learns the route (and its openai call returns) before the
    # first token, which may be seconds away.
    if not await writes.start():
        upstream.close()
        return response
    outcome.stream = response
    outcome.status = 200
    relay = _StreamRelay(exchange, sent, rename)
    try:
        try:
            async for data in upstream.content.iter_any():
                chunk, read_at = relay.received(data)
                if not chunk:
                    continue
                if not await writes.write(chunk):
                    upstream.close()  # the engine sees its client go away
                    return response
                if relay.written(chunk, read_at):
                    await _note_first_token(exchange, lease, progress, sent, read_at, relay.now)
        except (aiohttp.ClientError, TimeoutError) as error:
            rest = rename.flush() if rename else b""
            why = f"mid-stream: {type(error).__name__}: {error}"
            await _note_failure(app, lease.endpoint, why, isinstance(error, TimeoutError))
            pool = exchange.plan.pool.name
            app[METRICS].upstream_errors.labels(pool, lease.endpoint, "mid_stream").inc()
            outcome.error = "upstream_failed_mid_stream"
            await _end_with_error(writes, error, rest, relay.tail)
            return response
        rest = rename.flush() if rename else b""
        if rest and not await writes.write(rest):
            return response
        outcome.complete = True  # all the engine sent, whether or not it ended with [DONE]
        await writes.end()
        return response
    finally:
        writes.close()


class _StreamRelay:
    """A stream's bookkeeping per relayed read: renamed, parsed for its first token until it
    comes, timed once written (TBT, the gateway's own time), watched for its end."""

    def __init__(self, exchange: _Exchange, sent: _Sent, rename: ModelNameRewriter | None) -> None:
        app, plan = exchange.app, exchange.plan
        metrics = app[METRICS]
        self._rename = rename
        self._outcome = exchange.outcome
        self._clock = app[CLOCK]
        self._overhead = metrics.overhead
        self._gaps = metrics.tbt.labels(plan.pool.name, plan.lane.value)
        self._tbt_slo_millis = plan.pool.spec.slo.tbt_millis
        self._sent_overhead_s = sent.overhead_s
        self._first_token = FirstTokenWatch()
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
        chunk = self._rename.feed(data) if self._rename else data
        ending = self.tail + chunk[-SSE_TAIL:]
        self._ends = bool(chunk) and not self._outcome.complete and STREAM_END in ending
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
        elif self._last_event is not None and chunk.count(b"data:") > chunk.count(STREAM_END):
            gap = now - self._last_event
            self._gaps.observe(gap, within_slo(gap, self._tbt_slo_millis))
            self._last_event = now
        self.tail = (self.tail + chunk[-SSE_TAIL:])[-SSE_TAIL:]
        if self._ends:
            self._outcome.complete = True
        return first


async def _note_first_token(
    exchange: _Exchange,
    lease: Lease,
    progress: _Progress,
    sent: _Sent,
    read_at: float,
    written_at: float,
) -> None:
    """The stream's first content token: its TTFT against the SLO (written to the client, as
    the client's clock runs), the endpoint's prefill backlog released, and the endpoint's
    prefill rate learned from it (read from the engine, as the engine's clock runs)."""
    app, plan = exchange.app, exchange.plan
    labels = (plan.pool.name, plan.lane.value)
    ttft = written_at - exchange.started
    app[METRICS].ttft_of(*labels).observe(ttft)
    met = within_slo(ttft, plan.pool.spec.slo.ttft_millis)
    app[METRICS].ttft_slo_of(*labels, "true" if met else "false").inc()
    app[DEMAND].record_ttft(plan.pool.key, met)
    exchange.outcome.ttft_ms = ttft * 1000
    progress.first_token = True
    await app[TRACKER].prefill_done(lease)
    app[REGISTRY].record_first_token(
        lease.endpoint, sent.backlog_tokens, (read_at - sent.at) * 1000
    )


class _ClientWrites:
    """A stream's writes to its client, under the write deadline (issue 14), and what a
    client that left means.

    A client that reads nothing fills the socket's buffer and then blocks the stream's
    write: after the deadline it is cut off, so it holds neither the engine nor the pool's
    slot. One timer watches the whole stream, re-armed at most once per deadline, rather
    than a timeout per relayed chunk.
    """

    def __init__(self, exchange: _Exchange, response: web.StreamResponse) -> None:
        self._outcome = exchange.outcome
        self._request = exchange.request
        self._response = response
        self._loop = asyncio.get_running_loop()
        self._deadline_s = exchange.app[SETTINGS].clients.write_timeout_millis / 1000
        self._blocked_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._cut_off = False

    async def start(self) -> bool:
        """Send the stream's head; False when the client is gone."""
        return await self._under_deadline(self._response.prepare(self._request))

    async def write(self, chunk: bytes) -> bool:
        """Write `chunk`, waiting while the client's buffer is full; False when it is gone."""
        return await self._under_deadline(self._response.write(chunk))

    async def end(self) -> None:
        """The stream's end, under the deadline while it waits for the client to read."""
        await self._under_deadline(self._response.write_eof())

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
            _client_gone(self._outcome)

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


def _client_gone(outcome: _Outcome) -> None:
    """The client closed its connection: a 499 unless it already had the whole response (or
    was cut off for not reading, which says more)."""
    if not outcome.complete and outcome.status != CLIENT_CLOSED:
        outcome.status, outcome.error = CLIENT_CLOSED, "client_disconnected"


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


async def _note_failure(app: web.Application, url: str, why: str, timed_out: bool) -> None:
    """Count a failure against the endpoint, unless it was only slow.

    A read timeout is what a long generation and a hung engine have in common: the engine
    answering its health probe tells them apart, so a slow answer never ejects it.
    """
    if timed_out:
        limit = aiohttp.ClientTimeout(total=app[SETTINGS].upstream.health_timeout_millis / 1000)
        if await probe_health(app[SESSION], url, limit):
            return
    if app[REGISTRY].record_failure(url):
        log.warning(json.dumps({"event": "endpoint_ejected", "endpoint": url, "after": why}))


def _record(app: web.Application, record: RequestLog) -> None:
    metrics = app[METRICS]
    metrics.requests_of(record.pool, record.lane, str(record.status)).inc()
    if record.pool and record.status == 200:
        metrics.e2e_of(record.pool, record.lane).observe(record.total_ms / 1000)
    if record.lane and record.prompt_tokens is not None:
        metrics.prompt_tokens_of(record.lane).observe(record.prompt_tokens)
    access_log = app[ACCESS_LOG]
    if access_log.enabled:
        access_log.write(record.line(time.time()))
