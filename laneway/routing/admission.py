"""Admission order: who leaves a pool's line next when a slot frees.

Interactive requests go before batch ones. Within each, tenants take turns (fairshare.py):
interactive requests by count, so one tenant's burst of chats does not queue another's
first one behind it, batch requests by tokens, so one tenant's 500 documents do not starve
another's five; FIFO within a tenant. A tenant at its cap of running requests (or whose
next request's prompt would pass its cap of running prompt tokens) is passed over
(`eligible`) until one of its own finishes, and of two tenants whose turn it equally is,
the one with fewer requests running goes first. Pure: the ledger's `PoolGate` holds the
tickets in this line, and the shell does the waiting.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from laneway.api import Lane
from laneway.routing.fairshare import Eligible, FairShareQueue, Running

T = TypeVar("T")


class AdmissionLine(Generic[T]):
    def __init__(self) -> None:
        self._interactive: FairShareQueue[T] = FairShareQueue()
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
            self._interactive.push(tenant, item, 1)

    def charge(self, priority: Lane, tenant: str, tokens: int) -> None:
        """A request of `tenant` took a free slot without waiting: its turn is used all the
        same, or a tenant whose requests never wait would always be first in line."""
        if priority is Lane.BATCH:
            self._batch.charge(tenant, tokens)
        else:
            self._interactive.charge(tenant, 1)

    def next(self, eligible: Eligible[T] | None = None, running: Running | None = None) -> T | None:
        """The item that leaves next, among the `eligible` tenants' (everyone's by default);
        None when there is none. `running` breaks ties of turns: the tenant with fewer
        requests running goes first."""
        for lane in (self._interactive, self._batch):
            if lane.peek_tenant(eligible, running) is not None:
                return lane.pop(eligible, running)
        return None

    def waiting(self) -> dict[str, int]:
        """Each tenant's items in line."""
        tenants = set(self._interactive.backlogged()) | set(self._batch.backlogged())
        return {t: self._interactive.queued(t) + self._batch.queued(t) for t in tenants}

    def head(self, tenant: str, priority: Lane) -> T | None:
        """`tenant`'s first item in `priority`'s lane: the one that leaves before its others."""
        return (self._batch if priority is Lane.BATCH else self._interactive).head(tenant)

    def newest(self, tenant: str) -> T | None:
        """The item of `tenant` that gives up its place first: its last batch item, else its
        last interactive one (the batch lane waits longest anyway)."""
        newest = self._batch.newest(tenant)
        return newest if newest is not None else self._interactive.newest(tenant)

    def remove(self, item: T) -> bool:
        """Drop an item that gave up waiting; False when it is not in line."""
        return self._interactive.remove(item) or self._batch.remove(item)
