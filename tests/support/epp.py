"""The test in Envoy's place on `laneway epp`'s ext_proc stream: the picker started as the
command starts it (in-process, over loopback gRPC), the protocol's messages built, and its
answers read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from aiohttp import web
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from google.protobuf.struct_pb2 import Struct
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from laneway.gateway.config import load_config
from laneway.gateway.epp.cli import picker_app
from laneway.gateway.epp.objectives import NO_OBJECTIVES, Objectives
from laneway.gateway.epp.server import follow_readiness, start_grpc
from laneway.gateway.keys import LEDGER, METRICS
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.gateway.state.shared import SharedStateOptions
from support.client import Samples
from support.pools import gateway_doc, pool_doc

FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
CHAT = "/v1/chat/completions"


@dataclass
class Picker:
    app: web.Application
    stub: ExternalProcessorStub
    channel: grpc.aio.Channel

    def samples(self) -> Samples:
        found: Samples = {}
        text = generate_latest(self.app[METRICS].registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((sample.labels, sample.value))
        return found

    def in_flight(self, url: str) -> int:
        return self.app[LEDGER].load(url).in_flight


async def start_picker(
    tmp_path: Path,
    engines: Sequence[str],
    chat_limits: dict[str, Any] | None = None,
    *,
    shared: SharedStateOptions | None = None,
    trust_fairness_id: bool = False,
    objectives: Objectives = NO_OBJECTIVES,
    chat_scheduling: dict[str, Any] | None = None,
    **gateway: Any,
) -> AsyncIterator[Picker]:
    a, b, long = engines
    documents = [
        pool_doc(
            "chat", "interactive", "llama-small", [a, b],
            routing={"maxPromptTokens": 2000},
            limits={"maxContextTokens": 4096, **(chat_limits or {})},
        ),
        pool_doc(
            "long", "batch", "llama-long", [long],
            routing={"minPromptTokens": 2001}, limits={"maxContextTokens": 32768},
        ),
        gateway_doc(**gateway),
    ]  # fmt: skip
    if chat_scheduling is not None:
        documents[0]["spec"]["scheduling"] = chat_scheduling
    async for picker in serve_picker(
        tmp_path,
        documents,
        shared=shared,
        trust_fairness_id=trust_fairness_id,
        objectives=objectives,
    ):
        yield picker


async def serve_picker(
    tmp_path: Path,
    documents: Sequence[dict[str, Any]],
    *,
    shared: SharedStateOptions | None = None,
    trust_fairness_id: bool = False,
    objectives: Objectives = NO_OBJECTIVES,
) -> AsyncIterator[Picker]:
    """A picker on these pool and GatewayConfig documents, built as `laneway epp` builds it."""
    config = tmp_path / "pools.yaml"
    config.write_text(yaml.safe_dump_all(documents))
    loaded = load_config(config)
    app = picker_app(loaded.settings, StaticPoolSource(loaded.pools), shared)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    server, health, port = await start_grpc(
        app, "127.0.0.1", 0, trust_fairness_id=trust_fairness_id, objectives=objectives
    )
    readiness = asyncio.create_task(follow_readiness(app, health))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Picker(app=app, stub=ExternalProcessorStub(channel), channel=channel)
    finally:
        readiness.cancel()
        await channel.close()
        await server.stop(0)
        await runner.cleanup()


class Exchange:
    """One ext_proc stream, the test in Envoy's place."""

    def __init__(self, picker: Picker) -> None:
        self._outbox: asyncio.Queue[ext.ProcessingRequest | None] = asyncio.Queue()
        self.call = picker.stub.Process(self._requests())

    async def _requests(self) -> AsyncIterator[ext.ProcessingRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def send(self, *messages: ext.ProcessingRequest) -> None:
        for message in messages:
            self._outbox.put_nowait(message)

    async def read(self) -> ext.ProcessingResponse:
        async with asyncio.timeout(30):
            answer = await self.call.read()
        assert isinstance(answer, ext.ProcessingResponse), answer
        return answer

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        async with asyncio.timeout(30):
            assert await self.call.read() == grpc.aio.EOF


def _headers(pairs: Mapping[str, str]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])


def request_headers(
    *,
    path: str = CHAT,
    mode: int = FULL_DUPLEX,
    subset: Sequence[str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> ext.ProcessingRequest:
    pairs = {":method": "POST", ":path": path, "content-type": "application/json", **(extra or {})}
    message = ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(headers=_headers(pairs)),
        protocol_config=ext.ProtocolConfiguration(request_body_mode=mode, response_body_mode=mode),
    )
    if subset is not None:
        hint = Struct()
        hint.update({"x-gateway-destination-endpoint-subset": list(subset)})
        message.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb.subset_hint": hint}))
    return message


def request_body(body: bytes, end: bool = True) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=body, end_of_stream=end))


def response_headers(
    status: int, content_type: str, served: str | None = None
) -> ext.ProcessingRequest:
    message = ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=_headers({":status": str(status), "content-type": content_type})
        )
    )
    if served is not None:
        meta = Struct()
        meta.update({"x-gateway-destination-endpoint-served": served})
        message.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb": meta}))
    return message


def response_body(body: bytes, end: bool) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=body, end_of_stream=end))


def chat(content: str = "hello there", **fields: Any) -> bytes:
    body = {"model": "llama", "messages": [{"role": "user", "content": content}], **fields}
    return json.dumps(body).encode()


def set_headers(mutation: ext.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def address(url: str) -> str:
    return url.removeprefix("http://")


def destination(answer: ext.ProcessingResponse) -> str:
    fields = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return str(fields["x-gateway-destination-endpoint"].string_value)


def immediate_error(answer: ext.ProcessingResponse) -> tuple[int, dict[str, Any]]:
    assert answer.HasField("immediate_response"), answer
    reply = answer.immediate_response
    assert set_headers(reply.headers)["content-type"] == "application/json"
    return reply.status.code, json.loads(reply.body)["error"]
