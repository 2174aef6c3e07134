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

Beside other gateway replicas (with Redis, `state/lending_share.py`), one replica decides:
the one holding the leader lease rebalances on the chat demand of every replica (this one's
own, plus the others' as each publishes it, `RedisDemandShare`) and publishes the roles;
every other one adopts them on each tick (`Ledger.adopt_roles`), and a reclaim there ends
its own borrowed requests on the replica taken back, as above. With Redis away, or no roles
published by a leader, a replica falls back to what is safe alone: nothing lent, lent
replicas taken back (`Mode.UNSHARED`, logged once as `lending_unshared`).

The endpoint picker (`laneway epp`) is such a replica that never leads (`leads=False`):
Envoy holds its upstream requests, so it could not end a borrowed one. It adopts the roles
the leading gateway replica publishes (no chat on a draining or lent replica) and, as every
replica on the Redis does, publishes its chat demand and its load on the endpoints, which
the leader counts; its ledger feeds no batch request of its own to a lent replica
(`LedgerSettings.borrow_lent`). Without Redis, or while no roles are published, it lends
nothing (`Mode.UNSHARED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from laneway.gateway.state.demand import RedisDemandShare
from laneway.gateway.state.lending_share import Published, RedisLendingShare
from laneway.gateway.state.redis_store import REDIS_DOWN, RedisLoadShare
from laneway.gateway.wakes import Waiters
from laneway.ledger import Admitted, Ledger, PeerLending, Rebalanced, Ticket

log = logging.getLogger("laneway.gateway.lending")

T = TypeVar("T")


class Reclaimed(Exception):
    """The request's replica was taken back: its attempt was ended and it waits in its pool's
    line again; `line` resolves when the ledger grants it a slot (or refuses it)."""

    def __init__(self, line: asyncio.Future[Admitted]) -> None:
        super().__init__("replica reclaimed")
        self.line = line


class Mode(StrEnum):
    ALONE = "alone"  # no Redis: this replica decides alone
    LEADING = "leading"  # holds the lease: decides for every replica, publishes the roles
    FOLLOWING = "following"  # applies the roles the leader published
    UNSHARED = "unshared"  # Redis away, or no leader's roles: nothing lent


def mode_after(term: int | None, published: Published | None) -> Mode:
    """A shared replica's mode after one lending tick: `term`, its term as leader (0:
    another replica holds the lease; None: Redis did not answer); `published`, the roles
    the leader published (read when another leads)."""
    if term is None:
        return Mode.UNSHARED
    if term > 0:
        return Mode.LEADING
    return Mode.UNSHARED if published is None else Mode.FOLLOWING


@dataclass(frozen=True)
class LendingShares:
    """The Redis shares a replica's lending reads and writes beside other replicas."""

    roles: RedisLendingShare
    demand: RedisDemandShare
    load: RedisLoadShare


# The lease and the published roles outlive a tick by this many intervals (and the load
# lease's 6 s at least): a leader that died is followed that long, then replaced.
TTL_TICKS = 3
MIN_TTL_S = 6.0
# A replica the leader drains is lent no sooner than this many ticks later: by then every
# follower has read its role (on its next tick), stopped planning chat there, and the chat
# it still has there shows in the shared load the leader reads.
SETTLE_TICKS = 2


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
        *,
        shared: bool = False,
        leads: bool = True,
    ) -> None:
        self._ledger = ledger
        self._waiters = waiters
        self._clock = clock
        self._on_reclaim = on_reclaim  # per request taken off `url`: the metric
        self._attempts: dict[Ticket, _Attempt] = {}
        self._leads = leads  # False: follows a leader's roles or lends nothing, never decides
        # With Redis (or never leading), unknown (nothing lent) until the first tick.
        self._mode: Mode | None = None if shared or not leads else Mode.ALONE
        self._unpublished_ticks = 0  # a follower's ticks since its start with no roles read
        self._peers = PeerLending()  # what the other replicas report (leading)
        self._changed = asyncio.Event()  # the leader's roles changed: publish them now
        self._version = 0

    @property
    def mode(self) -> Mode | None:
        return self._mode

    def rebalance(self) -> None:
        """The lending pools' roles for the demand now, and the shell's part of them. A
        follower's roles are the leader's: they change on its ticks, not here."""
        ledger = self._ledger
        if not ledger.lends() or self._mode is Mode.FOLLOWING:
            return
        now = self._clock()
        if self._mode is Mode.ALONE:
            answer = ledger.rebalance(now)
        elif self._mode is Mode.LEADING:
            answer = ledger.rebalance(now, peers=self._peers)
            if answer.changes:
                self._changed.set()
        else:
            answer = ledger.rebalance(now, lend=False)
        self._act(answer, now)

    def _act(self, answer: Rebalanced, now: float) -> None:
        for change in answer.changes:
            event = {"event": "lending_role", "pool": change.pool, "endpoint": change.url}
            log.info(json.dumps({**event, "role": change.role.value}))
        for reclaim in answer.reclaims:
            for ticket in reclaim.tickets:
                self._take_back(ticket, reclaim.url, now)
        self._waiters.wake(answer.wakes)

    async def run(self, interval_s: float, shares: LendingShares | None = None) -> None:
        ttl_s = max(MIN_TTL_S, TTL_TICKS * interval_s)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), interval_s)
            self._changed.clear()
            if shares is None and not self._leads and self._ledger.lends():
                why = "no Redis state layer (--redis-url) to read the leading gateway's roles from"
                self._enter(Mode.UNSHARED, why, quiet=False)
            if shares is None or not self._ledger.lends():
                self.rebalance()
            else:
                await self._shared_tick(shares, interval_s, ttl_s)

    async def _shared_tick(self, shares: LendingShares, interval_s: float, ttl_s: float) -> None:
        """Lead or follow, as the lease says, and do it."""
        term: int | None = None
        published: Published | None = None
        why = ""  # why the roles cannot be shared, when they cannot
        try:
            term = await shares.roles.lead(ttl_s) if self._leads else 0
            if term:
                demand = await shares.demand.peers()
                urls = [url for roles in self._ledger.lending_roles().values() for url in roles]
                loads = await shares.load.peers(urls)
                self._peers = PeerLending(
                    demand={
                        key: count.queued_requests + count.in_flight_requests
                        for key, count in demand.items()
                    },
                    in_flight={url: load.in_flight for url, load in loads.items()},
                    loads_known=shares.load.shared,
                    settle_s=SETTLE_TICKS * interval_s,
                )
            else:
                published = await shares.roles.read()
                why = (
                    "another gateway replica holds the lending lease but published no roles"
                    if self._leads
                    else "no gateway replica leading lending has published roles"
                )
        except REDIS_DOWN as error:
            term, why = None, f"redis is unreachable: {type(error).__name__}"
        # A replica starting beside a leader that has not published yet: nothing to say. A
        # replica that never leads says so once a leader had a lease's time to publish.
        starting = self._mode is None and term == 0
        if starting and published is None and not self._leads:
            self._unpublished_ticks += 1
            starting = self._unpublished_ticks < TTL_TICKS
            if starting:
                self.rebalance()
                return
        self._enter(mode_after(term, published), why, quiet=starting)
        if self._mode is Mode.FOLLOWING:
            assert published is not None
            self._act(self._ledger.adopt_roles(self._clock(), published.roles), self._clock())
            return
        self.rebalance()
        if self._mode is Mode.LEADING and term:
            self._version += 1
            roles = Published(term=term, version=self._version, roles=self._ledger.lending_roles())
            with contextlib.suppress(*REDIS_DOWN):  # the next tick's lease says what it means
                await shares.roles.publish(roles, ttl_s)

    def _enter(self, mode: Mode, why: str, *, quiet: bool) -> None:
        if mode is self._mode:
            return
        self._mode = mode
        if mode is Mode.UNSHARED and not quiet:
            event = {
                "event": "lending_unshared",
                "why": f"{why}: lending roles cannot be shared between the gateway replicas, "
                "so none is lent and lent replicas are taken back until they can",
            }
            log.warning(json.dumps(event))
        elif mode is not Mode.UNSHARED:
            log.info(json.dumps({"event": "lending_shared", "mode": mode.value}))

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
