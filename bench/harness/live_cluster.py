"""The live cluster the scenario benchmarks' `--mode live` runs against: one `laneway sim`
per replica of each pool (its engine flags, time-scaled), and the real `laneway gateway`
configured with those pools as InferencePools and a GatewayConfig with the run's picking
settings; and the engines' own counters, read from their /metrics.

`bench seed --mode live` (`seed/live.py`) and `laneway demo` (`demo/run.py`) drive it with
the load generator (`loadgen.LoadGenerator`), `bench prefix --mode live` (`prefix/live.py`)
with its session client; all stream through `stream.stream_request`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import API_VERSION
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.routing.picker import PickingSettings
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import SCRAPE_INTERVAL_S, SimPool

# Pool name -> its engines' URLs -> the documents the gateway is configured with.
Documents = Callable[[Mapping[str, Sequence[str]]], list[dict[str, Any]]]


def gateway_config(
    name: str, picking: PickingSettings, max_body_bytes: int | None = None
) -> dict[str, Any]:
    """The GatewayConfig of a live run: the picking settings the virtual run routes with,
    the virtual run's scrape interval, and no queue or upstream timeout a run could hit."""
    prefix = picking.prefix
    spec: dict[str, Any] = {
        "picking": {
            "policy": picking.policy,
            "weights": dict(picking.weights),
            "prefix": {
                "blockChars": prefix.block_chars,
                "maxBlocks": prefix.max_blocks,
                "capacityBlocks": prefix.capacity_blocks,
            },
        },
        "scrape": {
            "intervalMillis": round(SCRAPE_INTERVAL_S * 1000),
            "staleAfterMillis": 2000,
        },
        "queue": {"timeoutMillis": 600_000},
        "upstream": {"readTimeoutMillis": 600_000},
    }
    if max_body_bytes is not None:
        spec["maxBodyBytes"] = max_body_bytes
    return {"apiVersion": API_VERSION, "kind": "GatewayConfig", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


@dataclass(frozen=True)
class LiveCluster:
    gateway: ChildProcess
    engines: tuple[ChildProcess, ...]
    pools: tuple[str, ...]  # each engine's pool, in the order of `engines`
    endpoints: Mapping[str, Sequence[str]]  # pool name -> its engines' URLs


LOOPBACK_ANY_PORT = ("--host", "127.0.0.1", "--port", "0")


async def start_gateway(
    children: Children,
    documents: Sequence[Mapping[str, Any]],
    gateway_args: Sequence[str] = LOOPBACK_ANY_PORT,
    config_dir: Path | None = None,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ChildProcess:
    """Start `laneway gateway` configured with `documents` (`env` added to its environment).

    The YAML goes to `config_dir` when given (a gateway that serves on keeps its file);
    otherwise to a folder removed once the gateway has read it.
    """
    with tempfile.TemporaryDirectory(prefix="laneway-gateway-") as directory:
        path = (config_dir or Path(directory)) / "gateway.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        return await children.start_laneway_async(
            "gateway", ["--config", str(path), *gateway_args], name, env=env
        )


async def start_cluster(
    children: Children,
    pools: Sequence[SimPool],
    profile: Profile,
    time_scale: float,
    documents: Documents,
    gateway_args: Sequence[str] = LOOPBACK_ANY_PORT,
    config_dir: Path | None = None,
) -> LiveCluster:
    """Start every pool's engines, then the gateway configured with `documents(endpoints)`
    (`start_gateway`'s `gateway_args` and `config_dir`)."""
    engines = await start_engines(children, pools, profile, time_scale)
    gateway = await start_gateway(children, documents(engines.endpoints), gateway_args, config_dir)
    return LiveCluster(
        gateway=gateway, engines=engines.engines, pools=engines.pools, endpoints=engines.endpoints
    )


@dataclass(frozen=True)
class LiveEngines:
    engines: tuple[ChildProcess, ...]
    pools: tuple[str, ...]  # each engine's pool, in the order of `engines`
    endpoints: Mapping[str, Sequence[str]]  # pool name -> its engines' URLs


async def start_engines(
    children: Children, pools: Sequence[SimPool], profile: Profile, time_scale: float
) -> LiveEngines:
    """One `laneway sim` per replica of every pool, with the pool's engine flags."""
    replicas = [(pool, index) for pool in pools for index in range(pool.replicas)]
    engines = await asyncio.gather(
        *(
            children.start_laneway_async(
                "sim", pool.sim_args(profile.name, time_scale), name=f"engine {pool.name}-{index}"
            )
            for pool, index in replicas
        )
    )
    endpoints: dict[str, list[str]] = {pool.name: [] for pool in pools}
    for (pool, _), engine in zip(replicas, engines, strict=True):
        endpoints[pool.name].append(engine.url)
    return LiveEngines(
        engines=tuple(engines),
        pools=tuple(pool.name for pool, _ in replicas),
        endpoints=endpoints,
    )


async def engine_counters(
    engines: Sequence[ChildProcess], names: Sequence[str]
) -> list[dict[str, float]]:
    """Each engine's counters `names` (summed over their labels), from its /metrics."""

    async def one(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    found[sample.name] = found.get(sample.name, 0.0) + sample.value
        missing = [name for name in names if name not in found]
        if missing:
            raise RuntimeError(f"{url}/metrics has no {', '.join(missing)}")
        return found

    async with aiohttp.ClientSession() as http:
        return list(await asyncio.gather(*(one(http, engine.url) for engine in engines)))
