"""A saturated pool, in-process: its line, its timeout, and a disconnect that frees the slot.
Faults only a process shows (an engine killed, a gateway drained) are in test_gateway_e2e.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from support.client import client, eventually, one_waits_in_line, scrape, total
from support.inproc import Servers


async def test_a_saturated_pool_queues_then_times_out_and_a_disconnect_frees_the_slot(
    servers: Servers, tmp_path: Path
) -> None:
    engine, gateway = await servers.single_pool(
        tmp_path,
        time_scale="1",
        name="narrow",
        limits={"maxConcurrentRequests": 1},
        queue={"timeoutMillis": 1500, "retryAfterSeconds": 3},
    )
    chat: dict[str, Any] = {"model": "llama", "messages": [{"role": "user", "content": "go"}]}
    async with client(gateway) as api, client(gateway) as holder_api:
        # A long stream holds the pool's one slot.
        holder = await holder_api.chat.completions.create(**chat, max_tokens=4000, stream=True)
        await anext(aiter(holder))
        waiting = asyncio.create_task(api.chat.completions.create(**chat, max_tokens=2))
        await one_waits_in_line(
            gateway, "narrow", "the second request to wait in the gateway's line"
        )
        with pytest.raises(openai.RateLimitError) as error:
            await waiting
        assert error.value.code == "pool_saturated"
        assert error.value.response.headers["retry-after"] == "3"

        # Queue again; the holder hangs up, which frees the slot for the one waiting.
        waiting = asyncio.create_task(api.chat.completions.create(**chat, max_tokens=2))
        await one_waits_in_line(gateway, "narrow", "the third request to wait")
        await holder.close()
        answer = await waiting
        assert answer.choices[0].message.content

    async def engine_idle() -> bool:
        return total(await scrape(engine.url), "vllm:num_requests_running") == 0

    # The engine saw the disconnect too: the abandoned stream is no longer running.
    await eventually(engine_idle, "the engine to drop the abandoned stream")
    samples = await scrape(gateway.url)
    assert total(samples, "laneway_gateway_requests_total", status="429") == 1
