"""Counts that match the engine's, chat template included, for both ways a pool can name them.

A small byte-level BPE with Llama-3-style special tokens is trained here, and a small chat
template in the Llama 3 shape (BOS, a default system block, a header per message, a
generation prompt, `raise_exception` on roles that do not alternate) is written as the
model's tokenizer_config.json. `laneway sim --tokenizer --chat-template` serves them, as vLLM
or SGLang would serve the model. A pool names them (`huggingface` with `configPath`: the
gateway renders the template itself) or names the engine (`engine`: the gateway asks its
`/tokenize` where the bounds do not decide), and the gateway's count must be the engine's on
every prompt the route depends on, one token either side of a lane threshold and of a
context cap included.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.chat_model import MAX_TOKENS, ModelFiles, chat_request, user
from support.client import Listening, client, scrape, total
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc
from support.tiny_tokenizer import WORDS, prompts

from laneway.errors import UsageError
from laneway.gateway.serving.counting import (
    tokenizer_free_bounds,
)
from laneway.gateway.serving.request_body import Endpoint, parse_request
from laneway.tokens import (
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
    HuggingFaceTokenizer,
    TemplateChat,
    count_chat,
    default_tokenizer,
    template_chat,
)


def user_chat_count(tokenizer: HuggingFaceTokenizer) -> Callable[[str], int]:
    """A one-message chat's count of `text`, through the tokenizer's chat template."""
    return lambda text: chat_request(user(text)).count(tokenizer)


def straddling(count: Callable[[str], int], edge: int, seed: int) -> tuple[str, str]:
    """Two texts, one word apart, counted at most `edge` and over it."""
    rng = random.Random(seed)
    words: list[str] = []
    while True:
        text = " ".join(words)
        words.append(rng.choice(WORDS))
        longer = " ".join(words)
        if count(text) <= edge < count(longer):
            return text, longer


async def engine_count(session: aiohttp.ClientSession, engine: Listening, text: str) -> int:
    """The engine's own count of a one-message chat, from its /tokenize."""
    body = {"model": "tiny", "messages": user(text)}
    async with session.post(f"{engine.url}/tokenize", json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["count"] == len(answer["tokens"])
    count: int = answer["count"]
    return count


async def streamed_count(
    session: aiohttp.ClientSession, api_client: openai.AsyncOpenAI, body: dict[str, Any]
) -> int:
    """The request's x-laneway-prompt-tokens as a stream: the gateway's own count (a
    non-streaming answer's header is the engine's usage)."""
    path = "chat/completions" if "messages" in body else "completions"
    async with session.post(
        f"{api_client.base_url}{path}", json={**body, "stream": True}
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return int(response.headers["x-laneway-prompt-tokens"])


@dataclass(frozen=True)
class Routed:
    status: int
    pool: str | None = None
    header_count: int | None = None
    usage_count: int | None = None
    error: str = ""


async def send(api_client: openai.AsyncOpenAI, text: str) -> Routed:
    try:
        raw = await api_client.chat.completions.with_raw_response.create(
            model="llama", messages=user(text), max_tokens=MAX_TOKENS
        )
    except openai.BadRequestError as error:
        return Routed(400, error=str(error))
    reply = raw.parse()
    assert reply.usage is not None
    return Routed(
        200,
        raw.headers["x-laneway-pool"],
        int(raw.headers["x-laneway-prompt-tokens"]),
        reply.usage.prompt_tokens,
    )


async def check_chat_routed_by_engine_count(
    session: aiohttp.ClientSession,
    api_client: openai.AsyncOpenAI,
    engine: Listening,
    text: str,
    threshold: int,
    cap: int,
) -> int:
    """Send a one-message chat through the gateway: it reaches the lane the engine's own
    count picks, with that count in its header and usage and, as a stream, in the header of
    the gateway's own count, or a 400 naming the count where it does not fit the cap.
    Returns the engine's count."""
    expected = await engine_count(session, engine, text)
    routed = await send(api_client, text)
    route = expected_route(expected, threshold, cap)
    if route is None:
        assert routed.status == 400, text
        assert f"{expected} tokens" in routed.error, routed.error
    else:
        assert routed.header_count == routed.usage_count == expected, text
        assert routed.pool == route, (text, expected)
        body = {"model": "llama", "messages": user(text), "max_tokens": MAX_TOKENS}
        assert await streamed_count(session, api_client, body) == expected, text
    return expected


async def check_completion_counted_as_engine(
    session: aiohttp.ClientSession, api_client: openai.AsyncOpenAI, engine: Listening, text: str
) -> tuple[dict[str, Any], str]:
    """Send a text completion through the gateway: its header and usage, and its header as
    a stream (the gateway's own count), hold the engine's /tokenize count of the prompt.
    Returns that answer and the pool the gateway picked."""
    async with session.post(
        f"{engine.url}/tokenize", json={"model": "tiny", "prompt": text}
    ) as response:
        tokenized: dict[str, Any] = await response.json()
    raw = await api_client.completions.with_raw_response.create(
        model="llama", prompt=text, max_tokens=MAX_TOKENS
    )
    completion = raw.parse()
    assert completion.usage is not None
    header = int(raw.headers["x-laneway-prompt-tokens"])
    assert header == completion.usage.prompt_tokens == tokenized["count"], text
    body = {"model": "llama", "prompt": text, "max_tokens": MAX_TOKENS}
    assert await streamed_count(session, api_client, body) == tokenized["count"], text
    return tokenized, raw.headers["x-laneway-pool"]


def lanes(
    engine: Listening, tokenizer: dict[str, Any], threshold: int, cap: int
) -> list[dict[str, Any]]:
    short = pool_doc("short", "interactive", "tiny", [engine.url], {"maxPromptTokens": threshold})
    long = pool_doc(
        "long",
        "batch",
        "tiny",
        [engine.url],
        {"minPromptTokens": threshold + 1},
        {"maxContextTokens": cap},
    )
    for doc in (short, long):
        doc["spec"]["tokenizer"] = tokenizer
    return [short, long, gateway_doc()]


async def start_model_sim(servers: Servers, model_files: ModelFiles, cap: int) -> Served:
    """A `laneway sim` that counts with the test's tokenizer and template, capped at `cap`."""
    return await servers.sim(
        "tiny",
        "--tokenizer",
        str(model_files.tokenizer),
        "--chat-template",
        str(model_files.config),
        "--max-context",
        str(cap),
    )


def expected_route(count: int, threshold: int, cap: int) -> str | None:
    if count <= threshold:
        return "short"
    return "long" if count + MAX_TOKENS <= cap else None


def test_the_template_renders_as_transformers_does(model_files: ModelFiles) -> None:
    template = ChatTemplate(model_files.config)
    chat = TemplateChat(
        ({"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "naïve"}),
        ({"type": "function", "function": {"name": "é"}},),
    )
    # trim_blocks/lstrip_blocks, the AddedToken's content as eos/bos, `| trim`, and tojson
    # that neither escapes non-ASCII nor HTML: what transformers' apply_chat_template writes.
    tools = '[\n  {\n    "type": "function",\n    "function": {\n      "name": "é"\n    }\n  }\n]'
    assert template.render(chat) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        f"<|start_header_id|>tools<|end_header_id|>\n\n{tools}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nnaïve<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    refused = TemplateChat(({"role": "user", "content": "a"}, {"role": "user", "content": "b"}))
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render(refused)


def test_the_chat_reaches_the_template_as_vllm_hands_it_over() -> None:
    sent: list[dict[str, Any]] = [
        {"role": "user", "content": "hi", "extra": 1},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "2", "name": "f"},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    chat = template_chat(sent, ["hi", "", "2", "done"], None)
    assert chat.messages == (
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "1", "name": "f"},
        {"role": "assistant", "content": "done"},
    )
    broken = [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{"}}]}]
    with pytest.raises(ChatTemplateError, match="not JSON"):
        template_chat(broken, [""], None)


def test_a_config_without_a_template_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(UsageError, match="has no 'chat_template'"):
        ChatTemplate(config)
    config.write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    with pytest.raises(UsageError, match="does not compile"):
        ChatTemplate(config)
    # Named templates (a tool-use one beside the default): the default frames chats.
    named = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
    ]
    config.write_text(json.dumps({"chat_template": named}))
    assert ChatTemplate(config).render(TemplateChat(({"role": "user", "content": "hi"},))) == "hi"


def test_bounds_without_a_tokenizer_hold_for_the_engines_count(model_files: ModelFiles) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    chats: list[list[ChatCompletionMessageParam]] = [user(text) for text in prompts()]
    chats.append(
        [
            {"role": "system", "content": "  Be brief. "},
            {"role": "user", "content": "naïve café — 東京 🚀"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "x" * 300},
        ]
    )
    for messages in chats:
        parsed = chat_request(messages)
        bounds = tokenizer_free_bounds(parsed)
        assert bounds.low <= parsed.count(ours) <= bounds.high, messages
    completion = parse_request(
        orjson.dumps({"model": "llama", "prompt": ["", "naïve café", "x" * 300]}),
        Endpoint.COMPLETIONS,
    )
    assert tokenizer_free_bounds(completion).high >= completion.count(ours) == 301
    tools = chat_request(user("hi"))
    with_tools = parse_request(
        orjson.dumps({**tools.payload, "tools": [{"type": "function"}]}), Endpoint.CHAT
    )
    assert tokenizer_free_bounds(with_tools).high > 2**60, "a template renders tools its way"


def test_a_chat_a_template_frames_has_no_length_bounds(model_files: ModelFiles) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    assert chat_request(user("lane")).length_bounds(ours) is None
    # A completion's prompt is the text as sent, BOS and all.
    body = {"model": "llama", "prompt": " ".join(WORDS)}
    completion = parse_request(orjson.dumps(body), Endpoint.COMPLETIONS)
    bounds = completion.length_bounds(ours)
    assert bounds is not None
    assert bounds.low <= completion.count(ours) <= bounds.high


async def test_a_tokenizer_json_pool_counts_chats_through_the_template(
    servers: Servers, tmp_path: Path, model_files: ModelFiles
) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    count = user_chat_count(ours)

    threshold, cap = 120, 1200
    texts = [
        *prompts(),
        *straddling(count, threshold, seed=1),
        *straddling(count, cap - MAX_TOKENS, seed=2),
    ]
    tokenizer = {
        "kind": "huggingface",
        "path": str(model_files.tokenizer),
        "configPath": str(model_files.config),
    }
    cl100k = default_tokenizer()
    engine = await start_model_sim(servers, model_files, cap)
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", lanes(engine, tokenizer, threshold, cap)
    )
    differs_from_openai_rule = 0
    async with client(gateway) as api_client, aiohttp.ClientSession() as session:
        for text in texts:
            expected = await check_chat_routed_by_engine_count(
                session, api_client, engine, text, threshold, cap
            )
            differs_from_openai_rule += count_chat(cl100k, [ChatMessage("user", text)]) != (
                expected
            )
        # A completion's prompt gets the tokenizer's BOS, at the gateway as at the engine.
        for text in prompts()[:4]:
            tokenized, _ = await check_completion_counted_as_engine(
                session, api_client, engine, text
            )
            assert tokenized["tokens"][0] == ours.encode_prompt("")[0]
            assert tokenized["count"] == ours.count(text) + 1
        # Tools reach the template as sent, here and at the engine.
        tools: list[Any] = [{"type": "function", "function": {"name": "route_lane"}}]
        raw_chat = await api_client.chat.completions.with_raw_response.create(
            model="llama", messages=user("lane"), tools=tools, max_tokens=MAX_TOKENS
        )
        answer = raw_chat.parse()
        assert answer.usage is not None
        async with session.post(
            f"{engine.url}/tokenize",
            json={"model": "tiny", "messages": user("lane"), "tools": tools},
        ) as response:
            with_tools = (await response.json())["count"]
        assert with_tools > await engine_count(session, engine, "lane")
        header = int(raw_chat.headers["x-laneway-prompt-tokens"])
        assert header == answer.usage.prompt_tokens == with_tools
        # The template's own refusal reaches the client as the engine's would: a 400.
        with pytest.raises(openai.BadRequestError, match="roles must alternate"):
            await api_client.chat.completions.create(
                model="llama",
                messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            )
    # The test means something only if OpenAI's framing rule would have counted otherwise.
    assert differs_from_openai_rule >= len(texts) // 2


async def test_an_engine_pool_asks_the_engine_only_where_the_bounds_do_not_decide(
    servers: Servers, tmp_path: Path, model_files: ModelFiles
) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    count = user_chat_count(ours)

    # The threshold sits above the bounds' allowance for an unknown template, so that short
    # chats are routed without asking.
    threshold, cap = 400, 1200
    near_edges = [
        *straddling(count, threshold, seed=3),
        *straddling(count, cap - MAX_TOKENS, seed=4),
    ]
    engine = await start_model_sim(servers, model_files, cap)
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        lanes(engine, {"kind": "engine", "timeoutMillis": 10_000}, threshold, cap),
    )

    async def asked() -> float:
        samples = await scrape(gateway.url)
        return total(samples, "laneway_gateway_engine_counts_total", outcome="engine")

    async with client(gateway) as api_client, aiohttp.ClientSession() as session:
        before = await asked()
        short = await send(api_client, "lane gateway")
        assert short.pool == "short"
        assert await asked() == before, "a chat the bounds route needs no engine count"
        for text in prompts():
            expected = await engine_count(session, engine, text)
            before = await asked()
            routed = await send(api_client, text)
            assert routed.pool == expected_route(expected, threshold, cap), (text, expected)
            if await asked() > before:
                assert routed.header_count == routed.usage_count == expected, text
        for text in near_edges:
            before = await asked()
            await check_chat_routed_by_engine_count(
                session, api_client, engine, text, threshold, cap
            )
            # Once for each pool: each may run another model, so each engine counts.
            assert await asked() == before + 2, text
        # A completion's prompt, BOS and all, near the threshold.
        for text in straddling(lambda t: len(ours.encode_prompt(t)), threshold, seed=5):
            tokenized, pool = await check_completion_counted_as_engine(
                session, api_client, engine, text
            )
            assert pool == expected_route(tokenized["count"], threshold, cap)
        # The same prompt again is answered from the gateway's cache.
        await send(api_client, near_edges[0])
        samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_engine_counts_total", outcome="cached") >= 1
