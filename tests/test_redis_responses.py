"""Stored responses across gateway replicas: two in-process gateways sharing a real Redis,
in front of `laneway sim` engines with vLLM's store enabled. A response made through one
replica is continued and fetched through the other (the holder is shared), still refused
to another tenant; and the Batches API runs `/v1/responses` items."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from support.client import eventually
from support.inproc import Served, Servers
from support.pools import FAST, gateway_doc, pool_doc

from laneway.bench.harness.redis_server import LocalRedis

TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
  - name: beta
    apiKeys: [sk-beta]
"""


async def two_replicas(servers: Servers, redis: LocalRedis, folder: Path) -> list[Served]:
    (folder / "tenants.yaml").write_text(TENANTS)
    flags = ("--time-scale", FAST, "--enable-responses-store")
    chat = [await servers.sim("llama-small", *flags) for _ in range(2)]
    documents_engine = await servers.sim("llama-long", *flags, "--max-context", "32768")
    documents = [
        pool_doc("realtime", "interactive", "llama-small", [e.url for e in chat],
                 routing={"maxPromptTokens": 2000}, limits={"maxContextTokens": 4096}),
        pool_doc("documents", "batch", "llama-long", [documents_engine.url],
                 routing={"minPromptTokens": 2001}, limits={"maxContextTokens": 32768}),
        gateway_doc(picking={"policy": "random"}),
    ]  # fmt: skip
    shared = ("--redis-url", redis.url, "--tenants", str(folder / "tenants.yaml"))
    return [await servers.gateway(folder / f"g{i}.yaml", documents, *shared) for i in range(2)]


def client(gateway: Served, key: str = "sk-acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


async def test_a_response_made_on_one_replica_continues_on_the_other(
    servers: Servers, redis_server: LocalRedis, tmp_path: Path
) -> None:
    one, other = await two_replicas(servers, redis_server, tmp_path)
    async with client(one) as first, client(other) as second, client(other, "sk-beta") as beta:
        previous = (await first.responses.create(model="llama", input="Hi", max_output_tokens=2)).id
        # Two engines at random: four turns on the right one by luck is 1 in 16.
        for turn in range(4):
            made = await second.responses.create(
                model="llama", input=f"turn {turn}", previous_response_id=previous,
                max_output_tokens=2,
            )  # fmt: skip
            previous = made.id
        fetched = await first.responses.retrieve(previous)
        # Through the replica that did not make it: the holder shared the name asked for.
        assert (fetched.id, fetched.model) == (previous, "llama")
        with pytest.raises(openai.BadRequestError) as refused:
            await beta.responses.create(model="llama", input="x", previous_response_id=previous)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "previous_response_not_found"


async def test_a_batch_runs_responses_items_in_the_batch_lane(
    servers: Servers, redis_server: LocalRedis, tmp_path: Path
) -> None:
    gateway, _ = await two_replicas(servers, redis_server, tmp_path)
    lines = [
        json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/responses",
                    "body": {"model": "llama", "input": f"summarize {i}",
                             "max_output_tokens": 3}})
        for i in range(3)
    ]  # fmt: skip
    async with client(gateway) as api:
        uploaded = await api.files.create(
            file=("in.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
        )
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
        )

        async def finished() -> bool:
            return (await api.batches.retrieve(batch.id)).status == "completed"

        await eventually(finished, "the batch to complete")
        done = await api.batches.retrieve(batch.id)
        assert done.output_file_id is not None
        output = (await api.files.content(done.output_file_id)).text
    answers = [json.loads(line) for line in output.splitlines()]
    assert sorted(a["custom_id"] for a in answers) == ["doc-0", "doc-1", "doc-2"]
    for answer in answers:
        assert answer["response"]["status_code"] == 200
        body = answer["response"]["body"]
        assert (body["object"], body["model"]) == ("response", "llama")
        assert body["usage"]["output_tokens"] == 3
