"""The gateway in front of real vLLM (`pytest -m vllm`): routed there and back through the
official openai client, streaming and not, its TTFT, its prompt counts against vLLM's own
/tokenize, and its scraper reading vLLM's own /metrics into the ledger.

The engine is the session's one `vllm serve` (support.fixtures.vllm); each test starts its
own in-process gateway in front of it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from support.chat_model import user
from support.client import client, eventually, scrape, total
from support.engine_traces import ENDLESS, idle, still_running
from support.inproc import Served, Servers
from support.vllm_engine import MAX_NUM_SEQS, SERVED_NAME, VLLMServer, vllm_pool_docs

from laneway.gateway.keys import CLOCK, LEDGER
from laneway.routing.engine_metrics import EngineMetrics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]
MAX = float(MAX_NUM_SEQS)

# About a thousand prompt tokens: a prefill of about a second on these cores, so the first
# token comes well after the response's head, which vLLM sends as the stream opens.
LONG_QUESTION = "Which lane does a long prompt take, and which a short chat? " * 25


def uncached_question() -> str:
    """Eight times LONG_QUESTION, led by a block no earlier request shares: its prefill
    outlasts the stream's head by far even on a quiet machine, where LONG_QUESTION alone
    (cached by an earlier test or not) was prefilled in 40 ms, under the check's 50."""
    return f"{uuid.uuid4()} " + LONG_QUESTION * 8


async def vllm_gateway(servers: Servers, tmp_path: Path, engine: VLLMServer) -> Served:
    """A gateway in front of the session's engine, once no earlier test's request is left
    on it (the tests below count the engine's requests and gauges)."""
    await idle(engine)
    return await servers.gateway(tmp_path / "gateway.yaml", vllm_pool_docs(engine))


async def test_the_gateway_routes_to_vllm_and_back_streaming_and_not(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    gateway = await vllm_gateway(servers, tmp_path, vllm_server)
    async with client(gateway) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="llama", messages=user("Say something."), max_tokens=4,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        reply = raw.parse()
        # The gateway sent the pool's served name (vLLM answers 404 to any other) and gives
        # the client back the name it asked for.
        assert reply.model == "llama"
        assert raw.headers["x-laneway-pool"] == "real"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 4
        assert int(raw.headers["x-laneway-prompt-tokens"]) == reply.usage.prompt_tokens

        completion = await api.completions.create(
            model="llama", prompt="lane gateway engine", max_tokens=3,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert completion.model == "llama"
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 3

        stream = await api.chat.completions.create(
            model="llama", messages=user("Count to ten."), max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        pieces, usage = [], None
        async for chunk in stream:
            pieces += [c.delta.content for c in chunk.choices if c.delta.content]
            usage = chunk.usage or usage
    assert usage is not None
    assert usage.completion_tokens == 6
    assert pieces, "the stream carried content"


async def test_ttft_is_timed_at_vllms_first_content_chunk(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """vLLM opens the stream (status and headers) as soon as it takes the request, then
    frames the first token in a chat chunk after the prefill. The gateway's TTFT lies between
    vLLM's own (from its arrival, so a little shorter) and the client's (a little longer):
    a gateway that timed the head would report less than vLLM's own."""
    gateway = await vllm_gateway(servers, tmp_path, vllm_server)
    engine_before = await scrape(vllm_server.url)
    async with client(gateway) as api:
        sent = time.monotonic()
        stream = await api.chat.completions.create(
            model="llama", messages=user(uncached_question()), max_tokens=2, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        client_ttft = None
        async for chunk in stream:
            if client_ttft is None and any(c.delta.content for c in chunk.choices):
                client_ttft = time.monotonic() - sent
    assert client_ttft is not None
    gateway_samples = await scrape(gateway.url)
    engine_after = await scrape(vllm_server.url)
    assert total(gateway_samples, "laneway_gateway_ttft_seconds_count", pool="real") == 1
    gateway_ttft = total(gateway_samples, "laneway_gateway_ttft_seconds_sum", pool="real")
    name = "vllm:time_to_first_token_seconds"
    assert total(engine_after, f"{name}_count") - total(engine_before, f"{name}_count") == 1
    engine_ttft = total(engine_after, f"{name}_sum") - total(engine_before, f"{name}_sum")
    # The head leaves vLLM within milliseconds of the request; the prefill takes longer.
    assert engine_ttft > 0.05, "the prefill took a while: the head came well before the token"
    assert engine_ttft <= gateway_ttft <= client_ttft


# Prompts whose framing the gateway must render as vLLM does: a system message, several
# turns, a `name`, tools (rendered by the template's tojson), non-ASCII text.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "weather", "description": "Wetter für Köln",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
]  # fmt: skip
CHATS: list[dict[str, Any]] = [
    {"messages": user("lane gateway engine prompt")},
    {"messages": [{"role": "system", "content": "  Be brief.  "},
                  {"role": "user", "content": "naïve café — 東京 🚀", "name": "ada"}]},
    {"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                  {"role": "user", "content": "second, longer: prefill decode chunk"}]},
    # tool_choice none: "auto" needs a tool parser the tiny model's server does not run;
    # vLLM still renders the tools into the prompt.
    {"messages": user("What is the weather?"), "tools": TOOLS, "tool_choice": "none"},
]  # fmt: skip
PROMPTS: list[str | list[str]] = [
    "lane gateway engine",
    "Zebra-crossing, 42 times: überraschend!",
    ["router pool batch", "naïve café", "x" * 150],  # a list prompt
]


async def vllm_tokenize(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(f"{url}/tokenize", json={"model": SERVED_NAME, **body}) as answer:
        assert answer.status == 200, await answer.text()
        tokenized = await answer.json()
    count: int = tokenized["count"]
    assert count == len(tokenized["tokens"])
    return count


async def gateway_count(
    session: aiohttp.ClientSession, gateway: Served, body: dict[str, Any]
) -> int:
    """The gateway's own count (a stream's x-laneway-prompt-tokens; a non-streaming answer's
    header is the engine's usage)."""
    path = "chat/completions" if "messages" in body else "completions"
    body = {"model": "llama", "max_tokens": 1, **body, "stream": True}
    async with session.post(f"{gateway.url}/v1/{path}", json=body) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
        return int(answer.headers["x-laneway-prompt-tokens"])


async def test_the_gateways_counts_are_vllms_own(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """The pool's spec.tokenizer names the model's tokenizer.json and tokenizer_config.json
    (the chat template): the gateway's count of every chat and prompt is vLLM's /tokenize."""
    gateway = await vllm_gateway(servers, tmp_path, vllm_server)
    async with aiohttp.ClientSession() as session:
        for chat in CHATS:
            expected = await vllm_tokenize(session, vllm_server.url, chat)
            assert await gateway_count(session, gateway, chat) == expected, chat
        for prompt in PROMPTS:
            texts = prompt if isinstance(prompt, list) else [prompt]
            # A list prompt runs as one sequence per text: the gateway's count is the longest
            # one's, which decides whether the request fits the context cap.
            expected = max(
                [await vllm_tokenize(session, vllm_server.url, {"prompt": t}) for t in texts]
            )
            assert await gateway_count(session, gateway, {"prompt": prompt}) == expected, prompt


async def test_the_scraper_reads_vllms_metrics_into_the_ledger(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """vLLM's own gauge and counter names (vllm:num_requests_waiting, _running,
    vllm:kv_cache_usage_perc, vllm:prefix_cache_queries_total) are what the ledger holds:
    with MAX_NUM_SEQS long streams running and one more waiting in vLLM, and afterwards."""
    gateway = await vllm_gateway(servers, tmp_path, vllm_server)
    app = gateway.runner.app
    ledger, clock = app[LEDGER], app[CLOCK]

    def seen() -> EngineMetrics | None:
        return ledger.fresh_metrics(vllm_server.url, clock())

    async with client(gateway) as api:
        streams = [long_stream(api, f"stream {i}") for i in range(MAX_NUM_SEQS + 1)]
        tasks = [asyncio.create_task(drain(s)) for s in streams]
        try:

            async def busy() -> bool:
                still_running(tasks)  # a refused stream fails here, with its error
                metrics = seen()
                return metrics is not None and (metrics.running, metrics.waiting) == (MAX, 1)

            try:
                await eventually(busy, "the ledger seeing vLLM run two and queue one", within=300)
            except AssertionError as error:
                raise AssertionError(f"{error}; last seen: {seen()}") from None
            metrics = seen()
            assert metrics is not None
            assert 0 < metrics.kv_usage < 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    last: list[object] = []

    async def idle_and_current() -> bool:
        metrics = seen()
        engine = await scrape(vllm_server.url)
        queries = total(engine, "vllm:prefix_cache_queries_total")
        last[:] = [metrics, queries]
        return (
            metrics is not None
            and (metrics.running, metrics.waiting) == (0, 0)
            and metrics.prefix_queries == queries > 0
        )

    # The cancelled streams end when vLLM sees their connections close; one it does not
    # abort runs to its 1500 tokens (test_vllm_engine.py's abort check failed so once), which
    # takes minutes on these cores: generous, and the last reading named if it gives up.
    try:
        await eventually(idle_and_current, "the ledger seeing vLLM idle", within=600)
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen (ledger, engine's queries): {last}") from None


async def long_stream(api: openai.AsyncOpenAI, text: str) -> AsyncIterator[Any]:
    stream = await api.chat.completions.create(
        model="llama", messages=user(text), max_tokens=ENDLESS, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for chunk in stream:
        yield chunk


async def drain(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


def settled(answer: dict[str, Any]) -> dict[str, Any]:
    """What of an answer two runs of one greedy request share: its choices, with the
    `null`s vLLM's whole answer writes and its chunks never carry left out (`token_ids`,
    `routed_experts`, the message's `refusal`...), and its token counts (the prefix cache
    serves the second run's prompt)."""
    choices = []
    for choice in answer["choices"]:
        if "message" in choice:
            message = {k: v for k, v in choice["message"].items() if v is not None}
            choice = {**choice, "message": message}
        kept = ("logprobs", "stop_reason")  # null or not, the assembled answer has them
        choices.append({k: v for k, v in choice.items() if v is not None or k in kept})
    usage = answer["usage"]
    return {
        "object": answer["object"],
        "model": answer["model"],
        "choices": choices,
        "tokens": (usage["prompt_tokens"], usage["completion_tokens"]),
    }


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        (
            "/v1/chat/completions",
            {"messages": user("Name three colours."), "logprobs": True, "top_logprobs": 2},
        ),
        ("/v1/completions", {"prompt": "The lanes of the gateway are", "logprobs": 2}),
    ],
)
async def test_an_unstreamed_answer_read_as_a_stream_is_vllms_own(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path, path: str, fields: dict[str, Any]
) -> None:
    await idle(vllm_server)
    pool, config = vllm_pool_docs(vllm_server)
    pool["spec"]["lane"] = "batch"  # the lane whose unstreamed answers are read as streams
    gateway = await servers.gateway(tmp_path / "gateway.yaml", [pool, config])
    body = {**fields, "max_tokens": 8, "temperature": 0, "stream": False}
    async with aiohttp.ClientSession() as session:
        own = {**body, "model": SERVED_NAME}
        async with session.post(vllm_server.url + path, json=own) as response:
            assert response.status == 200
            direct = await response.json()
        async with session.post(gateway.url + path, json={**body, "model": "llama"}) as response:
            assert response.status == 200
            through = await response.json()
    assert settled(through) == {**settled(direct), "model": "llama"}
    samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_ttft_seconds_count") == 1  # read as a stream
