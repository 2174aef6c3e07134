"""A virtual-time cluster whose pools grow and shrink: open-loop traffic over a compressed
day, the gateway's routing and its queue for a pool with no ready replica, and the
operator's scaling decision (`laneway.autoscale.decide`) every scrape interval.

Routing is the gateway's own, as in `runner.py`: `lanes.classify` picks the pool (batch
documents arrive pinned to the batch lane, as the Batches API dispatcher sends them) and
`plan.make_plan` ranks its ready replicas, fed from the cluster's accounting and the prefill
rate each replica's first tokens teach.

A replica the decision adds holds its GPU from that moment but serves only after its cold
start (`cold_start_s`: model load, torch.compile, CUDA graph capture); a replica it removes
stops taking work and holds its GPU until its last request finishes. GPU time is counted
from start to release, so no policy looks good by scaling instantly.

Cold start default: vLLM serving Meta-Llama-3-8B reports engine init (profile, KV cache,
torch.compile, CUDA graph capture) of 39 s with compilation (vllm-project/vllm PR #11005),
and a pod with a warm compile cache answering its first request 59 s after it started
(vllm-project/vllm issue #20264). 60 s is used; node provisioning and image pulls are not
modelled (the GPU nodes are assumed present).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from laneway.api import InferencePool, Lane
from laneway.autoscale import LaneDemand, Recommendation, ScalePolicy, decide, first_sight
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.plan import make_plan
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PrefillRate
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import PUBLIC_MODEL, SEED_PICKING, SimPool
from laneway.tokens import TokenBounds

COLD_START_S = 60.0
DECISION_INTERVAL_S = 15.0  # how often the operator reads demand and decides
ATTAINMENT_WINDOW_S = 60.0  # "recent" SLO attainment: requests finished this long ago

EventKind = Literal["arrive", "step_done", "ready", "scale"]
ProgressCallback = Callable[[float], None]


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt_tokens: int
    output_tokens: int
    pinned: Lane | None = None  # the lane the request asks for (x-laneway-lane), if any


@dataclass(frozen=True)
class ElasticPool:
    name: str
    interactive: bool
    engine: SchedulerConfig
    replicas: int  # at the start; fixed when policy is None
    policy: ScalePolicy | None  # None: a static pool
    max_prompt_tokens: int | None = None  # the gateway's routing range; None: the context cap

    def inference_pool(self) -> InferencePool:
        """The pool as the gateway is configured with it (its endpoints change as it scales)."""
        lane = Lane.INTERACTIVE if self.interactive else Lane.BATCH
        shape = SimPool(
            self.name,
            lane,
            self.max_prompt_tokens,
            self.engine.max_context,
            self.replicas,
            self.engine,
        )
        return shape.inference_pool([])


@dataclass(frozen=True)
class PoolTrace:
    """One pool over the run, sampled at each scrape."""

    at_s: tuple[float, ...]
    replicas: tuple[int, ...]  # holding a GPU (starting, serving or draining)
    demand: tuple[int, ...]  # requests queued + in flight
    reasons: tuple[str, ...]  # the decisions that changed the count


@dataclass(frozen=True)
class RequestOutcome:
    pool: int
    arrival_s: float
    ttft_s: float
    max_gap_s: float  # the longest wait between two tokens; 0 for one-token outputs
    finished_s: float


@dataclass(frozen=True)
class ElasticResult:
    outcomes: tuple[RequestOutcome, ...]
    unfinished: int  # requests still queued or running when the drain limit hit
    unrouted: int  # requests no pool takes (the gateway's 400)
    gpu_seconds: float
    traces: tuple[PoolTrace, ...]


@dataclass
class _Request:
    pool: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    route: Route  # the gateway's decision, made once on arrival
    backlog_tokens: int = 0  # the prefill backlog it joined at its replica
    sent_s: float = 0.0  # when it left the gateway's line for its replica
    first_token_s: float | None = None
    last_token_s: float | None = None
    max_gap_s: float = 0.0


@dataclass
class _Replica:
    pool: int
    core: EngineCore
    started_s: float
    ready: bool = False
    draining: bool = False
    released_s: float | None = None
    in_flight: int = 0
    pending_prefill_tokens: int = 0
    stepping: StepOutcome | None = None
    rate: PrefillRate = field(default_factory=PrefillRate)


@dataclass
class _PoolState:
    spec: ElasticPool
    replicas: list[int] = field(default_factory=list)  # replica indices holding a GPU
    queue: list[str] = field(default_factory=list)  # request ids waiting at the gateway
    history: tuple[Recommendation, ...] = ()
    finished: list[tuple[float, bool]] = field(default_factory=list)  # (when, met the SLO)
    at: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    demand: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


class ElasticCluster:
    """One configuration under one arrival trace; `run()` once."""

    def __init__(
        self,
        pools: Sequence[ElasticPool],
        profile: Profile,
        arrivals: Sequence[Arrival],
        end_s: float,
        slo: tuple[float, float],  # (TTFT, TBT) seconds, for the attainment signal
        cold_start_s: float = COLD_START_S,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self._profile = profile
        self._arrivals = arrivals
        self._end_s = end_s
        self._slo = slo
        self._cold_start_s = cold_start_s
        self._on_progress = on_progress
        # The gateway's scorers with the seed experiment's profile, and a seeded tie-break.
        self._picking = SEED_PICKING.profile()
        self._tie_break = random.Random("elastic/picker")
        # The operator's first sight of each elastic pool: the day starts as the night left
        # it, and no scale-down comes before a whole down window of demand is seen.
        self._pools = [
            _PoolState(spec, history=first_sight(spec.policy, spec.replicas, 0.0))
            if spec.policy is not None
            else _PoolState(spec)
            for spec in pools
        ]
        self._routing = [spec.inference_pool() for spec in pools]
        self._unrouted = 0
        self._replicas: list[_Replica] = []
        self._requests: dict[str, _Request] = {}
        self._outcomes: list[RequestOutcome] = []
        self._events: list[tuple[float, int, EventKind, int]] = []
        self._order = itertools.count()
        for index, pool in enumerate(self._pools):
            for _ in range(pool.spec.replicas):
                replica = self._add_replica(0.0, index)
                self._replicas[replica].ready = True

    def run(self) -> ElasticResult:
        for index, _ in enumerate(self._arrivals):
            self._push(self._arrivals[index].at_s, "arrive", index)
        self._push(0.0, "scale", 0)
        now = 0.0
        next_progress = self._end_s / 20
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if self._on_progress is not None and now >= next_progress:
                self._on_progress(now)
                next_progress += self._end_s / 20
            if kind == "arrive":
                self._arrive(now, subject)
            elif kind == "step_done":
                self._finish_step(now, subject)
            elif kind == "ready":
                self._ready(now, subject)
            elif self._requests or now < self._end_s:
                self._scale(now)
                self._push(now + DECISION_INTERVAL_S, "scale", 0)
        gpu_s = sum((r.released_s or now) - r.started_s for r in self._replicas)
        traces = tuple(
            PoolTrace(tuple(p.at), tuple(p.counts), tuple(p.demand), tuple(p.reasons))
            for p in self._pools
        )
        return ElasticResult(
            tuple(self._outcomes), len(self._requests), self._unrouted, gpu_s, traces
        )

    # -- events ------------------------------------------------------------------------

    def _push(self, at: float, kind: EventKind, subject: int) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject))

    def _add_replica(self, now: float, pool: int) -> int:
        spec = self._pools[pool].spec
        self._replicas.append(_Replica(pool, EngineCore(self._profile, spec.engine), now))
        index = len(self._replicas) - 1
        self._pools[pool].replicas.append(index)
        return index

    def _arrive(self, now: float, index: int) -> None:
        arrival = self._arrivals[index]
        bounds = TokenBounds(arrival.prompt_tokens, arrival.prompt_tokens)
        ask = RouteRequest(PUBLIC_MODEL, bounds, arrival.output_tokens, arrival.pinned)
        route = classify(ask, self._routing)
        if not isinstance(route, Route):
            self._unrouted += 1
            return
        pool = self._routing.index(route.pool)
        request_id = f"r{index}"
        self._requests[request_id] = _Request(
            pool, now, arrival.prompt_tokens, arrival.output_tokens, route
        )
        serving = self._serving(pool)
        if not serving:
            # No ready replica (a pool at zero, or waking): the gateway queues the request
            # and the queue is demand the next scaling decision sees.
            self._pools[pool].queue.append(request_id)
            return
        self._send(now, request_id, serving)

    def _serving(self, pool: int) -> list[int]:
        return [
            i
            for i in self._pools[pool].replicas
            if self._replicas[i].ready and not self._replicas[i].draining
        ]

    def _send(self, now: float, request_id: str, serving: Sequence[int]) -> None:
        request = self._requests[request_id]
        views = [
            EndpointView(
                str(i), self._replicas[i].in_flight, self._replicas[i].pending_prefill_tokens, None
            )
            for i in serving
        ]
        rates = {str(i): self._replicas[i].rate for i in serving}
        waited_ms = (now - request.arrival_s) * 1000
        plan = make_plan(request.route, views, rates, self._picking, self._tie_break, waited_ms)
        best = plan.endpoints[0]
        replica_index = int(best.url)
        request.backlog_tokens, request.sent_s = best.backlog_tokens, now
        replica = self._replicas[replica_index]
        replica.core.submit(request_id, request.prompt_tokens, request.output_tokens)
        replica.in_flight += 1
        replica.pending_prefill_tokens += request.prompt_tokens
        if replica.stepping is None:
            self._start_step(now, replica_index)

    def _ready(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        if replica.released_s is not None:
            return
        replica.ready = True
        pool = self._pools[replica.pool]
        waiting, pool.queue = pool.queue, []
        serving = self._serving(replica.pool)
        for request_id in waiting:
            self._send(now, request_id, serving)

    def _start_step(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        outcome = replica.core.step()
        replica.stepping = outcome
        if outcome is not None:
            self._push(now + outcome.duration_s, "step_done", replica_index)
        elif replica.draining:
            self._release(now, replica_index)

    def _finish_step(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        outcome = replica.stepping
        assert outcome is not None
        first = set(outcome.first_tokens)
        for request_id in outcome.tokens:
            request = self._requests[request_id]
            if request_id in first:
                replica.pending_prefill_tokens -= request.prompt_tokens
                replica.rate = replica.rate.observed(
                    request.backlog_tokens, (now - request.sent_s) * 1000
                )
                request.first_token_s = now
            elif request.last_token_s is not None:
                request.max_gap_s = max(request.max_gap_s, now - request.last_token_s)
            request.last_token_s = now
        for request_id in outcome.finished:
            request = self._requests.pop(request_id)
            replica.in_flight -= 1
            assert request.first_token_s is not None
            result = RequestOutcome(
                request.pool,
                request.arrival_s,
                request.first_token_s - request.arrival_s,
                request.max_gap_s,
                now,
            )
            self._outcomes.append(result)
            ttft_slo, tbt_slo = self._slo
            met = result.ttft_s <= ttft_slo and result.max_gap_s <= tbt_slo
            self._pools[request.pool].finished.append((now, met))
        self._start_step(now, replica_index)

    def _release(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        replica.released_s = now
        self._pools[replica.pool].replicas.remove(replica_index)

    # -- the operator ------------------------------------------------------------------

    def _scale(self, now: float) -> None:
        for index, pool in enumerate(self._pools):
            demand = self._demand(now, index)
            holding = len(pool.replicas)
            pool.at.append(now)
            pool.demand.append(demand.queued_requests + demand.in_flight_requests)
            policy = pool.spec.policy
            if policy is not None:
                active = [i for i in pool.replicas if not self._replicas[i].draining]
                decision = decide(policy, demand, len(active), pool.history, now)
                pool.history = decision.history
                if decision.changes(len(active)):
                    pool.reasons.append(f"{now:.0f}s {decision.reason}")
                    self._resize(now, index, active, decision.desired)
                holding = len(pool.replicas)
            pool.counts.append(holding)

    def _demand(self, now: float, index: int) -> LaneDemand:
        pool = self._pools[index]
        queued = [self._requests[r] for r in pool.queue]
        in_flight = [
            r for rid, r in self._requests.items() if r.pool == index and rid not in pool.queue
        ]
        pool.finished = [(t, met) for t, met in pool.finished if now - t <= ATTAINMENT_WINDOW_S]
        attainment = (
            sum(met for _, met in pool.finished) / len(pool.finished) if pool.finished else None
        )
        return LaneDemand(
            queued_requests=len(queued),
            queued_prompt_tokens=sum(r.prompt_tokens for r in queued),
            in_flight_requests=len(in_flight),
            # Prompt tokens not yet prefilled cost GPU time; a decoding request's prompt
            # is done, so it counts only its KV, not here.
            in_flight_prompt_tokens=sum(
                r.prompt_tokens for r in in_flight if r.first_token_s is None
            ),
            slo_attainment=attainment,
        )

    def _resize(self, now: float, pool_index: int, active: list[int], desired: int) -> None:
        if desired > len(active):
            for _ in range(desired - len(active)):
                added = self._add_replica(now, pool_index)
                self._push(now + self._cold_start_s, "ready", added)
            return
        # Stop the least useful first: still starting, then the least loaded.
        victims = sorted(
            active,
            key=lambda i: (self._replicas[i].ready, self._replicas[i].in_flight, -i),
        )[: len(active) - desired]
        for replica_index in victims:
            replica = self._replicas[replica_index]
            replica.draining = True
            if replica.stepping is None:
                self._release(now, replica_index)


def diurnal_rate(at_s: float, day_s: float, peak: float, trough: float) -> float:
    """Requests per second at `at_s`: the trough at midnight, the peak at midday."""
    return trough + (peak - trough) * (1 - math.cos(2 * math.pi * at_s / day_s)) / 2


def poisson_arrivals(
    rng: random.Random,
    rate: Callable[[float], float],
    peak_rate: float,
    end_s: float,
) -> list[float]:
    """Arrival times of a Poisson process whose rate varies, by thinning (Lewis-Shedler)."""
    times: list[float] = []
    now = 0.0
    while True:
        now += rng.expovariate(peak_rate)
        if now >= end_s:
            return times
        if rng.random() * peak_rate < rate(now):
            times.append(now)
