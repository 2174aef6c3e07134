"""The gateway's shell of the ledger's lending decisions (`spec.lending`, issue 26).

`Ledger.rebalance` decides each lending pool's replica roles (`laneway.ledger.lending`);
this acts on them as the virtual runner does (`simulator/runner.py`), so both drive the
same ledger code:

- it asks after every admission and every request's end (chat demand may have changed, a
  draining replica may have finished its last chat) and on a tick (a lend waits for demand
  to stay low, with no request to notice it);
- a role change is the ledger's own: a draining replica leaves the lender's endpoints, so
  no new chat turn is planned there; a lent one joins the borrower's, so its line (and the
  Batches API dispatcher's items, which run through it) is fed there;
- a reclaim ends each borrowed request running on the replica taken back: its attempt runs
  in a task of its own, which is cancelled, and that closes its upstream request (vLLM and
  SGLang abort a request whose client went away between two steps, and free its KV) before
  the ledger requeues it. The request's handler then waits in its pool's line again and is
  sent anew (`Reclaimed`).

Only requests of a borrowing pool run in a task of their own; every other request's attempt
runs in its handler's, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from laneway.gateway.wakes import Waiters
from laneway.ledger import Admitted, Ledger, Ticket

log = logging.getLogger("laneway.gateway.lending")

T = TypeVar("T")


class Reclaimed(Exception):
    """The request's replica was taken back: its attempt was ended and it waits in its pool's
    line again; `line` resolves when the ledger grants it a slot (or refuses it)."""

    def __init__(self, line: asyncio.Future[Admitted]) -> None:
        super().__init__("replica reclaimed")
        self.line = line


@dataclass
class _Attempt:
    task: asyncio.Future[Any]
    line: asyncio.Future[Admitted] | None = None  # set when a reclaim ended it


class Lending:
    def __init__(
        self,
        ledger: Ledger,
        waiters: Waiters,
        clock: Callable[[], float],
        on_reclaim: Callable[[str], None] = lambda _url: None,
    ) -> None:
        self._ledger = ledger
        self._waiters = waiters
        self._clock = clock
        self._on_reclaim = on_reclaim  # per request taken off `url`: the metric
        self._attempts: dict[Ticket, _Attempt] = {}
        self._paused = False  # more than one gateway replica: lending is off

    def rebalance(self) -> None:
        """The lending pools' roles for the demand now, and the shell's part of them."""
        ledger = self._ledger
        if not ledger.lends():
            return
        now = self._clock()
        answer = ledger.rebalance(now, lend=self._alone())
        for change in answer.changes:
            event = {"event": "lending_role", "pool": change.pool, "endpoint": change.url}
            log.info(json.dumps({**event, "role": change.role.value}))
        for reclaim in answer.reclaims:
            for ticket in reclaim.tickets:
                self._take_back(ticket, reclaim.url, now)
        self._waiters.wake(answer.wakes)

    def _alone(self) -> bool:
        """Whether this is the only gateway replica. The roles are this replica's own, not
        shared through Redis: replicas deciding them apart would lend and reclaim at odds,
        so beside others (their count comes with Redis' tenant heartbeat) lending is off."""
        replicas = self._ledger.gateway_replicas()
        paused = replicas > 1
        if paused != self._paused:
            self._paused = paused
            if paused:
                log.warning(
                    json.dumps(
                        {
                            "event": "lending_paused",
                            "gateway_replicas": replicas,
                            "why": "lending roles are decided by each gateway replica alone "
                            "(not shared through Redis): lent replicas are taken back and "
                            "lending pools are served as plain pools; run one gateway "
                            "replica to lend",
                        }
                    )
                )
            else:
                log.info(json.dumps({"event": "lending_resumed", "gateway_replicas": 1}))
        return not paused

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.rebalance()

    async def attempt(self, ticket: Ticket, coro: Coroutine[Any, Any, T]) -> T:
        """Run one attempt of a borrowing pool's request where a reclaim can end it;
        `Reclaimed` when one did."""
        task = asyncio.ensure_future(coro)
        held = self._attempts[ticket] = _Attempt(task)
        try:
            answered = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if held.line is None or (current is not None and current.cancelling()):
                raise  # the client left (the handler itself is cancelled), not a reclaim
            raise Reclaimed(held.line) from None
        finally:
            if self._attempts.get(ticket) is held:
                del self._attempts[ticket]
        if held.line is not None:
            # Its answer was complete before the cancel landed: the client has it, and the
            # requeued ticket leaves the line when the handler ends it.
            drop(held.line)
        return answered

    def _take_back(self, ticket: Ticket, url: str, now: float) -> None:
        held = self._attempts.pop(ticket, None)
        if held is None or held.task.done():
            # Its attempt is ending on its own (failed, or its answer is complete): its end
            # frees the replica as soon as a requeue would.
            return
        # Waited for before the requeue, which may grant it a slot at once.
        held.line = self._waiters.wait(ticket)
        held.task.cancel()  # closes the upstream request: the engine aborts it
        self._waiters.wake(self._ledger.requeue(ticket, now))
        self._on_reclaim(url)


def drop(line: asyncio.Future[Admitted]) -> None:
    """A requeued request's waiter that nobody awaits: its outcome is read, not raised."""
    if not line.done():
        line.cancel()
    elif not line.cancelled():
        line.exception()
