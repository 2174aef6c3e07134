"""The one virtual-time runner: simulated replicas, a workload, the gateway's routing and,
optionally, a scaler, as a discrete-event simulation. Nothing sleeps; the clock jumps from
event to event, and a given configuration and seed always produce the same events in the
same order (the event queue breaks time ties by the order events were scheduled in).

Every experiment is a configuration of `VirtualCluster`:

- the seed experiment (`seed_experiment.py`): closed-loop sessions and a burst of long
  requests on static pools;
- the prefix experiment (`prefix_experiment.py`): chat and document sessions on engines
  with prefix caching, the gateway's prefix index in the routing;
- the autoscale experiment (`elastic.py`): an open-loop arrival trace on pools that an
  `AutoScaler` grows (each new replica serving only after its cold start) and shrinks.

To plug in a workload, subclass `Workload`: `start` schedules its first events with
`cluster.schedule(at, subject)`; `on_event(cluster, now, subject)` receives them back and
sends requests with `cluster.submit(...)`, each as a tenant under its caps where it says so
(None: no pool takes the request, the gateway's 400, or its pool's line is full or its
tenant's queue cap reached, the gateway's 429); the `on_first_token`, `on_token_gap`
and `on_finished` hooks report each request's progress (a closed-loop session schedules
its next turn from `on_finished`). To plug in a scaler, subclass `Scaler`:
`decide(cluster, now)` is called every `interval_s` while work remains and may call
`cluster.add_replica` (serving after a cold start) and `cluster.drain`.
A request waits in its pool's line where the gateway's would: while the pool has no serving
replica, or has `maxConcurrentRequests` per serving replica running already.

Routing and every request's bookkeeping are the gateway's own: the runner drives the same
`laneway.ledger.Ledger` in virtual time (admit, plan, sent, first token, finished), so the
pool gates and lines, in-flight load, prefix index, learned prefill rates and demand are the
ledger's, and each request ends with the `RequestLog` the gateway would write. Engine gauges
(queue depth, KV usage) reach the ledger every `scrape_interval_s`, as the gateway scrapes
them; a pool's endpoints are its ready replicas that are not draining, as discovery lists
them. What stays here is the engine side: each replica's `EngineCore`, its steps and busy
time, and when tokens reach the client.

Prefix blocks: the workload's prompts are token ids without text, where the gateway cuts a
prompt's text into `block_chars`-character blocks. Prose runs about four characters per
token, so the runner cuts `block_chars / 4`-token blocks: the same blocks per prompt as the
gateway's estimate on prose, hashed from ids instead of characters (which changes no match:
two prompts share a block exactly when they share everything before it).

Lending (`spec.lending`, `laneway.ledger.lending`): after every chat admission, every step
that finished requests and every scrape the runner asks `Ledger.rebalance` for the lending
pools' roles and acts on the answer as the gateway does: each document on a replica taken
back is closed and requeued at once, and its engine aborts it after the step running (so
chat on that replica never shares a step with a document's prefill).

A replica starts its next step the moment the previous one completes (or the moment work
arrives at an idle replica); the step's tokens reach the client when the step ends.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Literal

from laneway.api import Lane
from laneway.ledger import (
    NO_BLOCKS,
    Admission,
    Admitted,
    EndpointLoad,
    Ledger,
    LedgerSettings,
    PromptBlocks,
    Refused,
    RequestLog,
    RoleChange,
    Ticket,
    Wakes,
)
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.fairshare import NO_CAPS, TenantCaps
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.picker import PickingSettings
from laneway.routing.prefix_index import leading_block_hashes
from laneway.routing.priority import engine_priority, gateway_level
from laneway.simulator.engine import EngineCore
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.profiles import Profile
from laneway.simulator.replicas import PoolState, Replica, Request
from laneway.simulator.scheduler import KV_BLOCK_TOKENS
from laneway.simulator.seed import PUBLIC_MODEL, SimPool
from laneway.tokens import TokenBounds

EventKind = Literal["workload", "step_done", "scrape", "ready", "scale"]
ProgressCallback = Callable[[float], None]
# A run that has not drained this long after its duration has a bug, not a slow GPU.
DRAIN_LIMIT_S = 3600.0
# Prose runs about four characters per token: the gateway's index blocks, in tokens.
CHARS_PER_TOKEN = 4
# Where the gateway's settings leave it: its default line length and staleness rule.
MAX_WAITING = 1024
COMPLETIONS_PATH = "/v1/completions"  # what each simulated request stands for
MIN_STALE_AFTER_S = 5.0


def ledger_settings(
    picking: PickingSettings,
    scrape_interval_s: float | None,
    lend_after_s: float = LedgerSettings.lend_after_s,
) -> LedgerSettings:
    """The ledger a gateway configured with `picking`, this scrape interval and this
    `spec.lending.lendAfterMillis` runs."""
    stale_after_s = max(MIN_STALE_AFTER_S, 3 * (scrape_interval_s or 0.0))
    return LedgerSettings(
        picking=picking,
        max_waiting=MAX_WAITING,
        stale_after_s=stale_after_s,
        lend_after_s=lend_after_s,
    )


class Workload:
    """Where requests come from; every hook but `on_event` may be left as is."""

    def start(self, cluster: VirtualCluster) -> None:
        """Schedule the first events."""

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        """An event this workload scheduled with `cluster.schedule(at, subject)`."""
        raise NotImplementedError

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        pass

    def on_token_gap(
        self, cluster: VirtualCluster, now: float, request: Request, gap_s: float
    ) -> None:
        pass

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        pass


class Scaler:
    """Changes the replica counts; `decide` runs every `interval_s` while work remains."""

    interval_s: float

    def decide(self, cluster: VirtualCluster, now: float) -> None:
        raise NotImplementedError


class VirtualCluster:
    """One configuration under one workload; `run()` once."""

    def __init__(
        self,
        pools: Sequence[SimPool],
        profile: Profile,
        picking: PickingSettings,
        workload: Workload,
        *,
        duration_s: float,  # the workload's length; the run drains after it
        tie_break: str,  # seeds the picker's tie-break
        scrape_interval_s: float | None,  # None: the engine gauges are never read
        scaler: Scaler | None = None,
        on_progress: ProgressCallback | None = None,
        # A ledger of the caller's (one that records, say); `ledger_settings` and a
        # generator seeded with `tie_break` make the default one.
        ledger: Ledger | None = None,
        drain_limit_s: float = DRAIN_LIMIT_S,  # 0: the run ends with its duration
        lend_after_s: float = LedgerSettings.lend_after_s,  # the lending pools' (`lending.py`)
    ) -> None:
        self._drain_limit_s = drain_limit_s
        self.profile = profile
        self.workload = workload
        self.scaler = scaler
        self.duration_s = duration_s
        self._scrape_interval_s = scrape_interval_s
        self._on_progress = on_progress
        self._prefix = picking.prefix
        settings = ledger_settings(picking, scrape_interval_s, lend_after_s)
        self.ledger = ledger or Ledger(settings, random.Random(tie_break))
        self.pools = [PoolState(spec) for spec in pools]
        self.replicas: list[Replica] = []
        self._by_url: dict[str, int] = {}  # replica URL -> its index
        for index, pool in enumerate(self.pools):
            for _ in range(pool.spec.replicas):
                self.add_replica(0.0, index, ready_after_s=None)
        self.logs: list[RequestLog] = []  # every finished request's, in order
        # The lending pools' role changes (`Ledger.rebalance`) and the reclaims' latencies
        # (decision to the first chat token there), as the run reports them.
        self.role_changes: list[tuple[float, RoleChange]] = []
        self.reclaim_ms: list[float] = []
        self.requests: dict[str, Request] = {}  # request id -> not finished yet
        self._ids = itertools.count()
        self._of_ticket: dict[Ticket, Request] = {}  # the same, by ledger ticket
        self._publish_endpoints(0.0)
        self._events: list[tuple[float, int, EventKind, int]] = []
        self._order = itertools.count()
        self.now = 0.0  # when the latest event happened
        self.last_work_s = 0.0  # when the latest event other than a scrape happened

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        self.workload.start(self)
        if self._scrape_interval_s is not None:
            self._push(0.0, "scrape", 0)
        if self.scaler is not None:
            self._push(0.0, "scale", 0)
        progress_every = self.duration_s / 20
        next_progress = progress_every
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if now > self.duration_s + self._drain_limit_s:
                break
            self.now = now
            if self._on_progress is not None and now >= next_progress:
                self._on_progress(now)
                next_progress = (now // progress_every + 1) * progress_every
            if kind == "scrape":
                self._scrape(now)
                continue  # a scrape is not work: it does not extend the run
            self.last_work_s = now
            if kind == "workload":
                self.workload.on_event(self, now, subject)
            elif kind == "step_done":
                self._finish_step(now, subject)
            elif kind == "ready":
                self._ready(now, subject)
            else:
                self._scale(now)

    def schedule(self, at: float, subject: int) -> None:
        """Call the workload's `on_event(cluster, at, subject)` at `at`."""
        self._push(at, "workload", subject)

    def _push(self, at: float, kind: EventKind, subject: int) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject))

    # -- requests ------------------------------------------------------------------------

    def submit(
        self,
        now: float,
        source: int,
        prompt_tokens: int,
        output_tokens: int,
        *,
        prompt_ids: Sequence[int] | None = None,
        pinned: Lane | None = None,
        session_key: str | None = None,
        tenant: str = "",
        caps: TenantCaps = NO_CAPS,
        objective_priority: int = 0,
    ) -> Request | None:
        """Route and admit a request as the gateway does, for `tenant` under its `caps`
        (the tenants file's), naming an InferenceObjective of `objective_priority` (higher
        more important; 0 for none); None if no pool takes it, its pool's line is full or
        its tenant's cap of waiting requests is reached (the gateway's 429s)."""
        bounds = TokenBounds(prompt_tokens, prompt_tokens)
        ask = RouteRequest(PUBLIC_MODEL, bounds, output_tokens, pinned)
        pools = self.ledger.pools()
        route = classify(ask, pools)
        if not isinstance(route, Route):
            return None
        admission = Admission(
            route=route,
            arrived=now,
            path=COMPLETIONS_PATH,
            model=PUBLIC_MODEL,
            stream=True,
            fair_tokens=route.prefill_tokens,
            caps=caps,
            session_key=session_key,
            tenant=tenant,
        )
        decision = self.ledger.admit(now, admission)
        if isinstance(decision, Refused):
            # A full line or the tenant's cap: the gateway's 429, which the workload hears as
            # a request no pool took (pools never leave a virtual run, nor do all their
            # endpoints fail).
            refused = self.ledger.finished(decision.ticket, now, status=429, error=decision.reason)
            self.logs.append(refused.log)
            return None
        request = Request(
            request_id=f"r{next(self._ids)}",
            source=source,
            pool=next(i for i, p in enumerate(self.pools) if p.spec.name == route.pool.name),
            route=route,
            arrival_s=now,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            prompt_ids=prompt_ids,
            session_key=session_key,
            ticket=decision.ticket,
            # As the EPP computes it (`gateway/epp/stream.py`): the tenant's level (0 here)
            # less the objective's priority, then the queue class's; the client asks none.
            engine_priority=engine_priority(
                route.pool, gateway_level(-objective_priority, route.priority, None)
            ),
        )
        self.requests[request.request_id] = request
        self._of_ticket[request.ticket] = request
        if isinstance(decision, Admitted):
            self._send(now, request)
        self._rebalance(now)
        # Else it waits in its pool's line (a pool at zero, or full), which is demand the
        # scaler sees, until a slot frees and the ledger grants it.
        return request

    def serving(self, pool: int) -> list[int]:
        """The pool's replicas that take new work, in the order they started."""
        return [
            i
            for i in self.pools[pool].replicas
            if self.replicas[i].ready and not self.replicas[i].draining
        ]

    def load(self, replica_index: int) -> EndpointLoad:
        """The gateway's in-flight load on the replica, as the ledger counts it."""
        return self.ledger.load(self.replicas[replica_index].url)

    def _send(self, now: float, request: Request) -> None:
        ticket = request.ticket
        plan = self.ledger.plan(ticket, now, self._prompt_blocks(request.prompt_ids))
        sent = self.ledger.sent(ticket, now, plan.endpoints[0])
        replica_index = self._by_url[sent.endpoint.url]
        replica = self.replicas[replica_index]
        engine_hashes = (
            block_hashes(request.prompt_ids, KV_BLOCK_TOKENS) if request.prompt_ids else ()
        )
        replica.core.submit(
            request.request_id,
            request.prompt_tokens,
            request.output_tokens,
            engine_hashes,
            priority=request.engine_priority or 0,  # vLLM's default where none is sent
        )
        request.replica = replica_index
        if replica.stepping is None:
            self._start_step(now, replica_index)

    def reclaim(self, now: float, request: Request) -> None:
        """Take the request's replica back: the gateway closes the upstream request, the
        engine aborts it (vLLM and SGLang between two steps: after the one running) and the
        ledger puts it back in its pool's line, to be sent anew."""
        assert request.replica >= 0, "only a request on a replica is reclaimed"
        replica = self.replicas[request.replica]
        if replica.stepping is None:
            self._abort(now, request)
        else:
            replica.aborting.add(request.request_id)

    def _close(self, now: float, request: Request) -> None:
        """A document on a replica taken back from lending: the gateway closes its upstream
        request and requeues it now (so chat sees the replica free at once); the engine
        aborts it after the step running. It is not resent there: the replica left the
        borrower's endpoints."""
        replica = self.replicas[request.replica]
        if replica.stepping is None:
            self._abort(now, request)
            return
        replica.closed.add(request.request_id)
        request.spans.attempt_ended()
        request.replica, request.first_token_s, request.last_token_s = -1, None, None
        self._wake(now, self.ledger.requeue(request.ticket, now))

    def _abort(self, now: float, request: Request) -> None:
        index, replica = request.replica, self.replicas[request.replica]
        replica.core.abort(request.request_id)
        request.spans.attempt_ended()
        request.replica, request.first_token_s, request.last_token_s = -1, None, None
        self._wake(now, self.ledger.requeue(request.ticket, now))
        if replica.stepping is None:  # idle with work queued: the freed KV may let it run
            self._start_step(now, index)

    def _rebalance(self, now: float) -> None:
        """The lending pools' roles for chat demand now: the gateway ends the borrowed
        requests on a replica it takes back, and sends the documents lending admits."""
        answer = self.ledger.rebalance(now)
        self.role_changes += ((now, change) for change in answer.changes)
        for reclaim in answer.reclaims:
            for ticket in reclaim.tickets:
                self._close(now, self._of_ticket[ticket])
        self._wake(now, answer.wakes)

    def _wake(self, now: float, wakes: Wakes) -> None:
        """Send the requests a change admitted from their lines."""
        assert not wakes.refused, wakes.refused  # pools never leave a virtual run
        for admitted in wakes.granted:
            self._send(now, self._of_ticket[admitted.ticket])

    def _prompt_blocks(self, prompt_ids: Sequence[int] | None) -> PromptBlocks:
        """The gateway's index blocks over the prompt (its text blocks, here in tokens)."""
        if prompt_ids is None or not self.ledger.wants_prefix_blocks:
            return NO_BLOCKS
        size = self._prefix.block_chars // CHARS_PER_TOKEN
        hashes = leading_block_hashes(tuple(prompt_ids), size, self._prefix.max_blocks)
        return PromptBlocks(hashes=hashes) if hashes else NO_BLOCKS

    # -- engines ---------------------------------------------------------------------------

    def _start_step(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        outcome = replica.core.step()
        replica.stepping = outcome
        if outcome is None:
            if replica.draining:
                self._release(now, replica_index)
            return
        replica.busy_s += outcome.duration_s
        replica.computed_prompt_tokens += sum(chunk.tokens for chunk in outcome.work.prefill)
        for request_id, chunk in zip(outcome.prefilled, outcome.work.prefill, strict=True):
            self.requests[request_id].spans.prefilled(chunk.context_before, chunk.tokens)
        self._push(now + outcome.duration_s, "step_done", replica_index)

    def _finish_step(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        outcome = replica.stepping
        assert outcome is not None
        first = set(outcome.first_tokens)
        # Closed by the gateway during the step: its tokens reach no client.
        aborting, replica.aborting = replica.aborting, set()
        closed, replica.closed = replica.closed, set()  # requeued already
        for request_id in closed:
            replica.core.abort(request_id)
        aborted = aborting | closed
        for request_id in (r for r in outcome.tokens if r not in aborted):
            request = self.requests[request_id]
            if request_id in first:
                answer = self.ledger.first_token(request.ticket, read_at=now, written_at=now)
                request.first_token_s = now
                if answer.reclaim_ms is not None:
                    self.reclaim_ms.append(answer.reclaim_ms)
                self.workload.on_first_token(self, now, request)
                # A fed batch replica's prefill is free: its next document goes now.
                self._wake(now, answer.wakes)
            else:
                assert request.last_token_s is not None
                gap = now - request.last_token_s
                request.max_gap_s = max(request.max_gap_s, gap)
                self.workload.on_token_gap(self, now, request, gap)
            request.last_token_s = now
        for request_id in aborting:
            self._abort(now, self.requests[request_id])
        for request_id in (r for r in outcome.finished if r not in aborted):
            request = self.requests.pop(request_id)
            del self._of_ticket[request.ticket]
            finished = self.ledger.finished(
                request.ticket,
                now,
                status=200,
                prompt_tokens=request.prompt_tokens,
                recomputed_prompt_tokens=request.spans.recomputed_tokens,
            )
            self.logs.append(finished.log)
            self._wake(now, finished.wakes)
            self.workload.on_finished(self, now, request)
        self._start_step(now, replica_index)
        if outcome.finished:  # after the next step began: a reclaim aborts after it
            self._rebalance(now)

    def _scrape(self, now: float) -> None:
        for replica in self.replicas:
            core = replica.core
            gauges = EngineMetrics(
                waiting=len(core.waiting), running=len(core.running), kv_usage=core.kv_usage
            )
            self._wake(now, self.ledger.record_scrape(replica.url, now, gauges).wakes)
        self._rebalance(now)
        if self._events and self._scrape_interval_s is not None:
            # Anything left to happen: keep scraping until the run drains.
            self._push(now + self._scrape_interval_s, "scrape", 0)

    # -- replicas coming and going ---------------------------------------------------------

    def add_replica(self, now: float, pool: int, ready_after_s: float | None) -> int:
        """Start a replica on a GPU; it serves after `ready_after_s` (None: at once)."""
        state = self.pools[pool]
        url = f"http://{state.spec.name}-{state.named}.virtual"
        state.named += 1
        core = EngineCore(self.profile, state.spec.engine)
        self.replicas.append(
            Replica(url=url, pool=pool, core=core, started_s=now, ready=ready_after_s is None)
        )
        index = len(self.replicas) - 1
        state.replicas.append(index)
        self._by_url[url] = index
        if ready_after_s is not None:
            self._push(now + ready_after_s, "ready", index)
        return index

    def drain(self, now: float, replica_index: int) -> None:
        """Stop sending the replica work; it gives its GPU back once its requests finish."""
        replica = self.replicas[replica_index]
        replica.draining = True
        self._publish_endpoints(now)
        if replica.stepping is None:
            self._release(now, replica_index)

    def _ready(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        if replica.released_s is not None:
            return
        replica.ready = True
        self._publish_endpoints(now)

    def _publish_endpoints(self, now: float) -> None:
        """The pools as discovery lists them to the gateway: each with its serving replicas."""
        pools = [
            pool.spec.inference_pool([self.replicas[i].url for i in self.serving(index)])
            for index, pool in enumerate(self.pools)
        ]
        self._wake(now, self.ledger.update_pools(now, pools))

    def _release(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        replica.released_s = now
        self.pools[replica.pool].replicas.remove(replica_index)

    def _scale(self, now: float) -> None:
        assert self.scaler is not None
        if self.requests or now < self.duration_s:
            self.scaler.decide(self, now)
            self._push(now + self.scaler.interval_s, "scale", 0)

    # -- totals ----------------------------------------------------------------------------

    def gpu_held_s(self) -> float:
        """GPU seconds from each replica's start to its release (or the run's end)."""
        return sum((r.released_s or self.now) - r.started_s for r in self.replicas)
