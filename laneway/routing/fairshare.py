"""Fair share between tenants: a virtual token counter (VTC) queue, and each tenant's part of
a pool's slots and line.

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Each tenant
has a counter of the tokens it has been served, divided by its weight. The next item
always comes from the backlogged tenant with the smallest counter, FIFO within a tenant,
so a tenant with 500 documents queued and one with 5 alternate by tokens rather than by
arrival. A tenant that was idle cannot bank credit: when it becomes backlogged again its
counter is lifted to the smallest counter among the backlogged tenants.

Pure: no clock, no I/O. Ties go to the tenant with fewer requests running, where the caller
says (`running`), then to the tenant whose head item arrived first. The first matters under
a flood: a tenant returning from idle is lifted to the smallest counter, which is then the
always-backlogged flooding tenant's, and by arrival alone it would lose that tie to the
flood's older queued request at every turn, waiting one extra slot each time.

A pool's line is shared too (`line_place_for`): a full line gives a newcomer's tenant a
place taken from the tenant holding the most, while the newcomer's tenant holds less than an
equal share, so one tenant's flood cannot fill the line that another's first request needs.
A tenant's own caps (`TenantCaps`) bound what it runs and queues in each pool: whether its
head item may leave the line is the caller's to say (`eligible`, given the tenant and that
item, since a cap of prompt tokens depends on the item's size).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
Running = Callable[[str], int]  # a tenant's requests running now
# Whether a tenant's head item (the one it would send next) may leave the line now.
Eligible = Callable[[str, T], bool]


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

    def peek_tenant(
        self, eligible: Eligible[T] | None = None, running: Running | None = None
    ) -> str | None:
        """The tenant whose item `pop` would return; None when empty (or none eligible).
        `running`: each tenant's requests running now, which breaks a tie of counters."""
        tenants = [
            t for t in self._queues if eligible is None or eligible(t, self._queues[t][0].item)
        ]
        if not tenants:
            return None

        def order(tenant: str) -> tuple[float, int, int]:
            busy = 0 if running is None else running(tenant)
            return (self._counters[tenant], busy, self._queues[tenant][0].seq)

        return min(tenants, key=order)

    def pop(self, eligible: Eligible[T] | None = None, running: Running | None = None) -> T:
        """The next item in fair order among the `eligible` tenants' (every tenant's by
        default), charging its tenant; IndexError when there is none."""
        tenant = self.peek_tenant(eligible, running)
        if tenant is None:
            raise IndexError("pop from an empty FairShareQueue")
        queue = self._queues[tenant]
        head = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self.charge(tenant, head.cost)
        return head.item

    def queued(self, tenant: str) -> int:
        """How many of `tenant`'s items wait."""
        queue = self._queues.get(tenant)
        return 0 if queue is None else len(queue)

    def head(self, tenant: str) -> T | None:
        """`tenant`'s first queued item, the one it sends next; None when it has none."""
        queue = self._queues.get(tenant)
        return None if queue is None else queue[0].item

    def newest(self, tenant: str) -> T | None:
        """`tenant`'s last queued item; None when it has none."""
        queue = self._queues.get(tenant)
        return None if queue is None else queue[-1].item

    def charge(self, tenant: str, tokens: int) -> None:
        """Add tokens served to a tenant's counter (e.g. completion tokens once known)."""
        self._counters[tenant] += tokens / self._weight(tenant)

    def remove(self, item: T) -> bool:
        """Drop a queued item (its waiter gave up); False when it is not queued."""
        for tenant, queue in self._queues.items():
            for queued in queue:
                if queued.item == item:
                    queue.remove(queued)
                    if not queue:
                        del self._queues[tenant]
                    return True
        return False


@dataclass(frozen=True)
class TenantCaps:
    """A tenant's caps in each pool it uses, counted over every gateway replica; None: no cap
    of that kind (the pool's own slots and line still bound it)."""

    max_running: int | None = None  # its requests running in one pool at once
    max_waiting: int | None = None  # its requests waiting in one pool's line
    # The prompt tokens of its requests running in one pool at once: a count of requests
    # lets a few long prompts hold most of a pool's prefill, this bounds what they weigh.
    max_running_tokens: int | None = None


NO_CAPS = TenantCaps()


def line_place_for(newcomer: str, waiting: Mapping[str, int], places: int) -> str | None:
    """Whose place in a full line of `places` goes to `newcomer`'s request: the tenant that
    holds the most places, where it holds more than an equal share among the tenants in
    line (the newcomer's included) and the newcomer's tenant, with this request, would hold
    no more than that share. None: the newcomer is refused (its tenant has its share).

    `waiting` is each tenant's requests in line.
    """
    share = places / len(waiting.keys() | {newcomer})
    if waiting.get(newcomer, 0) + 1 > share or not waiting:
        return None
    # The largest holder gives up a place; ties go to the name, so the choice is stable.
    most = max(waiting, key=lambda tenant: (waiting[tenant], tenant))
    return most if waiting[most] > share else None
