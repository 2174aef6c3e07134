"""Admission: per-pool slots, a line that serves interactive before batch and FIFO within."""

from __future__ import annotations

import asyncio

import pytest

from laneway.api import Lane
from laneway.gateway.pools.admission import AdmissionRefused, PoolGate


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_interactive_goes_before_batch_and_fifo_within_each_class() -> None:
    gate = PoolGate(limit=1, max_waiting=10)
    await gate.acquire(Lane.BATCH)
    order: list[str] = []

    async def wait(name: str, lane: Lane) -> None:
        await gate.acquire(lane)
        order.append(name)

    arrivals = [("b1", Lane.BATCH), ("i1", Lane.INTERACTIVE), ("b2", Lane.BATCH)]
    arrivals += [("i2", Lane.INTERACTIVE)]
    tasks = []
    for name, lane in arrivals:
        tasks.append(asyncio.create_task(wait(name, lane)))
        await settle()
    assert gate.waiting == 4
    for _ in arrivals:
        gate.release()
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["i1", "i2", "b1", "b2"]
    assert (gate.active, gate.waiting) == (1, 0)


async def test_a_full_line_refuses_at_once() -> None:
    gate = PoolGate(limit=1, max_waiting=1)
    await gate.acquire(Lane.INTERACTIVE)
    waiter = asyncio.create_task(gate.acquire(Lane.INTERACTIVE))
    await settle()
    with pytest.raises(AdmissionRefused) as refused:
        await gate.acquire(Lane.INTERACTIVE)
    assert refused.value.reason == "queue_full"
    waiter.cancel()


async def test_a_timed_out_wait_leaves_no_trace() -> None:
    gate = PoolGate(limit=1, max_waiting=5)
    await gate.acquire(Lane.BATCH)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await gate.acquire(Lane.BATCH)
    assert (gate.active, gate.waiting) == (1, 0)
    gate.release()
    await gate.acquire(Lane.BATCH)  # the slot went to nobody else
    assert gate.active == 1


async def test_a_slot_granted_to_a_waiter_cancelled_in_the_same_tick_is_given_back() -> None:
    gate = PoolGate(limit=1, max_waiting=5)
    await gate.acquire(Lane.BATCH)
    waiter = asyncio.create_task(gate.acquire(Lane.BATCH))
    await settle()
    gate.release()  # grants the waiter's slot...
    waiter.cancel()  # ...and the waiter is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (gate.active, gate.waiting) == (0, 0)


async def test_raising_the_limit_admits_waiters_and_closing_refuses_them() -> None:
    gate = PoolGate(limit=0, max_waiting=5)
    first = asyncio.create_task(gate.acquire(Lane.INTERACTIVE))
    second = asyncio.create_task(gate.acquire(Lane.INTERACTIVE))
    await settle()
    gate.set_limit(1)  # an endpoint came back
    await first
    assert not second.done()
    gate.close()  # the pool was removed
    with pytest.raises(AdmissionRefused) as refused:
        await second
    assert refused.value.reason == "pool_removed"
    with pytest.raises(AdmissionRefused):
        await gate.acquire(Lane.INTERACTIVE)
    gate.release()  # the admitted request drains normally
    assert gate.active == 0


async def test_closing_for_shutdown_says_so_to_waiters_and_newcomers() -> None:
    gate = PoolGate(limit=1, max_waiting=5)
    await gate.acquire(Lane.INTERACTIVE)
    waiter = asyncio.create_task(gate.acquire(Lane.BATCH, tenant="a", tokens=100))
    await settle()
    gate.close("shutting_down")
    with pytest.raises(AdmissionRefused) as refused:
        await waiter
    assert refused.value.reason == "shutting_down"
    with pytest.raises(AdmissionRefused) as late:
        await gate.acquire(Lane.INTERACTIVE)
    assert late.value.reason == "shutting_down"
    gate.release()
    assert (gate.active, gate.waiting) == (0, 0)


async def test_admit_now_takes_only_a_free_slot_nobody_waits_for() -> None:
    gate = PoolGate(limit=1, max_waiting=5)
    assert gate.admit_now()
    assert not gate.admit_now(), "the one slot is taken"
    waiter = asyncio.create_task(gate.acquire(Lane.INTERACTIVE))
    await settle()
    gate.set_limit(2)  # frees a slot, which the waiter takes first
    await waiter
    assert not gate.admit_now()
    gate.set_limit(3)
    gate.close("shutting_down")
    assert not gate.admit_now(), "a closed gate admits nobody, free slot or not"
    assert (gate.active, gate.waiting) == (2, 0)
