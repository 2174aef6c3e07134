"""The requests waiting in the ledger's lines, and the wake-ups its answers carry.

The ledger admits or refuses a queued ticket as part of whatever change freed or closed a
slot (a request finished, a pool changed, an endpoint came back, the replica drains) and
returns that as `Wakes`; every shell call that gets `Wakes` hands them here, and the waiting
request's future resolves.
"""

from __future__ import annotations

import asyncio

from laneway.ledger import Admitted, Refused, Ticket, Wakes


class LineRefused(Exception):
    """A queued request was refused while it waited (its pool removed, the replica
    draining)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.reason)
        self.refused = refused


class Waiters:
    def __init__(self) -> None:
        self._futures: dict[Ticket, asyncio.Future[Admitted]] = {}

    def wait(self, ticket: Ticket) -> asyncio.Future[Admitted]:
        """The future that `wake` resolves for the queued `ticket`."""
        future = self._futures[ticket] = asyncio.get_running_loop().create_future()
        return future

    def forget(self, ticket: Ticket) -> None:
        """`ticket` waits no more (admitted, refused, or its request gave up)."""
        self._futures.pop(ticket, None)

    def wake(self, wakes: Wakes) -> None:
        for admitted in wakes.granted:
            future = self._futures.pop(admitted.ticket, None)
            if future is not None and not future.done():
                future.set_result(admitted)
        for refused in wakes.refused:
            future = self._futures.pop(refused.ticket, None)
            if future is not None and not future.done():
                future.set_exception(LineRefused(refused))
