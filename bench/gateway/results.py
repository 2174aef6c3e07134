"""The numbers of a `laneway bench gateway` run (pure): each path's latency and CPU per
level, the gateway's own time from its histogram, how clumped the sends were, and the
routing of a long prompt."""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from laneway.bench.gateway.config import ZERO_PROFILE
from laneway.bench.harness.stream import StreamResult
from laneway.bench.harness.summary import Distribution


@dataclass(frozen=True)
class PhaseCpu:
    """CPU seconds each process spent during one phase."""

    client: float  # this process: the load generator
    engine: float
    gateway: float  # 0 on the direct path, which does not pass through it


@dataclass(frozen=True)
class OwnTime:
    """One stage of the gateway's own time, as its `laneway_gateway_overhead_seconds`
    histogram counted it during a phase; percentiles estimated from the buckets as
    Prometheus' `histogram_quantile` does."""

    stage: str  # request, chunk or stream (gateway/metrics.py says what each covers)
    count: int
    p50_s: float
    p99_s: float
    within_goal: float  # the share at or under OWN_TIME_GOAL_S, exact (it is a bucket edge)


OVERHEAD_METRIC = "laneway_gateway_overhead_seconds"
OWN_TIME_GOAL_S = 0.002  # issue 13: unqueued added latency P99 <= 2 ms
# Cumulative bucket counts by upper bound (`le`), as /metrics gives them, per stage.
Buckets = dict[str, dict[float, float]]


def overhead_buckets(metrics_text: str) -> Buckets:
    """The gateway's own-time histogram from its /metrics text: stage -> le -> count."""
    buckets: Buckets = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != OVERHEAD_METRIC:
            continue
        for sample in family.samples:
            if sample.name == f"{OVERHEAD_METRIC}_bucket":
                stage = buckets.setdefault(sample.labels["stage"], {})
                stage[float(sample.labels["le"])] = sample.value
    return buckets


def bucket_quantile(q: float, cumulative: Mapping[float, float]) -> float:
    """The q-quantile (0-1) of a histogram, linear within the bucket it falls in, as
    Prometheus' `histogram_quantile`: the highest finite edge if it falls past them all."""
    edges = sorted(cumulative)
    rank = q * cumulative[edges[-1]]
    lower, below = 0.0, 0.0
    for edge in edges:
        count = cumulative[edge]
        if count >= rank:
            if edge == float("inf"):
                return lower
            return lower + (edge - lower) * (
                (rank - below) / (count - below) if count > below else 1.0
            )
        lower, below = edge, count
    return lower


def own_time(stage: str, cumulative: Mapping[float, float]) -> OwnTime | None:
    """Percentiles of one stage's counts; None where it counted nothing."""
    count = cumulative.get(float("inf"), 0.0)
    if count <= 0:
        return None
    return OwnTime(
        stage=stage,
        count=round(count),
        p50_s=bucket_quantile(0.5, cumulative),
        p99_s=bucket_quantile(0.99, cumulative),
        within_goal=cumulative.get(OWN_TIME_GOAL_S, 0.0) / count,
    )


def buckets_between(before: Buckets, after: Buckets) -> Buckets:
    """What was counted between two reads of the histogram."""
    return {
        stage: {edge: count - before.get(stage, {}).get(edge, 0.0) for edge, count in edges.items()}
        for stage, edges in after.items()
    }


def add_buckets(total: Buckets, more: Buckets) -> Buckets:
    return {
        stage: {
            edge: total.get(stage, {}).get(edge, 0.0) + more.get(stage, {}).get(edge, 0.0)
            for edge in {*total.get(stage, {}), *more.get(stage, {})}
        }
        for stage in {*total, *more}
    }


OWN_STAGES = ("stream", "request", "chunk")


@dataclass(frozen=True)
class PathResult:
    """One path (direct or through the gateway) at one concurrency."""

    requests: int
    errors: int
    e2e: Distribution | None  # successful requests
    ttft: Distribution | None
    wall_s: float
    cpu: PhaseCpu
    # The mean number of streams open at once: with think time fewer than the clients.
    in_flight: float
    # How far the load generator's sends came in clumps (all its requests, failed ones too).
    clumps: SendClumps | None = None
    # The gateway's own time by stage, as it measured it (the gateway path only).
    own: tuple[OwnTime, ...] = ()

    def own_stage(self, stage: str) -> OwnTime | None:
        return next((own for own in self.own if own.stage == stage), None)

    @property
    def requests_per_s(self) -> float:
        return (self.requests - self.errors) / self.wall_s if self.wall_s > 0 else 0.0

    def cores_busy(self, cpu_s: float) -> float:
        """How many cores `cpu_s` of CPU time kept busy on average during this phase."""
        return cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def mean_in_flight(e2e_s: Sequence[float], wall_s: float) -> float:
    """Little's law: the mean number of requests open at once over `wall_s` is their arrival
    rate (count / wall) times their mean time open, that is the sum of their e2e over wall."""
    return sum(e2e_s) / wall_s if wall_s > 0 else 0.0


CLUMP_WINDOW_S = 0.010


@dataclass(frozen=True)
class SendClumps:
    """How many requests the load generator sent within CLUMP_WINDOW_S of each of its sends,
    that one included, against what independent (Poisson) sends at the same rate would give.

    A queue's tail is set by its arrivals: requests sent together wait for each other in the
    gateway whatever it costs per request, so a P99 well over Poisson's means the generator
    (its loop late on a shared core, firing its clients' timers together), not the gateway,
    made that part of the tail."""

    p50: int
    p99: int
    poisson_p99: int


def send_clumps(sent_at: Sequence[float], window_s: float = CLUMP_WINDOW_S) -> SendClumps | None:
    """`SendClumps` of send times (any order, one clock); None for fewer than two."""
    times = sorted(sent_at)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    if span <= 0:
        return None
    counts = sorted(bisect.bisect_right(times, t + window_s) - i for i, t in enumerate(times))
    return SendClumps(
        p50=counts[len(counts) // 2],
        p99=counts[min(len(counts) - 1, int(0.99 * len(counts)))],
        poisson_p99=1 + poisson_quantile(0.99, len(times) / span * window_s),
    )


def poisson_quantile(q: float, mean: float) -> int:
    """The smallest k whose Poisson(mean) cumulative probability reaches q."""
    k, term = 0, math.exp(-mean)
    total = term
    while total < q:
        k += 1
        term *= mean / k
        total += term
    return k


def path_result(
    results: Sequence[StreamResult], wall_s: float, cpu: PhaseCpu, own: Buckets | None = None
) -> PathResult:
    ok = [r for r in results if r.status == 200 and r.error is None]
    stages = (own_time(stage, (own or {}).get(stage, {})) for stage in OWN_STAGES)
    return PathResult(
        requests=len(results),
        errors=len(results) - len(ok),
        e2e=Distribution.of([r.e2e_s for r in ok]),
        ttft=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        wall_s=wall_s,
        cpu=cpu,
        in_flight=mean_in_flight([r.e2e_s for r in ok], wall_s),
        clumps=send_clumps([r.sent_at for r in results]),
        own=tuple(stage for stage in stages if stage is not None),
    )


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    direct: PathResult
    gateway: PathResult

    @property
    def added_p50_s(self) -> float | None:
        if self.direct.e2e is None or self.gateway.e2e is None:
            return None
        return self.gateway.e2e.p50 - self.direct.e2e.p50

    @property
    def added_p99_s(self) -> float | None:
        if self.direct.e2e is None or self.gateway.e2e is None:
            return None
        return self.gateway.e2e.p99 - self.direct.e2e.p99

    @property
    def requests_per_core_s(self) -> float | None:
        """Requests the gateway serves per second of its CPU time (one core fully busy)."""
        ok = self.gateway.requests - self.gateway.errors
        return ok / self.gateway.cpu.gateway if self.gateway.cpu.gateway > 0 else None


@dataclass(frozen=True)
class ClassifyResult:
    prompt_tokens: int
    prompt_bytes: int
    repeats: int
    bounds_decided_s: Distribution  # parse the body, bound the count, classify
    exact_count_s: Distribution  # the same where the bounds straddle a limit: count exactly
    bounds_pool: str  # the pool each path chose (both must be the batch pool)
    exact_pool: str
    # Median seconds of each stage, per path: parse, bounds, count, classify.
    bounds_stages_s: tuple[tuple[str, float], ...]
    exact_stages_s: tuple[tuple[str, float], ...]
    # The longest the event loop went without running while the exact count ran off it,
    # each way it can run, and with nothing running at all (the machine's own noise).
    loop_stalls: tuple[LoopStall, ...] = ()


@dataclass(frozen=True)
class LoopStall:
    """The longest gap between the event loop's 1 ms ticks while a 128k count runs `where`."""

    where: str
    p50_s: float  # the median over repeats of each repeat's longest gap
    max_s: float


@dataclass(frozen=True)
class BenchReport:
    machine: str
    date: str
    command: str
    placement: str  # which CPUs the processes ran on
    # The machine's 1-minute load average as the run began: other work skews latencies.
    load_average: float
    levels: tuple[LevelResult, ...]
    classification: ClassifyResult
    engine_profile: str = ZERO_PROFILE  # the simulated engine's pace
    engines: int = 1
    think_ms: float = 0.0  # each client's mean think time before a request

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        for level, data in zip(self.levels, document["levels"], strict=True):
            data["added_p50_s"] = level.added_p50_s
            data["added_p99_s"] = level.added_p99_s
            data["requests_per_core_s"] = level.requests_per_core_s
            data["gateway"]["requests_per_s"] = level.gateway.requests_per_s
            data["direct"]["requests_per_s"] = level.direct.requests_per_s
        return document
