"""The virtual-time runner: many simulated replicas, a workload and the gateway's routing,
as a discrete-event simulation. Nothing sleeps; the clock jumps from event to event, and
a given scenario and seed always produce the same events in the same order.

Routing is the gateway's own: `lanes.classify` picks the pool and `plan.make_plan` ranks its
replicas with the configuration's picking profile and a seeded tie-break, fed from the
runner's accounting (requests in flight, prompt tokens awaiting their first token, the
prefill rate each replica's first tokens teach) and from engine gauges (queue depth, KV
usage) sampled every SCRAPE_INTERVAL_S, as the gateway scrapes them.

Events: a session's next turn, the long-request burst, a replica's step completing, and a
scrape. A replica starts its next step the moment the previous one completes (or the moment
work arrives at an idle replica); the step's tokens reach the client when the step ends.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.plan import make_plan
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PrefillRate
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import (
    PUBLIC_MODEL,
    SCRAPE_INTERVAL_S,
    TBT_SLO_S,
    TTFT_SLO_S,
    ClusterConfig,
    SeedScenario,
)
from laneway.tokens import TokenBounds

EventKind = Literal["turn", "long", "step_done", "scrape"]
RequestKind = Literal["interactive", "batch"]
ProgressCallback = Callable[[float], None]
# A run that has not drained this long after its duration has a bug, not a slow GPU.
DRAIN_LIMIT_S = 3600.0


@dataclass(frozen=True)
class RunResult:
    config: ClusterConfig
    ttft_s: tuple[float, ...]  # per interactive request that got a first token
    ttft_at_s: tuple[float, ...]  # when each of those requests arrived
    tbt_s: tuple[float, ...]  # every gap between consecutive interactive tokens
    tbt_at_s: tuple[float, ...]  # when each of those gaps ended
    interactive_completed: int
    interactive_rejected: int  # no pool could hold them
    batch_finished_at_s: tuple[float, ...]
    batch_tokens: int  # prompt + output tokens of the completed batch requests
    batch_submitted: int
    gpu_busy_s: float  # summed over replicas
    end_s: float  # when the last event other than a scrape happened
    # Completed interactive turns whose TTFT and every gap met the seed's SLO.
    interactive_within_slo: int = 0


@dataclass
class _Request:
    kind: RequestKind
    session: int  # -1 for batch requests
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    replica: int
    backlog_tokens: int  # the replica's prefill backlog it joined, its own prompt included
    last_token_s: float | None = None
    within_slo: bool = True  # no TTFT or gap over the SLO so far


@dataclass
class _Replica:
    url: str  # its name in the InferencePool's endpoints
    core: EngineCore
    in_flight: int = 0
    pending_prefill_tokens: int = 0
    stepping: StepOutcome | None = None
    busy_s: float = 0.0
    rate: PrefillRate = field(default_factory=PrefillRate)
    scraped: EngineMetrics | None = None  # the gauges as last scraped; None before


@dataclass
class _Session:
    rng: random.Random
    turns: int = 0


@dataclass
class _Tally:
    ttft: list[float] = field(default_factory=list)
    ttft_at: list[float] = field(default_factory=list)
    tbt: list[float] = field(default_factory=list)
    tbt_at: list[float] = field(default_factory=list)
    interactive_completed: int = 0
    interactive_rejected: int = 0
    interactive_within_slo: int = 0
    batch_finished_at: list[float] = field(default_factory=list)
    batch_tokens: int = 0


class VirtualCluster:
    """One configuration under one scenario; `run()` once."""

    def __init__(
        self,
        config: ClusterConfig,
        profile: Profile,
        scenario: SeedScenario,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.config = config
        self.scenario = scenario
        self._on_progress = on_progress
        self._replicas: list[_Replica] = []
        self._replica_at: dict[str, int] = {}
        self._pools = []
        for pool in config.pools:
            urls = [f"http://{pool.name}-{index}.virtual" for index in range(pool.replicas)]
            for url in urls:
                self._replica_at[url] = len(self._replicas)
                self._replicas.append(_Replica(url, EngineCore(profile, pool.engine)))
            self._pools.append(pool.inference_pool(urls))
        self._profile = config.picking.profile()
        self._tie_break = random.Random(f"{scenario.seed}/picker")
        self._events: list[tuple[float, int, EventKind, int]] = []
        self._order = itertools.count()
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self._sessions = [
            _Session(random.Random(f"{scenario.seed}/session/{index}"))
            for index in range(scenario.sessions)
        ]
        self._tally = _Tally()

    def run(self) -> RunResult:
        scenario = self.scenario
        for index, session in enumerate(self._sessions):
            self._push(session.rng.uniform(0, scenario.session_start_spread_s), "turn", index)
        for index in range(scenario.long_requests):
            self._push(scenario.burst_at_s, "long", index)
        self._push(0.0, "scrape", 0)
        progress_every = scenario.duration_s / 20
        next_progress = progress_every
        now = end = 0.0
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if now > scenario.duration_s + DRAIN_LIMIT_S:
                break
            if self._on_progress is not None and now >= next_progress:
                self._on_progress(now)
                next_progress = (now // progress_every + 1) * progress_every
            if kind == "turn":
                self._start_turn(now, subject)
            elif kind == "long":
                self._submit(now, "batch", -1, scenario.long_tokens, scenario.long_output_tokens)
            elif kind == "scrape":
                self._scrape(now)
                continue  # a scrape is not work: it does not extend the run
            else:
                self._finish_step(now, subject)
            end = now
        tally = self._tally
        return RunResult(
            config=self.config,
            ttft_s=tuple(tally.ttft),
            ttft_at_s=tuple(tally.ttft_at),
            tbt_s=tuple(tally.tbt),
            tbt_at_s=tuple(tally.tbt_at),
            interactive_completed=tally.interactive_completed,
            interactive_rejected=tally.interactive_rejected,
            batch_finished_at_s=tuple(tally.batch_finished_at),
            batch_tokens=tally.batch_tokens,
            batch_submitted=scenario.long_requests,
            gpu_busy_s=sum(replica.busy_s for replica in self._replicas),
            end_s=end,
            interactive_within_slo=tally.interactive_within_slo,
        )

    # -- events ------------------------------------------------------------------------

    def _push(self, at: float, kind: EventKind, subject: int) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject))

    def _start_turn(self, now: float, session_index: int) -> None:
        if now >= self.scenario.duration_s:
            return
        session = self._sessions[session_index]
        session.turns += 1
        prompt = session.rng.randint(*self.scenario.prompt_tokens)
        output = session.rng.randint(*self.scenario.output_tokens)
        if not self._submit(now, "interactive", session_index, prompt, output):
            self._tally.interactive_rejected += 1
            self._next_turn(now, session_index)

    def _next_turn(self, now: float, session_index: int) -> None:
        think = self._sessions[session_index].rng.uniform(*self.scenario.think_time_s)
        self._push(now + think, "turn", session_index)

    def _submit(
        self, now: float, kind: RequestKind, session: int, prompt: int, output: int
    ) -> bool:
        """Route a request to a replica, as the gateway does; False if no pool takes it."""
        route = classify(
            RouteRequest(PUBLIC_MODEL, TokenBounds(prompt, prompt), output), self._pools
        )
        if not isinstance(route, Route):
            return False
        replicas = [self._replicas[self._replica_at[url]] for url in route.pool.endpoints]
        views = [
            EndpointView(r.url, r.in_flight, r.pending_prefill_tokens, r.scraped) for r in replicas
        ]
        rates = {r.url: r.rate for r in replicas}
        # No line to wait in: the virtual engines queue requests themselves, as vLLM does.
        best = make_plan(route, views, rates, self._profile, self._tie_break).endpoints[0]
        replica_index = self._replica_at[best.url]
        replica = self._replicas[replica_index]
        request_id = f"{kind[0]}{next(self._ids)}"
        replica.core.submit(request_id, prompt, output)
        self._requests[request_id] = _Request(
            kind, session, now, prompt, output, replica_index, best.backlog_tokens
        )
        replica.in_flight += 1
        replica.pending_prefill_tokens += route.prefill_tokens
        if replica.stepping is None:
            self._start_step(now, replica_index)
        return True

    def _start_step(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        outcome = replica.core.step()
        replica.stepping = outcome
        if outcome is not None:
            replica.busy_s += outcome.duration_s
            self._push(now + outcome.duration_s, "step_done", replica_index)

    def _finish_step(self, now: float, replica_index: int) -> None:
        replica = self._replicas[replica_index]
        outcome = replica.stepping
        assert outcome is not None
        tally = self._tally
        first = set(outcome.first_tokens)
        for request_id in outcome.tokens:
            request = self._requests[request_id]
            if request_id in first:
                replica.pending_prefill_tokens -= request.prompt_tokens
                replica.rate = replica.rate.observed(
                    request.backlog_tokens, (now - request.arrival_s) * 1000
                )
                if request.kind == "interactive":
                    tally.ttft.append(now - request.arrival_s)
                    tally.ttft_at.append(request.arrival_s)
                    request.within_slo = now - request.arrival_s <= TTFT_SLO_S
            elif request.kind == "interactive":
                assert request.last_token_s is not None
                tally.tbt.append(now - request.last_token_s)
                tally.tbt_at.append(now)
                request.within_slo &= now - request.last_token_s <= TBT_SLO_S
            request.last_token_s = now
        for request_id in outcome.finished:
            request = self._requests.pop(request_id)
            replica.in_flight -= 1
            if request.kind == "interactive":
                tally.interactive_completed += 1
                tally.interactive_within_slo += request.within_slo
                self._next_turn(now, request.session)
            else:
                tally.batch_finished_at.append(now)
                tally.batch_tokens += request.prompt_tokens + request.output_tokens
        self._start_step(now, replica_index)

    def _scrape(self, now: float) -> None:
        for replica in self._replicas:
            core = replica.core
            replica.scraped = EngineMetrics(len(core.waiting), len(core.running), core.kv_usage)
        if self._events:  # anything left to happen: keep scraping until the run drains
            self._push(now + SCRAPE_INTERVAL_S, "scrape", 0)


def run_virtual(
    config: ClusterConfig,
    profile: Profile,
    scenario: SeedScenario,
    on_progress: ProgressCallback | None = None,
) -> RunResult:
    return VirtualCluster(config, profile, scenario, on_progress).run()
