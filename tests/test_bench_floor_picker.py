"""The floor picker `bench gateway --against envoy+floor` measures
(bench/gateway/floor_picker.py), and the Envoy peers `--against` takes by name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

from laneway.bench.gateway import floor_picker
from laneway.bench.gateway.envoy_peers import (
    ENVOY_FLOOR,
    ENVOY_FLOOR_THREADS,
    ENVOY_LANEWAY,
    ENVOY_PEERS,
)
from laneway.bench.gateway.peers import RouterRun, parse_peers, picker_ratios
from laneway.bench.harness.envoy import free_port
from laneway.bench.harness.procs import Children

WORKERS = ("http://127.0.0.1:8101", "http://127.0.0.1:8102")


@pytest.fixture(params=floor_picker.SERVERS)
def picker(request: pytest.FixtureRequest) -> Iterator[str]:
    with Children() as children:
        port = free_port()
        argv = floor_picker.argv(WORKERS, port, request.param)
        children.start("floor picker", argv, floor_picker.READY_LINE)
        yield f"127.0.0.1:{port}"


async def _messages(chunks: tuple[bytes, ...]) -> AsyncIterator[ext.ProcessingRequest]:
    path = HeaderMap(headers=[HeaderValue(key=":path", raw_value=b"/v1/chat/completions")])
    yield ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=path))
    for n, chunk in enumerate(chunks):
        body = ext.HttpBody(body=chunk, end_of_stream=n == len(chunks) - 1)
        yield ext.ProcessingRequest(request_body=body)


async def test_names_the_engines_in_turn_and_passes_the_body_back(picker: str) -> None:
    async with grpc.aio.insecure_channel(picker) as channel:
        stub = ExternalProcessorStub(channel)
        picked = []
        for _ in range(3):
            chunks = (b'{"model": ', b'"m"}')
            answers = [answer async for answer in stub.Process(_messages(chunks))]
            head, *bodies = answers
            (header,) = head.request_headers.response.header_mutation.set_headers
            assert header.header.key == "x-gateway-destination-endpoint"
            picked.append(header.header.raw_value.decode())
            streamed = [b.request_body.response.body_mutation.streamed_response for b in bodies]
            assert [s.body for s in streamed] == list(chunks)
            assert [s.end_of_stream for s in streamed] == [False, True]
    assert picked == ["127.0.0.1:8101", "127.0.0.1:8102", "127.0.0.1:8101"]


def test_the_envoy_peers_are_peers_by_name() -> None:
    assert parse_peers(",".join(ENVOY_PEERS)) == ENVOY_PEERS


def _run(router: str, mode: str, *round_cpu_ms: float) -> RouterRun:
    requests = 100 * len(round_cpu_ms)
    cpu_s = sum(round_cpu_ms) * 100 / 1000
    return RouterRun(
        router=router, mode=mode, requests=requests, errors=0, wall_s=1.0, cpu_s=cpu_s,
        e2e=None, round_cpu_ms=round_cpu_ms,
    )  # fmt: skip


def test_the_picker_is_held_against_each_rounds_cheaper_floor() -> None:
    runs = [
        _run(ENVOY_FLOOR, "non-streaming", 2.0, 3.0),
        _run(ENVOY_FLOOR_THREADS, "non-streaming", 2.5, 1.5),
        _run(ENVOY_LANEWAY, "non-streaming", 4.0, 3.0),
        _run(f"{ENVOY_LANEWAY}@/tmp/base", "non-streaming", 5.0, 5.0),
        _run(ENVOY_FLOOR, "streaming", 4.0, 4.0),
        _run(ENVOY_LANEWAY, "streaming", 6.0, 6.0),
    ]
    ratios = {(r.mode, r.picker): r for r in picker_ratios(runs)}
    ours = ratios["non-streaming", ENVOY_LANEWAY]
    # Added up the thread-pool floor is cheaper (4.0 against 5.0 ms over the two rounds),
    # and each round is held against its own cheaper floor.
    assert ours.cheaper_floor == ENVOY_FLOOR_THREADS
    assert ours.ratio == pytest.approx(7.0 / 4.0)
    assert ours.round_ratios == pytest.approx((2.0, 2.0))
    assert ratios["non-streaming", f"{ENVOY_LANEWAY}@/tmp/base"].ratio == pytest.approx(2.5)
    assert ratios["streaming", ENVOY_LANEWAY].cheaper_floor == ENVOY_FLOOR
    assert len(ratios) == 3
