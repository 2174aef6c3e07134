"""Admission order: who leaves a pool's line next when a slot frees.

Interactive requests go before batch ones. Within each, tenants take turns (fairshare.py)
charged by the prompt tokens of what they were served, as VTC charges input tokens (Sheng
et al., OSDI 2024), FIFO within a tenant: one tenant's burst of chats does not queue
another's first one behind it, one tenant's 500 documents do not starve another's five, and
a tenant of long prompts gets fewer turns than one of short ones, in proportion, instead of
as many (which would hand it most of the pool's prefill). Output tokens, which VTC charges
too, are not known when a turn is taken, and are not charged. A tenant at its cap of running
requests (or whose next request's prompt would pass its cap of running prompt tokens) is
passed over (`eligible`) until one of its own finishes, and of two tenants whose turn it
equally is, the one with fewer requests running goes first. Pure: the ledger's `PoolGate`
holds the tickets in this line, and the shell does the waiting.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from laneway.api import Lane
from laneway.routing.fairshare import Eligible, FairShareQueue, Running

T = TypeVar("T")


def _service(tokens: int) -> int:
    """What a request's turn is charged: its prompt tokens, at least 1, so that requests
    whose size is unknown (0) still take turns by count."""
    return max(tokens, 1)


class AdmissionLine(Generic[T]):
    def __init__(self) -> None:
        self._interactive: FairShareQueue[T] = FairShareQueue()
        self._batch: FairShareQueue[T] = FairShareQueue()

    def __len__(self) -> int:
        return len(self._interactive) + len(self._batch)

    def __bool__(self) -> bool:
        # Asked on every admission and release: no count of the batch lane's tenants.
        return bool(self._interactive) or bool(self._batch)

    def _lane(self, priority: Lane) -> FairShareQueue[T]:
        return self._batch if priority is Lane.BATCH else self._interactive

    def join(self, item: T, priority: Lane, tenant: str = "", tokens: int = 0) -> None:
        """Queue `item`; `tenant` and `tokens` (its prompt's) place it in the fair order."""
        self._lane(priority).push(tenant, item, _service(tokens))

    def charge(self, priority: Lane, tenant: str, tokens: int) -> None:
        """A request of `tenant` took a free slot without waiting: its turn is used all the
        same, or a tenant whose requests never wait would always be first in line."""
        self._lane(priority).charge(tenant, _service(tokens))

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
        return self._lane(priority).head(tenant)

    def newest(self, tenant: str) -> T | None:
        """The item of `tenant` that gives up its place first: its last batch item, else its
        last interactive one (the batch lane waits longest anyway)."""
        newest = self._batch.newest(tenant)
        return newest if newest is not None else self._interactive.newest(tenant)

    def remove(self, item: T) -> bool:
        """Drop an item that gave up waiting; False when it is not in line."""
        return self._interactive.remove(item) or self._batch.remove(item)
