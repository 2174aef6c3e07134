"""The chaos run's processes: four engines, two gateway replicas sharing one redis-server,
their `/metrics`, and the run's clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laneway.bench.chaos.options import BATCH_CONCURRENCY, REPLICAS, ChaosOptions, Say
from laneway.bench.demo.run import DEMO_POOLS, config_documents
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.redis_server import LocalRedis, free_port
from laneway.simulator.profiles import DEFAULT_PROFILE


@dataclass
class Fleet:
    children: Children
    redis: LocalRedis
    engines: dict[str, ChildProcess]  # name -> engine, e.g. "chat-0"
    engine_args: dict[str, list[str]]
    engine_pools: dict[str, str]  # engine name -> its pool's name
    gateways: dict[str, ChildProcess]  # replica -> process
    gateway_args: list[str]
    ports: dict[str, int]  # replica -> port
    urls: dict[str, str]  # replica -> base URL, stable across restarts


def _engine_args(args: Sequence[str], port: int) -> list[str]:
    """The pool's `laneway sim` flags with a fixed port, so a restart comes back on it."""
    fixed = list(args)
    fixed[fixed.index("--port") + 1] = str(port)
    return fixed


async def start_fleet(
    children: Children, server: LocalRedis, directory: Path, options: ChaosOptions, say: Say
) -> Fleet:
    engine_args: dict[str, list[str]] = {}
    engine_pools: dict[str, str] = {}
    for pool in DEMO_POOLS:
        for index in range(2):
            name = f"{pool.name}-{index}"
            engine_args[name] = _engine_args(pool.sim_args(DEFAULT_PROFILE, 1.0), free_port())
            engine_pools[name] = pool.name
    say(f"redis-server (AOF) is up; starting {len(engine_args)} engines and 2 gateway replicas")
    started = await asyncio.gather(
        *(
            children.start_laneway_async("sim", args, name=f"engine {name}")
            for name, args in engine_args.items()
        )
    )
    engines = dict(zip(engine_args, started, strict=True))
    endpoints = {
        pool.name: [engines[f"{pool.name}-{i}"].url for i in range(2)] for pool in DEMO_POOLS
    }
    config = directory / "gateway.yaml"
    config.write_text(yaml.safe_dump_all(config_documents(endpoints)))
    gateway_args = [
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--redis-url",
        server.url,
        "--batch-lease",
        f"{options.batch_lease_s:g}",
        "--batch-concurrency",
        str(BATCH_CONCURRENCY),
    ]
    ports = {replica: free_port() for replica in REPLICAS}
    gateways = dict(
        zip(
            REPLICAS,
            await asyncio.gather(
                *(
                    children.start_laneway_async(
                        "gateway",
                        [*gateway_args, "--port", str(ports[r])],
                        name=f"gateway {r}",
                    )
                    for r in REPLICAS
                )
            ),
            strict=True,
        )
    )
    urls = {replica: gateways[replica].url for replica in REPLICAS}
    return Fleet(
        children=children,
        redis=server,
        engines=engines,
        engine_args=engine_args,
        engine_pools=engine_pools,
        gateways=gateways,
        gateway_args=gateway_args,
        ports=ports,
        urls=urls,
    )


async def metric_samples(
    session: aiohttp.ClientSession, url: str
) -> list[tuple[str, dict[str, str], float]]:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as reply:
        text = await reply.text()
    return [
        (sample.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def sum_of(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> float:
    return sum(value for sample, _, value in samples if sample == name)


class Clock:
    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start
