"""`laneway bench gateway`: what the gateway itself costs, measured against going direct.

One run starts a `laneway sim` (zero service time, or a hardware profile's pace with
`--engine-profile`; `--engines N` of them) and a gateway in front of it, then at each
concurrency sends the same closed-loop streaming requests straight to the engines in turn
(the baseline) and through the gateway; the difference of the latency percentiles is what the
gateway adds. By default each client sends its next request as soon as one ends; with
`--think-ms` it first waits an exponential think time, so that arrivals are independent, as
chat users' turns are, and not synchronised by the engine's steps. The gateway's CPU time
during its phase gives requests per second per core, and every process's CPU time shows which
of them was the bottleneck.
Separately, in this process, it times the gateway's routing of a 128k-token prompt: once
where the token bounds decide the lane, once where the exact count must.

The statistics and the table are pure; `run_bench` is the shell.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import API_VERSION, KIND, InferencePool, parse_pool
from laneway.bench.live_cluster import start_gateway
from laneway.bench.loadgen import (
    Distribution,
    PromptFactory,
    StreamResult,
    stream_request,
)
from laneway.bench.procs import ChildProcess, Children
from laneway.errors import UsageError
from laneway.simulator.profiles import PROFILES
from laneway.stats import percentile
from laneway.tables import format_table
from laneway.tokens import TokenBounds, default_tokenizer

T = TypeVar("T")

MODEL = "bench"
DEFAULT_CONCURRENCY = (1, 50, 200, 500)
INTERACTIVE_MAX_PROMPT = 4096
ROUNDS = 2  # per level and path
WARMUP_REQUESTS = 200  # per path, before the first level
ZERO_PROFILE = "zero"


def engine_args(profile: str = ZERO_PROFILE) -> tuple[str, ...]:
    """A simulated engine with room for every concurrent stream. With the zero profile it
    answers at once, so the gateway's own cost decides the pace; with a hardware profile
    its tokens come at a real engine's pace."""
    return (
        "--host", "127.0.0.1", "--port", "0", "--model", MODEL, "--profile", profile,
        "--max-num-seqs", "4096", "--token-budget", "8192", "--max-context", "8192",
    )  # fmt: skip


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int | None = None  # per level and path; None: max(400, 8 x concurrency)
    prompt_tokens: int = 200
    output_tokens: int = 16
    classify_tokens: int = 131_072
    classify_repeats: int = 15
    seed: int = 0
    # Pin the gateway to a CPU of its own, the client and the engine to the others, so
    # that what it adds is not CPU it takes from them.
    own_core: bool = False
    engine_profile: str = ZERO_PROFILE
    engines: int = 1
    # Each client's mean wait before each request; 0: none, the next goes as one ends.
    think_ms: float = 0.0

    def requests_at(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(400, 8 * concurrency)


def check_options(options: BenchOptions) -> None:
    if not options.concurrency or any(c < 1 for c in options.concurrency):
        raise UsageError("--concurrency needs one or more positive integers, e.g. 1,50,200")
    if options.requests is not None and options.requests < 1:
        raise UsageError(f"--requests must be at least 1, got {options.requests}")
    if options.prompt_tokens < 1 or options.prompt_tokens > INTERACTIVE_MAX_PROMPT:
        raise UsageError(f"--prompt-tokens must be within 1-{INTERACTIVE_MAX_PROMPT}")
    if options.output_tokens < 1:
        raise UsageError("--output-tokens must be at least 1")
    if options.engine_profile not in PROFILES:
        known = ", ".join(sorted(PROFILES))
        raise UsageError(f"--engine-profile must be one of {known}, got {options.engine_profile!r}")
    if options.engines < 1:
        raise UsageError(f"--engines must be at least 1, got {options.engines}")
    if not (math.isfinite(options.think_ms) and options.think_ms >= 0):
        raise UsageError(f"--think-ms must be 0 (no think time) or more, got {options.think_ms:g}")
    if options.own_core and len(os.sched_getaffinity(0)) < 2:
        raise UsageError("--own-core needs at least 2 CPUs to run on")
    if options.classify_tokens <= INTERACTIVE_MAX_PROMPT or options.classify_repeats < 1:
        raise UsageError(
            f"--classify-tokens must exceed {INTERACTIVE_MAX_PROMPT} (a batch-lane prompt)"
        )


# -- results (pure) -------------------------------------------------------------------------


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


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def render(report: BenchReport) -> list[str]:
    header = (
        "concurrency", "direct p50", "direct p99", "gateway p50", "gateway p99",
        "added p50", "added p99", "p99 ratio", "direct req/s", "gateway req/s",
        "req/s per gw core", "cores client/engine/gw", "in flight direct/gw", "errors",
    )  # fmt: skip
    rows = []
    for level in report.levels:
        direct, gateway = level.direct, level.gateway
        ratio = (
            f"{gateway.e2e.p99 / direct.e2e.p99:.2f}x"
            if gateway.e2e and direct.e2e and direct.e2e.p99 > 0
            else "-"
        )
        per_core = level.requests_per_core_s
        cores = "/".join(
            f"{gateway.cores_busy(cpu):.2f}"
            for cpu in (gateway.cpu.client, gateway.cpu.engine, gateway.cpu.gateway)
        )
        rows.append(
            (
                str(level.concurrency),
                _ms(direct.e2e.p50 if direct.e2e else None),
                _ms(direct.e2e.p99 if direct.e2e else None),
                _ms(gateway.e2e.p50 if gateway.e2e else None),
                _ms(gateway.e2e.p99 if gateway.e2e else None),
                _ms(level.added_p50_s),
                _ms(level.added_p99_s),
                ratio,
                f"{direct.requests_per_s:.0f}",
                f"{gateway.requests_per_s:.0f}",
                "-" if per_core is None else f"{per_core:.0f}",
                cores,
                f"{direct.in_flight:.1f}/{gateway.in_flight:.1f}",
                f"{direct.errors}/{gateway.errors}",
            )
        )
    classify = report.classification
    engines = "1 engine" if report.engines == 1 else f"{report.engines} engines"
    think = (
        f"think time exponential, mean {report.think_ms:g} ms"
        if report.think_ms > 0
        else "no think time"
    )
    lines = [
        f"gateway overhead, end-to-end latency of streamed requests in ms ({report.machine}; "
        f"load average {report.load_average:.2f} at the start; {report.placement}; "
        f"engine profile {report.engine_profile}; {engines}; {think}); "
        "concurrency: the clients; in flight: the mean of streams open at once, by Little's "
        "law (successful requests x mean e2e / wall s)",
        *format_table(header, rows),
        "",
        *render_own_time(report.levels),
        "",
        f"routing a {classify.prompt_tokens:,}-token prompt ({classify.prompt_bytes:,} bytes "
        f"of JSON body) in ms, {classify.repeats} times; stages are medians:",
        *format_table(
            ("path", "median", "p99", *STAGES, "pool"),
            [
                (
                    "bounds decide",
                    _ms(classify.bounds_decided_s.p50),
                    _ms(classify.bounds_decided_s.p99),
                    *(_ms(seconds) for _, seconds in classify.bounds_stages_s),
                    classify.bounds_pool,
                ),
                (
                    "exact count",
                    _ms(classify.exact_count_s.p50),
                    _ms(classify.exact_count_s.p99),
                    *(_ms(seconds) for _, seconds in classify.exact_stages_s),
                    classify.exact_pool,
                ),
            ],
        ),
        "",
        f"longest event-loop stall while the exact count ran off the loop, in ms, "
        f"{classify.repeats} times:",
        *format_table(
            ("count runs in", "median", "max"),
            [(stall.where, _ms(stall.p50_s), _ms(stall.max_s)) for stall in classify.loop_stalls],
        ),
    ]
    return lines


def render_own_time(levels: Sequence[LevelResult]) -> list[str]:
    """The gateway's own measure of its part, beside the client's difference of two paths."""
    header = (
        "concurrency", "stream p50", "stream p99", "request p50", "request p99",
        "chunk p50", "chunk p99", f"streams <= {OWN_TIME_GOAL_S * 1000:g} ms",
        "sends in 10 ms p50/p99 (Poisson p99)",
    )  # fmt: skip
    rows = []
    for level in levels:
        stream, request, chunk = (level.gateway.own_stage(stage) for stage in OWN_STAGES)
        clumps = level.gateway.clumps
        rows.append(
            (
                str(level.concurrency),
                *(
                    _ms(getattr(stage, field) if stage else None)
                    for stage in (stream, request, chunk)
                    for field in ("p50_s", "p99_s")
                ),
                "-" if stream is None else f"{stream.within_goal:.1%}",
                "-" if clumps is None else f"{clumps.p50}/{clumps.p99} ({clumps.poisson_p99})",
            )
        )
    return [
        "the gateway's own time per request in ms, as it measured it "
        f"({OVERHEAD_METRIC} on its /metrics, read before and after each round; percentiles "
        "from the buckets as Prometheus' histogram_quantile gives them). request: arrival to "
        "the engine; chunk: each relayed chunk, read to written; stream: request + the chunk "
        "with [DONE]. The client-side 'added' above is what a user measures, the difference of two "
        "paths, which the processes sharing a core also move; this is the gateway's part alone. "
        "sends in 10 ms: how many requests the load generator sent within 10 ms of each of its "
        "sends to the gateway, against independent sends at the same rate: requests sent "
        "together wait for each other on the gateway's core, whatever each costs:",
        *format_table(header, rows),
    ]


# -- configuration ------------------------------------------------------------------------


def pool_documents(
    endpoint: str, batch_context: int, max_concurrent: int = 1024
) -> list[dict[str, Any]]:
    """An interactive pool capped at 4k prompts and a batch pool with `batch_context` tokens."""

    def pool(name: str, lane: str, minimum: int, maximum: int, context: int) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "lane": lane,
                "model": MODEL,
                "engine": {"kind": "simulator"},
                "routing": {"minPromptTokens": minimum, "maxPromptTokens": maximum},
                "prefill": {"tokenBudget": 8192, "chunkSize": 1024},
                "limits": {"maxContextTokens": context, "maxConcurrentRequests": max_concurrent},
            },
            "status": {"endpoints": [endpoint]},
        }

    return [
        pool("interactive", "interactive", 0, INTERACTIVE_MAX_PROMPT, 8192),
        pool("batch", "batch", INTERACTIVE_MAX_PROMPT + 1, batch_context - 1024, batch_context),
    ]


def gateway_config(endpoints: Sequence[str]) -> list[dict[str, Any]]:
    """A bench gateway's documents: both pools on every one of `endpoints`, and a queue no
    level of concurrency fills or outwaits."""
    queue = {"maxWaiting": 100_000, "timeoutMillis": 120_000}
    settings = {"apiVersion": API_VERSION, "kind": "GatewayConfig", "spec": {"queue": queue}}
    pools = pool_documents(endpoints[0], 8192 * 16)
    for pool in pools:
        pool["status"]["endpoints"] = list(endpoints)
    return [settings, *pools]


# -- classification (in this process) ---------------------------------------------------------


async def time_classification(options: BenchOptions, clock: Callable[[], float]) -> ClassifyResult:
    """Time the gateway's routing path for one long prompt, bounds-decided and exact.

    The path is the gateway's own `settle_route` (bounds first, the exact count where they
    do not decide); the count runs inline here, where the gateway runs it off its loop.
    """
    from laneway.gateway.serving.request_body import Endpoint, parse_request
    from laneway.gateway.serving.routing import settle_route
    from laneway.routing.lanes import Route, RouteRequest

    tokenizer = default_tokenizer()
    body = long_prompt_body(options)
    # The byte bound of this prompt is several times its token count: a batch pool whose
    # context covers the byte bound is decided by bounds, one capped just above the token
    # count needs the exact count.
    roomy = [parse_pool(d) for d in pool_documents("http://127.0.0.1:1", 2 * len(body))]
    tight = [
        parse_pool(d) for d in pool_documents("http://127.0.0.1:1", options.classify_tokens + 2048)
    ]

    async def route(pools: Sequence[InferencePool]) -> tuple[str, dict[str, float]]:
        stages = dict.fromkeys(STAGES, 0.0)
        begun = clock()
        parsed = parse_request(body, Endpoint.COMPLETIONS)
        parsed_at = clock()
        bounds = parsed.bounds(tokenizer)
        bounded_at = clock()

        ask = RouteRequest(parsed.model, bounds, parsed.max_tokens)

        async def count_exactly() -> RouteRequest:
            counting = clock()
            exact = parsed.count(tokenizer)
            stages["count"] = clock() - counting
            return dataclasses.replace(ask, prompt_tokens=TokenBounds(exact, exact))

        decision = await settle_route(ask, pools, count_exactly)
        stages["classify"] = clock() - bounded_at - stages["count"]
        stages["parse"] = parsed_at - begun
        stages["bounds"] = bounded_at - parsed_at
        if not isinstance(decision, Route):
            raise RuntimeError(f"the benchmark prompt was not routed: {decision}")
        return decision.pool.name, stages

    bounds_runs = [await route(roomy) for _ in range(options.classify_repeats)]
    exact_runs = [await route(tight) for _ in range(options.classify_repeats)]
    return ClassifyResult(
        prompt_tokens=options.classify_tokens,
        prompt_bytes=len(body),
        repeats=options.classify_repeats,
        bounds_decided_s=_total(bounds_runs),
        exact_count_s=_total(exact_runs),
        bounds_pool=bounds_runs[0][0],
        exact_pool=exact_runs[0][0],
        bounds_stages_s=_stage_medians(bounds_runs),
        exact_stages_s=_stage_medians(exact_runs),
    )


def long_prompt_body(options: BenchOptions) -> bytes:
    text = PromptFactory(default_tokenizer()).text(
        random.Random(options.seed), options.classify_tokens
    )
    return json.dumps({"model": MODEL, "prompt": text, "max_tokens": 64}).encode()


async def count_stalls(options: BenchOptions) -> tuple[LoopStall, ...]:
    """The event loop's longest stall during an exact count of the long prompt: in the
    gateway's worker process (started and warmed first), in a thread of the default
    executor as the gateway counted before, and with the loop alone for as long."""
    from laneway.gateway.serving.counting import OffLoopCounter
    from laneway.gateway.serving.request_body import Endpoint, parse_request

    tokenizer = default_tokenizer()
    parsed = parse_request(long_prompt_body(options), Endpoint.COMPLETIONS)
    loop = asyncio.get_running_loop()
    counter = OffLoopCounter()
    stalls: dict[str, list[float]] = {"a worker process": [], "a thread": [], "nothing": []}
    try:
        await counter.count(parsed, tokenizer)
        for _ in range(options.classify_repeats):
            begun = time.perf_counter()
            stalls["a worker process"].append(
                await loop_stall_while(counter.count(parsed, tokenizer))
            )
            took = time.perf_counter() - begun
            stalls["a thread"].append(
                await loop_stall_while(loop.run_in_executor(None, parsed.count, tokenizer))
            )
            stalls["nothing"].append(await loop_stall_while(asyncio.sleep(took)))
    finally:
        counter.close()
    return tuple(
        LoopStall(where, statistics.median(gaps), max(gaps)) for where, gaps in stalls.items()
    )


async def loop_stall_while(work: Awaitable[object], tick_s: float = 0.001) -> float:
    """Run `work` as a task; the longest gap between the loop's 1 ms ticks meanwhile."""
    running = asyncio.ensure_future(work)
    longest, last = 0.0, time.perf_counter()
    while not running.done():
        await asyncio.sleep(tick_s)
        now = time.perf_counter()
        longest, last = max(longest, now - last - tick_s), now
    await running
    return max(longest, 0.0)


STAGES = ("parse", "bounds", "count", "classify")


def _total(runs: Sequence[tuple[str, dict[str, float]]]) -> Distribution:
    totals = Distribution.of([sum(stages.values()) for _, stages in runs])
    assert totals is not None  # at least one repeat
    return totals


def _stage_medians(runs: Sequence[tuple[str, dict[str, float]]]) -> tuple[tuple[str, float], ...]:
    return tuple((stage, percentile([s[stage] for _, s in runs], 50)) for stage in STAGES)


# -- the shell ------------------------------------------------------------------------------


def progress(message: str) -> None:
    print(f"laneway bench gateway: {message}", file=sys.stderr, flush=True)


def think_time(mean_ms: float, rng: random.Random) -> Callable[[], float] | None:
    """Draws of a client's think time in seconds, exponential of mean `mean_ms`: each client's
    requests then arrive as a Poisson process, independent of the others' and of when the
    engine ends their streams. None for no think time."""
    if mean_ms == 0:
        return None
    rate = 1000 / mean_ms
    return lambda: rng.expovariate(rate)


def round_think(
    options: BenchOptions, concurrency: int, round_index: int
) -> Callable[[], float] | None:
    """One round's think times: both paths of a round draw the same sequence, so that they
    differ only in the path; each round of each level its own."""
    rng = random.Random(f"{options.seed}/{concurrency}/{round_index}")
    return think_time(options.think_ms, rng)


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str | Iterator[str],
    body: dict[str, Any],
    concurrency: int,
    requests: int,
    think: Callable[[], float] | None = None,
) -> list[StreamResult]:
    """`concurrency` workers send `requests` in all to `url` (or to each next URL it gives),
    each the next as soon as one ends, or `think()` seconds after it and before the first."""
    urls = itertools.repeat(url) if isinstance(url, str) else url
    return await in_closed_loop(
        lambda: stream_request(session, next(urls), body), concurrency, requests, think
    )


async def in_closed_loop(
    job: Callable[[], Awaitable[T]],
    concurrency: int,
    count: int,
    think: Callable[[], float] | None = None,
) -> list[T]:
    """`concurrency` workers run `job` `count` times in all, each again as soon as it ends,
    or where `think` is given, `think()` seconds after it, and as long before its first."""
    results: list[T] = []
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            # Claimed before thinking, so that no other worker starts a job past `count`.
            remaining -= 1
            if think is not None:
                await asyncio.sleep(think())
            results.append(await job())

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return results


@dataclass
class _Phase:
    """What the rounds of one path at one level add up to."""

    results: list[StreamResult] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    client_s: float = 0.0
    engine_s: float = 0.0
    gateway_s: float = 0.0
    own: Buckets = dataclasses.field(default_factory=dict)

    def result(self) -> PathResult:
        cpu = PhaseCpu(self.client_s, self.engine_s, self.gateway_s)
        return path_result(self.results, self.wall_s, cpu, self.own)


@dataclass(frozen=True)
class _Path:
    """One way to the engines, and the processes whose CPU time it costs."""

    url: str | Iterator[str]  # the gateway's, or each engine's in turn
    engines: tuple[ChildProcess, ...]
    gateway: ChildProcess | None  # None on the direct path


async def measured_round(
    session: aiohttp.ClientSession,
    path: _Path,
    body: dict[str, Any],
    concurrency: int,
    requests: int,
    phase: _Phase,
    think: Callable[[], float] | None,
) -> None:
    """One closed-loop round, adding its wall time, each process's CPU time and the gateway's
    own measure of its time to `phase`. The gateway's /metrics is read outside the timed
    part, so that reading it costs no round anything."""
    gateway = path.gateway
    own_before = await read_own_time(session, gateway) if gateway else {}
    engines_before = sum(engine.cpu_seconds() for engine in path.engines)
    gateway_before = gateway.cpu_seconds() if gateway else 0.0
    client_before, begun = time.process_time(), time.perf_counter()
    phase.results += await closed_loop(session, path.url, body, concurrency, requests, think)
    phase.wall_s += time.perf_counter() - begun
    phase.client_s += time.process_time() - client_before
    phase.engine_s += sum(engine.cpu_seconds() for engine in path.engines) - engines_before
    if gateway:
        phase.gateway_s += gateway.cpu_seconds() - gateway_before
        own_after = await read_own_time(session, gateway)
        phase.own = add_buckets(phase.own, buckets_between(own_before, own_after))


async def read_own_time(session: aiohttp.ClientSession, gateway: ChildProcess) -> Buckets:
    async with session.get(f"{gateway.url}/metrics") as response:
        response.raise_for_status()
        return overhead_buckets(await response.text())


async def measure_levels(
    options: BenchOptions, engines: Sequence[ChildProcess], gateway: ChildProcess
) -> list[LevelResult]:
    tokenizer = default_tokenizer()
    content = PromptFactory(tokenizer).chat_content(
        random.Random(options.seed), options.prompt_tokens
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": options.output_tokens,
        "stream": True,
    }
    route = "/v1/chat/completions"
    paths = (
        _Path(itertools.cycle([engine.url + route for engine in engines]), tuple(engines), None),
        _Path(gateway.url + route, tuple(engines), gateway),
    )
    levels = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Enough to open connections and warm caches; never more than a level sends.
        warmup = min(WARMUP_REQUESTS, max(map(options.requests_at, options.concurrency)))
        progress(f"warming up both paths ({warmup} requests each)")
        for path in paths:
            await closed_loop(session, path.url, body, 20, warmup)
        for concurrency in options.concurrency:
            count = options.requests_at(concurrency)
            progress(
                f"{concurrency} concurrent: {count} requests direct and {count} through the "
                f"gateway, in {ROUNDS} alternating rounds"
            )
            phases = (_Phase(), _Phase())
            # Alternating rounds (direct first, then gateway first, ...) spread whatever else
            # the machine is doing evenly over both paths.
            for round_index in range(ROUNDS):
                share = count // ROUNDS + (1 if round_index < count % ROUNDS else 0)
                order = (0, 1) if round_index % 2 == 0 else (1, 0)
                for which in order:
                    if share:
                        await measured_round(
                            session,
                            paths[which],
                            body,
                            concurrency,
                            share,
                            phases[which],
                            round_think(options, concurrency, round_index),
                        )
            levels.append(LevelResult(concurrency, phases[0].result(), phases[1].result()))
    return levels


async def run_bench(options: BenchOptions, command: str) -> BenchReport:
    load_average = os.getloadavg()[0]
    progress(f"timing the routing of a {options.classify_tokens:,}-token prompt")
    classification = dataclasses.replace(
        await time_classification(options, time.perf_counter),
        loop_stalls=await count_stalls(options),
    )
    async with Children() as children:
        engines_named = (
            "a simulated engine" if options.engines == 1 else f"{options.engines} simulated engines"
        )
        progress(f"starting {engines_named} (profile {options.engine_profile}) and the gateway")
        engines = await start_engines(children, options)
        gateway = await start_gateway(children, gateway_config([e.url for e in engines]))
        placement = place(options, engines, gateway)
        levels = await children.watch(measure_levels(options, engines, gateway))
    return BenchReport(
        machine=machine_description(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        placement=placement,
        engine_profile=options.engine_profile,
        engines=options.engines,
        think_ms=options.think_ms,
        load_average=load_average,
        levels=tuple(levels),
        classification=classification,
    )


async def start_engines(children: Children, options: BenchOptions) -> list[ChildProcess]:
    return [
        await children.start_laneway_async(
            "sim", engine_args(options.engine_profile), name=f"engine {index}"
        )
        for index in range(options.engines)
    ]


def place(options: BenchOptions, engines: Sequence[ChildProcess], gateway: ChildProcess) -> str:
    """Pin the processes as the options ask; say where they run."""
    cpus = sorted(os.sched_getaffinity(0))
    if not options.own_core:
        return f"all processes share CPUs {_cpu_list(cpus)}"
    gateway_cpus, other_cpus = cpus[-1:], cpus[:-1]
    pin(gateway.pid, gateway_cpus)
    for pid in (*(engine.pid for engine in engines), os.getpid()):
        pin(pid, other_cpus)
    engine_part = "engine" if len(engines) == 1 else f"{len(engines)} engines"
    return (
        f"gateway alone on CPU {_cpu_list(gateway_cpus)}, "
        f"client and {engine_part} on {_cpu_list(other_cpus)}"
    )


def pin(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of `pid` on `cpus` (affinity is per thread; new ones inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus))


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
