"""The gateway's aiohttp application: `create_app` wires the cores, the shell serves them."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from laneway.api import InferencePool
from laneway.autoscale import DEMAND_PATH
from laneway.gateway.access_log import AccessLog
from laneway.gateway.batch.layer import install as install_batches
from laneway.gateway.config import GatewaySettings
from laneway.gateway.errors import ApiError, unreadable_body
from laneway.gateway.keys import (
    ACCESS_LOG,
    CLOCK,
    COUNTER,
    DEMAND_SHARE,
    LEDGER,
    LENDING,
    LENDING_SHARE,
    LOAD_SHARE,
    METRICS,
    POOL_TOKENIZERS,
    REQUEST_PATH,
    RESPONSE_SHARE,
    SESSION,
    SETTINGS,
    SHUTTING_DOWN,
    STOP,
    TENANT_SHARE,
    TOKENIZER,
    WAITERS,
)
from laneway.gateway.lifecycle import Stop, background
from laneway.gateway.metrics import GatewayMetrics
from laneway.gateway.pools.kv_events import KVEventSubscriber
from laneway.gateway.pools.scrape import probe_forever, scrape_forever
from laneway.gateway.pools.sources import PoolSource
from laneway.gateway.serving import responses
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.counting import EngineTokenize, OffLoopCounter, PoolTokenizers
from laneway.gateway.serving.handler import handle_completion
from laneway.gateway.serving.incoming import (
    drop_undecodable,
    expect_continue,
    unsupported_coding,
)
from laneway.gateway.serving.lending import Lending, LendingShares
from laneway.gateway.serving.protocol import stamp_arrival
from laneway.gateway.serving.request_body import Endpoint
from laneway.gateway.state.callers import TenantLimits, caller_of, routing_tenant
from laneway.gateway.state.shared import SharedStateOptions, install
from laneway.gateway.wakes import Waiters
from laneway.ledger import Ledger, LedgerSettings
from laneway.routing.lanes import serves_tenant
from laneway.tokens import Tokenizer, load_tokenizer

log = logging.getLogger("laneway.gateway")


def create_app(
    settings: GatewaySettings,
    source: PoolSource,
    *,
    tokenizer: Tokenizer | None = None,
    rng: random.Random | None = None,
    ledger: Ledger | None = None,
    clock: Callable[[], float] = time.monotonic,
    shared: SharedStateOptions | None = None,
    metrics_route: bool = True,
    leads_lending: bool = True,
    batches: bool = True,
) -> web.Application:
    """The whole gateway app; with `shared`, its state layer too (tenants, limits, Redis,
    the Files and Batches API). Without `metrics_route`, /metrics is served only by
    `create_metrics_app` on a port of its own. `ledger`: one built by the caller (a trace
    test's recording one) in place of the one `settings` describe. Without `leads_lending`,
    this app never decides lending roles: it adopts those a leading gateway replica
    publishes to the shared Redis, else lends nothing, and feeds no request of its own to a
    lent replica (the endpoint picker's: Envoy holds the upstream requests a reclaim would
    have to close). Without `batches`, the state layer comes without the
    Files and Batches API (the endpoint picker serves no HTTP API, so it has no batch lane
    to run items through)."""
    app = web.Application(middlewares=[stamp_arrival, openai_errors])
    app[SETTINGS] = settings
    if ledger is None:
        ledger = Ledger(
            ledger_settings(settings, borrow_lent=leads_lending), rng or random.Random()
        )
    app[LEDGER] = ledger
    app[WAITERS] = Waiters()
    tok = settings.tokenizer
    app[TOKENIZER] = tokenizer or load_tokenizer(tok.kind, tok.encoding, tok.path, tok.config_path)
    app[COUNTER] = OffLoopCounter()
    app.on_cleanup.append(_stop_counter)
    app[METRICS] = GatewayMetrics(ledger, clock)
    shares_redis = shared is not None and shared.redis is not None
    app[LENDING] = Lending(
        ledger,
        app[WAITERS],
        clock,
        app[METRICS].reclaimed_on,
        shared=shares_redis,
        leads=leads_lending,
    )
    app[POOL_TOKENIZERS] = PoolTokenizers(
        app[TOKENIZER],
        settings.queue.retry_after_seconds,
        app[COUNTER],
        EngineTokenize(lambda: app[SESSION], ledger, app[METRICS].engine_counts),
    )
    app[CLOCK] = clock
    app[SHUTTING_DOWN] = asyncio.Event()
    app[STOP] = Stop()
    app[ACCESS_LOG] = AccessLog(off_loop=True)
    app.on_cleanup.append(_close_access_log)
    app.cleanup_ctx.append(_client_session)
    # The state layer's teardown (its heartbeats stopped, the lending lease handed back,
    # Redis closed) runs after the background's below, which stops the lending loop first:
    # cleanup contexts end in reverse order.
    redis = install(app, shared) if shared is not None else None
    app.cleanup_ctx.append(_background(source))
    app.on_shutdown.append(_begin_drain)
    for endpoint in Endpoint:
        app.router.add_post(endpoint.value, _completion(endpoint), expect_handler=expect_continue)
    app.router.add_get("/v1/responses/{response_id}", responses.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", responses.cancel)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics_route:
        app.router.add_get("/metrics", metrics)
        # Demand names tenant-private pools and their load: on the API port only behind a
        # key (the tenant middleware's); with a metrics port, there instead.
        app.router.add_get(DEMAND_PATH, demand_of(app))
    if shared is not None and batches:
        install_batches(app, shared, redis)
    return app


def ledger_settings(settings: GatewaySettings, *, borrow_lent: bool = True) -> LedgerSettings:
    return LedgerSettings(
        picking=settings.picking,
        max_waiting=settings.queue.max_waiting,
        failures_to_eject=settings.health.failures_to_eject,
        stale_after_s=settings.scrape.stale_after_millis / 1000,
        max_attempts=UPSTREAM_ATTEMPTS,
        lend_after_s=settings.lending.lend_after_millis / 1000,
        borrow_lent=borrow_lent,
    )


def _completion(endpoint: Endpoint) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await handle_completion(request, endpoint)

    return handler


async def _stop_counter(app: web.Application) -> None:
    app[COUNTER].close()


async def _close_access_log(app: web.Application) -> None:
    app[ACCESS_LOG].close()


# An idle connection to an engine is reused within this and closed after: under the 5 s idle
# timeout of uvicorn (vLLM's and SGLang's server), so the engine never closes a connection
# just as a request is written on it.
ENGINE_KEEPALIVE_S = 4.0
UPSTREAM_ATTEMPTS = 2  # the first pick, and one retry on another endpoint


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    """The one client session for every engine request: completions, scrapes, probes,
    batch items."""
    # Many concurrent streams to few engines: no cap on the pool of connections.
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, keepalive_timeout=ENGINE_KEEPALIVE_S
    )
    limits = app[SETTINGS].upstream
    # The engines' timeouts as the session's default, built once: the request path passes
    # none, and every other caller (scrape, probe, batch dispatch) passes its own.
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=limits.connect_timeout_millis / 1000,
        sock_read=limits.read_timeout_millis / 1000,
    )
    # An engine's cookies are not kept: one client's answer must set nothing that the next
    # client's request to that engine would carry.
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=jar
    ) as session:
        app[SESSION] = session
        app[REQUEST_PATH] = RequestPath(
            ledger=app[LEDGER],
            waiters=app[WAITERS],
            session=session,
            settings=app[SETTINGS],
            clock=app[CLOCK],
            metrics=app[METRICS],
            tokenizers=app[POOL_TOKENIZERS],
            access_log=app[ACCESS_LOG],
            tenant_limits=TenantLimits.of(app),
            load_share=app.get(LOAD_SHARE),
            response_share=app.get(RESPONSE_SHARE),
            tenant_share=app.get(TENANT_SHARE),
            lending=app[LENDING],
        )
        yield


def _background(source: PoolSource) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        ledger, settings, session = app[LEDGER], app[SETTINGS], app[SESSION]
        clock, wake = app[CLOCK], app[WAITERS].wake

        def update(pools: Sequence[InferencePool]) -> None:
            wake(ledger.update_pools(clock(), pools))
            app[LENDING].rebalance()

        tasks = [
            asyncio.create_task(source.run(update), name="pool-source"),
            asyncio.create_task(
                scrape_forever(ledger, session, settings, clock, wake), name="scrape"
            ),
            asyncio.create_task(
                probe_forever(ledger, session, settings, clock, wake), name="probe"
            ),
        ]
        tasks[0].add_done_callback(lambda task: _source_ended(app, task))
        interval_s = settings.lending.interval_millis / 1000
        shares = None
        if LENDING_SHARE in app:
            shares = LendingShares(app[LENDING_SHARE], app[DEMAND_SHARE], app[LOAD_SHARE])
        tasks.append(asyncio.create_task(app[LENDING].run(interval_s, shares), name="lending"))
        subscribers = [
            KVEventSubscriber(source, ledger) for source in settings.picking.prefix.kv_events
        ]
        tasks += [
            asyncio.create_task(s.run(), name=f"kv-events {s.source.pool}") for s in subscribers
        ]
        try:
            async with background(*tasks):
                yield
        finally:
            for subscriber in subscribers:
                subscriber.close()

    return run


def _source_ended(app: web.Application, task: asyncio.Task[None]) -> None:
    # A static source returns after its one update; one that raises leaves the gateway
    # blind to pool changes, so it stops (and its supervisor restarts it).
    if not task.cancelled() and (error := task.exception()) is not None:
        app[STOP].fail(f"the pool source failed: {type(error).__name__}: {error}")


async def _begin_drain(app: web.Application) -> None:
    app[SHUTTING_DOWN].set()
    app[WAITERS].wake(app[LEDGER].drain())


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as OpenAI-shaped JSON; a bug is logged here, never sent."""
    response = await _answer(request, handler)
    await drop_undecodable(request, response)
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        if (refused := unsupported_coding(request)) is not None:
            raise refused
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.RequestPayloadError as error:
        # Raised while reading a body: a gzip header on plain text, a bad chunk size.
        return unreadable_body(error).response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return ApiError(
            error.status, error.reason, error.reason.lower().replace(" ", "_")
        ).response()
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return ApiError(500, "The gateway failed on this request", "internal_error").response()


async def models(request: web.Request) -> web.Response:
    """The models this caller may reach: the open pools' and its own tenant's."""
    tenant = routing_tenant(caller_of(request))
    pools = [pool for pool in request.app[LEDGER].pools() if serves_tenant(pool, tenant)]
    names = sorted({model for pool in pools for model in pool.spec.public_models})
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "laneway"} for name in names]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[SHUTTING_DOWN].is_set():
        return web.json_response({"status": "draining"}, status=503)
    if not request.app[LEDGER].ready():
        return web.json_response({"status": "no pool has an available endpoint"}, status=503)
    return web.json_response({"status": "ready"})


def demand_of(app: web.Application) -> Handler:
    """Each pool's demand in `app` for the operator's scaler: this replica's, or with Redis
    every replica's summed."""

    async def demand(request: web.Request) -> web.StreamResponse:
        local = app[LEDGER].demand(app[CLOCK]())
        share = app.get(DEMAND_SHARE)
        counts, replicas = (local, 1) if share is None else await share.total(local)
        pools = {key: count.to_wire() for key, count in sorted(counts.items())}
        return web.json_response({"object": "laneway.demand", "replicas": replicas, "pools": pools})

    return demand


def create_metrics_app(app: web.Application) -> web.Application:
    """/metrics and /laneway/demand, for a port apart from the API: both name engines,
    tenants and tenant-private pools, so a NetworkPolicy can admit only Prometheus and the
    scalers there."""
    metrics_app = web.Application()
    metrics_app[METRICS] = app[METRICS]
    metrics_app.router.add_get("/metrics", metrics)
    metrics_app.router.add_get(DEMAND_PATH, demand_of(app))
    return metrics_app


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
