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
from laneway.bench.gateway.envoy_peers import ENVOY_PEERS
from laneway.bench.gateway.peers import parse_peers
from laneway.bench.harness.envoy import free_port
from laneway.bench.harness.procs import Children

WORKERS = ("http://127.0.0.1:8101", "http://127.0.0.1:8102")


@pytest.fixture
def picker() -> Iterator[str]:
    with Children() as children:
        port = free_port()
        argv = floor_picker.argv(WORKERS, port)
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
