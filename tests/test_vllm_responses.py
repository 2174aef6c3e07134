"""`POST /v1/responses` through the gateway with the official openai client, each test run
twice: in front of real vLLM (the `vllm` tier, its store on: VLLM_ENABLE_RESPONSES_API_STORE)
and in front of `laneway sim` given the same tiny model's tokenizer and chat template, so
what the sim-backed tests (test_gateway_responses*.py) show of laneway sim holds of vLLM.

Streaming and not; TTFT at the first content event and usage from `response.completed`;
the gateway's own count equal to the engine's `input_tokens`; `previous_response_id` and
GET of a stored response (under the public model name); cancel refused for a finished one;
and the bad input the gateway refuses before any engine sees it (a background response among
it: it would run outside the pool's slots and the tenant's limits).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai.types.responses import Response, ResponseCompletedEvent, ResponseStreamEvent
from openai.types.responses.response import IncompleteDetails
from support.client import scrape, total
from support.engine_traces import idle
from support.inproc import Served, Servers
from support.pools import FAST
from support.vllm_engine import MAX_MODEL_LEN, SERVED_NAME, tiny_pool_docs, write_tiny_model

from laneway.responses_input import MAX_INPUT_ITEMS

pytestmark = pytest.mark.timeout(1200)  # the vllm case's first test waits for its start

TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
  - name: beta
    apiKeys: [sk-beta]
"""
IGNORE_EOS = {"ignore_eos": True}  # random weights: an early EOS would cut the counts short
# About a thousand prompt tokens: on vLLM a prefill long enough that the first delta comes
# well after the stream's head (response.created is sent on arrival).
LONG_QUESTION = "Which lane does a long prompt take, and which a short chat? " * 25


@dataclass(frozen=True)
class Setup:
    kind: str  # "vllm" or "sim"
    engine_url: str
    gateway: Served

    def client(self, key: str = "sk-acme") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.gateway.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest_asyncio.fixture
async def setup(
    engine_kind: str, request: pytest.FixtureRequest, servers: Servers, tmp_path: Path
) -> AsyncIterator[Setup]:
    if engine_kind == "vllm":
        server = request.getfixturevalue("vllm_server")
        await idle(server)  # no earlier test's request left to change what this one counts
        url, files = server.url, server.model.files
    else:
        files = write_tiny_model(tmp_path / "model").files
        sim = await servers.sim(
            SERVED_NAME, "--time-scale", FAST, "--enable-responses-store",
            "--max-context", str(MAX_MODEL_LEN),
            "--tokenizer", str(files.tokenizer), "--chat-template", str(files.config),
        )  # fmt: skip
        url = sim.url
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", tiny_pool_docs(url, files),
        "--tenants", str(tmp_path / "tenants.yaml"),
    )  # fmt: skip
    yield Setup(kind=engine_kind, engine_url=url, gateway=gateway)


async def events_of(parsed: object) -> list[ResponseStreamEvent]:
    assert isinstance(parsed, openai.AsyncStream)
    return [event async for event in parsed]


def completed(events: list[ResponseStreamEvent]) -> Response:
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent), [event.type for event in events[-3:]]
    return last.response


async def test_a_response_through_the_gateway_streaming_and_not(setup: Setup) -> None:
    async with setup.client() as api:
        raw = await api.responses.with_raw_response.create(
            model="llama", instructions="Answer briefly.", input="Where is my parcel?",
            max_output_tokens=4, extra_body=IGNORE_EOS,
        )  # fmt: skip
        made = raw.parse()
        assert (raw.headers["x-laneway-pool"], raw.headers["x-laneway-lane"]) == (
            "real",
            "interactive",
        )
        assert made.model == "llama"  # the name asked for, not the served "tiny"
        # Cut at max_output_tokens (ignore_eos): vLLM's "incomplete", streamed or not.
        assert (made.status, made.incomplete_details) == (
            "incomplete",
            IncompleteDetails(reason="max_output_tokens"),
        )
        assert made.usage is not None
        assert made.usage.output_tokens == 4
        assert [item.type for item in made.output] == ["message"]

        stream = await api.responses.with_raw_response.create(
            model="llama", input="Tell me a story", max_output_tokens=6, stream=True,
            extra_body=IGNORE_EOS,
        )  # fmt: skip
        events = await events_of(stream.parse())
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    response = completed(events)
    assert response.model == "llama"
    assert response.status == "incomplete"
    assert response.usage is not None
    assert response.usage.output_tokens == 6
    # The stream's header is the gateway's own count, sent before the engine's usage.
    assert int(stream.headers["x-laneway-prompt-tokens"]) == response.usage.input_tokens


async def test_ttft_is_the_first_content_event_and_usage_the_completed_one(setup: Setup) -> None:
    """vLLM sends response.created and .in_progress as it takes the request, the first
    delta after the prefill: the gateway's TTFT lies between vLLM's own (from its arrival)
    and the client's. The prompt-token metric takes the usage of response.completed."""
    engine_before = await scrape(setup.engine_url)
    async with setup.client() as api:
        sent = time.monotonic()
        stream = await api.responses.create(
            # A fresh first block: no earlier test's prefill of it in vLLM's prefix cache.
            model="llama", input=f"{uuid.uuid4().hex} {LONG_QUESTION}", max_output_tokens=2,
            stream=True, extra_body=IGNORE_EOS,
        )  # fmt: skip
        client_ttft, events = None, []
        async for event in stream:
            events.append(event)
            if client_ttft is None and event.type == "response.output_text.delta" and event.delta:
                client_ttft = time.monotonic() - sent
    assert client_ttft is not None
    usage = completed(events).usage
    assert usage is not None
    samples = await scrape(setup.gateway.url)
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="real") == 1
    gateway_ttft = total(samples, "laneway_gateway_ttft_seconds_sum", pool="real")
    assert 0 < gateway_ttft <= client_ttft
    assert total(samples, "laneway_gateway_prompt_tokens_sum") == usage.input_tokens
    if setup.kind == "vllm":  # the sim's own histogram runs on its scaled clock
        engine_after = await scrape(setup.engine_url)
        name = "vllm:time_to_first_token_seconds"
        assert total(engine_after, f"{name}_count") - total(engine_before, f"{name}_count") == 1
        engine_ttft = total(engine_after, f"{name}_sum") - total(engine_before, f"{name}_sum")
        # vLLM yields response.created before it awaits the first token: a gateway that timed
        # that head would report less than the prefill vLLM itself timed (about 50 ms here).
        assert engine_ttft <= gateway_ttft


TOOLS: list[Any] = [
    {"type": "function", "name": "track", "description": "Wo ist Paket 42?",
     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}},
]  # fmt: skip
# Inputs whose framing the gateway must count as the engine renders them: instructions,
# turns as message items with typed parts, reasoning left out, function tools, non-ASCII.
INPUTS: list[dict[str, Any]] = [
    {"input": "lane gateway engine prompt"},
    {"instructions": "  Be brief.  ", "input": "naïve café — 東京 🚀"},
    {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Track parcel 42"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Calling the tracker."}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "user", "content": "And when does it arrive?"},
    ]},
    # tool_choice none: "auto" needs a tool parser the tiny model's server does not run;
    # the tools are still rendered into the prompt.
    {"instructions": "Route parcels.", "input": "where is 42", "tools": TOOLS,
     "tool_choice": "none"},
]  # fmt: skip


def completed_usage(stream: str) -> dict[str, Any]:
    """The usage a raw event stream's response.completed event carries."""
    for block in stream.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        if name == "event: response.completed":
            usage: dict[str, Any] = json.loads(data.removeprefix("data: "))["response"]["usage"]
            return usage
    raise AssertionError(f"no response.completed event in {stream[-300:]!r}")


async def test_the_gateways_count_is_the_engines_input_tokens(setup: Setup) -> None:
    """A stream's x-laneway-prompt-tokens is the gateway's count, made before the engine
    answers: it equals the `input_tokens` of the engine's response.completed (vLLM frames a
    response with one more BOS than a chat, and the gateway counts it so)."""
    async with aiohttp.ClientSession() as session:
        for body in INPUTS:
            full = {"model": "llama", "max_output_tokens": 1, "stream": True, **body}
            async with session.post(
                f"{setup.gateway.url}/v1/responses", json=full,
                headers={"Authorization": "Bearer sk-acme"},
            ) as answer:  # fmt: skip
                assert answer.status == 200, await answer.text()
                text = await answer.text()
                counted = int(answer.headers["x-laneway-prompt-tokens"])
            assert counted == completed_usage(text)["input_tokens"], body


@pytest.mark.parametrize("stream", [False, True])
async def test_a_continued_turn_reaches_its_history_and_is_fetched_by_the_public_name(
    setup: Setup, stream: bool
) -> None:
    async with setup.client() as api:
        first = await api.responses.create(
            model="llama", input="Hello there", max_output_tokens=3, extra_body=IGNORE_EOS
        )
        assert first.usage is not None
        history = first.usage.input_tokens + first.usage.output_tokens
        raw = await api.responses.with_raw_response.create(
            model="llama", input="and then?", previous_response_id=first.id,
            max_output_tokens=3, stream=stream, extra_body=IGNORE_EOS,
        )  # fmt: skip
        parsed = raw.parse()
        second = completed(await events_of(parsed)) if stream else parsed
        assert isinstance(second, Response)
        assert second.usage is not None
        # The engine prepended the first turn: more than its tokens.
        assert second.usage.input_tokens > history
        # The gateway counted the history too (an upper bound, its own framing counted
        # twice; a non-streaming answer's header is the engine's count).
        assert int(raw.headers["x-laneway-prompt-tokens"]) >= second.usage.input_tokens
        third = await api.responses.create(
            model="llama", input="and last?", previous_response_id=second.id,
            max_output_tokens=2, extra_body=IGNORE_EOS,
        )  # fmt: skip
        assert third.usage is not None
        assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
        fetched = await api.responses.retrieve(second.id)
    assert (fetched.id, fetched.previous_response_id) == (second.id, first.id)
    assert fetched.model == "llama"  # the engine stored it as "tiny"
    assert fetched.status == second.status == "incomplete"  # cut at max_output_tokens
    assert fetched.usage == second.usage


async def test_unknown_and_foreign_response_ids_are_openais_not_found(setup: Setup) -> None:
    async with setup.client("sk-acme") as acme, setup.client("sk-beta") as beta:
        with pytest.raises(openai.BadRequestError) as unknown:
            await acme.responses.create(
                model="llama", input="hi", previous_response_id="resp_nowhere", stream=True
            )
        with pytest.raises(openai.NotFoundError) as missing:
            await acme.responses.retrieve("resp_nowhere")
        made = await acme.responses.create(model="llama", input="secret", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError) as foreign:
            await beta.responses.create(
                model="llama", input="what was it?", previous_response_id=made.id
            )
        with pytest.raises(openai.NotFoundError):
            await beta.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await beta.responses.cancel(made.id)
        assert (await acme.responses.retrieve(made.id)).id == made.id
    for refused, response_id in ((unknown, "resp_nowhere"), (foreign, made.id)):
        error = refused.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("previous_response_not_found",
                                                   "previous_response_id")  # fmt: skip
        assert error["type"] == "invalid_request_error"
        assert response_id in error["message"]
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "invalid_request_error"


async def test_a_finished_response_cannot_be_cancelled(setup: Setup) -> None:
    async with setup.client() as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.cancel(made.id)
    assert isinstance(refused.value.body, dict)
    assert "Cannot cancel a synchronous response" in refused.value.body["message"]


async def post(setup: Setup, body: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
    """The status, the error, and whether the answer names a pool (an engine was asked)."""
    headers = {"Authorization": "Bearer sk-acme"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{setup.gateway.url}/v1/responses", json=body, headers=headers) as answer,
    ):
        return answer.status, (await answer.json())["error"], "x-laneway-pool" in answer.headers


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": "hi"}] * (MAX_INPUT_ITEMS + 1)}, "input"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
        # It would run outside the pool's slots and the tenant's limits.
        ({"input": "hi", "background": True}, "background"),
    ],
)
async def test_bad_input_is_refused_before_the_engine(
    setup: Setup, body: dict[str, Any], param: str
) -> None:
    status, error, routed = await post(setup, {"model": "llama", **body})
    assert (status, error["param"], error["type"]) == (400, param, "invalid_request_error")
    assert not routed


async def test_a_turn_too_long_with_its_history_is_refused_before_the_engine(
    setup: Setup,
) -> None:
    """The new turn alone fits the context; with the stored history the engine would
    prepend, it does not: the gateway refuses it (no engine asked) at the summed count."""
    async with setup.client() as api:
        made = await api.responses.create(
            model="llama", input=LONG_QUESTION, max_output_tokens=4, extra_body=IGNORE_EOS
        )
        assert made.usage is not None
        history = made.usage.input_tokens + made.usage.output_tokens
        # The new turn's own count: a stream's header, the gateway's count.
        alone = await api.responses.with_raw_response.create(
            model="llama", input="and?", max_output_tokens=1, stream=True
        )
        await events_of(alone.parse())
    turn = int(alone.headers["x-laneway-prompt-tokens"])
    reserve = MAX_MODEL_LEN - history  # room for the turn alone, not beside its history
    assert turn + reserve <= MAX_MODEL_LEN < history + turn + reserve
    status, error, routed = await post(
        setup,
        {"model": "llama", "input": "and?", "max_output_tokens": reserve,
         "previous_response_id": made.id},
    )  # fmt: skip
    assert (status, error["code"], error["param"]) == (400, "context_length_exceeded", "input")
    assert not routed
    counted = re.search(r"(\d+) prompt tokens", error["message"])
    assert counted is not None, error["message"]
    assert history <= int(counted.group(1)) <= history + turn
