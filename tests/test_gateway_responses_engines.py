"""Responses behind gateways of their own (test_gateway_responses.py shares one setup): a
holder whose engine restarted on the same address before any scrape showed it (OpenAI's
not-found, never an answer without history), and a pool whose model's chat template the
gateway holds, as the engine does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent
from support.chat_model import ModelFiles
from support.inproc import Servers
from support.pools import FAST, gateway_doc, pool_doc


async def test_a_holder_whose_engine_restarted_answers_openais_not_found(
    servers: Servers, tmp_path: Path
) -> None:
    """The engine restarts on the same address before any scrape shows it: its store is
    gone, and the turn that needed it is refused, not answered without its history."""
    flags = ("--time-scale", FAST, "--enable-responses-store")
    engine = await servers.sim("llama-small", *flags)
    documents = [pool_doc("solo", "interactive", "llama-small", [engine.url]), gateway_doc()]
    gateway = await servers.gateway(tmp_path / "gateway.yaml", documents)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0) as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        await engine.runner.cleanup()
        await servers.sim("llama-small", *flags, "--port", str(engine.port))
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.create(model="llama", input="x", previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            await api.responses.retrieve(made.id)  # forgotten: not asked of the engine again
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "previous_response_not_found"


async def test_a_pools_chat_template_frames_a_response_as_the_engines(
    servers: Servers, tmp_path: Path, model_files: ModelFiles
) -> None:
    """With the model's tokenizer and chat template on both sides, the gateway's count of a
    response (instructions, function tools, a turn continued from the engine's store) is
    the engine's own: the template renders the tools as the engine's does."""
    files = ("--tokenizer", str(model_files.tokenizer), "--chat-template", str(model_files.config))
    engine = await servers.sim("tiny", "--time-scale", FAST, "--enable-responses-store", *files)
    pool = pool_doc("solo", "interactive", "tiny", [engine.url])
    pool["spec"]["tokenizer"] = {
        "kind": "huggingface",
        "path": str(model_files.tokenizer),
        "configPath": str(model_files.config),
    }
    gateway = await servers.gateway(tmp_path / "gateway.yaml", [pool, gateway_doc()])
    tools: list[Any] = [{"type": "function", "name": "track", "description": "Track a parcel",
                         "parameters": {"type": "object",
                                        "properties": {"id": {"type": "string"}}}}]  # fmt: skip
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0) as api:
        first = await api.responses.with_raw_response.create(
            model="llama", instructions="Route parcels.", input="where is parcel 42",
            tools=tools, max_output_tokens=3,
        )  # fmt: skip
        made = first.parse()
        assert made.usage is not None
        assert int(first.headers["x-laneway-prompt-tokens"]) == made.usage.input_tokens
        stream = await api.responses.with_raw_response.create(
            model="llama", input="and parcel 43", previous_response_id=made.id, tools=tools,
            max_output_tokens=3, stream=True,
        )  # fmt: skip
        parsed = stream.parse()
        assert isinstance(parsed, openai.AsyncStream)
        events = [event async for event in parsed]
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    assert last.response.usage is not None
    history = made.usage.input_tokens + made.usage.output_tokens
    # The engine prepended the first turn (its messages, not its tools: the tools come with
    # each request, as an agent sends them every turn).
    assert last.response.usage.input_tokens > history
    # The header goes out before the engine counts: the first turn's tokens plus the new
    # turn framed alone, an upper bound (its framing and tools counted once more).
    assert int(stream.headers["x-laneway-prompt-tokens"]) >= last.response.usage.input_tokens


async def test_a_holder_that_is_down_is_a_503_never_another_replica(
    servers: Servers, tmp_path: Path
) -> None:
    """The other engine could answer, but without the history: the turn waits for the
    holder (503 with Retry-After) instead."""
    flags = ("--time-scale", FAST, "--enable-responses-store")
    engines = [await servers.sim("llama-small", *flags) for _ in range(2)]
    documents = [
        pool_doc("pair", "interactive", "llama-small", [e.url for e in engines]),
        gateway_doc(health={"failuresToEject": 1}),
    ]
    gateway = await servers.gateway(tmp_path / "gateway.yaml", documents)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0) as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        holders = []
        async with aiohttp.ClientSession() as session:
            for engine in engines:
                async with session.get(f"{engine.url}/v1/responses/{made.id}") as answer:
                    holders.append(answer.status == 200)
        assert sorted(holders) == [False, True]
        await engines[holders.index(True)].runner.cleanup()
        for _ in range(2):  # the failed attempt, then the ejected holder
            with pytest.raises(openai.InternalServerError) as refused:
                await api.responses.create(
                    model="llama", input="x", previous_response_id=made.id, max_output_tokens=2
                )
            assert refused.value.status_code == 503
            assert refused.value.response.headers["Retry-After"]
        # Requests without history still go to the engine that is up.
        assert (await api.responses.create(model="llama", input="y", max_output_tokens=2)).id
