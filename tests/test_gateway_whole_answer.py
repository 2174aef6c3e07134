"""An unstreamed chat or completion on the batch lane through the gateway, over loopback with
`laneway sim` engines: the gateway reads it from its engine as a stream and answers it whole, the
answer the engine gives unstreamed; its first token is seen on the way, so a fed batch replica
takes its next document while the one before decodes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.client import client, scrape, total
from support.inproc import Servers
from support.pools import FAST, fed_docs, gateway_doc, pool_doc

from laneway.gateway.keys import LEDGER

CHAT = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 9}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 7}
DOCUMENT = "The parcel left the warehouse on Monday and reached the depot by noon. " * 600
UNIQUE_PER_ANSWER = ("id", "created")


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body) as response,
    ):
        return response.status, json.loads(await response.read())


def same_but_unique(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in UNIQUE_PER_ANSWER}


@pytest.mark.parametrize(
    ("path", "fields"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]
)
async def test_the_answer_is_the_engines_own_unstreamed_answer(
    servers: Servers, tmp_path: Path, path: str, fields: dict[str, Any]
) -> None:
    # Two engines alike: the one asked directly must not have the prompt cached.
    behind = await servers.sim("served-name", "--time-scale", FAST)
    direct = await servers.sim("served-name", "--time-scale", FAST)
    pool = pool_doc("docs", "batch", "served-name", [behind.url])
    gateway = await servers.gateway(tmp_path / "gateway.yaml", [pool, gateway_doc()])
    status, through = await post(gateway.url, path, {"model": "llama", **fields})
    direct_status, own = await post(direct.url, path, {"model": "served-name", **fields})
    assert (status, direct_status) == (200, 200)
    assert through["model"] == "llama"  # the name its client asked for
    assert same_but_unique(through) == {**same_but_unique(own), "model": "llama"}
    assert through["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # Its first token was seen: TTFT taken, as for a stream.
    samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="docs") == 1


async def test_a_whole_document_frees_its_replicas_prefill_at_its_first_token(
    servers: Servers, tmp_path: Path
) -> None:
    # A step budget of one chunk: the ledger feeds two documents at a time (the one
    # prefilling and the next). Long answers: each document decodes long after its prefill.
    engine = await servers.sim(
        "llama-long",
        *("--time-scale", FAST, "--scheduler", "chunked", "--max-context", "131072"),
        *("--token-budget", "2048", "--chunk-size", "2048"),
    )
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", [fed_docs(engine.url), gateway_doc()]
    )
    ledger = gateway.runner.app[LEDGER]
    pool = ledger.pools()[0]
    api = client(gateway)
    at_engine: list[float] = []

    async def send() -> str:
        answer = await api.completions.create(
            model="llama", prompt=DOCUMENT, max_tokens=400, stream=False
        )
        return answer.choices[0].finish_reason

    async def watch() -> None:
        while True:
            samples = await scrape(engine.url)
            running = total(samples, "vllm:num_requests_running")
            at_engine.append(running + total(samples, "vllm:num_requests_waiting"))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        reasons = await asyncio.wait_for(asyncio.gather(*(send() for _ in range(3))), 120)
    finally:
        watcher.cancel()
        await api.close()
    assert reasons == ["length"] * 3
    # All three at the engine at once: the third went at a first token, not at an answer's
    # end, though no client saw a byte before its whole answer.
    assert max(at_engine) == 3
    assert ledger.gate(pool).active == 0


async def test_the_openai_clients_unstreamed_call(servers: Servers, tmp_path: Path) -> None:
    engine = await servers.sim("served-name", "--time-scale", FAST)
    pool = pool_doc("docs", "batch", "served-name", [engine.url])
    gateway = await servers.gateway(tmp_path / "gateway.yaml", [pool, gateway_doc()])
    api = client(gateway)
    try:
        raw = await api.chat.completions.with_raw_response.create(
            model="llama", messages=[{"role": "user", "content": "Say something."}], max_tokens=5
        )
        completion = raw.parse()
        text = await api.completions.create(model="llama", prompt="Hi", max_tokens=3)
    finally:
        await api.close()
    assert completion.object == "chat.completion"
    assert completion.model == "llama"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == " lorem ipsum dolor sit amet"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert raw.headers["x-laneway-prompt-tokens"] == str(completion.usage.prompt_tokens)
    assert text.object == "text_completion"
    assert text.choices[0].text == " lorem ipsum dolor"
    samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="docs") == 2


async def test_an_interactive_unstreamed_answer_is_asked_unstreamed(
    servers: Servers, tmp_path: Path
) -> None:
    engine = await servers.sim("served-name", "--time-scale", FAST)
    pool = pool_doc("chat", "interactive", "served-name", [engine.url])
    gateway = await servers.gateway(tmp_path / "gateway.yaml", [pool, gateway_doc()])
    status, answer = await post(gateway.url, "/v1/completions", {"model": "llama", **COMPLETION})
    assert status == 200
    assert answer["choices"][0]["text"] == " lorem ipsum dolor sit amet consectetur adipiscing"
    # No first token seen: it came whole.
    samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="chat") == 0
