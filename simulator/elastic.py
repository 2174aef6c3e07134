"""The autoscale experiment's parts for the virtual-time runner (`runner.py`): pools that
grow and shrink under open-loop traffic over a compressed day. `TraceWorkload` replays an
arrival trace (batch documents pinned to the batch lane, as the Batches API dispatcher sends
them); `AutoScaler` is the operator's scaling decision (`laneway.autoscale.decide`) every
DECISION_INTERVAL_S on the demand the ledger counts, as the operator reads the gateway's;
the runner routes as the gateway does and holds requests for a pool with no serving replica
in the gateway's line.

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

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from laneway.api import Lane
from laneway.autoscale import Recommendation, ScalePolicy, decide, first_sight
from laneway.simulator.profiles import Profile
from laneway.simulator.replicas import Request
from laneway.simulator.runner import ProgressCallback, Scaler, VirtualCluster, Workload
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import SEED_PICKING, SimPool

COLD_START_S = 60.0
DECISION_INTERVAL_S = 15.0  # how often the operator reads demand and decides


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

    def sim_pool(self) -> SimPool:
        """The pool's shape at the start: its lane, routing range, engine and replicas."""
        lane = Lane.INTERACTIVE if self.interactive else Lane.BATCH
        return SimPool(
            name=self.name,
            lane=lane,
            max_prompt_tokens=self.max_prompt_tokens,
            max_context_tokens=self.engine.max_context,
            replicas=self.replicas,
            engine=self.engine,
        )


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
class _PoolScaling:
    policy: ScalePolicy | None
    history: tuple[Recommendation, ...] = ()
    at: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    demand: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def trace(self) -> PoolTrace:
        return PoolTrace(
            at_s=tuple(self.at),
            replicas=tuple(self.counts),
            demand=tuple(self.demand),
            reasons=tuple(self.reasons),
        )


class AutoScaler(Scaler):
    """The operator: every DECISION_INTERVAL_S, each pool's demand into `autoscale.decide`.

    The demand is the ledger's (`Ledger.demand`), the counts the gateway serves the real
    operator on `GET /laneway/demand`: queued and in-flight requests and prompt tokens, and
    the TTFT-SLO attainment over the ledger's window, so a simulated day measures the
    operator and gateway as they run rather than a bookkeeping of its own.
    """

    interval_s = DECISION_INTERVAL_S

    def __init__(self, pools: Sequence[ElasticPool], cold_start_s: float) -> None:
        # The operator's first sight of each elastic pool: the day starts as the night left
        # it, and no scale-down comes before a whole down window of demand is seen.
        self._pools = [
            _PoolScaling(spec.policy, first_sight(spec.policy, spec.replicas, 0.0))
            if spec.policy is not None
            else _PoolScaling(None)
            for spec in pools
        ]
        self._cold_start_s = cold_start_s

    def traces(self) -> tuple[PoolTrace, ...]:
        return tuple(pool.trace() for pool in self._pools)

    def decide(self, cluster: VirtualCluster, now: float) -> None:
        # The operator reads every pool's counts in one answer, as it reads the gateway's.
        counts = cluster.ledger.demand(now)
        keys = {pool.name: pool.key for pool in cluster.ledger.pools()}
        for index, pool in enumerate(self._pools):
            demand = counts[keys[cluster.pools[index].spec.name]].lane_demand()
            pool.at.append(now)
            pool.demand.append(demand.queued_requests + demand.in_flight_requests)
            if pool.policy is not None:
                holding = cluster.pools[index].replicas
                active = [i for i in holding if not cluster.replicas[i].draining]
                decision = decide(pool.policy, demand, len(active), pool.history, now)
                pool.history = decision.history
                if decision.changes(len(active)):
                    pool.reasons.append(f"{now:.0f}s {decision.reason}")
                    self._resize(cluster, now, index, active, decision.desired)
            pool.counts.append(len(cluster.pools[index].replicas))

    def _resize(
        self, cluster: VirtualCluster, now: float, pool: int, active: list[int], desired: int
    ) -> None:
        if desired > len(active):
            for _ in range(desired - len(active)):
                cluster.add_replica(now, pool, ready_after_s=self._cold_start_s)
            return
        # Stop the least useful first: still starting, then the least loaded.
        replicas = cluster.replicas
        victims = sorted(active, key=lambda i: (replicas[i].ready, cluster.load(i).in_flight, -i))[
            : len(active) - desired
        ]
        for replica_index in victims:
            cluster.drain(now, replica_index)


class TraceWorkload(Workload):
    """Open-loop arrivals: each request at its time in the trace, whatever came back."""

    def __init__(self, arrivals: Sequence[Arrival]) -> None:
        self._arrivals = arrivals
        self.outcomes: list[RequestOutcome] = []
        self.unrouted = 0

    def start(self, cluster: VirtualCluster) -> None:
        for index, arrival in enumerate(self._arrivals):
            cluster.schedule(arrival.at_s, index)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        arrival = self._arrivals[subject]
        sent = cluster.submit(
            now, subject, arrival.prompt_tokens, arrival.output_tokens, pinned=arrival.pinned
        )
        if sent is None:
            self.unrouted += 1

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        assert request.first_token_s is not None
        self.outcomes.append(
            RequestOutcome(
                pool=request.pool,
                arrival_s=request.arrival_s,
                ttft_s=request.first_token_s - request.arrival_s,
                max_gap_s=request.max_gap_s,
                finished_s=now,
            )
        )


def run_elastic(
    pools: Sequence[ElasticPool],
    profile: Profile,
    arrivals: Sequence[Arrival],
    end_s: float,
    cold_start_s: float = COLD_START_S,
    on_progress: ProgressCallback | None = None,
) -> ElasticResult:
    """One configuration under one arrival trace, routed with the seed's picking profile.
    The scaler's SLO attainment is the ledger's: first tokens against the pool's TTFT SLO
    (`SimPool` pools carry the InferencePool default, 300 ms, the seed's TTFT_SLO_S)."""
    workload = TraceWorkload(arrivals)
    scaler = AutoScaler(pools, cold_start_s)
    cluster = VirtualCluster(
        [pool.sim_pool() for pool in pools],
        profile,
        SEED_PICKING,
        workload,
        duration_s=end_s,
        tie_break="elastic/picker",
        scrape_interval_s=None,
        scaler=scaler,
        on_progress=on_progress,
    )
    cluster.run()
    return ElasticResult(
        tuple(workload.outcomes),
        len(cluster.requests),
        workload.unrouted,
        cluster.gpu_held_s(),
        scaler.traces(),
    )


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
