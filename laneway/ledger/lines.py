"""A pool's gate: at most `limit` requests of the pool run at once, the rest wait in line.

The line holds tickets, never waiters: the shell that waits (an asyncio future per ticket
in the gateway, nothing in the virtual runner) is told which tickets a change granted or
refused, and wakes them. The line's order is `laneway.routing.admission.AdmissionLine`'s:
interactive first, tenants taking turns in each lane. Which tenants may take a slot now for
their next ticket (the ones under their caps) is the ledger's to say: `eligible`.
"""

from __future__ import annotations

from dataclasses import dataclass

from laneway.api import Lane
from laneway.routing.admission import AdmissionLine
from laneway.routing.fairshare import Eligible, Running, line_place_for

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
        self.max_waiting = max_waiting
        self._line: AdmissionLine[Ticket] = AdmissionLine()
        self.closed: str | None = None  # why the gate refuses everyone, once it does

    @property
    def waiting(self) -> int:
        return len(self._line)

    def state(self) -> GateState:
        return GateState(active=self.active, waiting=self.waiting, limit=self.limit)

    def take_free_slot(self, priority: Lane, tenant: str, tokens: int) -> bool:
        """Take a slot if one is free. Nobody eligible waits for it: every change that frees
        a slot or lifts a tenant's cap grants the line first (`next_granted`)."""
        if self.closed is None and self.active < self.limit:
            self.active += 1
            self._line.charge(priority, tenant, tokens)
            return True
        return False

    def can_join(self) -> bool:
        return self.closed is None and self.waiting < self.max_waiting

    def place_from(self, tenant: str) -> Ticket | None:
        """The full line's ticket that gives its place up to a newcomer of `tenant`
        (`line_place_for`); None: the newcomer is refused."""
        if self.closed is not None:
            return None
        holder = line_place_for(tenant, self._line.waiting(), self.max_waiting)
        return None if holder is None else self._line.newest(holder)

    def join(self, ticket: Ticket, priority: Lane, tenant: str, tokens: int) -> None:
        self._line.join(ticket, priority, tenant, tokens)

    def head(self, tenant: str, priority: Lane) -> Ticket | None:
        """`tenant`'s first ticket in line in `priority`'s lane."""
        return self._line.head(tenant, priority)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a ticket out of line (its request gave up); False when it is not in line."""
        return self._line.remove(ticket)

    def release(self) -> None:
        """A running request ended: its slot is free for `next_granted`."""
        self.active -= 1

    def next_granted(
        self, eligible: Eligible[Ticket], running: Running | None = None
    ) -> Ticket | None:
        """The next ticket in line that a free slot admits (taking the slot); None when no
        slot is free or no eligible tenant waits. `running`: each tenant's requests running
        in the pool, which breaks a tie of turns toward the tenant with fewer."""
        if self.active >= self.limit:
            return None
        ticket = self._line.next(eligible, running)
        if ticket is not None:
            self.active += 1
        return ticket

    def close(self, reason: str) -> list[Ticket]:
        """Refuse every ticket in line and every newcomer; running requests finish (drain).
        Returns the refused tickets, in line order."""
        self.closed = reason
        refused = []
        while (ticket := self._line.next()) is not None:
            refused.append(ticket)
        return refused
