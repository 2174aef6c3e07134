"""Lending whole replicas (`spec.lending`): an interactive pool packs its chat onto as few
replicas as keep the SLO with headroom and lends the rest to its borrower batch pool, and
takes them back the moment chat needs them.

Each replica of a lending pool has a role:

- serving: takes the pool's chat turns;
- draining: chosen to be lent; takes no new chat turn, and is lent once its chats are done
  (so a replica never holds a long prefill and chat at once);
- lent: one of the borrower's endpoints; the borrower's line is fed to it per replica;
- reclaiming: taken back; takes chat at once, while the shell aborts the borrower's
  requests still there (closing each upstream request: the engine aborts it between two
  steps and frees its KV) and requeues them (`Ledger.requeue`). Serving again once none is.

The packing: a replica holds `limits.maxConcurrentRequests` chat turns within the SLO
(the engine's `--max-num-seqs` / `--max-running-requests`, set where its steps keep TBT),
of which the pool fills `1 - headroom`; chat demand is the pool's turns running and in line.
The pool keeps as many replicas as that demand needs, never fewer than `keepReplicas`.
More are needed: a draining replica serves again first (nothing to abort), then the lent
replica with the fewest borrowed requests is reclaimed. Fewer: one replica is lent per
`lend_after_s` of demand that stayed below (so a dip between two turns lends nothing).
The borrower keeps every replica of its own: lending only adds to the batch lane, which so
never falls below its own pool's share.

Beside other gateway replicas (sharing one Redis), one of them, the leader, decides the
roles from every replica's chat demand and publishes them; the others `adopt` them: a
replica the leader took back is reclaimed here too, from this replica's own borrowed
requests there.

Pure: the ledger calls `rebalance` (or `adopt`) with what it knows and applies the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from laneway.api import InferencePool, Lane


class Role(StrEnum):
    SERVING = "serving"
    DRAINING = "draining"
    LENT = "lent"
    RECLAIMING = "reclaiming"


CHAT_ROLES = (Role.SERVING, Role.RECLAIMING)


@dataclass(frozen=True)
class Reclaim:
    """A lent replica taken back: the shell ends each of the borrower's requests there
    (closes its upstream request, which makes the engine abort it and free its KV) and
    requeues it (`Ledger.requeue`). Chat goes to the replica at once."""

    url: str
    tickets: tuple[int, ...]  # the ledger's tickets


@dataclass(frozen=True)
class PeerLending:
    """What the other gateway replicas report, for the one deciding the roles for all."""

    demand: Mapping[str, int] = field(default_factory=dict)  # pool key -> chat turns
    in_flight: Mapping[str, int] = field(default_factory=dict)  # endpoint -> requests there
    # False: the others' requests on the endpoints could not be read (their load share is
    # away). Unknown counts as busy, so no replica is lent on a reading never made.
    loads_known: bool = True
    # How long a published role takes to reach every other replica. They plan chat on a
    # replica until they adopt its draining role, so it drains at least this long, never
    # lent at once: else documents would reach it beside the chat they still send it.
    settle_s: float = 0.0


@dataclass(frozen=True)
class RoleChange:
    pool: str  # the lender's key
    url: str
    role: Role  # its new role


def borrower_of(lender: InferencePool, pools: Mapping[str, InferencePool]) -> InferencePool | None:
    """The lender's borrower where the set holds it as `check_pool_set` requires."""
    lending = lender.spec.lending
    if lending is None or lender.spec.lane is not Lane.INTERACTIVE:
        return None
    borrower = pools.get(f"{lender.namespace}/{lending.borrower}")
    if borrower is None or borrower.spec.lane is not Lane.BATCH:
        return None
    return borrower


def needed_replicas(lender: InferencePool, demand: int) -> int:
    """Replicas that hold `demand` chat turns within the SLO, with the pool's headroom."""
    lending = lender.spec.lending
    assert lending is not None
    per_replica = lender.spec.limits.max_concurrent_requests * (1 - lending.headroom)
    return max(lending.keep_replicas, math.ceil(demand / per_replica))


class LendingBook:
    """Every lending pool's replica roles, and when each pending change began."""

    def __init__(self, lend_after_s: float, *, borrow_lent: bool = True) -> None:
        self._lend_after_s = lend_after_s
        self._borrow_lent = borrow_lent  # False: lent replicas leave chat, join no borrower
        self.roles: dict[str, dict[str, Role]] = {}  # lender key -> endpoint -> role
        self._low_since: dict[str, float] = {}  # lender key -> demand below its replicas since
        self.reclaimed_at: dict[str, float] = {}  # endpoint -> when it was taken back
        self._draining_since: dict[str, float] = {}  # endpoint -> when it began to drain
        self.borrowers: dict[str, str] = {}  # lender key -> its borrower's

    def sync(self, pools: Mapping[str, InferencePool]) -> None:
        """The pool set changed: roles for the lenders' endpoints now (new ones serve)."""
        roles, self.borrowers = {}, {}
        for key, pool in pools.items():
            if (borrower := borrower_of(pool, pools)) is not None:
                old = self.roles.get(key, {})
                roles[key] = {url: old.get(url, Role.SERVING) for url in pool.endpoints}
                self.borrowers[key] = borrower.key
        self.roles = roles
        self._low_since = {k: t for k, t in self._low_since.items() if k in roles}
        urls = {url for of_pool in roles.values() for url in of_pool}
        self.reclaimed_at = {u: t for u, t in self.reclaimed_at.items() if u in urls}
        self._draining_since = {u: t for u, t in self._draining_since.items() if u in urls}

    def first_token(self, pool: str, url: str, at: float) -> float | None:
        """Milliseconds from taking `url` back to this first token of `pool`'s there, for
        the first chat token since (None for any other)."""
        if pool not in self.roles or url not in self.reclaimed_at:
            return None
        return (at - self.reclaimed_at.pop(url)) * 1000

    def effective(self, pools: Mapping[str, InferencePool]) -> list[InferencePool]:
        """The pools as the routing sees them: a lender with its chat replicas, a borrower
        with its own and the ones lent to it (where this ledger borrows them)."""
        lent: dict[str, list[str]] = {}
        chat: dict[str, tuple[str, ...]] = {}
        for key, roles in self.roles.items():
            borrower = borrower_of(pools[key], pools)
            assert borrower is not None
            chat[key] = tuple(url for url, role in roles.items() if role in CHAT_ROLES)
            lent.setdefault(borrower.key, []).extend(
                url for url, role in roles.items() if role is Role.LENT and self._borrow_lent
            )
        out = []
        for key, pool in pools.items():
            if key in chat:
                pool = replace(pool, endpoints=chat[key])
            elif lent.get(key):
                pool = replace(pool, endpoints=(*pool.endpoints, *lent[key]))
            out.append(pool)
        return out

    def rebalance(
        self,
        now: float,
        pools: Mapping[str, InferencePool],
        *,
        demand: Callable[[str], int],
        in_flight: Callable[[str], int],
        running: Callable[[str, str], tuple[int, ...]],
        lend: bool = True,
        settle_s: float = 0.0,
    ) -> tuple[tuple[RoleChange, ...], tuple[Reclaim, ...]]:
        """Every lender's role changes now, and the replicas taken back. `demand(key)`: a
        pool's chat turns running and in line; `in_flight(url)`: requests running on an
        endpoint; `running(url, key)`: a pool's tickets running there. Without `lend`,
        every replica is needed for chat: none is lent, and the lent ones are taken back.
        `settle_s`: how long a replica drains at least (`PeerLending.settle_s`)."""
        changes: list[RoleChange] = []
        reclaims: list[Reclaim] = []
        for key, borrower in self.borrowers.items():

            def borrowed(url: str, borrower: str = borrower) -> int:
                return len(running(url, borrower))

            ours = self._one(now, pools[key], demand(key), in_flight, borrowed, lend, settle_s)
            changes += ours
            reclaims += (
                Reclaim(url=c.url, tickets=running(c.url, borrower))
                for c in ours
                if c.role is Role.RECLAIMING
            )
        return tuple(changes), tuple(reclaims)

    def _one(
        self,
        now: float,
        lender: InferencePool,
        demand: int,
        in_flight: Callable[[str], int],
        borrowed: Callable[[str], int],
        lend: bool,
        settle_s: float,
    ) -> list[RoleChange]:
        key, roles = lender.key, self.roles[lender.key]
        changes = [
            RoleChange(key, url, Role.LENT)
            for url, role in roles.items()
            if role is Role.DRAINING
            and in_flight(url) == 0
            and now - self._draining_since.get(url, now) >= settle_s
        ]
        changes += [
            RoleChange(key, url, Role.SERVING)
            for url, role in roles.items()
            if role is Role.RECLAIMING and borrowed(url) == 0
        ]
        self._apply(now, changes)
        chat = [url for url, role in roles.items() if role in CHAT_ROLES]
        needed = needed_replicas(lender, demand) if lend else len(roles)
        if needed >= len(chat):
            self._low_since.pop(key, None)
        packed: list[RoleChange] = []
        if needed > len(chat):
            packed = _take_back(key, roles, needed - len(chat), borrowed)
        elif needed < len(chat):
            since = self._low_since.setdefault(key, now)
            serving = [url for url in chat if roles[url] is Role.SERVING]
            if now - since >= self._lend_after_s and serving:
                self._low_since[key] = now  # the next one waits as long again
                url = min(serving, key=in_flight)
                packed = [RoleChange(key, url, Role.DRAINING)]
                if in_flight(url) == 0 and not settle_s:  # no chat to finish: lent at once
                    packed.append(RoleChange(key, url, Role.LENT))
        self._apply(now, packed)
        return changes + packed

    def adopt(
        self,
        now: float,
        published: Mapping[str, Mapping[str, Role]],
        *,
        running: Callable[[str, str], tuple[int, ...]],
    ) -> tuple[tuple[RoleChange, ...], tuple[Reclaim, ...]]:
        """The roles another gateway replica decided (lender key -> endpoint -> role), made
        this replica's: the changes, and a reclaim of this replica's own borrowed requests
        (`running(url, key)`) on each lent replica the leader took back. An endpoint the
        leader does not know (yet) serves chat."""
        changes: list[RoleChange] = []
        reclaims: list[Reclaim] = []
        for key, roles in self.roles.items():
            self._low_since.pop(key, None)  # a lend waits from when this replica decides
            theirs = published.get(key, {})
            for url, old in roles.items():
                new = theirs.get(url, Role.SERVING)
                if new is old:
                    continue
                changes.append(RoleChange(key, url, new))
                if old is Role.LENT:
                    self.reclaimed_at[url] = now
                    reclaims.append(Reclaim(url=url, tickets=running(url, self.borrowers[key])))
        self._apply(now, changes)
        return tuple(changes), tuple(reclaims)

    def _apply(self, now: float, changes: Sequence[RoleChange]) -> None:
        for change in changes:
            if change.role is Role.RECLAIMING:
                self.reclaimed_at[change.url] = now
            if change.role is Role.DRAINING:
                self._draining_since[change.url] = now
            else:
                self._draining_since.pop(change.url, None)
            self.roles[change.pool][change.url] = change.role


def _take_back(
    key: str, roles: Mapping[str, Role], count: int, borrowed: Callable[[str], int]
) -> list[RoleChange]:
    draining = [url for url, role in roles.items() if role is Role.DRAINING]
    lent = sorted((url for url, role in roles.items() if role is Role.LENT), key=borrowed)
    back: Sequence[tuple[str, Role]] = [
        *((url, Role.SERVING) for url in draining),
        *((url, Role.RECLAIMING) for url in lent),
    ]
    return [RoleChange(key, url, role) for url, role in back[:count]]
