"""`laneway epp`'s side of the Endpoint Picker Protocol, message by message: the gRPC
server and the gateway app as the command starts them (in-process, over loopback gRPC),
`laneway sim` engines as the pool's endpoints, and the test in Envoy's place sending
ext_proc messages and reading the answers. What a real Envoy does with those answers is
test_epp_envoy.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf.struct_pb2 import Struct
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.client import eventually, total
from support.epp import (
    BUFFERED,
    Exchange,
    Picker,
    address,
    chat,
    destination,
    immediate_error,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    start_picker,
)
from support.inproc import Servers

from laneway.gateway.epp.protocol import time_in_proxy


@pytest.fixture
async def engines(servers: Servers) -> tuple[str, str, str]:
    """Two interactive engines and a batch one."""
    a, b, long = [await servers.sim("llama-small", "--time-scale", "20") for _ in range(3)]
    return a.url, b.url, long.url


@pytest.fixture
async def picker(tmp_path: Path, engines: tuple[str, str, str]) -> AsyncIterator[Picker]:
    async for started in start_picker(tmp_path, engines):
        yield started


async def test_full_duplex_headers_answer_waits_for_the_body_and_names_the_endpoints(
    picker: Picker, engines: tuple[str, str, str]
) -> None:
    a, b, _ = engines
    body = chat(max_tokens=4)
    exchange = Exchange(picker)
    # The body in two chunks, as Envoy streams it: the picker answers only after the last.
    exchange.send(request_headers(), request_body(body[:10], end=False), request_body(body[10:]))
    first = await exchange.read()
    assert first.HasField("request_headers")
    sets = set_headers(first.request_headers.response.header_mutation)
    picked = sets["x-gateway-destination-endpoint"].split(",")
    # Every endpoint of the interactive pool, the chosen one first; header and metadata agree.
    assert sorted(picked) == sorted([address(a), address(b)])
    assert destination(first) == sets["x-gateway-destination-endpoint"]
    assert sets["x-laneway-lane"] == "interactive"
    assert sets["x-laneway-pool"] == "chat"
    second = await exchange.read()
    streamed = second.request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    forwarded = json.loads(streamed.body)
    # The pool serves the model under another name: rewritten, and the length follows.
    assert forwarded["model"] == "llama-small"
    assert int(sets["content-length"]) == len(streamed.body)
    chosen = "http://" + picked[0]
    assert picker.in_flight(chosen) == 1

    exchange.send(response_headers(200, "application/json"))
    head = await exchange.read()
    assert set_headers(head.response_headers.response.header_mutation)["x-laneway-pool"] == "chat"
    # The public name goes back; the engine's length no longer holds.
    assert "content-length" in head.response_headers.response.header_mutation.remove_headers
    answer = b'{"model":"llama-small","choices":[],"usage":{"prompt_tokens":9}}'
    exchange.send(response_body(answer[:20], end=False), response_body(answer[20:], end=True))
    parts = [await exchange.read(), await exchange.read()]
    relayed = b"".join(p.response_body.response.body_mutation.streamed_response.body for p in parts)
    assert json.loads(relayed)["model"] == "llama"
    await exchange.close()
    assert picker.in_flight(chosen) == 0
    samples = picker.samples()
    assert total(samples, "laneway_gateway_requests_total", pool="chat", status="200") == 1
    # The engine's own count, from the answer's usage.
    assert total(samples, "laneway_gateway_prompt_tokens_sum", lane="interactive") == 9


async def test_picks_only_among_the_proxys_candidates(
    picker: Picker, engines: tuple[str, str, str]
) -> None:
    _, b, _ = engines
    for _ in range(4):
        exchange = Exchange(picker)
        exchange.send(request_headers(subset=[address(b), "10.9.9.9:8000"]), request_body(chat()))
        first = await exchange.read()
        assert destination(first) == address(b)
        exchange.call.cancel()
    # None of the candidates is an endpoint of the pool: 503, as the protocol asks.
    exchange = Exchange(picker)
    exchange.send(request_headers(subset=["10.9.9.9:8000"]), request_body(chat()))
    status, error = immediate_error(await exchange.read())
    assert status == 503
    assert error["code"] == "no_healthy_endpoint"
    assert "candidate" in error["message"]


async def test_buffered_mode_continues_the_headers_and_routes_with_the_body(
    picker: Picker, engines: tuple[str, str, str]
) -> None:
    _, _, long = engines
    exchange = Exchange(picker)
    exchange.send(request_headers(mode=BUFFERED))
    head = await exchange.read()
    assert head.HasField("request_headers")
    assert not head.request_headers.response.header_mutation.set_headers
    # A long prompt: the batch lane.
    exchange.send(request_body(chat("lorem ipsum " * 1500)))
    body = await exchange.read()
    common = body.request_body.response
    assert set_headers(common.header_mutation)["x-gateway-destination-endpoint"] == address(long)
    assert destination(body) == address(long)
    assert set_headers(common.header_mutation)["x-laneway-lane"] == "batch"
    assert json.loads(common.body_mutation.body)["model"] == "llama-long"
    exchange.call.cancel()


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (chat(model="nope"), {}, 404, "model_not_found"),
        (b'{"model": "llama", "messages": [', {}, 400, "invalid_request"),
        (chat("lorem ipsum " * 20000), {}, 400, "context_length_exceeded"),
        (chat(), {"x-llm-d-slo-ttft-ms": "soon"}, 400, "invalid_request"),
        (chat(), {"x-laneway-lane": "sideways"}, 400, "invalid_request"),
    ],
    ids=["unknown-model", "bad-json", "context-too-long", "bad-slo-header", "bad-lane-header"],
)
async def test_refusals_are_the_gateways_openai_errors(
    picker: Picker, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    exchange = Exchange(picker)
    exchange.send(request_headers(extra=headers), request_body(body))
    got, error = immediate_error(await exchange.read())
    assert (got, error["code"]) == (status, code), error
    assert error["message"]


async def test_a_full_pool_answers_429_with_retry_after(
    tmp_path: Path, engines: tuple[str, str, str]
) -> None:
    # One slot per endpoint and no line: the third request is refused at once.
    limits = {"maxConcurrentRequests": 1}
    async for picker in start_picker(tmp_path, engines, limits, queue={"maxWaiting": 0}):
        held = []
        for _ in range(2):
            exchange = Exchange(picker)
            exchange.send(request_headers(), request_body(chat()))
            assert (await exchange.read()).HasField("request_headers")
            held.append(exchange)
        exchange = Exchange(picker)
        exchange.send(request_headers(), request_body(chat()))
        answer = await exchange.read()
        status, error = immediate_error(answer)
        assert (status, error["code"]) == (429, "pool_saturated")
        assert "Retry-After".lower() in set_headers(answer.immediate_response.headers)
        for waiting in held:
            waiting.call.cancel()


async def test_a_stream_is_followed_for_its_first_token_gaps_and_usage(picker: Picker) -> None:
    exchange = Exchange(picker)
    exchange.send(request_headers(), request_body(chat(stream=True)))
    first = await exchange.read()
    chosen = "http://" + destination(first).split(",")[0]
    await exchange.read()
    exchange.send(response_headers(200, "text/event-stream"))
    head = await exchange.read()
    # A small streamed prompt is counted exactly for the header.
    assert (
        int(set_headers(head.response_headers.response.header_mutation)["x-laneway-prompt-tokens"])
        > 0
    )
    start = b'data: {"model":"llama-small","choices":'
    events = [
        start + b'[{"delta":{"role":"assistant","content":""}}]}\n\n',
        start + b'[{"delta":{"content":"Hi"}}]}\n\n',
        start + b'[{"delta":{"content":" there"}}]}\n\n',
        start + b'[],"usage":{"prompt_tokens":4321}}\n\ndata: [DONE]\n\n',
    ]
    relayed = []
    for n, event in enumerate(events):
        exchange.send(response_body(event, end=n == len(events) - 1))
        relayed.append(
            (await exchange.read()).response_body.response.body_mutation.streamed_response
        )
    assert relayed[-1].end_of_stream
    text = b"".join(part.body for part in relayed)
    assert b'"model":"llama"' in text
    assert b"llama-small" not in text
    await exchange.close()
    samples = picker.samples()
    labels = {"pool": "chat", "lane": "interactive"}
    assert total(samples, "laneway_gateway_ttft_seconds_count", **labels) == 1
    # Two gaps after the first token: the second content event and the usage one.
    assert total(samples, "laneway_gateway_tbt_seconds_count", **labels) == 2
    assert total(samples, "laneway_gateway_prompt_tokens_sum", lane="interactive") == 4321
    assert picker.in_flight(chosen) == 0


async def test_a_client_that_leaves_releases_what_the_request_held(picker: Picker) -> None:
    exchange = Exchange(picker)
    exchange.send(request_headers(), request_body(chat(stream=True)))
    chosen = "http://" + destination(await exchange.read()).split(",")[0]
    assert picker.in_flight(chosen) == 1
    exchange.call.cancel()  # Envoy resets the stream when its client goes

    async def released() -> bool:
        return picker.in_flight(chosen) == 0

    await eventually(released, "the picker to release the request")
    samples = picker.samples()
    assert total(samples, "laneway_gateway_requests_total", pool="chat", status="499") == 1


async def test_the_served_endpoint_moves_the_requests_load(
    picker: Picker, engines: tuple[str, str, str]
) -> None:
    exchange = Exchange(picker)
    exchange.send(request_headers(), request_body(chat()))
    picked = destination(await exchange.read()).split(",")
    await exchange.read()
    # The first pick failed to connect; the proxy's retry went to the fallback.
    exchange.send(response_headers(200, "application/json", served=picked[1]))
    await exchange.read()
    assert picker.in_flight("http://" + picked[0]) == 0
    assert picker.in_flight("http://" + picked[1]) == 1
    exchange.call.cancel()


async def test_a_lane_named_objective_pins_the_lane(picker: Picker) -> None:
    exchange = Exchange(picker)
    # Short enough for the interactive lane, pinned to the batch one by its objective.
    extra = {"x-gateway-inference-objective": "batch", "x-llm-d-inference-fairness-id": "team-a"}
    exchange.send(request_headers(extra=extra), request_body(chat()))
    first = await exchange.read()
    assert set_headers(first.request_headers.response.header_mutation)["x-laneway-lane"] == "batch"
    exchange.call.cancel()


async def test_requests_it_does_not_route_pass_through(picker: Picker) -> None:
    exchange = Exchange(picker)
    exchange.send(request_headers(path="/v1/models"))
    exchange.send(request_body(b"{}", end=True))
    head = await exchange.read()
    assert head.HasField("request_headers")
    assert not head.request_headers.response.header_mutation.set_headers
    body = await exchange.read()
    assert body.request_body.response.body_mutation.streamed_response.body == b"{}"
    await exchange.close()


async def test_health_names_liveness_readiness_and_the_service(picker: Picker) -> None:
    health = health_pb2_grpc.HealthStub(picker.channel)

    async def status(service: str) -> int:
        answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
        return int(answer.status)

    serving = health_pb2.HealthCheckResponse.SERVING
    assert await status("liveness") == serving

    async def ready() -> bool:
        return bool(await status("readiness") == serving)

    await eventually(ready, "readiness once the engines pass their probes")
    assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == serving


async def test_a_completion_without_a_body_passes_through_unlogged(picker: Picker) -> None:
    exchange = Exchange(picker)
    bodiless = request_headers()
    bodiless.request_headers.end_of_stream = True
    exchange.send(bodiless)
    head = await exchange.read()
    assert not head.request_headers.response.header_mutation.set_headers
    await exchange.close()
    assert total(picker.samples(), "laneway_gateway_requests_total") == 0


def with_request_time(value: str | None) -> ext.ProcessingRequest:
    """Request headers carrying Envoy's `request.time` attribute as the filter sends it."""
    message = request_headers()
    if value is not None:
        attributes = Struct()
        attributes.update({"request.time": value})
        message.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    return message


@pytest.mark.parametrize(
    ("sent", "seconds"),
    [
        ("2026-12-03T12:52:49.778447+00:00", 1.5),  # as Envoy 1.40 writes it
        ("2026-12-03T13:52:49.778447+01:00", 1.5),  # the same moment in another zone
        ("2026-12-03T12:52:51.278447+00:00", 0.0),  # not yet: the proxy's clock ahead
        ("2026-12-03T12:52:49.778447", 0.0),  # no zone: no moment
        ("yesterday", 0.0),
        ("", 0.0),
        (None, 0.0),  # not asked for: the picker's own clock
    ],
)
def test_the_time_in_the_proxy_is_read_from_request_time(sent: str | None, seconds: float) -> None:
    now = datetime.fromisoformat("2026-12-03T12:52:51.278447+00:00").timestamp()
    assert time_in_proxy(with_request_time(sent), now) == pytest.approx(seconds)
