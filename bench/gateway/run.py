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

The options and configuration are in `config`, the statistics in `results` and the tables
in `report`, all pure; the long prompt's routing is timed in `classify`; `run_bench` here
is the shell.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from laneway.bench.gateway.classify import count_stalls, time_classification
from laneway.bench.gateway.config import (
    MODEL,
    ROUNDS,
    WARMUP_REQUESTS,
    BenchOptions,
    engine_args,
    gateway_config,
)
from laneway.bench.gateway.results import (
    BenchReport,
    Buckets,
    LevelResult,
    PathResult,
    PhaseCpu,
    add_buckets,
    buckets_between,
    overhead_buckets,
    path_result,
)
from laneway.bench.harness.closed_loop import closed_loop, think_time
from laneway.bench.harness.live_cluster import start_gateway
from laneway.bench.harness.machine import cpu_list, machine_description, pin
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.stream import StreamResult
from laneway.tokens import default_tokenizer


def progress(message: str) -> None:
    print(f"laneway bench gateway: {message}", file=sys.stderr, flush=True)


def round_think(
    options: BenchOptions, concurrency: int, round_index: int
) -> Callable[[], float] | None:
    """One round's think times: both paths of a round draw the same sequence, so that they
    differ only in the path; each round of each level its own."""
    rng = random.Random(f"{options.seed}/{concurrency}/{round_index}")
    return think_time(options.think_ms, rng)


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
        cpu = PhaseCpu(client=self.client_s, engine=self.engine_s, gateway=self.gateway_s)
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
        _Path(
            url=itertools.cycle([engine.url + route for engine in engines]),
            engines=tuple(engines),
            gateway=None,
        ),
        _Path(url=gateway.url + route, engines=tuple(engines), gateway=gateway),
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
            levels.append(
                LevelResult(
                    concurrency=concurrency, direct=phases[0].result(), gateway=phases[1].result()
                )
            )
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
        return f"all processes share CPUs {cpu_list(cpus)}"
    gateway_cpus, other_cpus = cpus[-1:], cpus[:-1]
    pin(gateway.pid, gateway_cpus)
    for pid in (*(engine.pid for engine in engines), os.getpid()):
        pin(pid, other_cpus)
    engine_part = "engine" if len(engines) == 1 else f"{len(engines)} engines"
    return (
        f"gateway alone on CPU {cpu_list(gateway_cpus)}, "
        f"client and {engine_part} on {cpu_list(other_cpus)}"
    )
