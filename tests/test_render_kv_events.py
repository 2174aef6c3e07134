"""`spec.engine.kvEvents`: the operator renders the engines' --kv-events-config, and the pod
it renders publishes events the gateway files under that pod's endpoint.

The flags themselves are in tests/test_render_engines.py's table and the CEL rules in
tests/test_crd_cel.py; here the rendered container runs as a kubelet would start it (its
`$(VAR)` references expanded from its env), a `laneway sim`, and the gateway's own
subscriber hears it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from support.client import eventually
from support.kube.kubelet import kubelet_argv
from support.pools import spec_pool

from laneway import api
from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import free_port
from laneway.gateway.app import ledger_settings
from laneway.gateway.config import GatewaySettings
from laneway.gateway.pools.kv_events import KVEventSubscriber
from laneway.ledger import Ledger
from laneway.operator.render import POD_IP_ENV, render_pool
from laneway.routing.prefix_index import KVEventSource
from laneway.simulator.scheduler import KV_BLOCK_TOKENS

POD_IP = "127.0.0.1"  # where this test's "pod" listens


def container_of(rendered_pool: api.InferencePool) -> dict[str, Any]:
    deployment = render_pool(rendered_pool).child("Deployment")
    assert deployment is not None
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_pod_ip_comes_from_the_downward_api_only_where_kv_events_need_it() -> None:
    engine = {
        "kind": "vllm",
        "kvEvents": {"endpoint": "tcp://gw:5557"},
        "env": [{"name": "POD_IP", "value": "theirs"}],
    }
    publishing = container_of(spec_pool({"engine": engine}))
    assert publishing["env"][-2:] == [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_IP", "value": "theirs"},  # the pool's own, untouched
    ]
    argv = kubelet_argv(publishing, "10.1.2.3")
    config = argv[argv.index("--kv-events-config") + 1]
    assert '"topic":"kv@10.1.2.3:8000"' in config
    quiet = container_of(spec_pool({"engine": {"kind": "vllm", "kvEvents": None}}))
    assert POD_IP_ENV not in {var["name"] for var in quiet["env"]}
    assert "--kv-events-config" not in quiet["args"]


def test_the_simulators_block_size_is_the_one_the_api_allows_it() -> None:
    assert api.SIMULATOR_KV_BLOCK_SIZE == KV_BLOCK_TOKENS


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (
            {"kind": "sglang", "kvEvents": {"endpoint": "tcp://gw:5557"}},
            "spec.engine.kvEvents: is for engine kind vllm or simulator",
        ),
        (
            {"kind": "vllm", "kvEvents": {"endpoint": "tcp://*:5557"}},
            "spec.engine.kvEvents.endpoint: must be tcp://HOST:PORT, the gateway's KV events "
            "address the engines connect to (e.g. tcp://laneway-gateway-kv-events.laneway.svc"
            ":5557), got 'tcp://*:5557'",
        ),
        (
            {"kind": "vllm", "kvEvents": {"endpoint": "tcp://gw:5557", "blockSize": 24}},
            "spec.engine.kvEvents.blockSize: must be one of 16, 32, 64, 128, got 24",
        ),
        (
            {"kind": "simulator", "kvEvents": {"endpoint": "tcp://gw:5557", "blockSize": 64}},
            "spec.engine.kvEvents.blockSize: must be 16 for engine kind simulator",
        ),
        (
            {"kind": "vllm", "kvEvents": {"endpoint": "tcp://gw:5557"},
             "args": ["--block-size", "32"]},
            "spec.engine.args: must not carry --block-size with engine.kvEvents",
        ),
        ({"kind": "vllm", "kvEvents": {}}, "spec.engine.kvEvents.endpoint: is required"),
    ],
)  # fmt: skip
def test_a_pool_the_operator_cannot_render_kv_events_for_says_what_to_change(
    engine: dict[str, Any], message: str
) -> None:
    with pytest.raises(api.SpecError) as caught:
        spec_pool({"engine": engine})
    first = str(caught.value.errors[0])
    assert first.startswith(message), first


@pytest.fixture
def children() -> Iterator[Children]:
    with Children(stop_grace=10) as started:
        yield started


async def test_a_rendered_pod_publishes_kv_events_the_gateway_files_under_its_endpoint(
    children: Children,
) -> None:
    port, events = free_port(), f"tcp://127.0.0.1:{free_port()}"
    rendered_pool = spec_pool(
        {
            "port": port,
            "servedModelName": "sim-chat",
            "engine": {
                "kind": "simulator",
                "simulator": {"profile": "zero", "timeScale": 100},
                "kvEvents": {"endpoint": events},
            },
        }
    )
    url = f"http://{POD_IP}:{port}"
    # The gateway's side: the pool's endpoint as discovery reports it, and the SUB socket its
    # picking.prefix.kvEvents entry binds.
    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    ledger.update_pools(0.0, [dataclasses.replace(rendered_pool, endpoints=(url,))])
    index = ledger.prefix_index
    subscriber = KVEventSubscriber(KVEventSource(rendered_pool.name, events), ledger)
    listening = asyncio.create_task(subscriber.run())
    try:
        argv = kubelet_argv(container_of(rendered_pool), POD_IP)
        argv[argv.index("--host") + 1] = POD_IP  # 0.0.0.0 in a pod; loopback only here
        assert argv[0] == "laneway"
        await children.start_laneway_async(argv[1], argv[2:])

        async with aiohttp.ClientSession() as http:

            async def indexed() -> bool:
                # ZMQ drops what a PUB sends before the SUB's subscription reaches it, so a
                # new prompt each time until one's blocks arrive.
                words = f"the lease of flat {time.monotonic()} runs for a year " * 12
                body = {"model": "sim-chat", "prompt": words, "max_tokens": 1}
                async with http.post(f"{url}/v1/completions", json=body) as response:
                    assert response.status == 200
                await asyncio.sleep(0.2)
                return index.blocks_of(url) > 0

            await eventually(indexed, "the engine's stored blocks filed under its endpoint", 60)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        subscriber.close()
