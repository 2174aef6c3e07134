"""One HTTP request's ext_proc stream: the picker's shell around the gateway's own steps.

Envoy sends the request's headers, its body (in chunks, full-duplex, or buffered whole),
then the response's headers and body. Once the body is whole the request goes the way the
standalone gateway sends it (`serving`: parse, count, classify, admit, plan) and the answer
is data: the plan's endpoints among the proxy's candidates, the chosen one first, as
`x-gateway-destination-endpoint` and `envoy.lb` metadata, or the gateway's OpenAI-shaped
error as an ImmediateResponse. The ledger is told each step (sent, answered, first token,
failed) and releases the request when the response ends, fails or its client leaves.

Full-duplex order (the protocol's): the headers answer waits for the whole body, then goes
before the body's; a buffered body comes after the headers answer, so the destination goes
with the body's answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from laneway.gateway.epp import protocol
from laneway.gateway.epp.asks import Asks, read_asks
from laneway.gateway.epp.following import ResponseWatch
from laneway.gateway.epp.objectives import NO_OBJECTIVES, ObjectivePriorities
from laneway.gateway.epp.tenancy import Identify
from laneway.gateway.errors import ApiError
from laneway.gateway.metrics import GapTally
from laneway.gateway.serving.admitting import admit, no_endpoint
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.engine_body import engine_body
from laneway.gateway.serving.handler import plan_request, record, release
from laneway.gateway.serving.incoming import body_too_large
from laneway.gateway.serving.model_name import rewriter
from laneway.gateway.serving.outcome import Outcome
from laneway.gateway.serving.relay import note_first_token
from laneway.gateway.serving.request_body import Endpoint
from laneway.gateway.serving.routing import PromptCount, parse, prompt_blocks, route_request
from laneway.gateway.state.callers import (
    Caller,
    routing_tenant,
    tenant_caps,
    tenant_name,
    tenant_priority,
)
from laneway.ledger import Admission, Ticket
from laneway.routing.plan import PlannedEndpoint, RoutingPlan
from laneway.routing.priority import engine_priority, gateway_level
from laneway.routing.slo import within_slo

log = logging.getLogger("laneway.gateway.requests")

ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}
INTERNAL = ApiError(500, "The endpoint picker failed on this request", "internal_error")
# A request that is not a completion (GET /v1/models, ...) is passed through: the proxy's
# own load balancing sends it.
PASS_THROUGH = "pass-through"


@dataclass(slots=True)
class _Routed:
    """What the picker decided for one routed request."""

    ticket: Ticket
    plan: RoutingPlan  # its endpoints among the proxy's candidates, best first
    public_model: str
    count: PromptCount


class PickerStream:
    """The ext_proc exchange of one HTTP request, message by message."""

    def __init__(
        self, path: RequestPath, identify: Identify, objectives: ObjectivePriorities = NO_OBJECTIVES
    ) -> None:
        self._path = path
        self._identify = identify
        self._objectives = objectives
        self._outcome = Outcome()
        self._started = 0.0
        self._route_path = ""
        self._headers: dict[str, str] = {}
        self._endpoint: Endpoint | None = None
        self._asks: Asks | None = None
        self._caller: Caller | None = None
        self._duplex_request = True
        self._duplex_response = True
        self._subset: tuple[str, ...] | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._routed: _Routed | None = None
        self._on: PlannedEndpoint | None = None  # the endpoint the ledger counts it on
        self._watch: ResponseWatch | None = None
        self._last_event: float | None = None
        self._gaps: GapTally | None = None  # the pool's TBT tally, from the first token on
        self._status = 0
        self._released = False

    async def run(
        self, messages: AsyncIterator[ext.ProcessingRequest]
    ) -> AsyncIterator[ext.ProcessingResponse]:
        try:
            async for message in messages:
                if self._watch is not None and message.HasField("response_body"):
                    # A response chunk, the stream's most frequent message: no coroutine or
                    # list to make for it.
                    chunk = self._response_body(message.response_body)
                    if chunk is not None:
                        yield chunk
                    continue
                try:
                    answers = await self._answer(message)
                except Exception:
                    # A bug: logged, and before the response the client gets the gateway's
                    # 500, never a gRPC error that FailOpen would let past unrouted.
                    log.exception("unhandled error in the picker on POST %s", self._route_path)
                    if self._watch is not None:
                        raise
                    answers = [self._refuse(INTERNAL)]
                for answer in answers:
                    yield answer
                    if answer.HasField("immediate_response"):
                        return
        except asyncio.CancelledError:
            self._outcome.client_gone()
            raise
        finally:
            self._release()

    async def _answer(self, message: ext.ProcessingRequest) -> list[ext.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if message.HasField("metadata_context") and self._subset is None:
            self._subset = protocol.subset_hint(message)
        if kind == "request_headers":
            return self._request_headers(message)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "request_trailers":
            return [protocol.trailers_continue(response=False)]
        if kind == "response_headers":
            return await self._response_headers(message)
        if kind == "response_body":  # before the response's headers (no routed request)
            body = message.response_body
            return [
                protocol.response_body_chunk(body.body, body.end_of_stream, self._duplex_response)
            ]
        if kind == "response_trailers":
            return [protocol.trailers_continue(response=True)]
        return []

    # -- the request -------------------------------------------------------------------------

    def _request_headers(self, message: ext.ProcessingRequest) -> list[ext.ProcessingResponse]:
        # The request arrived when the proxy read its first byte, where the proxy says when
        # (`request.time`): its own read and the hop here count, as the client counts them.
        self._started = self._path.clock() - protocol.time_in_proxy(message, time.time())
        self._headers = protocol.headers_of(message.request_headers)
        duplex = protocol.full_duplex(message)
        # Without the proxy's word, the mode the ecosystem's pickers are configured with.
        self._duplex_request = True if duplex is None else duplex
        self._duplex_response = protocol.response_full_duplex(message)
        self._route_path = self._headers.get(":path", "").split("?", 1)[0]
        method = self._headers.get(":method", "POST")
        endpoint = ENDPOINTS.get(self._route_path) if method == "POST" else None
        if endpoint is None or message.request_headers.end_of_stream:
            self._route_path = PASS_THROUGH  # for the proxy's own balancing; not logged
            return [protocol.request_headers_continue()]
        self._endpoint = endpoint
        try:
            # Who asks, and what, before its body comes: a refusal costs the body nothing.
            self._asks = asks = read_asks(self._headers)
            self._caller = self._identify(self._headers, asks.fairness_id)
        except ApiError as error:
            return [self._refuse(error)]
        if self._duplex_request:
            return []  # answered once the body is whole
        return [protocol.request_headers_continue()]

    async def _request_body(self, body: ext.HttpBody) -> list[ext.ProcessingResponse]:
        if self._endpoint is None:
            if self._duplex_request:
                return [protocol.request_body_chunk(body.body, body.end_of_stream)]
            return [ext.ProcessingResponse(request_body=ext.BodyResponse())]
        limit = self._path.settings.max_body_bytes
        self._body.append(body.body)
        self._body_bytes += len(body.body)
        if self._body_bytes > limit:
            return [self._refuse(body_too_large(limit))]
        if not body.end_of_stream:
            return []
        try:
            return await self._route(b"".join(self._body))
        except ApiError as error:
            return [self._refuse(error)]

    def _refuse(self, error: ApiError) -> ext.ProcessingResponse:
        outcome = self._outcome
        outcome.status, outcome.error = error.status, error.code
        self._body = []
        return protocol.immediate(error, outcome.routing_headers())

    async def _route(self, body: bytes) -> list[ext.ProcessingResponse]:
        path, outcome, endpoint = self._path, self._outcome, self._endpoint
        assert endpoint is not None
        self._body = []
        asks, caller = self._asks, self._caller
        assert asks is not None, "read with the headers of every routed request"
        parsed, inline = await parse(body, endpoint)
        outcome.parsed = parsed
        route, count = await route_request(
            path, parsed, len(body), inline, asks.lane, routing_tenant(caller), outcome
        )
        outcome.route = route
        pool = route.pool
        try:
            if path.tenant_limits is not None:
                context = pool.spec.limits.max_context_tokens
                await path.tenant_limits.admit(caller, parsed.charge(route.prefill_tokens, context))
            # An anonymous request's fair share is its fairness id's flow.
            tenant = routing_tenant(caller) or asks.fairness_id or tenant_name(caller)
            ask = Admission(
                route=route,
                arrived=self._started,
                path=endpoint.value,
                model=parsed.model,
                stream=parsed.stream,
                tenant=tenant,
                fair_tokens=parsed.sequences * route.prefill_tokens,
                caps=tenant_caps(caller),
                session_key=asks.session_key,
            )
            admitted = await admit(path, ask, outcome)
            path.metrics.queue_wait_of(pool.name, route.lane.value).observe(
                admitted.queue_ms / 1000
            )
            blocks = await prompt_blocks(path, parsed, pool)
            candidates = self._candidates(pool.endpoints)
            plan = await plan_request(path, admitted.ticket, pool, blocks, candidates)
        except BaseException:
            count.cancel()
            raise
        self._routed = routed = _Routed(
            ticket=admitted.ticket,
            plan=plan,
            public_model=parsed.model,
            count=count,
        )
        if not plan.endpoints:
            why = "no candidate the proxy offered is a ready endpoint of the pool"
            raise no_endpoint(path, plan.pool, why if self._subset is not None else "none is ready")
        self._on = plan.endpoints[0]
        path.ledger.sent(routed.ticket, path.clock(), self._on)
        path.load_changed()
        if count.known is not None:
            outcome.prompt_tokens = count.known
        # As the gateway sends it: the served name, its priority level, the allowed fields.
        # An objective's priority (higher more important) moves the tenant's level earlier.
        base = tenant_priority(caller) - self._objectives.priority(asks.objective)
        level = gateway_level(base, route.priority, parsed.priority)
        new_body = engine_body(
            parsed.payload,
            endpoint.value,
            body,
            plan.pool.spec.served_model_name,
            engine_priority(plan.pool, level),
        )
        addresses = [protocol.address_of(e.url) for e in plan.endpoints]
        headers = outcome.routing_headers()
        if self._duplex_request:
            length = None if new_body is body else len(new_body)
            return [
                protocol.routed_headers(addresses=addresses, headers=headers, body_bytes=length),
                protocol.routed_body(
                    addresses=addresses, headers=headers, body=new_body, streamed=True
                ),
            ]
        return [
            protocol.routed_body(
                addresses=addresses, headers=headers, body=new_body, streamed=False
            )
        ]

    def _candidates(self, urls: tuple[str, ...]) -> tuple[str, ...] | None:
        """The pool's endpoints the proxy lets it pick (as the ledger names them)."""
        if self._subset is None:
            return None
        hint = set(self._subset)
        return tuple(url for url in urls if protocol.address_of(url) in hint)

    # -- the response ------------------------------------------------------------------------

    async def _response_headers(
        self, message: ext.ProcessingRequest
    ) -> list[ext.ProcessingResponse]:
        headers = protocol.headers_of(message.response_headers)
        routed = self._routed
        if routed is None:
            return [protocol.response_headers({})]
        path, outcome = self._path, self._outcome
        self._status = status = int(headers.get(":status", "0") or 0)
        self._follow_served(routed, protocol.served_endpoint(message))
        if self._on is not None:
            if status >= 500:
                # Counted against the endpoint's health, as the gateway counts a 5xx.
                path.ledger.failed(routed.ticket, path.clock())
                self._on = None
                path.load_changed()
            else:
                path.ledger.answered(routed.ticket)
        outcome.status = status
        if outcome.prompt_tokens is None and routed.count.counting is not None:
            # A stream's prompt, counted while the engine worked, for the header; a whole
            # answer's count comes from the engine's usage instead, after the headers.
            outcome.prompt_tokens = await routed.count
        streaming = "text/event-stream" in headers.get("content-type", "")
        rename = rewriter(routed.plan.pool.spec.served_model_name, routed.public_model)
        self._watch = ResponseWatch(streaming=streaming, rename=rename)
        answer = protocol.response_headers(outcome.routing_headers())
        if rename is not None and not streaming:
            # The public name may be longer or shorter than the served one.
            answer.response_headers.response.header_mutation.remove_headers.append("content-length")
        return [answer]

    def _follow_served(self, routed: _Routed, served: str | None) -> None:
        """The proxy went to another of the chosen endpoints (the first failed): the ledger
        moves the request's load there."""
        on = self._on
        if served is None or on is None or protocol.address_of(on.url) == served:
            return
        path = self._path
        path.ledger.failed(routed.ticket, path.clock())
        self._on = None
        for planned in routed.plan.endpoints:
            if protocol.address_of(planned.url) == served:
                path.ledger.sent(routed.ticket, path.clock(), planned)
                self._on = planned
                break
        path.load_changed()

    def _response_body(self, body: ext.HttpBody) -> ext.ProcessingResponse | None:
        """The chunk passed back (renamed); None while a buffered body is still coming."""
        watch, routed = self._watch, self._routed
        assert watch is not None
        assert routed is not None, "a watch is set once routed"
        # One moment per chunk: the picker reads it and hands it on at once (the engine's
        # read and the client's write of the gateway are one hop apart here).
        now = self._path.clock()
        chunk, first = watch.feed(body.body)
        if body.end_of_stream:
            chunk += watch.end()
        if watch.streaming and self._status == 200 and chunk:
            self._time_tokens(routed, watch, chunk, first, now)
        if body.end_of_stream:
            self._outcome.complete = True
            self._release()
        if not self._duplex_response and not body.end_of_stream:
            return None  # buffered: the whole body comes in one message
        return protocol.response_body_chunk(chunk, body.end_of_stream, self._duplex_response)

    def _time_tokens(
        self, routed: _Routed, watch: ResponseWatch, chunk: bytes, first: bool, now: float
    ) -> None:
        if first and self._on is not None:
            path, plan = self._path, routed.plan
            note_first_token(path, plan, routed.ticket, read_at=now, written_at=now)
            self._gaps = path.metrics.tbt.labels(plan.pool.name, plan.lane.value)
            self._last_event = now
            return
        last, gaps = self._last_event, self._gaps
        if last is not None and gaps is not None and watch.events(chunk) > 0:
            gap = now - last
            gaps.observe(gap, within_slo(gap, routed.plan.pool.spec.slo.tbt_millis))
            self._last_event = now

    # -- the end -----------------------------------------------------------------------------

    def _release(self) -> None:
        """Once, however the request ended: the ledger releases what it held, the log."""
        if self._released or not self._route_path or self._route_path == PASS_THROUGH:
            return
        self._released = True
        path, outcome, routed = self._path, self._outcome, self._routed
        if not outcome.complete and outcome.status in (0, 200):
            # The stream closed before the response's end: the client left (or the proxy
            # reset the request), which the gateway logs as a 499 too.
            outcome.client_gone()
        if routed is not None:
            engine = self._watch.prompt_tokens if self._watch else None
            if engine is not None and outcome.parsed is not None and outcome.parsed.sequences == 1:
                outcome.prompt_tokens = engine
            elif outcome.prompt_tokens is None and routed.count.known is not None:
                outcome.prompt_tokens = routed.count.known
            routed.count.cancel()
        record(path, release(path, self._route_path, outcome, self._started))
