"""A non-streaming answer's prompt count is the engine's own `usage.prompt_tokens`.

The pure part is table-driven. Then the gateway app serves in front of a simulated engine
(both in-process) that counts with a tokenizer trained here while the pool names none (so
the gateway's own count, cl100k_base, differs on most prompts): the header, the
prompt-token metric and the log line of a non-streaming answer carry the engine's count, a
stream's the gateway's. Scripted engines show where the gateway counts after all: an answer
without usage, an error answer, and a list of prompts, whose usage is their total where the
header names the longest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.client import client, scrape, total
from support.engines import engine_app
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc
from support.tiny_tokenizer import prompts, train_tokenizer

from laneway.gateway.serving.engine_usage import (
    EngineUsage,
    StreamUsageWatch,
    engine_prompt_tokens,
    engine_usage,
)
from laneway.tokens import ChatMessage, HuggingFaceTokenizer, count_chat, default_tokenizer

ENGINE_COUNT = 4321  # what the scripted engines report, far from any gateway count here


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # (a JSON answer, the count taken from it)
        (b'{"usage": {"prompt_tokens": 17, "completion_tokens": 2}}', 17),
        (b'{"choices": [], "usage": {"prompt_tokens": 0}}', 0),  # an empty prompt
        (b'{"choices": []}', None),  # an engine that reports no usage
        (b'{"usage": null}', None),
        (b'{"usage": {"completion_tokens": 2}}', None),
        (b'{"usage": {"prompt_tokens": true}}', None),  # a bool is no count
        (b'{"usage": {"prompt_tokens": -1}}', None),
        (b'{"usage": {"prompt_tokens": "17"}}', None),
        (b'{"usage": {"prompt_tokens": 17.0}}', None),
        (b'{"usage": [17]}', None),
        (b"[17]", None),
        (b'{"error": {"message": "boom"}}', None),
        (b"Internal Server Error", None),  # not JSON at all
        (b"", None),
    ],
)
def test_the_engines_count_is_read_from_its_answer(answer: bytes, expected: int | None) -> None:
    assert engine_prompt_tokens(answer) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # (a JSON answer, the prompt and cached counts taken from it)
        (b'{"usage": {"prompt_tokens": 17, "prompt_tokens_details": {"cached_tokens": 16}}}',
         EngineUsage(17, 16)),  # vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report
        (b'{"usage": {"prompt_tokens": 17, "prompt_tokens_details": {"cached_tokens": 0}}}',
         EngineUsage(17, 0)),
        # vLLM without the flag; SGLang with it when nothing was cached
        (b'{"usage": {"prompt_tokens": 17, "prompt_tokens_details": null}}',
         EngineUsage(17, None)),
        (b'{"usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 8}}}',
         EngineUsage(9, 8)),  # a response
        (b'{"usage": {"prompt_tokens": 17, "prompt_tokens_details": {"cached_tokens": -1}}}',
         EngineUsage(17, None)),
        (b'{"usage": {"prompt_tokens": 17, "prompt_tokens_details": [16]}}',
         EngineUsage(17, None)),
        (b'{"choices": []}', EngineUsage(None, None)),
    ],
)  # fmt: skip
def test_the_engines_cached_count_is_read_from_its_answer(
    answer: bytes, expected: EngineUsage
) -> None:
    assert engine_usage(answer) == expected


def test_a_streams_usage_event_is_read_across_chunk_breaks() -> None:
    events = (
        b'data: {"choices":[{"text":"a"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":40,'
        b'"prompt_tokens_details":{"cached_tokens":32}}}\n\ndata: [DONE]\n\n'
    )
    for cut in range(1, len(events)):
        watch = StreamUsageWatch()
        watch.feed(events[:cut])
        watch.feed(events[cut:])
        assert watch.usage == EngineUsage(40, 32), cut
    watch = StreamUsageWatch()
    watch.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n')
    assert watch.usage == EngineUsage(None, None)  # no usage asked for


def chat_body(text: str, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "llama",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "stream": stream,
    }


async def logged_prompt_tokens(capsys: pytest.CaptureFixture[str], requests: int) -> list[int]:
    """`prompt_tokens` of the gateway's first `requests` log lines, once it has written them
    to stderr."""
    written: list[str] = []
    async with asyncio.timeout(30):
        while True:
            written.append(capsys.readouterr().err)
            lines = [
                json.loads(line)
                for line in "".join(written).splitlines()
                if line.startswith("{") and '"path"' in line
            ]
            if len(lines) >= requests:
                return [line["prompt_tokens"] for line in lines[:requests]]
            await asyncio.sleep(0.05)


async def test_a_non_streaming_answer_carries_the_engines_count(
    servers: Servers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As `laneway gateway` configures logging; pytest's root logger says WARNING.
    caplog.set_level(logging.INFO, logger="laneway.gateway.requests")
    tokenizer_json = train_tokenizer(tmp_path / "tokenizer.json")
    engines_tokenizer = HuggingFaceTokenizer(tokenizer_json)
    texts = prompts()
    engine = await servers.sim("tiny", "--tokenizer", str(tokenizer_json))
    # The pool names no tokenizer: the gateway counts with its default, cl100k_base.
    documents = [pool_doc("solo", "interactive", "tiny", [engine.url]), gateway_doc()]
    gateway = await servers.gateway(tmp_path / "gateway.yaml", documents)
    headers, usages = [], []
    async with client(gateway) as api:
        for text in texts:
            raw = await api.chat.completions.with_raw_response.create(
                model="llama", messages=[{"role": "user", "content": text}], max_tokens=2
            )
            reply = raw.parse()
            assert reply.usage is not None
            headers.append(int(raw.headers["x-laneway-prompt-tokens"]))
            usages.append(reply.usage.prompt_tokens)
    # A stream's header goes out before the engine's usage: it is the gateway's count.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.url}/v1/chat/completions", json=chat_body(texts[0], stream=True)
        ) as response,
    ):
        assert response.status == 200
        await response.read()
        streamed = int(response.headers["x-laneway-prompt-tokens"])
    samples = await scrape(gateway.url)
    logged = await logged_prompt_tokens(capsys, len(texts) + 1)

    chats = [[ChatMessage("user", text)] for text in texts]
    assert usages == [count_chat(engines_tokenizer, chat) for chat in chats]
    assert headers == usages
    # The test means something only where the gateway's own count would have differed.
    gateways = [count_chat(default_tokenizer(), chat) for chat in chats]
    assert sum(g != u for g, u in zip(gateways, usages, strict=True)) >= len(texts) // 2
    assert streamed == gateways[0] != usages[0]
    assert logged == [*usages, streamed]
    metric = "laneway_gateway_prompt_tokens_sum"
    assert total(samples, metric, lane="interactive") == sum(usages) + streamed


def scripted_answer(usage: bool, status: int = 200) -> web.Application:
    """An engine answering every completion with one short choice, `usage` or not."""

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        if status != 200:
            return web.json_response({"error": {"message": "overloaded"}}, status=status)
        answer: dict[str, Any] = {
            "id": "x",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        }
        if usage:
            answer["usage"] = {"prompt_tokens": ENGINE_COUNT, "completion_tokens": 1}
        return web.json_response(answer)

    return engine_app(generate)


@pytest.fixture
async def scripted_gateway(servers: Servers, tmp_path: Path) -> AsyncIterator[Served]:
    """A gateway with three pools: `usage` (its engine reports usage), `countless` (it does
    not) and `refusing` (it answers 429)."""
    runners = []
    documents = []
    try:
        for model, engine in (
            ("usage", scripted_answer(usage=True)),
            ("countless", scripted_answer(usage=False)),
            ("refusing", scripted_answer(usage=True, status=429)),
        ):
            runner = web.AppRunner(engine)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            documents.append(pool_doc(model, "interactive", "scripted", [url], {"models": [model]}))
        yield await servers.gateway(tmp_path / "gateway.yaml", [*documents, gateway_doc()])
    finally:
        for runner in runners:
            await runner.cleanup()


async def answered(gateway: Served, path: str, body: dict[str, Any]) -> tuple[int, int]:
    """The status and the x-laneway-prompt-tokens header of one non-streaming request."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}{path}", json=body) as response,
    ):
        await response.read()
        return response.status, int(response.headers["x-laneway-prompt-tokens"])


async def test_without_the_engines_count_the_gateway_counts(
    scripted_gateway: Served,
) -> None:
    text = "Which lane does this prompt take?"
    chat = [ChatMessage("user", text)]
    ours = count_chat(default_tokenizer(), chat)
    assert ours != ENGINE_COUNT
    path = "/v1/chat/completions"
    assert await answered(scripted_gateway, path, {**chat_body(text), "model": "usage"}) == (
        200,
        ENGINE_COUNT,
    )
    countless = {**chat_body(text), "model": "countless"}
    assert await answered(scripted_gateway, path, countless) == (200, ours)
    refusing = {**chat_body(text), "model": "refusing"}
    assert await answered(scripted_gateway, path, refusing) == (429, ours)
    # A list of prompts: the engine's usage is their total, the header the longest one's.
    texts = ["a short prompt", "a somewhat longer prompt than the first one"]
    several = {"model": "usage", "prompt": texts, "max_tokens": 2}
    longest = max(default_tokenizer().count(t) for t in texts)
    assert await answered(scripted_gateway, "/v1/completions", several) == (200, longest)
    one = {"model": "usage", "prompt": texts[0], "max_tokens": 2}
    assert await answered(scripted_gateway, "/v1/completions", one) == (200, ENGINE_COUNT)
