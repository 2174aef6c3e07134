"""Admission order: who leaves a pool's line next when a slot frees.

Interactive requests go before batch ones, FIFO among themselves; batch requests leave in
fair-share order between tenants, weighted by tokens (fairshare.py), so one tenant's 500
documents do not starve another's five. Pure: the gateway's `PoolGate` holds the waiters
(asyncio futures) in this line and does the waiting.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from laneway.api import Lane
from laneway.routing.fairshare import FairShareQueue

T = TypeVar("T")


class AdmissionLine(Generic[T]):
    def __init__(self) -> None:
        self._interactive: deque[T] = deque()
        self._batch: FairShareQueue[T] = FairShareQueue()

    def __len__(self) -> int:
        return len(self._interactive) + len(self._batch)

    def __bool__(self) -> bool:
        # Asked on every admission and release: no count of the batch lane's tenants.
        return bool(self._interactive) or bool(self._batch)

    def join(self, item: T, priority: Lane, tenant: str = "", tokens: int = 0) -> None:
        """Queue `item`; `tenant` and `tokens` place a batch item in the fair-share order."""
        if priority is Lane.BATCH:
            self._batch.push(tenant, item, tokens)
        else:
            self._interactive.append(item)

    def next(self) -> T:
        """The item that leaves next; IndexError when the line is empty."""
        return self._interactive.popleft() if self._interactive else self._batch.pop()

    def remove(self, item: T) -> bool:
        """Drop an item that gave up waiting; False when it is not in line."""
        if item in self._interactive:
            self._interactive.remove(item)
            return True
        return self._batch.remove(item)
