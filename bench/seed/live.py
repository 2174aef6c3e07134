"""`laneway bench seed --mode live`: the seed experiment over HTTP, through the real gateway.

Per configuration: one `laneway sim` process per simulated GPU, run with its pool's engine
settings (time-scaled); the real `laneway gateway` configured with one InferencePool per
pool; and the load generator (laneway.bench.harness.loadgen), which replays the very turns
the virtual runner prices (same seed, same per-session random streams) and measures TTFT and
every gap between tokens at the client, in model time. Every child is stopped when the
configuration ends, however it ends (laneway.bench.harness.procs).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from laneway.bench.harness.fronts import GATEWAY, start_front
from laneway.bench.harness.live_cluster import engine_counters, gateway_config, start_engines
from laneway.bench.harness.loadgen import LoadGenerator, RequestRecord
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.workload import INTERACTIVE, workload_from_scenario
from laneway.bench.seed.ttft_check import Histogram, gateway_ttft
from laneway.errors import ChildError
from laneway.simulator.metrics import BUSY_SECONDS
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import (
    PUBLIC_MODEL,
    SCRAPE_INTERVAL_S,
    TBT_SLO_S,
    TTFT_SLO_S,
    ClusterConfig,
    SeedScenario,
)
from laneway.simulator.seed_experiment import RunResult

DRAIN_S = 600.0  # model seconds the generator waits for stragglers after the duration
# The gateway config's queue timeout (gateway_config): Envoy waits as long for the picker.
QUEUE_WAIT_S = 600
WARM_UP_PER_REPLICA = 2

Say = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True)
class RunCpu:
    """CPU seconds used during a run, and the wall seconds it took."""

    generator_s: float
    gateway_s: float
    engines_s: float
    wall_s: float

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class LiveRun:
    front: str  # what the clients sent to (harness/fronts.py)
    result: RunResult
    records: tuple[RequestRecord, ...]
    issued: int
    cpu: RunCpu
    gateway_ttft: Histogram  # what laneway's own TTFT histogram recorded during the run


def gateway_documents(
    config: ClusterConfig, endpoints: Mapping[str, Sequence[str]], time_scale: float
) -> list[dict[str, Any]]:
    """The InferencePools the virtual runner routes over, with their engines' URLs, and a
    GatewayConfig with the configuration's picking profile (and, where a pool lends, the
    runner's lending timings)."""
    documents = [pool.document(endpoints[pool.name]) for pool in config.pools]
    gateway = gateway_config("seed", config.picking)
    if config.lends:
        gateway["spec"]["lending"] = lending_timings(config, time_scale)
    return [*documents, gateway]


def lending_timings(config: ClusterConfig, time_scale: float) -> dict[str, int]:
    """The GatewayConfig's `spec.lending`: the virtual runner's timings in model time, in
    wall time here: a replica lent per `config.lend_after_s` of lull, the roles decided
    again every scrape interval (as the runner does after every scrape)."""
    return {
        "lendAfterMillis": round(config.lend_after_s * 1000 / time_scale),
        "intervalMillis": max(10, round(SCRAPE_INTERVAL_S * 1000 / time_scale)),
    }


async def _tiny_request(session: aiohttp.ClientSession, gateway_url: str, lane: str) -> None:
    body = {
        "model": PUBLIC_MODEL,
        "messages": [{"role": "user", "content": "warm up"}],
        "max_tokens": 2,
        "stream": True,
    }
    async with session.post(
        f"{gateway_url}/v1/chat/completions", json=body, headers={"x-laneway-lane": lane}
    ) as response:
        response.raise_for_status()
        await response.read()


async def warm_up(gateway_url: str, config: ClusterConfig) -> None:
    """A few tiny requests through the gateway to every pool before the clock starts.

    They open the gateway's connections to the engines and run every code path once, so
    the first seconds of the run measure the system, not its cold start.
    """
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            *(
                _tiny_request(session, gateway_url, pool.lane.value)
                for pool in config.pools
                for _ in range(pool.replicas * WARM_UP_PER_REPLICA)
            )
        )


async def _gateway_ttft(gateway_url: str) -> Histogram:
    async with aiohttp.ClientSession() as session, session.get(f"{gateway_url}/metrics") as reply:
        return gateway_ttft(await reply.text())


async def _busy_of(engines: Sequence[ChildProcess]) -> list[float]:
    busy = f"{BUSY_SECONDS}_total"
    return [counters[busy] for counters in await engine_counters(engines, [busy])]


def result_from_records(
    config: ClusterConfig,
    scenario: SeedScenario,
    records: Sequence[RequestRecord],
    gpu_busy_s: float,
    end_s: float,
) -> RunResult:
    """The live run in the virtual runner's terms, so one summary and plot serve both."""
    ttft: list[float] = []
    ttft_at: list[float] = []
    tbt: list[float] = []
    tbt_at: list[float] = []
    completed = 0
    within_slo = 0
    batch_finished: list[float] = []
    batch_tokens = 0
    for record in records:
        if record.kind == INTERACTIVE:
            if record.ttft_s is not None:
                ttft.append(record.ttft_s)
                ttft_at.append(record.started_s)
                moment = record.started_s + record.ttft_s
                for gap in record.gaps_s:
                    moment += gap
                    tbt.append(gap)
                    tbt_at.append(moment)
            completed += record.ok
            within_slo += (
                record.ok
                and record.ttft_s is not None
                and record.ttft_s <= TTFT_SLO_S
                and all(gap <= TBT_SLO_S for gap in record.gaps_s)
            )
        elif record.ok and record.e2e_s is not None:
            batch_finished.append(record.started_s + record.e2e_s)
            batch_tokens += record.prompt_tokens + record.output_tokens
    rejected = sum(1 for r in records if r.kind == INTERACTIVE and r.status == 400)
    return RunResult(
        config=config,
        ttft_s=tuple(ttft),
        ttft_at_s=tuple(ttft_at),
        tbt_s=tuple(tbt),
        tbt_at_s=tuple(tbt_at),
        interactive_completed=completed,
        interactive_rejected=rejected,
        batch_finished_at_s=tuple(sorted(batch_finished)),
        batch_tokens=batch_tokens,
        batch_submitted=scenario.long_requests,
        gpu_busy_s=gpu_busy_s,
        end_s=end_s,
        interactive_within_slo=within_slo,
    )


async def _report_progress(generator: LoadGenerator, duration_s: float, say: Say) -> None:
    while True:
        await asyncio.sleep(5.0)
        done = len(generator.records)
        say(
            f"{generator.elapsed_s():6.1f} s of {duration_s:g} s model time, "
            f"{done} requests done, {generator.issued - done} in flight"
        )


async def _guarded(children: Children, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; if a child died meanwhile, say so rather than how a call failed."""
    try:
        return await children.watch(awaitable)
    except aiohttp.ClientError as error:
        await asyncio.sleep(0.5)  # give a dying child's exit status time to arrive
        crashed = children.crashed()
        if crashed:
            raise ChildError(crashed[0].describe_exit()) from None
        raise ChildError(f"the gateway or an engine stopped answering: {error}") from None


async def run_live_config(
    config: ClusterConfig,
    scenario: SeedScenario,
    profile: Profile,
    time_scale: float,
    say: Say,
    front: str = GATEWAY,
) -> LiveRun:
    """Start the engines and `front` (the gateway, or Envoy and the picker) for `config`,
    replay the workload, stop them all."""
    async with Children() as children:
        say(f"starting {config.gpus} engines and {front}")
        engines = await start_engines(children, config.pools, profile, time_scale)
        documents = gateway_documents(config, engines.endpoints, time_scale)
        urls = [url for pool in config.pools for url in engines.endpoints[pool.name]]
        entry = await start_front(children, front, documents, urls, QUEUE_WAIT_S)
        sims = engines.engines

        await _guarded(children, warm_up(entry.url, config))
        busy_before = await _guarded(children, _busy_of(sims))
        ttft_before = await _guarded(children, _gateway_ttft(entry.metrics_url))
        workload = workload_from_scenario(scenario, PUBLIC_MODEL, drain_s=DRAIN_S)
        generator = LoadGenerator(workload, entry.url, time_scale)
        cpu_before = (
            time.process_time(),
            entry.cpu_seconds(),
            sum(e.cpu_seconds() for e in sims),
        )
        wall_before = time.perf_counter()
        progress = asyncio.create_task(_report_progress(generator, scenario.duration_s, say))
        try:
            records = await _guarded(children, generator.run())
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        cpu = RunCpu(
            generator_s=time.process_time() - cpu_before[0],
            gateway_s=entry.cpu_seconds() - cpu_before[1],
            engines_s=sum(e.cpu_seconds() for e in sims) - cpu_before[2],
            wall_s=time.perf_counter() - wall_before,
        )
        end_s = generator.elapsed_s()
        busy = await _guarded(children, _busy_of(sims))
        ttft = (await _guarded(children, _gateway_ttft(entry.metrics_url))).minus(ttft_before)
        say(f"{len(records)} of {generator.issued} requests accounted for; stopping")
    result = result_from_records(config, scenario, records, sum(busy) - sum(busy_before), end_s)
    return LiveRun(
        front=front,
        result=result,
        records=tuple(records),
        issued=generator.issued,
        cpu=cpu,
        gateway_ttft=ttft,
    )


def stderr_say(config_name: str) -> Say:
    def say(message: str) -> None:
        print(f"seed live: {config_name:<16} {message}", file=sys.stderr, flush=True)

    return say
