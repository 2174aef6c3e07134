"""The prefix index fed by the engines' own KV cache events: two simulated engines publish
vLLM's events (`--kv-events-config`) to the gateway's SUB socket, and the gateway routes on
what the engines really hold, including prefixes it never routed itself."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp
import msgpack
import pytest
from openai.types.chat import ChatCompletionUserMessageParam
from support.client import client, eventually, scrape, total
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc

from laneway.api import parse_pool
from laneway.bench.harness.redis_server import free_port
from laneway.errors import UsageError
from laneway.gateway.app import ledger_settings
from laneway.gateway.config import GatewaySettings
from laneway.gateway.pools.kv_events import KVEventSubscriber, endpoint_of_topic
from laneway.ledger import Ledger
from laneway.prompt_ids import chat_token_ids
from laneway.routing.prefix_index import KVEventSource
from laneway.tokens import ChatMessage, default_tokenizer

DOCUMENT = " ".join(
    f"Clause {i}: the tenant keeps the garden tidy and the gate shut." for i in range(300)
)
MODEL = "llama-small"


async def start_publishing_sim(servers: Servers, gateway_events: str) -> Served:
    port = free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": gateway_events,
              "topic": f"kv@127.0.0.1:{port}@{MODEL}"}  # fmt: skip
    args = ["--host", "127.0.0.1", "--port", str(port), "--max-context", "32768",
            "--kv-events-config", json.dumps(config)]  # fmt: skip
    return await servers.sim(MODEL, *args)


def content(question: str) -> str:
    return f"{DOCUMENT}\n\n{question}"


def ask(question: str) -> list[ChatCompletionUserMessageParam]:
    return [{"role": "user", "content": content(question)}]


async def index_blocks(gateway: Served, engine: Served) -> float:
    samples = await scrape(gateway.url)
    return total(samples, "laneway_gateway_prefix_index_blocks", endpoint=engine.url)


async def served(engine: Served) -> float:
    return total(await scrape(engine.url), "vllm:request_success_total")


async def test_the_gateway_routes_to_the_engine_whose_events_say_it_holds_the_prompt(
    servers: Servers, tmp_path: Path
) -> None:
    events = f"tcp://127.0.0.1:{free_port()}"
    engines = [await start_publishing_sim(servers, events) for _ in range(2)]
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        [
            pool_doc(
                "docs", "batch", MODEL, [e.url for e in engines], limits={"maxContextTokens": 32768}
            ),
            gateway_doc(picking={"prefix": {"kvEvents": [{"pool": "docs", "bind": events}]}}),
        ],
    )
    # The prompt as the engine renders it: its blocks are what the events will describe.
    ids = chat_token_ids(default_tokenizer(), [ChatMessage("user", content("Who mows?"))])
    blocks = len(ids) // 16

    async with aiohttp.ClientSession() as http:

        async def direct(messages: list[ChatCompletionUserMessageParam]) -> None:
            body = {"model": MODEL, "messages": messages, "max_tokens": 1}
            async with http.post(f"{engines[1].url}/v1/chat/completions", json=body) as response:
                assert response.status == 200

        # PUB drops what it sends before the gateway's subscription reaches it (ZMQ's slow
        # joiner): new short chats until one shows up in the index.
        async def subscribed() -> bool:
            await direct([{"role": "user", "content": f"warm-up {time.monotonic()} " * 20}])
            await asyncio.sleep(0.2)
            return await index_blocks(gateway, engines[1]) > 0

        await eventually(subscribed, "engine 1's events reaching the gateway", within=60)
        before = await index_blocks(gateway, engines[1])
        # Sent straight to engine 1, past the gateway: only the engine's events can tell.
        await direct(ask("Who mows?"))

    async def indexed() -> bool:
        return await index_blocks(gateway, engines[1]) == before + blocks

    await eventually(indexed, "engine 1's stored blocks in the gateway's index", within=60)
    assert await index_blocks(gateway, engines[0]) == 0

    # Through the gateway, the same document with another question: to engine 1, where it
    # is cached, though this gateway never routed it anywhere.
    direct_served = await served(engines[1])
    hits_before = total(await scrape(engines[1].url), "vllm:prefix_cache_hits_total")
    async with client(gateway) as api:
        for question in ("Who shuts the gate?", "Is the garden shared?"):
            await api.chat.completions.create(model="llama", messages=ask(question), max_tokens=1)
    assert [await served(e) for e in engines] == [0, direct_served + 2]
    hits = total(await scrape(engines[1].url), "vllm:prefix_cache_hits_total") - hits_before
    assert hits >= 2 * (blocks - 1) * 16, "both questions found the document cached"


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (b"kv@127.0.0.1:8001@llama-small", "http://127.0.0.1:8001"),
        (b"kv@127.0.0.1:8002", "http://127.0.0.1:8002"),
        (b"kv@127.0.0.1:9999", None),  # no such endpoint in the pool
        # An IPv6 pod: the operator's topic has its bare IP, the endpoint URL brackets it.
        (b"kv@fd00::5:8000", "http://[fd00::5]:8000"),
        (b"kv@[fd00::5]:8000", "http://[fd00::5]:8000"),
        (b"kv@fd00::5:8001", None),
        (b"kv-events", None),  # vLLM's example topic names no endpoint
        (b"", None),
    ],
)
def test_the_topic_names_the_endpoint(topic: bytes, expected: str | None) -> None:
    endpoints = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://[fd00::5]:8000"]
    assert endpoint_of_topic(topic, endpoints) == expected


def test_unreadable_messages_are_skipped_and_a_taken_address_is_a_clear_error() -> None:
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    ledger.update_pools(
        0.0, [parse_pool(pool_doc("docs", "batch", MODEL, ["http://127.0.0.1:8001"]))]
    )
    index = ledger.prefix_index
    source = KVEventSource("docs", f"tcp://127.0.0.1:{free_port()}")
    subscriber = KVEventSubscriber(source, ledger)
    try:
        topic = b"kv@127.0.0.1:8001"
        for frames in ([topic, b"\0" * 8, b"\xc1"], [topic, b"\0" * 8, msgpack.packb("x")],
                       [b"kv@nobody:1", b"\0" * 8, b""], [topic]):  # fmt: skip
            subscriber.receive(frames)
        assert index.blocks == 0
        stored = ["BlockStored", [1], None, list(range(16)), 16, None, "GPU"]
        subscriber.receive([topic, b"\0" * 8, msgpack.packb([0.0, [stored], 0])])
        assert index.blocks_of("http://127.0.0.1:8001") == 1
        with pytest.raises(UsageError, match=f"pool docs cannot bind {source.bind}"):
            KVEventSubscriber(source, ledger)
    finally:
        subscriber.close()


def test_an_engine_whose_blocks_are_not_the_entrys_size_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    ledger.update_pools(0.0, [parse_pool(pool_doc("docs", "batch", MODEL, urls))])
    source = KVEventSource("docs", f"tcp://127.0.0.1:{free_port()}", block_size=16)
    subscriber = KVEventSubscriber(source, ledger)

    def stored(topic: bytes, block_size: int) -> None:
        event = ["BlockStored", [1], None, list(range(block_size)), block_size, None, "GPU"]
        subscriber.receive([topic, b"\0" * 8, msgpack.packb([0.0, [event], 0])])

    try:
        with caplog.at_level("WARNING", logger="laneway.gateway.pools.kv_events"):
            for _ in range(3):
                stored(b"kv@127.0.0.1:8001", 32)
                stored(b"kv@127.0.0.1:8002", 16)
    finally:
        subscriber.close()
    assert [r.getMessage() for r in caplog.records] == [
        "kv events from http://127.0.0.1:8001: the engine stores 32-token blocks, but "
        "spec.picking.prefix.kvEvents gives pool docs blockSize 16, so none of its blocks can "
        "match a prompt: make the two the same (the engine's --block-size, "
        "spec.engine.kvEvents.blockSize on an operator-run pool)"
    ]


def test_a_missing_kvevents_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    source = KVEventSource("docs", f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(UsageError, match=r"kvEvents needs zmq: pip install 'laneway\[kvevents\]'"):
        KVEventSubscriber(source, ledger)
