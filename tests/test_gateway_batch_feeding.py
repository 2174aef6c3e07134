"""The gateway feeds its batch lane per replica, over HTTP: a `laneway sim` engine whose step
budget holds one chunk takes two documents at a time (the one prefilling and the next), the
rest wait in the gateway's line, and each first token sends the next one there."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.client import client
from support.inproc import Servers
from support.pools import FAST, fed_docs, gateway_doc

from laneway.gateway.keys import LEDGER

# About 8k tokens of prose: a prefill of several engine steps.
DOCUMENT = "The parcel left the warehouse on Monday and reached the depot by noon. " * 600


async def test_the_batch_lane_takes_a_document_per_free_prefill(
    servers: Servers, tmp_path: Path
) -> None:
    engine = await servers.sim(
        "llama-long",
        *("--time-scale", FAST, "--scheduler", "chunked", "--max-context", "131072"),
        *("--token-budget", "2048", "--chunk-size", "2048"),
    )
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", [fed_docs(engine.url), gateway_doc()]
    )
    ledger = gateway.runner.app[LEDGER]
    pool = ledger.pools()[0]
    seen: list[tuple[int, int]] = []
    api = client(gateway)

    async def send() -> int:
        raw = await api.completions.with_raw_response.create(
            model="llama", prompt=DOCUMENT, max_tokens=4, stream=False
        )
        return raw.http_response.status_code

    async def watch() -> None:
        while True:
            gate = ledger.gate(pool)
            seen.append((gate.active, gate.waiting))
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        statuses = await asyncio.wait_for(asyncio.gather(*(send() for _ in range(5))), 60)
    finally:
        watcher.cancel()
        await api.close()
    assert statuses == [200] * 5
    # Never more than two documents before their first token, though the pool's
    # maxConcurrentRequests would have let in all five; and the rest waited in line.
    assert max(active for active, _ in seen) == 2
    assert max(waiting for _, waiting in seen) == 3
