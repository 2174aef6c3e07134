"""`laneway bench chaos`: mixed load through two gateway replicas while faults strike.

Four `laneway sim` engines (the demo's pools: two chat, two documents), two `laneway gateway`
replicas sharing one redis-server (AOF, fsynced on every write), and three kinds of client
traffic for a bounded time: closed-loop chat streams (interactive lane), long documents
(batch lane) and one Batches API job (Files and Batches API, run by the replicas'
dispatchers). The run is cut into five windows; at the start of windows 2-4 one fault
strikes and is repaired `outage_s` later:

1. `engine`: the busiest engine (of one pool, with --kill-engine-in) is SIGKILLed, then
   restarted on its port;
2. `redis`: redis-server is SIGKILLed, then restarted from its AOF;
3. `gateway`: replica b is SIGKILLed, then restarted on its port.

Clients spread over both replicas, as a Service would spread them, and a request whose
replica refuses the connection goes to the other one (a load balancer's retry: a refused
connection never reached the process). A request in flight on a process when it was killed
fails; it is counted apart, as "in flight on the killed process". Every other failure is one
the system should not have had.

At the end: the batch's output and error files against its input (every custom_id exactly
once), what is still held (each replica's admitted and queued requests, in-flight prompt
tokens and running batch items; the shared endpoint load and pending batch entries in Redis;
the requests each engine is still running), and TTFT P50/P99 per window.

The pure part is apart from the shell: the options in `options`, the schedule, the
classification of failures and the summary in `accounting`, the text in `report`. The
processes are started in `fleet`, the clients and the batch run in `clients`; here the
faults strike and what is held at the end is read.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from laneway.bench.chaos.accounting import (
    ChaosReport,
    FaultEvent,
    HeldAtEnd,
    failure_groups,
    window_of,
    window_rows,
    window_starts,
)
from laneway.bench.chaos.clients import Batch, Clients
from laneway.bench.chaos.fleet import Clock, Fleet, metric_samples, start_fleet, sum_of
from laneway.bench.chaos.options import ENGINE, FAULTS, KILLED_REPLICA, REDIS, ChaosOptions, Say
from laneway.bench.harness.machine import machine_description
from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.batch.files import as_text


async def _busiest_engine(fleet: Fleet, session: aiohttp.ClientSession, pool: str | None) -> str:
    """The engine (of `pool`, or of any) running the most requests now: where a kill hurts
    most."""
    running = {}
    for name, engine in fleet.engines.items():
        if pool is not None and fleet.engine_pools[name] != pool:
            continue
        samples = await metric_samples(session, engine.url)
        running[name] = sum_of(samples, "vllm:num_requests_running")
    return max(running, key=lambda name: (running[name], name))


async def _inject(
    fleet: Fleet,
    options: ChaosOptions,
    clock: Clock,
    session: aiohttp.ClientSession,
    say: Say,
) -> list[FaultEvent]:
    starts = window_starts(options.duration_s)
    events: list[FaultEvent] = []
    for fault in FAULTS:
        await asyncio.sleep(max(0.0, starts[fault] - clock.now()))
        if fault == ENGINE:
            target = await _busiest_engine(fleet, session, options.engine_pool)
            fleet.engines[target].kill_now()
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL engine {target}")
            await asyncio.sleep(options.outage_s)
            fleet.engines[target] = await fleet.children.start_laneway_async(
                "sim", fleet.engine_args[target], name=f"engine {target} (restarted)"
            )
        elif fault == REDIS:
            target = "redis-server"
            await asyncio.to_thread(fleet.redis.kill)
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL redis-server")
            await asyncio.sleep(options.outage_s)
            await asyncio.to_thread(fleet.redis.start)
        else:
            target = KILLED_REPLICA
            fleet.gateways[target].kill_now()
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL gateway {target}")
            await asyncio.sleep(options.outage_s)
            fleet.gateways[target] = await fleet.children.start_laneway_async(
                "gateway",
                [*fleet.gateway_args, "--port", str(fleet.ports[target])],
                name=f"gateway {target} (restarted)",
            )
        back = clock.now()
        say(f"{back:6.1f} s  {target} serving again")
        events.append(
            FaultEvent(
                fault=fault,
                target=target,
                killed_at_s=killed,
                back_at_s=back,
                pool=fleet.engine_pools.get(target),
            )
        )
    return events


async def _held(fleet: Fleet, session: aiohttp.ClientSession, since: float) -> HeldAtEnd:
    gauges = (
        "laneway_gateway_active_requests",
        "laneway_gateway_queue_depth",
        "laneway_gateway_in_flight_prompt_tokens",
        "laneway_gateway_batch_items_running",
    )
    gateway: dict[str, dict[str, float]] = {}
    shared: dict[str, bool] = {}
    for replica, child in fleet.gateways.items():
        samples = await metric_samples(session, child.url)
        gateway[replica] = {
            name.removeprefix("laneway_gateway_"): sum_of(samples, name) for name in gauges
        }
        shared[replica] = sum_of(samples, "laneway_gateway_redis_up") == 1
    engines = {}
    for name, engine in fleet.engines.items():
        samples = await metric_samples(session, engine.url)
        engines[name] = int(
            sum_of(samples, "vllm:num_requests_running")
            + sum_of(samples, "vllm:num_requests_waiting")
        )
    store = aioredis.Redis.from_url(fleet.redis.url)
    try:
        totals = await store.hgetall("laneway:load")
        load = {as_text(key): int(value) for key, value in totals.items() if int(value) != 0}
        pending = 0
        for tenant in await store.smembers("laneway:batch:queues"):
            for group in await store.xinfo_groups(f"laneway:batch:queue:{as_text(tenant)}"):
                pending += int(group["pending"])
    finally:
        await store.aclose()
    return HeldAtEnd(
        gateway=gateway,
        shared=shared,
        redis_load=load,
        redis_pending=pending,
        engines=engines,
        settled_after_s=time.monotonic() - since,
    )


async def _settle(
    fleet: Fleet, session: aiohttp.ClientSession, patience_s: float, say: Say
) -> HeldAtEnd:
    """Read what is held until it is all released or patience runs out; the last reading."""
    since = time.monotonic()
    said = since
    while True:
        held = await _held(fleet, session, since)
        if (held.total == 0 and all(held.shared.values())) or held.settled_after_s > patience_s:
            return held
        if time.monotonic() - said >= 5.0:
            said = time.monotonic()
            say(f"{held.settled_after_s:5.1f} s after the load: {held.total:g} still held")
        await asyncio.sleep(1.0)


async def _progress(
    clients: Clients, batch: Batch, clock: Clock, options: ChaosOptions, say: Say
) -> None:
    starts = window_starts(options.duration_s)
    while True:
        await asyncio.sleep(5.0)
        now = clock.now()
        failed = sum(1 for r in clients.records if not r.ok)
        say(
            f"{now:6.1f} s of {options.duration_s:g} s ({window_of(now, starts)} window): "
            f"{len(clients.records)} requests done, {failed} failed; batch {batch.progress}"
        )


async def run_bench(options: ChaosOptions, command: str, say: Say) -> ChaosReport:
    with tempfile.TemporaryDirectory(prefix="laneway-chaos-") as directory:
        server = LocalRedis(append_only_dir=Path(directory))
        try:
            await asyncio.to_thread(server.start)
            async with Children() as children:
                fleet = await start_fleet(children, server, Path(directory), options, say)
                return await _run_load(fleet, options, command, say)
        finally:
            server.stop()


async def _run_load(fleet: Fleet, options: ChaosOptions, command: str, say: Say) -> ChaosReport:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        batch = Batch(fleet, options)
        await batch.create(session)
        say(f"batch {batch.batch_id}: {options.items} items; load for {options.duration_s:g} s")
        clock = Clock()
        clients = Clients(fleet, options, clock)
        stop_following = asyncio.Event()
        follower = asyncio.create_task(batch.follow(session, stop_following, clock))
        progress = asyncio.create_task(_progress(clients, batch, clock, options, say))
        try:
            load = asyncio.create_task(clients.run(session))
            faults = await _inject(fleet, options, clock, session, say)
            await load
            say(f"{clock.now():6.1f} s  load done; waiting for the batch")
            await asyncio.wait({follower}, timeout=options.settle_s)
        finally:
            stop_following.set()
            progress.cancel()
            await asyncio.gather(follower, progress, return_exceptions=True)
        batch_check = await batch.check(session)
        held = await _settle(fleet, session, options.settle_s, say)
    starts = window_starts(options.duration_s)
    records = clients.records
    return ChaosReport(
        command=command,
        machine=machine_description(),
        options={**asdict(options), "items": options.items},
        faults=tuple(faults),
        windows=window_rows(records, faults, starts),
        failures=failure_groups(records, faults, starts),
        batch=batch_check,
        held=held,
    )


def stderr_say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)
