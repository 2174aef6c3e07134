"""What laneway's policies rely on vLLM to do, checked on real vLLM (`pytest -m vllm`): a
client that leaves makes it abort the request, an aborted prompt's blocks stay in the prefix
cache, `--scheduling-policy priority` runs lower values first (through the gateway too), and
its KV events (`--kv-events-config`, ZMQ) feed the gateway's precise prefix index.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from support.chat_model import user
from support.client import client, eventually, scrape, total
from support.engine_traces import (
    ENDLESS,
    document,
    engine_value,
    equals,
    priority_order,
    tokenized_ids,
    until,
)
from support.inproc import Servers
from support.vllm_engine import BLOCK_SIZE, MAX_NUM_SEQS, SERVED_NAME, VLLMServer, vllm_pool_docs

from laneway.gateway.keys import LEDGER
from laneway.routing.kv_events import token_block_keys

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


@pytest.mark.vllm_timing  # docs/TESTING.md: vLLM ran on for 40 s after the close in 2 of 5 runs
async def test_a_client_that_leaves_mid_stream_makes_vllm_abort_and_keep_the_blocks(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """Through the gateway: the client reads the first tokens of a stream that would run
    for minutes (ENDLESS) and closes it. vLLM stops generating (its running count drops to
    0 where the whole stream would hold it for minutes), and the prompt sent again hits the
    prefix cache for every block it computed, which is what lending a replica and taking it
    back relies on (DESIGN.md, lanes that share)."""
    gateway = await servers.gateway(tmp_path / "gateway.yaml", vllm_pool_docs(vllm_server))
    text = document()
    async with aiohttp.ClientSession() as session:
        prompt_tokens = len(await tokenized_ids(session, vllm_server, SERVED_NAME, text))
    generated_before = await engine_value(vllm_server, "vllm:generation_tokens_total")
    async with client(gateway) as api:
        stream = await api.chat.completions.create(
            model="llama", messages=user(text), max_tokens=ENDLESS, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        # Chunks, not content: vLLM frames every token, but a token of the random model may
        # decode to no text (a special token, part of a UTF-8 character).
        chunks = 0
        async for chunk in stream:
            chunks += bool(chunk.choices)
            if chunks == 3:
                break
        # Left while vLLM runs the request (it has not run to its end).
        assert await engine_value(vllm_server, "vllm:num_requests_running") == 1
        await stream.close()
    await until(vllm_server, "vllm:num_requests_running", equals(0), "vLLM aborting")
    generated = await engine_value(vllm_server, "vllm:generation_tokens_total") - generated_before
    assert generated < ENDLESS / 2, f"vLLM generated {generated:g} tokens: it did not abort"

    queries_before = await engine_value(vllm_server, "vllm:prefix_cache_queries_total")
    hits_before = await engine_value(vllm_server, "vllm:prefix_cache_hits_total")
    async with client(gateway) as api:
        await api.chat.completions.create(model="llama", messages=user(text), max_tokens=1)
    queries = await engine_value(vllm_server, "vllm:prefix_cache_queries_total") - queries_before
    hits = await engine_value(vllm_server, "vllm:prefix_cache_hits_total") - hits_before
    assert queries == prompt_tokens
    # Every full block of the prompt but the one holding its last token, which vLLM always
    # computes again to sample from (kv_cache_manager: max_cache_hit_length = len - 1).
    assert hits == (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


@pytest.mark.vllm_timing  # docs/TESTING.md: no full batch within 120 s once, under load
async def test_vllm_runs_lower_priority_values_first_as_laneway_maps_them(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """`--scheduling-policy priority` orders vLLM's waiting queue by (priority, arrival),
    lower first: what laneway's SchedulingPolicy.PRIORITY documents, what `laneway sim`
    does, and why the operator renders SGLang with --schedule-low-priority-values-first.
    The request's `priority` reaches vLLM unchanged through the gateway."""
    engine_url = f"{vllm_server.url}/v1"
    assert await priority_order(vllm_server, engine_url, SERVED_NAME, MAX_NUM_SEQS) == [0, 3, 5]
    gateway = await servers.gateway(tmp_path / "gateway.yaml", vllm_pool_docs(vllm_server))
    gateway_url = f"{gateway.url}/v1"
    assert await priority_order(vllm_server, gateway_url, "llama", MAX_NUM_SEQS) == [0, 3, 5]


async def index_blocks(gateway_url: str, engine: VLLMServer) -> float:
    samples = await scrape(gateway_url)
    return total(samples, "laneway_gateway_prefix_index_blocks", endpoint=engine.url)


async def test_vllms_kv_events_feed_the_gateways_prefix_index(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """The session's vLLM publishes its KV events (`--kv-events-config`, topic
    kv@host:port@model) to the address this gateway binds for the pool. A prompt sent past
    the gateway, straight to vLLM, shows up in the index as exactly its full blocks, keyed
    from the engine's own token ids; vLLM's block hashes are its own and never used."""
    kv_events = {"kvEvents": [{"pool": "real", "bind": vllm_server.kv_events,
                               "blockSize": BLOCK_SIZE}]}  # fmt: skip
    docs = vllm_pool_docs(vllm_server, picking={"prefix": kv_events})
    gateway = await servers.gateway(tmp_path / "gateway.yaml", docs)
    index = gateway.runner.app[LEDGER].prefix_index

    async with aiohttp.ClientSession() as session:

        async def direct(text: str) -> None:
            body = {"model": SERVED_NAME, "messages": user(text), "max_tokens": 1}
            async with session.post(f"{vllm_server.url}/v1/chat/completions", json=body) as answer:
                assert answer.status == 200, await answer.text()

        # The engine's PUB connected before this gateway bound, and ZMQ drops what it
        # publishes until the subscription reaches it (the slow joiner): fresh prompts
        # until one shows up.
        async def subscribed() -> bool:
            await direct(document(40))
            await asyncio.sleep(0.5)
            return await index_blocks(gateway.url, vllm_server) > 0

        await eventually(subscribed, "vLLM's events reaching the gateway", within=120)
        before = await index_blocks(gateway.url, vllm_server)
        text = document()
        ids = await tokenized_ids(session, vllm_server, SERVED_NAME, text)
        await direct(text)

    blocks = len(ids) // BLOCK_SIZE

    async def indexed() -> bool:
        return await index_blocks(gateway.url, vllm_server) == before + blocks

    await eventually(indexed, "the prompt's blocks in the index", within=60)
    keys = token_block_keys(ids, BLOCK_SIZE)
    assert index.matched_blocks(keys) == {vllm_server.url: blocks}
