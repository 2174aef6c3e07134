"""Where the gateway cannot have the engine's count: an engine that is slow, failing,
refusing or without an answer, or unreachable, leaves the count to the gateway; an engine's
answer is cached; the off-loop worker renders templates as the loop does; and each model's
counters are built once per set of pools."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from support.chat_model import ModelFiles, chat_request, user
from support.pools import pool_doc
from support.tiny_tokenizer import WORDS

from laneway import api
from laneway.gateway.app import ledger_settings
from laneway.gateway.config import GatewaySettings
from laneway.gateway.serving.counting import (
    EngineTokenize,
    LocalCount,
    OffLoopCounter,
    PoolTokenizers,
)
from laneway.gateway.serving.request_body import Endpoint, parse_request
from laneway.ledger import Ledger
from laneway.tokens import (
    HuggingFaceTokenizer,
    default_tokenizer,
)

# --- the engine does not answer ---------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(60)
    return web.json_response({"count": 1})


async def _failing(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "boom"}}, status=500)


async def _refusing(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "roles must alternate"}}, status=400)


async def _countless(request: web.Request) -> web.Response:
    return web.json_response({"tokens": []})


@pytest.fixture
async def stub_engine() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def serve(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/tokenize", handler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield serve
    for runner in runners:
        await runner.cleanup()


def engine_pool(url: str, timeout_millis: int) -> api.InferencePool:
    doc = pool_doc("short", "interactive", "tiny", [url])
    doc["spec"]["tokenizer"] = {"kind": "engine", "timeoutMillis": timeout_millis}
    return api.parse_pool(doc)


@pytest.mark.parametrize(
    ("handler", "outcome"),
    [(_slow, "timeout"), (_failing, "failed"), (_refusing, "refused"), (_countless, "bad_answer")],
)
async def test_an_engine_that_does_not_answer_leaves_the_count_to_the_gateway(
    stub_engine: Callable[[Handler], Awaitable[str]], handler: Handler, outcome: str
) -> None:
    pool = engine_pool(await stub_engine(handler), timeout_millis=200)
    await check_fallback(pool, outcome)


async def test_an_unreachable_engine_leaves_the_count_to_the_gateway() -> None:
    await check_fallback(engine_pool("http://127.0.0.1:9", timeout_millis=2000), "unreachable")


async def check_fallback(pool: api.InferencePool, outcome: str) -> None:
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    ledger.update_pools(0.0, [pool])
    metrics = CollectorRegistry()
    outcomes = Counter("engine_counts", "", ("pool", "outcome"), registry=metrics)
    fallback = LocalCount(default_tokenizer(), OffLoopCounter())
    parsed = chat_request(user("lane gateway engine"))
    async with aiohttp.ClientSession() as session:
        engine = EngineTokenize(lambda: session, ledger, outcomes)
        assert await engine.count(pool, parsed, fallback) == parsed.count(default_tokenizer())
    labels = {"pool": pool.key, "outcome": outcome}
    assert metrics.get_sample_value("engine_counts_total", labels) == 1


async def test_an_engine_answer_is_cached(
    stub_engine: Callable[[Handler], Awaitable[str]],
) -> None:
    questions: list[dict[str, Any]] = []

    async def counting(request: web.Request) -> web.Response:
        questions.append(await request.json())
        return web.json_response({"count": 7, "tokens": [0] * 7, "max_model_len": 100})

    pool = engine_pool(await stub_engine(counting), timeout_millis=2000)
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    ledger.update_pools(0.0, [pool])
    metrics = CollectorRegistry()
    outcomes = Counter("engine_counts", "", ("pool", "outcome"), registry=metrics)
    fallback = LocalCount(default_tokenizer(), OffLoopCounter())
    chat = chat_request(user("lane"))
    completion = parse_request(
        orjson.dumps({"model": "llama", "prompt": ["a b", "c"]}), Endpoint.COMPLETIONS
    )
    async with aiohttp.ClientSession() as session:
        engine = EngineTokenize(lambda: session, ledger, outcomes)
        assert await engine.count(pool, chat, fallback) == 7
        assert await engine.count(pool, chat, fallback) == 7
        # Each prompt of a list is asked alone (vLLM takes one string); the longest decides.
        assert await engine.count(pool, completion, fallback) == 7
    # vLLM's and SGLang's shapes: the served name, and messages or one prompt string.
    assert questions == [
        {"model": "tiny", "messages": user("lane")},
        {"model": "tiny", "prompt": "a b"},
        {"model": "tiny", "prompt": "c"},
    ]
    labels = {"pool": pool.key, "outcome": "cached"}
    assert metrics.get_sample_value("engine_counts_total", labels) == 1


async def test_the_worker_process_renders_the_template_as_the_loop_does(
    model_files: ModelFiles,
) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    parsed = chat_request(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " ".join(WORDS) * 50},
        ]
    )
    counter = OffLoopCounter()
    try:
        assert await counter.count(parsed, ours) == parsed.count(ours)
    finally:
        counter.close()


def test_each_models_counters_are_built_once_per_set_of_pools(model_files: ModelFiles) -> None:
    tokenizer = {"kind": "huggingface", "path": str(model_files.tokenizer)}
    documents = [pool_doc("short", "interactive", "tiny", ["http://127.0.0.1:1"])]
    documents.append(pool_doc("long", "batch", "tiny", ["http://127.0.0.1:1"]))
    documents[1]["spec"]["tokenizer"] = tokenizer
    pools = tuple(api.parse_pool(doc) for doc in documents)
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    outcomes = Counter("engine_counts", "", ("pool", "outcome"), registry=CollectorRegistry())
    engine = EngineTokenize(lambda: aiohttp.ClientSession(), ledger, outcomes)
    tokenizers = PoolTokenizers(default_tokenizer(), 1, OffLoopCounter(), engine)

    counters = tokenizers.serving(pools, "llama")
    assert set(counters.by_pool) == {pool.key for pool in pools}
    assert counters.by_pool[pools[0].key] is tokenizers.default
    assert len(counters.distinct) == 2, "the default and the pool's own tokenizer"
    assert tokenizers.serving(pools, "llama") is counters
    # Another set of pools (an update) builds them again; an unknown model is not kept.
    assert tokenizers.serving(pools[:1], "llama").distinct == (tokenizers.default,)
    unknown = tokenizers.serving(pools[:1], "gpt-nothing")
    assert (dict(unknown.by_pool), unknown.distinct) == ({}, (tokenizers.default,))
    assert tokenizers.serving(pools[:1], "gpt-nothing") is not unknown
