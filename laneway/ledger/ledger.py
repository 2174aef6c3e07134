"""The request ledger: the one place a request's and an endpoint's state changes.

A request's life is its methods, each called by a shell (the gateway, the virtual-time
runner) with the time and returning data:

    admit -> plan -> sent -> first_token -> finished
                      \\-> failed (-> sent again on the retry)      withdraw: gave up in line
                      \\-> requeue (its replica taken back: in line again -> plan)

The ledger owns the pools' gates and lines, each tenant's requests per pool (against its
caps), every endpoint's in-flight load, each pool's demand, the prefix index, the learned
prefill rates, health, scraped gauges, stored responses' holders and a lending pool's replica
roles (`rebalance`, `lending.py`). It reads no clock and does no I/O: time comes in as `now`
(seconds on one clock of the shell's choosing), and whatever a change means for a waiting
request comes back as `Wakes`.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from laneway.api import InferencePool
from laneway.ledger.decisions import (
    NO_BLOCKS,
    NO_WAKES,
    Admission,
    AdmitDecision,
    Admitted,
    Failed,
    Finished,
    FirstToken,
    LedgerSettings,
    PromptBlocks,
    Queued,
    Rebalanced,
    Refused,
    Scraped,
    Sent,
    Wakes,
    Withdrawn,
)
from laneway.ledger.demand import DemandBook
from laneway.ledger.endpoints import EndpointBook
from laneway.ledger.facts import PlanFacts
from laneway.ledger.feeding import FeedCounts, fed_candidates, feeding_limit, feeds, free_slots
from laneway.ledger.lending import LendingBook, PeerLending, Role
from laneway.ledger.lines import PoolGate, Ticket
from laneway.ledger.load import LoadBook
from laneway.ledger.records import LedgerRecords
from laneway.ledger.responses import ResponseBook
from laneway.ledger.tenants import TenantBook, TenantCount, TenantKey
from laneway.ledger.tickets import TicketState, running_on
from laneway.routing.cycle import CycleRequest, candidates
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.kv_events import EngineBlockFeed
from laneway.routing.picker import wants_prefix_blocks
from laneway.routing.plan import PlannedEndpoint, RoutingPlan, plan_cycle
from laneway.routing.prefix_index import PrefixIndex
from laneway.routing.slo import within_slo


class Ledger(LedgerRecords):
    def __init__(self, settings: LedgerSettings, rng: random.Random) -> None:
        self.settings = settings
        self._rng = rng
        self._profile = settings.picking.profile()
        # Fixed with the profile, and asked once per request.
        self._wants_prefix_blocks = wants_prefix_blocks(self._profile)
        self._endpoints = EndpointBook(settings.failures_to_eject, settings.stale_after_s)
        self._gates: dict[str, PoolGate] = {}
        self._load = LoadBook()
        self._tenants = TenantBook()
        self._demand = DemandBook(settings.slo_window_s)
        self.prefix_index = PrefixIndex(settings.picking.prefix.capacity_blocks)
        self._feeds: dict[str, EngineBlockFeed] = {}
        self._requests: dict[Ticket, TicketState] = {}
        self._responses = ResponseBook(settings.response_capacity)
        # Pool key -> the tickets holding its prefill slots, for the pools fed per replica.
        self._prefilling: dict[str, set[Ticket]] = {}
        self._lending = LendingBook(settings.lend_after_s, borrow_lent=settings.borrow_lent)
        self._listed: dict[str, InferencePool] = {}  # the pools as delivered, before lending
        self._tickets = itertools.count(1)
        self.synced = False  # a pool set has been delivered

    # -- a request's life ------------------------------------------------------------------

    def admit(self, now: float, ask: Admission) -> AdmitDecision:
        """A slot in the route's pool at once, a place in its line, or a refusal."""
        ticket = next(self._tickets)
        key = ask.route.pool.key
        pool, gate = self._endpoints.pools.get(key), self._gates.get(key)
        request = TicketState(
            ticket=ticket, ask=ask, gate=gate or PoolGate(0), state="refused", joined_at=now
        )
        self._requests[ticket] = request
        if pool is None or gate is None:
            return Refused(ticket=ticket, reason="pool_removed", gate=request.gate.state())
        # A pool with no endpoint at all is at zero or starting: it admits nobody, so the
        # request waits in line (and counts as demand) for a first replica. One whose
        # endpoints are all ejected is broken, not scaling: that is said at once.
        if pool.endpoints and not self._endpoints.available(pool):
            return Refused(ticket=ticket, reason="all_ejected", gate=gate.state())
        if gate.closed is not None:
            return Refused(ticket=ticket, reason=gate.closed, gate=gate.state())
        tenant, route = ask.tenant, ask.route
        self._tenants.set_caps(tenant, ask.caps)
        # A tenant at its cap of running requests (or of their prompt tokens) waits in line
        # for one of its own to end, however many slots are free.
        if self._tenants.may_start(key, tenant, route.prefill_tokens) and gate.take_free_slot(
            route.priority, tenant, ask.fair_tokens
        ):
            self._run(request, now)
            return Admitted(ticket=ticket, queue_ms=request.queue_ms or 0.0)
        if not self._tenants.may_wait(key, tenant):
            return Refused(ticket=ticket, reason="tenant_queue_full", gate=gate.state())
        wakes = NO_WAKES
        if not gate.can_join():
            place = gate.place_from(tenant)
            if place is None:
                return Refused(ticket=ticket, reason="queue_full", gate=gate.state())
            wakes = Wakes(refused=(self._give_up_place(place),))
        gate.join(ticket, route.priority, tenant, ask.fair_tokens)
        request.state = "queued"
        self._demand.add(key, route.prefill_tokens, queued=True)
        self._tenants.add(key, tenant, waiting=1)
        return Queued(ticket=ticket, wakes=wakes)

    def withdraw(self, ticket: Ticket, now: float) -> Withdrawn:
        """The shell stopped waiting (its limit passed, the client left). A slot granted
        meanwhile is handed on."""
        request = self._requests[ticket]
        wakes = NO_WAKES
        if request.state == "queued":
            self._leave_line(ticket, request)
        elif request.state == "running":
            wakes = self._stop_running(request, now)
        request.state = "refused"
        refused = Refused(ticket=ticket, reason="timeout", gate=request.gate.state())
        return Withdrawn(refused=refused, wakes=wakes)

    def plan(
        self,
        ticket: Ticket,
        now: float,
        blocks: PromptBlocks = NO_BLOCKS,
        subset: Iterable[str] | None = None,
    ) -> RoutingPlan:
        """The admitted request's endpoints best first, by the load of this moment: the
        pool's endpoints through the filter stage (health, `subset` where a caller gives
        one), ranked by the profile on the data its scorers ask for.

        `blocks` are the prompt's prefix blocks (empty unless `wants_prefix_blocks`).
        """
        request = self._running(ticket)
        route = request.ask.route
        # The pool as configured now: its endpoints may have changed while it waited.
        pool = self._endpoints.pools.get(route.pool.key) or route.pool
        if pool is not route.pool:
            route = replace(route, pool=pool)
        if request.feeding and pool.key in self._prefilling:
            subset = fed_candidates(pool, subset, self._feed_counts(pool.key, now))
        ask = CycleRequest(
            route=route,
            elapsed_ms=(now - request.ask.arrived) * 1000,
            session_key=request.ask.session_key,
            subset=None if subset is None else frozenset(subset),
        )
        facts = PlanFacts(
            self._load, self._endpoints, self.prefix_index, now, blocks, route.prefill_tokens
        )
        plan = plan_cycle(candidates(ask, pool.endpoints, facts), self._profile, self._rng)
        request.plan, request.blocks = plan, blocks
        return plan

    def sent(self, ticket: Ticket, now: float, endpoint: PlannedEndpoint) -> Sent:
        """An attempt on `endpoint` (one of the plan's) begins: its load counts there."""
        request = self._running(ticket)
        request.attempts += 1
        request.tried = request.on = endpoint
        request.sent_at, request.first = now, None
        blocks = request.blocks
        if blocks.hashes and blocks.exact_block_size is None:
            # Every endpoint tried holds the prompt's blocks afterwards, as far as the
            # estimate knows: a failed attempt may have prefilled it.
            self.prefix_index.record(endpoint.url, blocks.hashes)
        self._load.start(endpoint.url, endpoint.prefill_tokens)
        own_s = now - request.ask.arrived - (request.queue_ms or 0.0) / 1000
        return Sent(endpoint=endpoint, attempt=request.attempts, own_s=own_s)

    def answered(self, ticket: Ticket) -> None:
        """The endpoint answered (below 500): its run of failures is over."""
        request = self._running(ticket)
        if request.on is not None:
            self._endpoints.success(request.on.url)

    def first_token(self, ticket: Ticket, *, read_at: float, written_at: float) -> FirstToken:
        """The stream's first content token: read from the engine at `read_at` (what the
        endpoint's prefill rate learns from), written to the client at `written_at` (its
        TTFT against the SLO)."""
        request = self._running(ticket)
        on, plan = request.on, request.plan
        assert on is not None, "first_token before sent"
        assert plan is not None, "first_token before plan"
        if request.first is not None:
            return request.first  # only the first one counts
        ttft_s = written_at - request.ask.arrived
        met = within_slo(ttft_s, plan.pool.spec.slo.ttft_millis)
        self._demand.record_ttft(plan.pool.key, written_at, met)
        self._load.prefill_done(on.url, on.prefill_tokens)
        self._endpoints.first_token(on.url, on.backlog_tokens, (read_at - request.sent_at) * 1000)
        reclaim_ms = self._lending.first_token(plan.pool.key, on.url, read_at)
        request.first = FirstToken(ttft_ms=ttft_s * 1000, met_slo=met, reclaim_ms=reclaim_ms)
        if not request.feeding:
            return request.first
        # Its replica's prefill is free: the pool's next document may go there.
        return replace(request.first, wakes=self._stop_feeding(request, read_at))

    def failed(self, ticket: Ticket, now: float, *, counts: bool = True) -> Failed:
        """The current attempt failed. `counts`: against the endpoint's health (a read
        timeout whose engine still passes its health probe does not)."""
        request = self._running(ticket)
        on = request.on
        assert on is not None, "failed before sent"
        self._end_attempt(request)
        ejected = counts and self._endpoints.failure(on.url)
        if ejected:
            self._refresh_limits(now)  # fewer endpoints: limits only fall, nothing is granted
        plan = request.plan
        retry = None
        if plan is not None and request.attempts < min(
            self.settings.max_attempts, len(plan.endpoints)
        ):
            retry = plan.endpoints[request.attempts]
        return Failed(endpoint=on.url, ejected=ejected, retry=retry)

    def finished(
        self,
        ticket: Ticket,
        now: float,
        *,
        status: int,
        error: str | None = None,
        prompt_tokens: int | None = None,
        recomputed_prompt_tokens: int = 0,
    ) -> Finished:
        """The request is over, however it ended: everything it held is released and its
        log built. Call it once per ticket, refused ones included. `recomputed_prompt_tokens`:
        prompt tokens its engines prefilled that an attempt it was requeued from (`requeue`)
        had prefilled already: the virtual runner's exact count, the gateway's an upper bound
        (laneway/gateway/serving/recompute.py says why)."""
        request = self._requests.pop(ticket)
        wakes = NO_WAKES
        if request.state == "queued":
            self._leave_line(ticket, request)
        elif request.state == "running":
            wakes = self._stop_running(request, now)
        log = request.log(now, status, error, prompt_tokens, recomputed_prompt_tokens)
        return Finished(log=log, wakes=wakes)

    def requeue(self, ticket: Ticket, now: float) -> Wakes:
        """The shell ended the running request's attempt to take its replica back (a
        reclaim: it closed the upstream request, which makes the engine abort it). Its slot
        and load are released, not counted against the endpoint's health, and it waits in
        its pool's line again, to be planned and sent anew when a slot frees (where the
        pool's picking scores prefixes, the blocks its attempt prefilled, cached where it
        ran, count for that replica). A closed pool refuses it."""
        request = self._running(ticket)
        wakes = self._stop_running(request, now)
        request.requeued += 1
        gate, ask = request.gate, request.ask
        if gate.closed is not None or not gate.can_join():
            reason = gate.closed or "queue_full"
            refused = Refused(ticket=ticket, reason=reason, gate=gate.state())
            return wakes + Wakes(refused=(refused,))
        gate.join(ticket, ask.route.priority, ask.tenant, ask.fair_tokens)
        request.state, request.joined_at = "queued", now
        self._demand.add(ask.route.pool.key, ask.route.prefill_tokens, queued=True)
        self._tenants.add(ask.route.pool.key, ask.tenant, waiting=1)
        return wakes + self._grant(ask.route.pool.key, gate, now)

    # -- pools and endpoints ---------------------------------------------------------------

    def update_pools(self, now: float, pools: Sequence[InferencePool]) -> Wakes:
        """The complete current set of pools: new ones open, removed ones drain (running
        requests finish, waiting ones are refused), limits follow the endpoints."""
        incoming = {pool.key for pool in pools}
        refused: list[Refused] = []
        for key in self._gates.keys() - incoming:
            refused += self._refuse(self._gates.pop(key), "pool_removed")
        for key in incoming - self._gates.keys():
            self._gates[key] = PoolGate(self.settings.max_waiting)
        self._listed = {pool.key: pool for pool in pools}
        self._lending.sync(self._listed)
        self._endpoints.update(self._lending.effective(self._listed), self._listed.values())
        self.synced = True
        return Wakes(refused=tuple(refused)) + self._refresh_limits(now)

    def rebalance(
        self, now: float, *, lend: bool = True, peers: PeerLending | None = None
    ) -> Rebalanced:
        """The lending pools' replica roles for their chat demand now (`lending.py`): call
        it whenever that demand may have changed (a chat turn admitted or ended, a scrape).
        The shell acts on the reclaims; the wakes admit the borrowers' next documents.
        Without `lend` (the shell cannot act on lending now), every lent replica is taken
        back and none is lent. `peers`: the other gateway replicas' chat demand and requests
        on the lenders' endpoints, added to this replica's own (the leader decides for them
        all: a replica is lent once no gateway replica has a request there, and not before
        it has drained `peers.settle_s`)."""
        gates, requests, own = self._gates, self._requests, self._load.own()
        peers = peers or PeerLending()

        def demand_of(key: str) -> int:
            return gates[key].active + gates[key].waiting + peers.demand.get(key, 0)

        def in_flight(url: str) -> int:
            mine = own[url].in_flight if url in own else 0
            return mine + (peers.in_flight.get(url, 0) if peers.loads_known else 1)

        changes, reclaims = self._lending.rebalance(
            now,
            self._listed,
            demand=demand_of,
            in_flight=in_flight,
            running=lambda url, pool: running_on(requests, url, pool),
            lend=lend,
            settle_s=peers.settle_s,
        )
        if not changes:
            return Rebalanced()
        self._endpoints.update(self._lending.effective(self._listed), self._listed.values())
        return Rebalanced(changes, reclaims, self._refresh_limits(now))

    def adopt_roles(self, now: float, published: Mapping[str, Mapping[str, Role]]) -> Rebalanced:
        """The lending roles the leading gateway replica published (`LendingBook.adopt`):
        the shell ends this replica's borrowed requests on each replica taken back."""
        requests = self._requests
        changes, reclaims = self._lending.adopt(
            now, published, running=lambda url, pool: running_on(requests, url, pool)
        )
        if not changes:
            return Rebalanced()
        self._endpoints.update(self._lending.effective(self._listed), self._listed.values())
        return Rebalanced(changes, reclaims, self._refresh_limits(now))

    def drain(self) -> Wakes:
        """This replica is shutting down: every request still in line is refused now, so
        its client retries elsewhere instead of waiting out the drain."""
        refused: list[Refused] = []
        for gate in self._gates.values():
            refused += self._refuse(gate, "shutting_down")
        return Wakes(refused=tuple(refused))

    def record_probe(self, url: str, now: float, passed: bool) -> Wakes:
        """An ejected endpoint's health probe: one that passed is available again."""
        self._endpoints.probe(url, passed)
        return self._refresh_limits(now)

    def record_scrape(self, url: str, now: float, metrics: EngineMetrics) -> Scraped:
        """Keep an engine's gauges: whether they show its prefix cache was reset (the index
        then forgets the endpoint, where the settings say so), and whom KV room they show
        on a replica fed per replica admits."""
        reset = self._endpoints.scrape(url, now, metrics)
        if reset:
            self._responses.forget_endpoint(url)  # the store went with the old process
        if reset and self.settings.picking.prefix.forget_on_engine_restart:
            self.prefix_index.forget(url)
        return Scraped(reset=reset, wakes=self._refresh_feeding(now))

    def set_peer_tenants(
        self, now: float, counts: Mapping[TenantKey, TenantCount], replicas: int | None = None
    ) -> Wakes:
        """The other replicas' requests of these (pool, tenant)s, summed, and how many
        replicas share the caps (each keeps to its part): a tenant whose requests ended there
        may run here again."""
        self._tenants.set_peers(counts)
        if replicas is not None:
            self._tenants.replicas = max(1, replicas)
        return self._grant_all(now)

    def set_lone_leases(self, now: float, *, needed: bool) -> Wakes:
        """Whether a prompt that runs only alone needs the pool-wide lease (beside other
        replicas, through Redis) or runs on this replica's reading alone (Redis away)."""
        self._tenants.lone_leases = needed
        return self._grant_all(now)

    def take_lone(self, now: float, key: TenantKey) -> Wakes:
        """This replica holds the pool-wide lease for `key`'s next lone prompt."""
        self._tenants.take_lone(key)
        return self._grant_all(now)

    def released_lone(self, key: TenantKey) -> None:
        self._tenants.released_lone(key)

    # -- the rest --------------------------------------------------------------------------

    def _running(self, ticket: Ticket) -> TicketState:
        request = self._requests[ticket]
        if request.state != "running":
            raise ValueError(f"ticket {ticket} holds no slot (it is {request.state})")
        return request

    def _run(self, request: TicketState, now: float) -> None:
        request.state = "running"
        request.queue_ms = (now - request.joined_at) * 1000
        route = request.ask.route
        self._demand.add(route.pool.key, route.prefill_tokens, queued=False)
        self._tenants.add(
            route.pool.key, request.ask.tenant, running=1, tokens=route.prefill_tokens
        )
        prefilling = self._prefilling.get(route.pool.key)
        if prefilling is not None:
            request.feeding = request.fed = True
            prefilling.add(request.ticket)

    def _leave_line(self, ticket: Ticket, request: TicketState) -> None:
        request.gate.withdraw(ticket)
        self._dequeued(request)

    def _dequeued(self, request: TicketState) -> None:
        ask = request.ask
        self._demand.remove(ask.route.pool.key, ask.route.prefill_tokens, queued=True)
        self._tenants.add(ask.route.pool.key, ask.tenant, waiting=-1)

    def _give_up_place(self, ticket: Ticket) -> Refused:
        request = self._requests[ticket]
        self._leave_line(ticket, request)
        request.state = "refused"
        return Refused(ticket=ticket, reason="line_share", gate=request.gate.state())

    def _stop_running(self, request: TicketState, now: float) -> Wakes:
        self._end_attempt(request)
        ask = request.ask
        key = ask.route.pool.key
        self._demand.remove(key, ask.route.prefill_tokens, queued=False)
        self._tenants.add(key, ask.tenant, running=-1, tokens=-ask.route.prefill_tokens)
        request.state = "refused"
        if request.feeding:
            return self._stop_feeding(request, now)
        if request.fed:
            # Its slot was given back at its first token; its end leaves its replica one
            # request lighter, which may let the next document go there.
            return self._feed(key, now) if key in self._prefilling else NO_WAKES
        request.gate.release()
        return self._grant(key, request.gate, now)

    # -- per-replica feeding (`feeding.py`) ------------------------------------------------

    def _stop_feeding(self, request: TicketState, now: float) -> Wakes:
        """The request gives its prefill slot back (first token, or its end before one)."""
        request.feeding = False
        key = request.ask.route.pool.key
        prefilling = self._prefilling.get(key)
        request.gate.release()
        if prefilling is None:  # its pool was removed: its gate only drains
            return NO_WAKES
        prefilling.discard(request.ticket)
        return self._feed(key, now)

    def _feed(self, key: str, now: float) -> Wakes:
        """The fed pool's gate limit from its endpoints now, and whom it admits."""
        pool, gate = self._endpoints.pools.get(key), self._gates.get(key)
        if pool is None or gate is None:
            return NO_WAKES
        prefilling = self._prefilling[key]
        unsent = sum(1 for t in prefilling if self._requests[t].on is None)
        free = free_slots(pool, self._endpoints.available_of(key), self._feed_counts(key, now))
        gate.limit = feeding_limit(len(prefilling), unsent, sum(free.values()))
        return self._grant(key, gate, now)

    def _feed_counts(self, key: str, now: float) -> FeedCounts:
        own = Counter(
            on.url for t in self._prefilling[key] if (on := self._requests[t].on) is not None
        )
        return FeedCounts(self._load, self._endpoints, own, now, self.settings.feed_kv_limit)

    def _refresh_feeding(self, now: float) -> Wakes:
        return sum((self._feed(key, now) for key in self._prefilling), NO_WAKES)

    def _end_attempt(self, request: TicketState) -> None:
        on = request.on
        if on is not None:
            self._load.finish(on.url, on.prefill_tokens, prefill_done=request.first is not None)
            request.on = None

    def _grant(self, key: str, gate: PoolGate, now: float) -> Wakes:
        """Free slots to the line, in its order, passing over tenants at their cap; of two
        tenants whose turn it equally is, the one with fewer running here goes first."""
        granted = []

        def eligible(tenant: str, ticket: Ticket) -> bool:
            tokens = self._requests[ticket].ask.route.prefill_tokens
            return self._tenants.may_run(key, tenant, tokens)

        def running(tenant: str) -> int:
            return self._tenants.of(key, tenant).running

        while (ticket := gate.next_granted(eligible, running)) is not None:
            request = self._requests[ticket]
            self._dequeued(request)
            self._run(request, now)
            granted.append(Admitted(ticket=ticket, queue_ms=request.queue_ms or 0.0))
        return Wakes(granted=tuple(granted)) if granted else NO_WAKES

    def _grant_all(self, now: float) -> Wakes:
        wakes = NO_WAKES
        for key, gate in self._gates.items():
            wakes += self._grant(key, gate, now)
        return wakes

    def _refuse(self, gate: PoolGate, reason: str) -> list[Refused]:
        refused = []
        for ticket in gate.close(reason):
            request = self._requests[ticket]
            self._dequeued(request)
            request.state = "refused"
            refused.append(Refused(ticket=ticket, reason=reason, gate=gate.state()))
        return refused

    def _refresh_limits(self, now: float) -> Wakes:
        # A pool admits maxConcurrentRequests per available endpoint; beyond that, requests
        # wait in its line, where interactive ones go first.
        wakes = NO_WAKES
        fed = self.settings.feed_batch_per_replica
        self._prefilling = {
            key: self._prefilling.get(key, set())
            for key, pool in self._endpoints.pools.items()
            if feeds(pool, fed)
        }
        for key, pool in self._endpoints.pools.items():
            if key in self._prefilling:
                wakes += self._feed(key, now)
                continue
            per_endpoint = pool.spec.limits.max_concurrent_requests
            self._gates[key].limit = per_endpoint * len(self._endpoints.available_of(key))
        return wakes + self._grant_all(now)
