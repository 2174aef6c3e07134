"""One completion request through the gateway: read, route, admit, plan, relay, log.

The decisions are the routing library's and the ledger's, made once each as data:
`lanes.classify` gives the request's `Route` (pool, queue class, prefill estimate, reason),
`Ledger.admit` its slot, `Ledger.plan` its `RoutingPlan` once it holds one, and
`Ledger.finished` its one `RequestLog` for the metrics and the structured log line, however
it ended. This shell does the I/O between them and changes no state of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from laneway.api import InferencePool
from laneway.gateway.errors import ApiError
from laneway.gateway.keys import ARRIVED, REQUEST_PATH
from laneway.gateway.serving.admitting import admit, wait_in_line
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.incoming import SESSION_HEADER, read_body
from laneway.gateway.serving.lending import Reclaimed, drop
from laneway.gateway.serving.outcome import Outcome
from laneway.gateway.serving.relay import Exchange, end_stream, forward, resumable
from laneway.gateway.serving.request_body import (
    LANE_HEADER,
    Endpoint,
    ParsedRequest,
    parse_lane,
)
from laneway.gateway.serving.responses import holder, previous_not_found, remember
from laneway.gateway.serving.routing import parse, prompt_blocks, route_request
from laneway.gateway.state.callers import (
    caller_of,
    routing_tenant,
    tenant_caps,
    tenant_name,
    tenant_priority,
)
from laneway.ledger import Admission, PromptBlocks, RequestLog, StoredResponse, Ticket
from laneway.routing.plan import RoutingPlan
from laneway.routing.priority import gateway_level

log = logging.getLogger("laneway.gateway.requests")


async def handle_completion(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """Serve one completion request. A bug before a stream's head propagates (the error
    middleware answers 500 and logs it); one after it is logged and ends the connection."""
    path = request.app[REQUEST_PATH]
    started = request[ARRIVED]  # when its first bytes were read, as the client's clock runs
    outcome = Outcome()
    try:
        return await _serve(path, request, endpoint, started, outcome)
    except ApiError as error:
        outcome.status, outcome.error = error.status, error.code
        return error.response(outcome.routing_headers())
    except asyncio.CancelledError:
        outcome.client_gone()
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
        record(path, release(path, endpoint.value, outcome, started))


async def _serve(
    path: RequestPath, request: web.Request, endpoint: Endpoint, started: float, outcome: Outcome
) -> web.StreamResponse:
    settings = path.settings
    caller = caller_of(request)
    deadline_s = settings.clients.body_timeout_millis / 1000
    body = await read_body(request, settings.max_body_bytes, deadline_s)
    parsed, inline = await parse(body, endpoint)
    outcome.parsed = parsed
    pinned = parse_lane(request.headers.get(LANE_HEADER))
    held = await _continued(path, parsed, tenant_name(caller))
    route, count = await route_request(
        path,
        parsed,
        len(body),
        inline,
        pinned,
        routing_tenant(caller),
        outcome,
        held_by=held[1] if held else None,
        history_tokens=(held[0].context_tokens or 0) if held else 0,
    )
    pool = route.pool
    if path.tenant_limits is not None:
        context = pool.spec.limits.max_context_tokens
        await path.tenant_limits.admit(caller, parsed.charge(route.prefill_tokens, context))
    outcome.route = route
    try:
        ask = Admission(
            route=route,
            arrived=started,
            path=endpoint.value,
            model=parsed.model,
            stream=parsed.stream,
            tenant=tenant_name(caller),
            fair_tokens=parsed.sequences * route.prefill_tokens,
            caps=tenant_caps(caller),
            session_key=(request.headers.get(SESSION_HEADER) or "").strip() or None,
        )
        admitted = await admit(path, ask, outcome)
        path.metrics.queue_wait_of(pool.name, route.lane.value).observe(admitted.queue_ms / 1000)
        blocks = await prompt_blocks(path, parsed, pool)
        only = (held[0].endpoint,) if held else None
        plan = await plan_request(path, admitted.ticket, pool, blocks, only)
        exchange = Exchange(
            path=path,
            request=request,
            ticket=admitted.ticket,
            parsed=parsed,
            body=body,
            level=gateway_level(tenant_priority(caller), route.priority, parsed.priority),
            plan=plan,
            count=count,
            outcome=outcome,
            blocks=blocks,
        )
        answer = await _forward_lent(exchange, ask, only)
        if held is not None and outcome.status == 404:
            # The holder lost it, its engine restarted before a scrape showed it: the
            # history is gone, as OpenAI says of a response it does not have.
            previous = parsed.previous_response_id
            assert previous is not None
            path.ledger.forget_response(previous)
            raise previous_not_found(previous)
        made = outcome.made
        if made is not None and made.kept(asked=parsed.asks_store):
            await remember(path, admitted.ticket, made)
        if made is not None and made.input_tokens is not None:
            outcome.prompt_tokens = made.input_tokens  # the engine's count, history and all
        return answer
    finally:
        count.cancel()


async def _forward_lent(
    exchange: Exchange, ask: Admission, only: tuple[str, ...] | None
) -> web.StreamResponse:
    """`forward`, and again each time a reclaim takes the request off a lent replica: back
    in its pool's line, then planned anew. A stream whose client has seen tokens cannot be
    sent again unnoticed: it ends with an error event instead."""
    path = exchange.path
    while True:
        try:
            return await forward(exchange)
        except Reclaimed as reclaimed:
            line = reclaimed.line
            exchange.outcome.reclaimed = True
        except ApiError as error:
            if exchange.outcome.stream is None:
                raise
            # A resent stream, its head out already: every endpoint failed it.
            return await end_stream(exchange, error)
        if not resumable(exchange):
            drop(line)
            return await end_stream(exchange, _reclaimed_midway(exchange.plan.pool))
        try:
            await wait_in_line(path, ask, exchange.ticket, line)
        except ApiError as error:
            if exchange.outcome.stream is None:
                raise
            return await end_stream(exchange, error)
        exchange.plan = await plan_request(
            path, exchange.ticket, exchange.plan.pool, exchange.blocks, only
        )


def _reclaimed_midway(pool: InferencePool) -> ApiError:
    return ApiError(
        503,
        f"The replica streaming this answer was taken back by pool {pool.name}'s lender "
        "for its chat; the stream ends here: retry the request",
        "replica_reclaimed",
    )


async def _continued(
    path: RequestPath, parsed: ParsedRequest, tenant: str
) -> tuple[StoredResponse, InferencePool] | None:
    """The stored response a request continues, and its endpoint's pool; 400 where no
    endpoint holds it for this tenant (its history would be missing)."""
    previous = parsed.previous_response_id
    if previous is None:
        return None
    held = await holder(path, previous, tenant)
    if held is None:
        raise previous_not_found(previous)
    return held


async def plan_request(
    path: RequestPath,
    ticket: Ticket,
    pool: InferencePool,
    blocks: PromptBlocks,
    only: tuple[str, ...] | None,
) -> RoutingPlan:
    """The request's endpoints best first, by their load now that it holds a slot: with
    Redis, the other replicas' load on them read first. `only`: the endpoints it may use
    (the one that stored the response it continues; the proxy's candidates, for the picker)."""
    ledger = path.ledger
    if path.load_share is not None:
        current = ledger.current(pool)
        if current is not None:
            ledger.set_peer_loads(await path.load_share.peers(ledger.available(current)))
    return ledger.plan(ticket, path.clock(), blocks, subset=only)


def release(path: RequestPath, route_path: str, outcome: Outcome, started: float) -> RequestLog:
    """Whatever the request held is released; its log. The endpoint picker's requests end
    here too."""
    now = path.clock()
    ticket = outcome.ticket
    if ticket is not None:
        finished = path.ledger.finished(
            ticket, now, status=outcome.status, error=outcome.error,
            prompt_tokens=outcome.prompt_tokens,
            recomputed_prompt_tokens=outcome.recomputed_prompt_tokens(),
        )  # fmt: skip
        path.waiters.forget(ticket)
        path.wake(finished.wakes)
        path.demand_changed()
        path.load_changed()
        return finished.log
    # Refused before the ledger saw it: bad JSON, an unknown model, no lane, a tenant limit.
    parsed, route = outcome.parsed, outcome.route
    return RequestLog(
        path=route_path,
        status=outcome.status,
        total_ms=(now - started) * 1000,
        model=parsed.model if parsed else "",
        pool=route.pool.name if route else "",
        lane=route.lane.value if route else "",
        reason=route.reason if route else "",
        prompt_tokens=outcome.prompt_tokens,
        stream=parsed.stream if parsed else False,
        error=outcome.error,
    )


def record(path: RequestPath, entry: RequestLog) -> None:
    metrics = path.metrics
    metrics.requests_of(entry.pool, entry.lane, str(entry.status)).inc()
    if entry.pool and entry.status == 200:
        metrics.e2e_of(entry.pool, entry.lane).observe(entry.total_ms / 1000)
    if entry.lane and entry.prompt_tokens is not None:
        metrics.prompt_tokens_of(entry.lane).observe(entry.prompt_tokens)
    if entry.recomputed_prompt_tokens:
        metrics.recomputed_prompt_tokens.labels(entry.pool).inc(entry.recomputed_prompt_tokens)
    if path.access_log.enabled:
        path.access_log.write(entry.line(time.time()))
