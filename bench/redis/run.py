"""`laneway bench redis`: what the Redis state layer costs per request, against in-memory.

One run measures two things, each against its in-memory baseline in the same run:

1. End to end: two gateways in front of one zero-service-time engine, identical but for
   `--redis-url`, both with tenant keys and per-minute limits (so every request is
   authenticated, charged against its limits and counted in the endpoint load). Closed-loop
   streaming requests alternate between them in rounds; the latency difference is what
   Redis adds to a request.
2. The state operations alone, in this process: one request's limit check, load read,
   start, first token and finish, on the in-memory classes and on the Redis ones.

The statistics and the table are pure; `run_bench` is the shell.
"""

from __future__ import annotations

import datetime
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from laneway.bench.gateway.config import MODEL, engine_args, gateway_config
from laneway.bench.harness.closed_loop import closed_loop, in_closed_loop
from laneway.bench.harness.live_cluster import LOOPBACK_ANY_PORT, start_gateway
from laneway.bench.harness.machine import machine_description
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.redis_server import LocalRedis
from laneway.bench.harness.summary import Distribution
from laneway.errors import UsageError
from laneway.gateway.state.redis_store import RedisLoadShare, connect, redis_settings
from laneway.gateway.state.tenants import InMemoryRateLimiter, RateLimiter, RedisRateLimiter, Tenant
from laneway.ledger.load import LoadBook
from laneway.tables import format_table
from laneway.tokens import default_tokenizer

DEFAULT_CONCURRENCY = (1, 32, 128)
ROUNDS = 2
API_KEY = "sk-bench"
# Limits no run reaches: every request pays for the check and passes it.
BENCH_TENANT = Tenant("bench", requests_per_minute=10**9, tokens_per_minute=10**12)
ENDPOINTS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int | None = None  # per level and backend; None: max(300, 4 x concurrency)
    state_ops: int = 3000  # requests' worth of state operations per level and backend
    redis_url: str | None = None  # None: start a throwaway redis-server
    seed: int = 0

    def requests_at(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(300, 4 * concurrency)


def check_options(options: BenchOptions) -> None:
    if not options.concurrency or any(c < 1 for c in options.concurrency):
        raise UsageError("--concurrency needs one or more positive integers, e.g. 1,32,128")
    if options.requests is not None and options.requests < 1:
        raise UsageError(f"--requests must be at least 1, got {options.requests}")
    if options.state_ops < 1:
        raise UsageError(f"--state-ops must be at least 1, got {options.state_ops}")


@dataclass(frozen=True)
class Comparison:
    """One measurement, in memory and with Redis: seconds per request."""

    what: str  # "gateway" or "state ops"
    concurrency: int
    memory: Distribution
    redis: Distribution
    errors: int

    @property
    def added_p50_s(self) -> float:
        return self.redis.p50 - self.memory.p50

    @property
    def added_p99_s(self) -> float:
        return self.redis.p99 - self.memory.p99


@dataclass(frozen=True)
class BenchReport:
    machine: str
    date: str
    command: str
    load_average: float
    comparisons: tuple[Comparison, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def render(report: BenchReport) -> list[str]:
    header = (
        "measured", "concurrency", "requests", "memory p50", "memory p99",
        "redis p50", "redis p99", "added p50", "added p99", "p50 ratio", "p99 ratio", "errors",
    )  # fmt: skip
    rows = [
        (
            c.what,
            str(c.concurrency),
            str(c.memory.count),
            _ms(c.memory.p50),
            _ms(c.memory.p99),
            _ms(c.redis.p50),
            _ms(c.redis.p99),
            _ms(c.added_p50_s),
            _ms(c.added_p99_s),
            f"{c.redis.p50 / c.memory.p50:.2f}x" if c.memory.p50 > 0 else "-",
            f"{c.redis.p99 / c.memory.p99:.2f}x" if c.memory.p99 > 0 else "-",
            str(c.errors),
        )
        for c in report.comparisons
    ]
    return [
        f"Redis state cost per request in ms ({report.machine}; load average "
        f"{report.load_average:.2f} at the start)",
        *format_table(header, rows),
        "gateway: end-to-end latency of a streamed request through a gateway on in-memory "
        "state vs one on Redis (auth, limits, shared load), zero-service-time engine",
        "state ops: one request's limit check + load read + start + first token + finish, "
        "in this process",
    ]


def progress(message: str) -> None:
    print(f"laneway bench redis: {message}", file=sys.stderr, flush=True)


# -- the state operations alone ---------------------------------------------------------------


@dataclass(frozen=True)
class LoadState:
    """The endpoint load as a gateway keeps it: its ledger's book, shared through Redis
    where `share` is given."""

    book: LoadBook
    share: RedisLoadShare | None = None

    def changed(self) -> None:
        if self.share is not None:
            self.share.publish(self.book.own())


async def one_request_of_state(limiter: RateLimiter, load: LoadState, rng: random.Random) -> float:
    begun = time.perf_counter()
    await limiter.admit(BENCH_TENANT, 500)
    if load.share is not None:
        load.book.set_peers(await load.share.peers(ENDPOINTS))
    endpoint = min(ENDPOINTS, key=lambda url: (load.book.of(url).in_flight, rng.random()))
    load.book.start(endpoint, 500)
    load.changed()
    load.book.prefill_done(endpoint, 500)
    load.changed()
    load.book.finish(endpoint, 500, prefill_done=True)
    load.changed()
    return time.perf_counter() - begun


async def time_state_ops(
    limiter: RateLimiter, tracker: LoadState, concurrency: int, count: int, seed: int
) -> Distribution:
    rng = random.Random(seed)
    durations = await in_closed_loop(
        lambda: one_request_of_state(limiter, tracker, rng), concurrency, count
    )
    result = Distribution.of(durations)
    assert result is not None
    return result


async def measure_state_ops(options: BenchOptions, redis_url: str) -> list[Comparison]:
    settings = redis_settings(redis_url)
    assert settings is not None
    client = connect(settings)
    try:
        await client.flushdb()
        backends: tuple[tuple[RateLimiter, LoadState], ...] = (
            (InMemoryRateLimiter(), LoadState(LoadBook())),
            (RedisRateLimiter(client), LoadState(LoadBook(), RedisLoadShare(client))),
        )
        comparisons = []
        for concurrency in options.concurrency:
            progress(f"state operations, {concurrency} concurrent: {options.state_ops} each")
            for limiter, tracker in backends:  # warm-up: connections, scripts loaded
                await time_state_ops(limiter, tracker, concurrency, 50, options.seed)
            memory = await time_state_ops(
                *backends[0], concurrency, options.state_ops, options.seed
            )
            redis = await time_state_ops(*backends[1], concurrency, options.state_ops, options.seed)
            comparisons.append(
                Comparison(
                    what="state ops", concurrency=concurrency, memory=memory, redis=redis, errors=0
                )
            )
        return comparisons
    finally:
        await client.aclose()


# -- end to end through two gateways ----------------------------------------------------------


async def measure_gateways(
    options: BenchOptions, memory: ChildProcess, redis: ChildProcess
) -> list[Comparison]:
    content = PromptFactory(default_tokenizer()).chat_content(random.Random(options.seed), 200)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "stream": True,
    }
    urls = (f"{memory.url}/v1/chat/completions", f"{redis.url}/v1/chat/completions")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    comparisons = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        progress("warming up both gateways")
        for url in urls:
            await closed_loop(session, url, body, 16, 100)
        for concurrency in options.concurrency:
            count = options.requests_at(concurrency)
            progress(f"gateways, {concurrency} concurrent: {count} requests through each")
            results: tuple[list[float], list[float]] = ([], [])
            errors = 0
            for round_index in range(ROUNDS):
                share = count // ROUNDS + (1 if round_index < count % ROUNDS else 0)
                # Alternate which backend goes first, to spread the machine's other work.
                order = (0, 1) if round_index % 2 == 0 else (1, 0)
                for which in order:
                    for result in await closed_loop(session, urls[which], body, concurrency, share):
                        if result.status == 200 and result.error is None:
                            results[which].append(result.e2e_s)
                        else:
                            errors += 1
            memory_e2e, redis_e2e = Distribution.of(results[0]), Distribution.of(results[1])
            if memory_e2e is None or redis_e2e is None:
                raise RuntimeError(f"every request failed at concurrency {concurrency}")
            comparisons.append(
                Comparison(
                    what="gateway",
                    concurrency=concurrency,
                    memory=memory_e2e,
                    redis=redis_e2e,
                    errors=errors,
                )
            )
    return comparisons


def tenants_document() -> dict[str, Any]:
    return {
        "tenants": [
            {
                "name": BENCH_TENANT.name,
                "apiKeys": [API_KEY],
                "requestsPerMinute": BENCH_TENANT.requests_per_minute,
                "tokensPerMinute": BENCH_TENANT.tokens_per_minute,
            }
        ]
    }


async def run_bench(options: BenchOptions, command: str) -> BenchReport:
    load_average = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="laneway-bench-redis-") as workdir:
        local = LocalRedis() if options.redis_url is None else None
        if local is not None:
            progress("starting a throwaway redis-server")
            local.start()
        redis_url = options.redis_url or (local.url if local else "")
        try:
            comparisons = await measure_state_ops(options, redis_url)
            async with Children() as children:
                progress("starting a zero-service-time engine and two gateways")
                engine = await children.start_laneway_async("sim", engine_args(), name="engine")
                documents = gateway_config([engine.url])
                tenants = Path(workdir) / "tenants.yaml"
                tenants.write_text(yaml.safe_dump(tenants_document()))
                common = [*LOOPBACK_ANY_PORT, "--tenants", str(tenants)]
                memory = await start_gateway(
                    children, documents, [*common, "--redis-url", ""], name="in-memory gateway"
                )
                shared = await start_gateway(
                    children, documents, [*common, "--redis-url", redis_url], name="redis gateway"
                )
                comparisons += await children.watch(measure_gateways(options, memory, shared))
        finally:
            if local is not None:
                local.stop()
    return BenchReport(
        machine=machine_description(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        load_average=load_average,
        comparisons=tuple(sorted(comparisons, key=lambda c: (c.what != "gateway", c.concurrency))),
    )
