"""Fair share between tenants in the batch lane: a virtual token counter (VTC) queue.

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Each tenant
has a counter of the tokens it has been served, divided by its weight. The next item
always comes from the backlogged tenant with the smallest counter, FIFO within a tenant,
so a tenant with 500 documents queued and one with 5 alternate by tokens rather than by
arrival. A tenant that was idle cannot bank credit: when it becomes backlogged again its
counter is lifted to the smallest counter among the backlogged tenants.

Pure: no clock, no I/O. Ties go to the tenant whose head item arrived first.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Queued(Generic[T]):
    item: T
    cost: int
    seq: int  # arrival order across tenants, for ties


class FairShareQueue(Generic[T]):
    def __init__(self, weights: Mapping[str, float] | Callable[[str], float] | None = None) -> None:
        self._weight: Callable[[str], float]
        if weights is None:
            self._weight = lambda _tenant: 1.0
        elif callable(weights):
            self._weight = weights
        else:
            table = dict(weights)
            self._weight = lambda tenant: table.get(tenant, 1.0)
        self._counters: dict[str, float] = collections.defaultdict(float)
        self._queues: dict[str, collections.deque[_Queued[T]]] = {}
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)  # a tenant's queue leaves once it is empty

    @property
    def counters(self) -> Mapping[str, float]:
        """Each tenant's weighted tokens served so far (lifted when it returned from idle)."""
        return dict(self._counters)

    def backlogged(self) -> tuple[str, ...]:
        return tuple(self._queues)

    def push(self, tenant: str, item: T, cost: int) -> None:
        """Queue `item` for `tenant`; `cost` is the tokens it will be charged when it leaves."""
        if tenant not in self._queues:
            if self._queues:
                floor = min(self._counters[t] for t in self._queues)
                self._counters[tenant] = max(self._counters[tenant], floor)
            self._queues[tenant] = collections.deque()
        self._queues[tenant].append(_Queued(item=item, cost=cost, seq=next(self._arrivals)))

    def peek_tenant(self) -> str | None:
        """The tenant whose item `pop` would return; None when empty."""
        if not self._queues:
            return None
        return min(self._queues, key=lambda t: (self._counters[t], self._queues[t][0].seq))

    def pop(self) -> T:
        """The next item in fair order, charging its tenant; IndexError when empty."""
        tenant = self.peek_tenant()
        if tenant is None:
            raise IndexError("pop from an empty FairShareQueue")
        queue = self._queues[tenant]
        head = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self.charge(tenant, head.cost)
        return head.item

    def charge(self, tenant: str, tokens: int) -> None:
        """Add tokens served to a tenant's counter (e.g. completion tokens once known)."""
        self._counters[tenant] += tokens / self._weight(tenant)

    def remove(self, item: T) -> bool:
        """Drop a queued item (its waiter gave up); False when it is not queued."""
        for tenant, queue in self._queues.items():
            for queued in queue:
                if queued.item is item:
                    queue.remove(queued)
                    if not queue:
                        del self._queues[tenant]
                    return True
        return False
