"""`POST /v1/responses` through the gateway: the official openai client's
`client.responses.create(...)`, streaming and not, chained with `previous_response_id`, to
`laneway sim` engines that keep their responses as vLLM does with its store enabled.

One pool of two engines picked at random, so a chain of turns that always finds its history
shows that each continuation went to the engine holding it (a wrong pick answers 404 from
that engine); tenants acme and beta, so that one's response ids are refused to the other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai.types.responses import Response, ResponseCompletedEvent, ResponseStreamEvent
from support.client import scrape, total
from support.inproc import Served, Servers
from support.pools import FAST, gateway_doc, pool_doc

from laneway.responses_input import MAX_INPUT_ITEMS

TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
  - name: beta
    apiKeys: [sk-beta]
"""

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass(frozen=True)
class Setup:
    gateway: Served
    engines: tuple[Served, Served]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    folder = tmp_path_factory.mktemp("responses")
    (folder / "tenants.yaml").write_text(TENANTS)
    servers = Servers()
    flags = ("--time-scale", FAST, "--max-context", "4096", "--enable-responses-store")
    first = await servers.sim("llama-small", *flags)
    second = await servers.sim("llama-small", *flags)
    documents = [
        pool_doc(
            "realtime",
            "interactive",
            "llama-small",
            [first.url, second.url],
            limits={"maxContextTokens": 4096},
        ),
        gateway_doc(picking={"policy": "random"}),
    ]
    gateway = await servers.gateway(
        folder / "gateway.yaml", documents, "--tenants", str(folder / "tenants.yaml")
    )
    yield Setup(gateway=gateway, engines=(first, second))
    await servers.close()


async def stream_events(parsed: object) -> list[ResponseStreamEvent]:
    assert isinstance(parsed, openai.AsyncStream)
    return [event async for event in parsed]


def completed_response(events: list[ResponseStreamEvent]) -> Response:
    """The response a stream's last event, `response.completed`, carries."""
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    return last.response


def client(setup: Setup, key: str = "sk-acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{setup.gateway.url}/v1", api_key=key, max_retries=0)


async def test_a_response_is_routed_and_counted_as_a_chat(setup: Setup) -> None:
    async with client(setup) as api:
        raw = await api.responses.with_raw_response.create(
            model="llama",
            instructions="Answer briefly.",
            input="Where is my parcel?",
            max_output_tokens=8,
        )
    response = raw.parse()
    assert raw.headers["x-laneway-pool"] == "realtime"
    assert raw.headers["x-laneway-lane"] == "interactive"
    assert response.model == "llama"  # the public name, not the served llama-small
    assert response.usage is not None
    assert response.usage.output_tokens == 8
    assert int(raw.headers["x-laneway-prompt-tokens"]) == response.usage.input_tokens
    assert response.output_text


async def test_the_gateway_counts_the_input_messages_as_the_engine_does(setup: Setup) -> None:
    """A stream's header is the gateway's own count (sent before the engine's usage): it
    matches what the engine reports at the end, for the message items the input holds (the
    simulator frames no tool fields without a chat template: test_responses_input.py shows
    how function calls and their outputs become the chat)."""
    items: list[Any] = [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "Track parcel 42"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Calling the tracker."}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # left out, as vLLM does
        {"type": "message", "role": "user", "content": "And when does it arrive?"},
    ]  # fmt: skip
    async with client(setup) as api:
        raw = await api.responses.with_raw_response.create(
            model="llama", instructions="Answer briefly.", input=items, max_output_tokens=4,
            stream=True,
        )  # fmt: skip
        events = await stream_events(raw.parse())
    completed = events[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    assert completed.response.usage is not None
    assert int(raw.headers["x-laneway-prompt-tokens"]) == completed.response.usage.input_tokens


async def test_a_stream_is_relayed_unchanged_and_timed_from_its_first_delta(setup: Setup) -> None:
    async with client(setup) as api:
        before = await scrape(setup.gateway.url)
        stream = await api.responses.create(
            model="llama", input="Tell me a story", max_output_tokens=12, stream=True
        )
        events = [event async for event in stream]
        after = await scrape(setup.gateway.url)
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 12
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert completed_response(events).model == "llama"
    name = "laneway_gateway_ttft_seconds_count"
    assert total(after, name, pool="realtime") - total(before, name, pool="realtime") == 1
    # TBT between relayed chunks of deltas alone (a chunk may hold several): at most 11
    # gaps, however the bookkeeping events after the last delta arrive.
    gaps = "laneway_gateway_tbt_seconds_count"
    assert 1 <= total(after, gaps, pool="realtime") - total(before, gaps, pool="realtime") <= 11
    # Its end, the terminal event (no `[DONE]`), closes the gateway's own time on it.
    ends = "laneway_gateway_overhead_seconds_count"
    assert total(after, ends, stage="stream") - total(before, ends, stage="stream") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chain_of_turns_always_reaches_the_engine_holding_its_history(
    setup: Setup, stream: bool
) -> None:
    async with client(setup) as api:
        first = await api.responses.create(model="llama", input="Hello", max_output_tokens=4)
        assert first.usage is not None
        previous, history = first.id, first.usage.input_tokens + first.usage.output_tokens
        # Two engines picked at random: six turns on the right one by luck is 1 in 64.
        for turn in range(6):
            raw = await api.responses.with_raw_response.create(
                model="llama",
                input=f"and then {turn}?",
                previous_response_id=previous,
                max_output_tokens=4,
                stream=stream,
            )
            parsed = raw.parse()
            if stream:
                response = completed_response(await stream_events(parsed))
            else:
                assert isinstance(parsed, Response)
                response = parsed
            assert response.usage is not None
            # The engine prepended the whole history: more than the last turn's tokens.
            assert response.usage.input_tokens > history
            # The gateway counted it too, for the lane decision and the header.
            assert int(raw.headers["x-laneway-prompt-tokens"]) > history
            previous = response.id
            history = response.usage.input_tokens + response.usage.output_tokens
        fetched = await api.responses.retrieve(previous)
    assert fetched.id == previous
    assert fetched.previous_response_id is not None
    assert fetched.model == "llama"  # the name asked for, not the engine's llama-small


async def test_an_unknown_previous_response_is_openais_400_not_an_answer(setup: Setup) -> None:
    async with client(setup) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.create(
                model="llama", input="hi", previous_response_id="resp_nowhere", stream=True
            )
        with pytest.raises(openai.NotFoundError) as missing:
            await api.responses.retrieve("resp_nowhere")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "previous_response_not_found"
    assert error["param"] == "previous_response_id"
    assert error["type"] == "invalid_request_error"
    assert "resp_nowhere" in error["message"]
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "invalid_request_error"


async def test_another_tenants_response_is_refused_as_unknown(setup: Setup) -> None:
    async with client(setup, "sk-acme") as acme, client(setup, "sk-beta") as beta:
        made = await acme.responses.create(model="llama", input="secret", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError) as refused:
            await beta.responses.create(
                model="llama", input="what was it?", previous_response_id=made.id
            )
        with pytest.raises(openai.NotFoundError):
            await beta.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await beta.responses.cancel(made.id)
        assert (await acme.responses.retrieve(made.id)).id == made.id
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "previous_response_not_found"


async def test_a_finished_response_cannot_be_cancelled_as_on_vllm(setup: Setup) -> None:
    async with client(setup) as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.cancel(made.id)
    assert isinstance(refused.value.body, dict)
    assert "Cannot cancel a synchronous response" in refused.value.body["message"]


async def post(setup: Setup, body: object) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": "Bearer sk-acme"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{setup.gateway.url}/v1/responses", json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type", "not an input"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "must be one of"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", ""),
        ({"input": 42}, "input", "string or a list"),
        ({"input": [{"role": "user", "content": "hi"}] * (MAX_INPUT_ITEMS + 1)}, "input",
         f"limit of {MAX_INPUT_ITEMS}"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]", "function tool"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "positive"),
        ({"input": "hi", "previous_response_id": 7}, "previous_response_id", "string"),
    ],
)  # fmt: skip
async def test_bad_input_gets_openais_400_naming_the_field(
    setup: Setup, body: dict[str, object], param: str, says: str
) -> None:
    status, answer = await post(setup, {"model": "llama", **body})
    assert status == 400
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert says in str(error["message"])


async def test_a_prompt_over_the_context_is_refused_before_the_engine(setup: Setup) -> None:
    status, answer = await post(setup, {"model": "llama", "input": "word " * 5000})
    assert status == 400
    error = answer["error"]
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")


async def test_delete_which_vllm_does_not_serve_is_an_openai_405(setup: Setup) -> None:
    async with client(setup) as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        with pytest.raises(openai.APIStatusError) as refused:
            await api.responses.delete(made.id)
    assert refused.value.status_code == 405
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["type"] == "invalid_request_error"
