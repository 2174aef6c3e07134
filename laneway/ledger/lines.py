"""A pool's gate: at most `limit` requests of the pool run at once, the rest wait in line.

The line holds tickets, never waiters: the shell that waits (an asyncio future per ticket
in the gateway, nothing in the virtual runner) is told which tickets a change granted or
refused, and wakes them. The line's order is `laneway.routing.admission.AdmissionLine`'s:
interactive first, fair share between tenants in the batch lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from laneway.api import Lane
from laneway.routing.admission import AdmissionLine

Ticket = int  # one request in the ledger, from `Ledger.open` to `Ledger.finished`


@dataclass(frozen=True)
class GateState:
    """What a refusal's message says about the pool: its slots in use and its line."""

    active: int
    waiting: int
    limit: int


class PoolGate:
    def __init__(self, max_waiting: int) -> None:
        self.limit = 0  # maxConcurrentRequests x the pool's available endpoints
        self.active = 0
        self._max_waiting = max_waiting
        self._line: AdmissionLine[Ticket] = AdmissionLine()
        self.closed: str | None = None  # why the gate refuses everyone, once it does

    @property
    def waiting(self) -> int:
        return len(self._line)

    def state(self) -> GateState:
        return GateState(active=self.active, waiting=self.waiting, limit=self.limit)

    def take_free_slot(self) -> bool:
        """Take a slot if one is free and nobody waits for it."""
        if self.closed is None and self.active < self.limit and not self._line:
            self.active += 1
            return True
        return False

    def can_join(self) -> bool:
        return self.closed is None and self.waiting < self._max_waiting

    def join(self, ticket: Ticket, priority: Lane, tenant: str, tokens: int) -> None:
        self._line.join(ticket, priority, tenant, tokens)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a ticket out of line (its request gave up); False when it is not in line."""
        return self._line.remove(ticket)

    def release(self) -> list[Ticket]:
        """A running request ended; the tickets its slot (and any other free one) now admits."""
        self.active -= 1
        return self.grant()

    def vacate(self) -> None:
        """A request gave its slot back without a grant: the caller sets the new limit."""
        self.active -= 1

    def set_limit(self, limit: int) -> list[Ticket]:
        self.limit = limit
        return self.grant()

    def grant(self) -> list[Ticket]:
        granted = []
        while self._line and self.active < self.limit:
            granted.append(self._line.next())
            self.active += 1
        return granted

    def close(self, reason: str) -> list[Ticket]:
        """Refuse every ticket in line and every newcomer; running requests finish (drain).
        Returns the refused tickets, in line order."""
        self.closed = reason
        refused = []
        while self._line:
            refused.append(self._line.next())
        return refused
