"""A pool that names its engine's tokenizer: the gateway counts every prompt as the engine does.

A small byte-level BPE is trained here with the `tokenizers` package, written as a
tokenizer.json, served by `laneway sim --tokenizer` and named by the pool; the gateway's
`x-laneway-prompt-tokens`, the engine's `usage.prompt_tokens` and the engine's `/tokenize`
must agree exactly, and the lane threshold must hold at the engine's count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai.types.chat import ChatCompletionUserMessageParam
from support.client import client
from support.inproc import Servers
from support.pools import gateway_doc, pool_doc
from support.tiny_tokenizer import prompts, train_tokenizer

from laneway.gateway.serving.counting import OffLoopCounter
from laneway.gateway.serving.request_body import Endpoint, parse_request
from laneway.tokens import ChatMessage, HuggingFaceTokenizer, count_chat, default_tokenizer

THRESHOLD = 120  # the interactive pool's maxPromptTokens


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    return train_tokenizer(tmp_path / "tokenizer.json")


def tokenized_pool(name: str, lane: str, endpoint: str, path: Path, **routing: Any) -> Any:
    doc = pool_doc(name, lane, "tiny", [endpoint], routing=routing)
    doc["spec"]["tokenizer"] = {"kind": "huggingface", "path": str(path)}
    return doc


async def test_gateway_and_engine_counts_agree_on_every_prompt(
    servers: Servers, tmp_path: Path, tokenizer_json: Path
) -> None:
    ours = HuggingFaceTokenizer(tokenizer_json)
    cl100k = default_tokenizer()
    engine = await servers.sim("tiny", "--tokenizer", str(tokenizer_json))
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        [
            tokenized_pool(
                "short", "interactive", engine.url, tokenizer_json, maxPromptTokens=THRESHOLD
            ),
            tokenized_pool(
                "long", "batch", engine.url, tokenizer_json, minPromptTokens=THRESHOLD + 1
            ),
            gateway_doc(),
        ],
    )
    differs_from_default = 0
    async with client(gateway) as api, aiohttp.ClientSession() as session:
        for text in prompts():
            message: ChatCompletionUserMessageParam = {"role": "user", "content": text}
            messages = [message]
            raw = await api.chat.completions.with_raw_response.create(
                model="llama", messages=messages, max_tokens=2
            )
            reply = raw.parse()
            assert reply.usage is not None
            engine_count = reply.usage.prompt_tokens
            gateway_count = int(raw.headers["x-laneway-prompt-tokens"])
            async with session.post(
                f"{engine.url}/tokenize", json={"model": "tiny", "messages": messages}
            ) as response:
                tokenized = await response.json()
            assert gateway_count == engine_count == tokenized["count"], text
            # A non-streaming answer's header is the engine's usage; a stream's is the
            # gateway's own count, which must be the same.
            streamed = {"model": "llama", "messages": messages, "max_tokens": 2, "stream": True}
            async with session.post(
                f"{gateway.url}/v1/chat/completions", json=streamed
            ) as response:
                assert response.status == 200
                await response.read()
                assert int(response.headers["x-laneway-prompt-tokens"]) == engine_count
            # The lane was chosen at the engine's count.
            expected = "short" if engine_count <= THRESHOLD else "long"
            assert raw.headers["x-laneway-pool"] == expected, (text, engine_count)
            async with session.post(
                f"{engine.url}/tokenize", json={"model": "tiny", "prompt": text}
            ) as response:
                plain = await response.json()
            assert plain["count"] == len(plain["tokens"]) == ours.count(text)
            chat = [ChatMessage("user", text)]
            differs_from_default += count_chat(cl100k, chat) != count_chat(ours, chat)
    # The test means something only if the default tokenizer would have counted otherwise.
    assert differs_from_default >= len(prompts()) // 2


async def test_sglang_style_list_prompt_is_counted_per_string(
    servers: Servers, tokenizer_json: Path
) -> None:
    ours = HuggingFaceTokenizer(tokenizer_json)
    texts = ["lane gateway", "naïve café — 東京"]
    engine = await servers.sim("tiny", "--tokenizer", str(tokenizer_json))
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/tokenize", json={"prompt": texts}) as response,
    ):
        assert response.status == 200
        answer = await response.json()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/tokenize", json={"prompt": 3}) as bad,
    ):
        assert bad.status == 400
        assert "prompt" in (await bad.json())["error"]["message"]
    assert answer["count"] == [ours.count(t) for t in texts]
    assert answer["tokens"] == [ours.encode(t) for t in texts]


async def test_a_pool_whose_tokenizer_file_is_missing_answers_503(
    servers: Servers, tmp_path: Path
) -> None:
    engine = await servers.sim("tiny")
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        [
            tokenized_pool("short", "interactive", engine.url, tmp_path / "absent.json"),
            gateway_doc(),
        ],
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "llama", "messages": [{"role": "user", "content": "hi"}]},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 503
    assert body["error"]["code"] == "tokenizer_unavailable"
    assert "absent.json" in body["error"]["message"]


async def test_the_worker_process_counts_long_prompts_as_the_loop_would(
    tokenizer_json: Path,
) -> None:
    chat = parse_request(
        orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": p} for p in prompts()]}
        ),
        Endpoint.CHAT,
    )
    completion = parse_request(
        orjson.dumps({"model": "m", "prompt": prompts(), "stream": True}), Endpoint.COMPLETIONS
    )
    counter = OffLoopCounter()
    try:
        for tokenizer in (default_tokenizer(), HuggingFaceTokenizer(tokenizer_json)):
            for parsed in (chat, completion):
                assert await counter.count(parsed, tokenizer) == parsed.count(tokenizer)
    finally:
        counter.close()
