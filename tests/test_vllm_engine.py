"""What laneway's policies rely on vLLM to do, checked on real vLLM (`pytest -m vllm`): a
client that leaves makes it abort the request, an aborted prompt's blocks stay in the prefix
cache, `--scheduling-policy priority` runs lower values first (through the gateway too), and
its KV events (`--kv-events-config`, ZMQ) feed the gateway's precise prefix index.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from support.chat_model import user
from support.client import client, eventually, scrape, total
from support.engine_traces import (
    ENDLESS,
    document,
    engine_value,
    idle,
    priority_order,
    tokenized_ids,
)
from support.inproc import Servers
from support.vllm_engine import BLOCK_SIZE, MAX_NUM_SEQS, SERVED_NAME, VLLMServer, vllm_pool_docs

from laneway.gateway.keys import LEDGER
from laneway.routing.kv_events import token_block_keys

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


# How long the abort may take: vLLM itself aborted 0.3-24.9 s after the client closed, with
# no gateway between them (docs/TESTING.md), and ENDLESS tokens take minutes to run out.
ABORTED_WITHIN_S = 90


async def finished_by_length(engine: VLLMServer) -> float:
    """vLLM's requests that ran to their max_tokens; an aborted one is never counted so."""
    samples = await scrape(engine.url)
    return total(samples, "vllm:request_success_total", finished_reason="length")


async def test_a_client_that_leaves_mid_stream_makes_vllm_abort_and_keep_the_blocks(
    vllm_server: VLLMServer, servers: Servers, tmp_path: Path
) -> None:
    """Through the gateway: the client reads the first chunks of a stream of ENDLESS tokens
    and closes it. vLLM aborts the request: it leaves the engine (nothing running or
    waiting) and never finishes by its length, as it would had it run on. When the abort
    comes is vLLM's (seconds after the close, by load), so no bound on the tokens it made
    meanwhile. The prompt sent again hits the prefix cache for every block it computed,
    which is what lending a replica and taking it back relies on (DESIGN.md, lanes that
    share)."""
    await idle(vllm_server)
    gateway = await servers.gateway(tmp_path / "gateway.yaml", vllm_pool_docs(vllm_server))
    text = document()
    async with aiohttp.ClientSession() as session:
        prompt_tokens = len(await tokenized_ids(session, vllm_server, SERVED_NAME, text))
    ran_out_before = await finished_by_length(vllm_server)
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
                # Left while vLLM runs the request (it has not run to its end).
                assert await engine_value(vllm_server, "vllm:num_requests_running") == 1
                break
        await stream.close()
    closed = time.monotonic()
    await idle(vllm_server, "vLLM aborting the closed stream", within=ABORTED_WITHIN_S)
    gone_after_s = time.monotonic() - closed
    ran_out = await finished_by_length(vllm_server) - ran_out_before
    assert ran_out == 0, (
        f"vLLM finished the stream by its length, {gone_after_s:.1f} s after the client"
        " closed it: it ran to its end, and no abort came"
    )

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
