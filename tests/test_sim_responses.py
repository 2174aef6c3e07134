"""`laneway sim`'s `/v1/responses`, served in-process and asked with the official openai
client and raw HTTP: vLLM's framing (named events, no `[DONE]`), its store (off unless
enabled, as `VLLM_ENABLE_RESPONSES_API_STORE`), `previous_response_id`, GET and cancel, and
vLLM's errors for ids it does not hold."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from openai.types.responses import Response
from support.inproc import Servers
from support.pools import FAST

from laneway.prompt_ids import chat_token_ids
from laneway.tokens import ChatMessage, default_tokenizer

MODEL = "llama-small"


def api(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_store_is_ignored_unless_enabled_as_on_vllm(servers: Servers) -> None:
    engine = await servers.sim(MODEL, "--time-scale", FAST)
    async with api(engine.url) as client:
        made = await client.responses.create(model=MODEL, input="hi", max_output_tokens=3)
        assert made.to_dict()["store"] is False  # asked for (OpenAI's default), silently not kept
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.responses.create(model=MODEL, input="more", previous_response_id=made.id)
        with pytest.raises(openai.BadRequestError) as background:
            await client.responses.create(model=MODEL, input="hi", background=True)
    for error in (missing.value, unknown.value):
        assert isinstance(error.body, dict)
        assert error.body["type"] == "invalid_request_error"
        assert error.body["message"] == f"Response with id '{made.id}' not found."
    assert "VLLM_ENABLE_RESPONSES_API_STORE" in str(background.value)


async def test_the_prompt_is_the_chat_of_instructions_history_and_input(servers: Servers) -> None:
    engine = await servers.sim(MODEL, "--time-scale", FAST, "--enable-responses-store")
    tokenizer = default_tokenizer()
    async with api(engine.url) as client:
        first = await client.responses.create(
            model=MODEL, instructions="Be brief.", input="Where is it?", max_output_tokens=3
        )
        second = await client.responses.create(
            model=MODEL, input="And now?", previous_response_id=first.id, max_output_tokens=2
        )
        fetched = await client.responses.retrieve(second.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.cancel(second.id)
    assert first.to_dict()["store"] is True
    assert first.usage is not None
    assert second.usage is not None
    assert first.output_text == " lorem ipsum dolor"
    # vLLM's order: instructions, the previous turn's messages and output, the new input;
    # the previous turn's instructions do not carry over.
    system = ChatMessage("system", "Be brief.")
    chat = [
        ChatMessage("user", "Where is it?"),
        ChatMessage("assistant", first.output_text),
        ChatMessage("user", "And now?"),
    ]
    assert first.usage.input_tokens == len(chat_token_ids(tokenizer, [system, chat[0]]))
    assert second.usage.input_tokens == len(chat_token_ids(tokenizer, chat))
    assert isinstance(fetched, Response)
    assert (fetched.id, fetched.previous_response_id) == (second.id, first.id)
    assert "Cannot cancel a synchronous response." in str(refused.value)


async def test_a_stream_is_named_events_without_a_done_marker(servers: Servers) -> None:
    engine = await servers.sim(MODEL, "--time-scale", FAST)
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 3, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/v1/responses", json=body) as answer,
    ):
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        text = await answer.text()
    blocks = [block.split("\n") for block in text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in blocks]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(lines[1].startswith("data: {") and len(lines) == 2 for lines in blocks)
    assert "[DONE]" not in text
