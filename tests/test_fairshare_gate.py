"""The gateway's admission line: interactive first, then batch in fair share between tenants."""

from __future__ import annotations

import asyncio

from laneway.api import Lane
from laneway.gateway.pools.admission import PoolGate


async def test_batch_waiters_leave_in_fair_share_order_after_interactive_ones() -> None:
    gate = PoolGate(limit=1, max_waiting=100)
    await gate.acquire(Lane.BATCH, "bulk", 1000)  # the one running request
    granted: list[str] = []

    async def wait(name: str, lane: Lane, tenant: str, tokens: int) -> None:
        await gate.acquire(lane, tenant, tokens)
        granted.append(name)

    waiters = [
        *(asyncio.create_task(wait(f"bulk-{i}", Lane.BATCH, "bulk", 1000)) for i in range(6)),
        *(asyncio.create_task(wait(f"small-{i}", Lane.BATCH, "small", 1000)) for i in range(2)),
        asyncio.create_task(wait("chat", Lane.INTERACTIVE, "", 300)),
    ]
    await asyncio.sleep(0)  # every waiter joins the line
    assert gate.waiting == 9
    for _ in waiters:
        gate.release()
        await asyncio.sleep(0)
    await asyncio.gather(*waiters)
    assert granted[0] == "chat"
    # FIFO would put both small ones after all six bulk ones.
    assert granted[1:5] == ["bulk-0", "small-0", "bulk-1", "small-1"]
    assert granted[5:] == [f"bulk-{i}" for i in range(2, 6)]


async def test_a_batch_waiter_that_gives_up_leaves_the_line() -> None:
    gate = PoolGate(limit=1, max_waiting=10)
    await gate.acquire(Lane.BATCH, "a", 10)
    waiter = asyncio.create_task(gate.acquire(Lane.BATCH, "b", 10))
    await asyncio.sleep(0)
    assert gate.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert gate.waiting == 0
    gate.release()
    assert gate.active == 0
