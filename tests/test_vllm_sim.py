"""The simulator against the engine (`pytest -m vllm`): the same request traces through real
vLLM and `laneway sim` with the same scheduler settings (token budget, long-prefill
threshold, max-num-seqs, priority policy, block size, tokenizer and chat template), and the
scheduling behaviour each shows on its own /metrics: tokens per step
(vllm:iteration_tokens_total), prefix-cache hits, preemptions, priority order. Behaviour
only: CPU timings say nothing about a GPU's, and nothing here calibrates the cost model.
docs/SIMULATOR.md tabulates what these tests find, and why the engines differ where they do.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from support.client import Listening, eventually, scrape
from support.engine_traces import (
    document,
    endless,
    engine_value,
    idle,
    priority_order,
    still_running,
    tokenized_ids,
    until,
)
from support.inproc import Served, Servers
from support.vllm_engine import (
    BLOCK_SIZE,
    CHUNK_SIZE,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SERVED_NAME,
    TOKEN_BUDGET,
    VLLMServer,
)

from laneway.routing.kv_events import BlockStored, parse_event_batch
from laneway.simulator.metrics import ITERATION_TOKEN_BUCKETS
from laneway.simulator.prefix_cache import DEFAULT_BLOCK_SIZE as SIM_BLOCK_SIZE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

STEPS = "vllm:iteration_tokens_total"


async def twin_sim(servers: Servers, engine: VLLMServer) -> Served:
    """`laneway sim` with the session vLLM's scheduler settings and its model's tokenizer."""
    files = engine.model.files
    return await servers.sim(
        SERVED_NAME,
        *("--scheduler", "chunked", "--token-budget", str(TOKEN_BUDGET)),
        *("--chunk-size", str(CHUNK_SIZE), "--max-num-seqs", str(MAX_NUM_SEQS)),
        *("--scheduling-policy", "priority", "--max-context", str(MAX_MODEL_LEN)),
        *("--tokenizer", str(files.tokenizer), "--chat-template", str(files.config)),
    )


async def step_buckets(engine: Listening) -> dict[float, float]:
    """Cumulative steps per `le` bucket of vllm:iteration_tokens_total."""
    samples = await scrape(engine.url)
    buckets: dict[float, float] = {}
    for labels, value in samples.get(f"{STEPS}_bucket", []):
        le = float(labels["le"])
        buckets[le] = buckets.get(le, 0.0) + value
    return buckets


async def steps_of(engine: Listening, trace: Callable[[], Awaitable[None]]) -> dict[float, float]:
    """Steps the trace added per bucket (not cumulative): upper bound -> steps, zeros left out."""
    before = await step_buckets(engine)
    await trace()
    after = await step_buckets(engine)
    bounds = sorted(after)
    cumulative = [0.0, *(after[b] - before.get(b, 0.0) for b in bounds)]
    per_bucket = {b: cumulative[i + 1] - cumulative[i] for i, b in enumerate(bounds)}
    return {b: n for b, n in per_bucket.items() if n}


async def one_request(engine: Listening, text: str) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": text}],
                "max_tokens": 1}  # fmt: skip
        async with session.post(f"{engine.url}/v1/chat/completions", json=body) as answer:
            assert answer.status == 200, await answer.text()


def bucket_of(tokens: int) -> float:
    return next(b for b in (*ITERATION_TOKEN_BUCKETS, math.inf) if tokens <= b)


async def test_steps_emit_tokens_and_count_them_as_vllm_does(
    vllm_server: VLLMServer, servers: Servers
) -> None:
    """vllm:iteration_tokens_total counts, per step that emits tokens, those tokens and the
    whole prompt each first token completes (vllm/v1/metrics/stats.py, IterationStats); a
    step that only advances a prefill emits nothing and is not counted, so the histogram
    never shows chunking. A long prompt alone, one output token: one observation of the
    prompt and its token, in vLLM and in the simulator alike."""
    sim = await twin_sim(servers, vllm_server)
    text = document(600)
    observed = {}
    for engine in (vllm_server, sim):
        async with aiohttp.ClientSession() as session:
            prompt = len(await tokenized_ids(session, engine, SERVED_NAME, text))
        await until(engine, "vllm:num_requests_running", lambda n: n == 0, "an idle engine")

        async def trace(engine: Listening = engine) -> None:
            await one_request(engine, text)

        observed[engine.url] = (prompt, await steps_of(engine, trace))
    prompts = {prompt for prompt, _ in observed.values()}
    assert len(prompts) == 1, "the same tokenizer and template: the same prompt"
    (prompt,) = prompts
    assert prompt > TOKEN_BUDGET, "a prompt of several chunks"
    assert {url: steps for url, (_, steps) in observed.items()} == {
        vllm_server.url: {bucket_of(prompt + 1): 1.0},
        sim.url: {bucket_of(prompt + 1): 1.0},
    }


async def prefill_steps_beside_a_decode(engine: Listening, text: str) -> float:
    """Steps a long prompt's prefill took while a stream decoded beside it: the stream's
    tokens generated meanwhile (one a step), from the engine's generation counter."""
    async with aiohttp.ClientSession() as session:
        stream = asyncio.create_task(endless(session, f"{engine.url}/v1", SERVED_NAME))
        try:
            await until(engine, "vllm:num_requests_running", lambda n: n == 1, "a decode")
            before = await engine_value(engine, "vllm:generation_tokens_total")
            await one_request(engine, text)
            after = await engine_value(engine, "vllm:generation_tokens_total")
        finally:
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)
    await until(engine, "vllm:num_requests_running", lambda n: n == 0, "the stream's abort")
    return after - before - 1  # the long prompt's own first token


async def prompt_blocks_per_step(engine: VLLMServer, text: str) -> list[int]:
    """How many of a long prompt's blocks each of vLLM's steps stored while a stream decoded
    beside it, from its KV events: the scheduler publishes one batch per step
    (Scheduler.update_from_output), and a block is stored in the step that computes it. A
    test SUB socket binds the address the session's engine connects its publisher to."""
    context = zmq.asyncio.Context()
    events = context.socket(zmq.SUB)
    try:
        events.bind(engine.kv_events)
        events.setsockopt(zmq.SUBSCRIBE, b"")
        async with aiohttp.ClientSession() as session:
            ids = await tokenized_ids(session, engine, SERVED_NAME, text)

            async def heard() -> bool:
                # ZMQ drops what the engine publishes until the subscription reaches it.
                await one_request(engine, document(40))
                return bool(await events.poll(500))

            await eventually(heard, "vLLM's KV events", within=120)
            # The warm-ups' blocks repeat the prompt's words: drop them while the engine is
            # idle, the only time it goes quiet (a decode stores a block every BLOCK_SIZE
            # tokens, more often than any quiet spell a fast machine leaves).
            await idle(engine, "the warm-ups done")
            while await events.poll(1000):
                await events.recv_multipart()
            prompt_blocks = {
                tuple(ids[start : start + BLOCK_SIZE])
                for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE)
            }
            stream = asyncio.create_task(endless(session, f"{engine.url}/v1", SERVED_NAME))
            try:
                await until(
                    engine, "vllm:num_requests_running", lambda n: n == 1, "a decode",
                    streams=[stream],
                )  # fmt: skip
                await one_request(engine, text)
                # Alone, vLLM lifts the threshold (Scheduler.schedule: nobody to starve).
                still_running([stream])
            finally:
                stream.cancel()
                await asyncio.gather(stream, return_exceptions=True)
        per_step: list[int] = []
        while await events.poll(1000):
            frames = await events.recv_multipart()
            stored = [
                event
                for event in parse_event_batch(msgpack.unpackb(frames[2]))
                if isinstance(event, BlockStored)
            ]
            count = sum(
                tuple(event.token_ids[start : start + BLOCK_SIZE]) in prompt_blocks
                for event in stored
                for start in range(0, len(event.token_ids), BLOCK_SIZE)
            )
            if count:
                per_step.append(count)
        # A repeated block counts once in the set, once per place in the prompt here.
        assert sum(per_step) == len(ids) // BLOCK_SIZE, "every block of the prompt was stored"
        return per_step
    finally:
        events.close(linger=0)
        context.term()


async def test_a_long_prompt_beside_a_decode_is_chunked_at_the_threshold_in_both(
    vllm_server: VLLMServer, servers: Servers
) -> None:
    """With another request running, each step gives the long prompt at most CHUNK_SIZE
    tokens (--long-prefill-token-threshold / --chunk-size) and the stream its token, so the
    prefill takes ceil(prompt / CHUNK_SIZE) steps in both, where the token budget alone
    would allow ceil(prompt / TOKEN_BUDGET)."""
    sim = await twin_sim(servers, vllm_server)
    # So long that the chunked prefill's steps (about 30) stand well above the budget's
    # (about 8) plus the steps that pass before the request reaches the engine.
    text = document(1700)
    async with aiohttp.ClientSession() as session:
        prompt = len(await tokenized_ids(session, vllm_server, SERVED_NAME, text))
    least = math.ceil(prompt / CHUNK_SIZE)
    assert least > 3 * math.ceil(prompt / TOKEN_BUDGET)
    # vLLM, exactly, from its KV events: no step stored more than a chunk's blocks.
    per_step = await prompt_blocks_per_step(vllm_server, text)
    print(f"vLLM: a {prompt}-token prompt's blocks stored per step: {per_step}")
    assert max(per_step) == CHUNK_SIZE // BLOCK_SIZE
    assert len(per_step) >= (prompt // BLOCK_SIZE) / (CHUNK_SIZE // BLOCK_SIZE)
    # The simulator, from the stream's tokens meanwhile (its steps before the request
    # arrived count too: hence at least). vLLM's count that way is no check at all: its API
    # server takes a hundred decode steps and more to render and tokenize the prompt here.
    steps = await prefill_steps_beside_a_decode(sim, text)
    print(f"laneway sim: the prefill's steps beside a decode: {steps:g}")
    assert steps >= least


async def aborted_then_resent(engine: Listening, text: str) -> tuple[float, float]:
    """Stream `text`, leave after the first content, send it again: (queried, hit) tokens
    of the second request, from the engine's prefix-cache counters."""
    async with aiohttp.ClientSession() as session:
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": text}],
                "max_tokens": 500, "stream": True, "ignore_eos": True}  # fmt: skip
        async with session.post(f"{engine.url}/v1/chat/completions", json=body) as answer:
            async for line in answer.content:
                if b'"content":"' in line and b'"content":""' not in line:
                    break
    await until(engine, "vllm:num_requests_running", lambda n: n == 0, "the abort")
    queries = await engine_value(engine, "vllm:prefix_cache_queries_total")
    hits = await engine_value(engine, "vllm:prefix_cache_hits_total")
    await one_request(engine, text)
    return (
        await engine_value(engine, "vllm:prefix_cache_queries_total") - queries,
        await engine_value(engine, "vllm:prefix_cache_hits_total") - hits,
    )


async def test_an_aborted_prompt_resent_hits_the_same_blocks_in_both(
    vllm_server: VLLMServer, servers: Servers
) -> None:
    """A stream left after its first token: both engines keep its computed blocks cached."""
    sim = await twin_sim(servers, vllm_server)
    text = document(300)
    async with aiohttp.ClientSession() as session:
        prompt = len(await tokenized_ids(session, vllm_server, SERVED_NAME, text))
    for engine, block in ((vllm_server, BLOCK_SIZE), (sim, SIM_BLOCK_SIZE)):
        # Every full block but the one holding the prompt's last token, which both compute
        # again to sample from; in blocks of each engine's own size (the simulator's is fixed
        # at CUDA's 16, vLLM's CPU backend needs 32).
        expected = (float(prompt), float((prompt - 1) // block * block))
        assert await aborted_then_resent(engine, text) == expected, engine.url


async def test_priority_order_and_no_preemption_are_the_same_in_both(
    vllm_server: VLLMServer, servers: Servers
) -> None:
    """Under --scheduling-policy priority both admit the waiting requests lowest value
    first. Neither preempted anything in these traces: vLLM preempts only when a step cannot
    get KV blocks (VLLM_CPU_KVCACHE_SPACE=2 GiB is far more than they use), and the
    simulator never preempts (it keeps a prompt waiting until its blocks are free)."""
    sim = await twin_sim(servers, vllm_server)
    preemptions = await engine_value(vllm_server, "vllm:num_preemptions_total")
    for engine in (vllm_server, sim):
        order = await priority_order(engine, f"{engine.url}/v1", SERVED_NAME, MAX_NUM_SEQS)
        assert order == [0, 3, 5], engine.url
    assert await engine_value(vllm_server, "vllm:num_preemptions_total") == preemptions
