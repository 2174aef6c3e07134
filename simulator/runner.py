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
sends requests with `cluster.submit(...)` (None: no pool takes the request, the gateway's
400); the `on_first_token`, `on_token_gap` and `on_finished` hooks report each request's
progress (a closed-loop session schedules its next turn from `on_finished`). To plug in a
scaler, subclass `Scaler`: `decide(cluster, now)` is called every `interval_s` while work
remains and may call `cluster.add_replica` (serving after a cold start) and `cluster.drain`;
a request that finds its pool with no serving replica waits in the gateway's line for one.

Routing is the gateway's own: `lanes.classify` picks the pool and `plan.make_plan` ranks its
serving replicas with the picking profile and a seeded tie-break, fed from the runner's
accounting (requests in flight, prompt tokens awaiting their first token, the prefill rate
each replica's first tokens teach), engine gauges (queue depth, KV usage) sampled every
`scrape_interval_s` as the gateway scrapes them, and, when the profile has the
prefixAffinity scorer and the workload sends token ids, the gateway's prefix index.

A replica starts its next step the moment the previous one completes (or the moment work
arrives at an idle replica); the step's tokens reach the client when the step ends.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from laneway.api import Lane
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.picker import PickingSettings
from laneway.routing.plan import make_plan
from laneway.routing.prefix_index import PrefixIndex, chain_hashes, estimated_cached_tokens
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PrefillRate
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import KV_BLOCK_TOKENS
from laneway.simulator.seed import PUBLIC_MODEL, SimPool
from laneway.tokens import TokenBounds

EventKind = Literal["workload", "step_done", "scrape", "ready", "scale"]
ProgressCallback = Callable[[float], None]
# A run that has not drained this long after its duration has a bug, not a slow GPU.
DRAIN_LIMIT_S = 3600.0
# Prose runs about four characters per token: the gateway's index blocks, in tokens.
CHARS_PER_TOKEN = 4


@dataclass
class Request:
    request_id: str
    source: int  # the workload's own reference (its session, its arrival); -1 for none
    pool: int
    route: Route  # the gateway's decision, made once on arrival
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_ids: Sequence[int] | None  # the prompt's token ids, if the workload has them
    session_key: str | None  # its x-laneway-session, if any
    replica: int = -1  # -1 while it waits in the gateway's line
    backlog_tokens: int = 0  # the replica's prefill backlog it joined, its own prompt included
    # What it added to its replica's outstanding prefill: its prompt less the prefix the
    # gateway's index estimates that replica holds (plan.PlannedEndpoint.prefill_tokens).
    prefill_tokens: int = 0
    sent_s: float = 0.0  # when it left the gateway for its replica
    first_token_s: float | None = None
    last_token_s: float | None = None
    max_gap_s: float = 0.0  # the longest wait between two of its tokens


@dataclass
class Replica:
    url: str  # its name in its InferencePool's endpoints
    pool: int
    core: EngineCore
    started_s: float  # when it took its GPU
    ready: bool  # serving (a new replica is not until its cold start is over)
    draining: bool = False  # takes no new work; gives its GPU back when idle
    released_s: float | None = None
    in_flight: int = 0
    pending_prefill_tokens: int = 0  # the routed prompts' uncached parts, first token not back
    stepping: StepOutcome | None = None
    busy_s: float = 0.0
    computed_prompt_tokens: int = 0  # prompt tokens its engine prefilled (cache hits not)
    rate: PrefillRate = field(default_factory=PrefillRate)
    scraped: EngineMetrics | None = None  # the gauges as last scraped; None before


@dataclass
class _Pool:
    spec: SimPool
    replicas: list[int] = field(default_factory=list)  # indices of replicas holding a GPU
    queue: list[str] = field(default_factory=list)  # request ids waiting in the gateway
    named: int = 0  # replicas ever started, for their names


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

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        pass


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
    ) -> None:
        self.profile = profile
        self.workload = workload
        self.scaler = scaler
        self.duration_s = duration_s
        self._scrape_interval_s = scrape_interval_s
        self._on_progress = on_progress
        self._picking = picking.profile()
        self._prefix = picking.prefix
        affinity = any(scorer.name == "prefixAffinity" for scorer in self._picking)
        self._index = PrefixIndex(picking.prefix.capacity_blocks) if affinity else None
        self._tie_break = random.Random(tie_break)
        self.pools = [_Pool(spec) for spec in pools]
        self.replicas: list[Replica] = []
        for index, pool in enumerate(self.pools):
            for _ in range(pool.spec.replicas):
                self.add_replica(0.0, index, ready_after_s=None)
        self._routing = [
            pool.spec.inference_pool([self.replicas[i].url for i in pool.replicas])
            for pool in self.pools
        ]
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
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
            if now > self.duration_s + DRAIN_LIMIT_S:
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
    ) -> Request | None:
        """Route a request as the gateway does; None if no pool takes it."""
        bounds = TokenBounds(prompt_tokens, prompt_tokens)
        ask = RouteRequest(PUBLIC_MODEL, bounds, output_tokens, pinned)
        route = classify(ask, self._routing)
        if not isinstance(route, Route):
            return None
        pool = next(i for i, p in enumerate(self._routing) if p is route.pool)
        request = Request(
            f"r{next(self._ids)}",
            source,
            pool,
            route,
            now,
            prompt_tokens,
            output_tokens,
            prompt_ids,
            session_key,
        )
        self.requests[request.request_id] = request
        serving = self.serving(pool)
        if not serving:
            # No serving replica (a pool at zero, or waking): the gateway holds the
            # request in its line, and the line is demand the scaler sees.
            self.pools[pool].queue.append(request.request_id)
        else:
            self._send(now, request, serving)
        return request

    def serving(self, pool: int) -> list[int]:
        """The pool's replicas that take new work, in the order they started."""
        return [
            i
            for i in self.pools[pool].replicas
            if self.replicas[i].ready and not self.replicas[i].draining
        ]

    def _send(self, now: float, request: Request, serving: Sequence[int]) -> None:
        hashes = self._index_hashes(request.prompt_ids)
        matched = self._index.matched_blocks(hashes) if self._index and hashes else {}
        candidates = [self.replicas[i] for i in serving]
        views = [
            EndpointView(
                r.url,
                r.in_flight,
                r.pending_prefill_tokens,
                r.scraped,
                cached_prompt_tokens=estimated_cached_tokens(
                    matched.get(r.url, 0), len(hashes), request.route.prefill_tokens
                )
                if hashes
                else None,
                session_key=request.session_key,
            )
            for r in candidates
        ]
        rates = {r.url: r.rate for r in candidates}
        waited_ms = (now - request.arrival_s) * 1000
        plan = make_plan(request.route, views, rates, self._picking, self._tie_break, waited_ms)
        best = plan.endpoints[0]
        if self._index is not None and hashes:
            self._index.record(best.url, hashes)
        replica_index = next(i for i in serving if self.replicas[i].url == best.url)
        replica = self.replicas[replica_index]
        engine_hashes = (
            block_hashes(request.prompt_ids, KV_BLOCK_TOKENS) if request.prompt_ids else ()
        )
        replica.core.submit(
            request.request_id, request.prompt_tokens, request.output_tokens, engine_hashes
        )
        request.replica, request.backlog_tokens = replica_index, best.backlog_tokens
        request.sent_s = now
        replica.in_flight += 1
        request.prefill_tokens = best.prefill_tokens
        replica.pending_prefill_tokens += request.prefill_tokens
        if replica.stepping is None:
            self._start_step(now, replica_index)

    def _index_hashes(self, prompt_ids: Sequence[int] | None) -> tuple[int, ...]:
        """The gateway's index blocks over the prompt (its text blocks, here in tokens)."""
        if self._index is None or prompt_ids is None:
            return ()
        size = self._prefix.block_chars // CHARS_PER_TOKEN
        blocks = min(len(prompt_ids) // size, self._prefix.max_blocks)
        return chain_hashes(
            hash(tuple(prompt_ids[i : i + size])) for i in range(0, blocks * size, size)
        )

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
        self._push(now + outcome.duration_s, "step_done", replica_index)

    def _finish_step(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        outcome = replica.stepping
        assert outcome is not None
        first = set(outcome.first_tokens)
        for request_id in outcome.tokens:
            request = self.requests[request_id]
            if request_id in first:
                replica.pending_prefill_tokens -= request.prefill_tokens
                replica.rate = replica.rate.observed(
                    request.backlog_tokens, (now - request.sent_s) * 1000
                )
                request.first_token_s = now
                self.workload.on_first_token(self, now, request)
            else:
                assert request.last_token_s is not None
                gap = now - request.last_token_s
                request.max_gap_s = max(request.max_gap_s, gap)
                self.workload.on_token_gap(self, now, request, gap)
            request.last_token_s = now
        for request_id in outcome.finished:
            request = self.requests.pop(request_id)
            replica.in_flight -= 1
            if self.scaler is not None:
                self.scaler.on_finished(self, now, request)
            self.workload.on_finished(self, now, request)
        self._start_step(now, replica_index)

    def _scrape(self, now: float) -> None:
        for replica in self.replicas:
            core = replica.core
            replica.scraped = EngineMetrics(len(core.waiting), len(core.running), core.kv_usage)
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
        self.replicas.append(Replica(url, pool, core, now, ready=ready_after_s is None))
        index = len(self.replicas) - 1
        state.replicas.append(index)
        if ready_after_s is not None:
            self._push(now + ready_after_s, "ready", index)
        return index

    def drain(self, now: float, replica_index: int) -> None:
        """Stop sending the replica work; it gives its GPU back once its requests finish."""
        replica = self.replicas[replica_index]
        replica.draining = True
        if replica.stepping is None:
            self._release(now, replica_index)

    def _ready(self, now: float, replica_index: int) -> None:
        replica = self.replicas[replica_index]
        if replica.released_s is not None:
            return
        replica.ready = True
        pool = self.pools[replica.pool]
        waiting, pool.queue = pool.queue, []
        serving = self.serving(replica.pool)
        for request_id in waiting:
            self._send(now, self.requests[request_id], serving)

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
