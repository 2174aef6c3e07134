"""The gateway's Kubernetes PoolSource against a scripted API server on loopback (no real
API server runs on these machines): the first list, watch events, 410 Gone, dropped
connections, and an API server that goes away and comes back."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import FakeApiServer
from support.rbac import granted_rules, rbac_call

from laneway.api import InferencePool
from laneway.gateway.pools.discovery import Backoff, KubernetesPoolSource, Retry
from laneway.gateway.pools.sources import PoolSource
from laneway.kube.client import KubeApi

POOLS = "/apis/laneway.io/v1alpha1/namespaces/serving/inferencepools"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
# Patience, not a budget: a loaded 2-core machine may take seconds to schedule the watch.
WAIT = 60.0


def pool(name: str, lane: str = "interactive", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "serving", "generation": 1},
        "spec": {"lane": lane, "model": "llama", "engine": {"kind": "simulator"}, **spec},
    }


def endpoint_slice(
    service: str, ready: Sequence[str], not_ready: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-x1",
            "namespace": "serving",
            "labels": {"kubernetes.io/service-name": service, "laneway.io/pool": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ready]
        + [{"addresses": [ip], "conditions": {"ready": False}} for ip in not_ready],
    }


class Harness:
    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.updates: asyncio.Queue[tuple[InferencePool, ...]] = asyncio.Queue()
        self.delays: list[float] = []
        self.retried_often = asyncio.Event()  # set after six backoff sleeps
        self.api = KubeApi(server.url, authorization=lambda: "Bearer test-token")

        async def sleep(delay: float) -> None:
            self.delays.append(delay)
            if len(self.delays) >= 6:
                self.retried_often.set()
            await asyncio.sleep(0.01)

        self.source = KubernetesPoolSource(
            "serving",
            api=self.api,
            retry=Retry(
                backoff=Backoff(initial=0.1, maximum=0.8), rng=random.Random(7), sleep=sleep
            ),
        )

    def update(self, pools: Sequence[InferencePool]) -> None:
        self.updates.put_nowait(tuple(pools))

    async def next(self) -> dict[str, tuple[str, ...]]:
        """The next complete pool set, as name -> endpoints."""
        pools = await asyncio.wait_for(self.updates.get(), WAIT)
        return {p.name: p.endpoints for p in pools}

    async def until_watching(self) -> None:
        await asyncio.wait_for(self.server.until_watched(POOLS, SLICES), WAIT)


@pytest.fixture
def server(fake_apiserver: FakeApiServer) -> FakeApiServer:
    fake_apiserver.put(POOLS, pool("realtime"))
    fake_apiserver.put(POOLS, pool("batch", lane="batch"))
    fake_apiserver.put(SLICES, endpoint_slice("realtime", ["10.0.0.5"], not_ready=["10.0.0.9"]))
    return fake_apiserver


@pytest.fixture
async def harness(server: FakeApiServer) -> AsyncIterator[Harness]:
    running = Harness(server)
    task = asyncio.create_task(running.source.run(running.update))
    yield running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await running.api.close()


async def test_is_a_pool_source() -> None:
    source: PoolSource = KubernetesPoolSource(None, api=KubeApi("http://127.0.0.1:1"))
    assert isinstance(source, KubernetesPoolSource)


async def test_first_list_gives_pools_with_their_ready_endpoints(harness: Harness) -> None:
    assert await harness.next() == {"batch": (), "realtime": ("http://10.0.0.5:8000",)}
    (first_list,) = [r for r in harness.server.requests if r.path == POOLS][:1]
    assert first_list.headers["Authorization"] == "Bearer test-token"


async def test_endpoints_appear_and_vanish_without_a_restart(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    harness.server.put(SLICES, endpoint_slice("realtime", ["10.0.0.5", "10.0.0.6"]), "MODIFIED")
    assert (await harness.next())["realtime"] == ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
    harness.server.put(SLICES, endpoint_slice("batch", ["10.0.1.1"]), "ADDED")
    assert (await harness.next())["batch"] == ("http://10.0.1.1:8000",)
    harness.server.delete(SLICES, "realtime-x1")
    assert (await harness.next())["realtime"] == ()


async def test_pools_added_changed_and_deleted(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    harness.server.put(POOLS, pool("long", lane="batch"), "ADDED")
    assert set(await harness.next()) == {"batch", "long", "realtime"}
    harness.server.delete(POOLS, "batch")
    assert set(await harness.next()) == {"long", "realtime"}  # the registry drains it


async def test_nothing_is_sent_when_nothing_changed(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    harness.server.bookmark(POOLS)
    harness.server.put(SLICES, endpoint_slice("realtime", ["10.0.0.5"]), "MODIFIED")
    harness.server.put(POOLS, pool("marker"), "ADDED")
    assert "marker" in await harness.next()  # the bookmark and the same endpoint sent nothing


async def test_an_invalid_pool_is_left_out_and_the_rest_served(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    broken = pool("broken", prefill={"chunkSize": 4096, "tokenBudget": 2048})
    harness.server.put(POOLS, broken, "ADDED")
    harness.server.put(POOLS, pool("fine"), "ADDED")
    assert set(await harness.next()) == {"batch", "fine", "realtime"}


@pytest.mark.parametrize("how", ["error-event", "http-410"])
async def test_an_expired_watch_lists_again(harness: Harness, how: str) -> None:
    await harness.next()
    await harness.until_watching()
    # While the watch is unusable, a pool appears without an event for it.
    harness.server.put(POOLS, pool("missed", lane="batch"))
    harness.server.compact()
    if how == "error-event":
        harness.server.expire_watches(POOLS)
    else:
        harness.server.drop_watches(POOLS)  # the retry's watch then gets HTTP 410
    assert set(await harness.next()) == {"batch", "missed", "realtime"}
    lists = [r for r in harness.server.requests if r.path == POOLS and "watch" not in r.query]
    assert len(lists) == 2


async def test_a_dropped_connection_resumes_from_the_last_revision(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    watches = [r for r in harness.server.requests if r.path == SLICES and "watch" in r.query]
    harness.server.drop_watches(SLICES)
    await harness.until_watching()
    harness.server.put(SLICES, endpoint_slice("realtime", ["10.0.0.7"]), "MODIFIED")
    assert (await harness.next())["realtime"] == ("http://10.0.0.7:8000",)
    resumed = [r for r in harness.server.requests if r.path == SLICES and "watch" in r.query]
    assert len(resumed) == len(watches) + 1
    assert resumed[-1].query["resourceVersion"] == watches[-1].query["resourceVersion"]
    assert resumed[-1].query["labelSelector"] == "laneway.io/pool"
    assert len(harness.delays) == 1


async def test_unreachable_api_keeps_the_last_pools_then_resyncs(harness: Harness) -> None:
    assert set(await harness.next()) == {"batch", "realtime"}
    await harness.until_watching()
    await harness.server.stop()

    await asyncio.wait_for(harness.retried_often.wait(), WAIT)
    assert harness.updates.empty()  # the gateway keeps routing on what it knew
    pools_delays = harness.delays[::2]
    assert pools_delays == sorted(pools_delays)  # backing off, not hammering
    assert max(harness.delays) <= 0.8

    # The API server returns with its history compacted and a pool deleted meanwhile.
    harness.server.delete(POOLS, "batch", notify=False)
    harness.server.compact()
    await harness.server.start()
    assert set(await harness.next()) == {"realtime"}


async def test_kubeconfig_credentials_reach_the_server(
    server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    server.write_kubeconfig(kubeconfig, "from-kubeconfig")
    api = KubeApi.from_environment(str(kubeconfig))
    try:
        listed = await api.list("InferencePool", "serving")
    finally:
        await api.close()
    assert sorted(p["metadata"]["name"] for p in listed.items) == ["batch", "realtime"]
    assert server.requests[-1].headers["Authorization"] == "Bearer from-kubeconfig"


async def test_every_request_is_granted_by_the_gateway_rbac(harness: Harness) -> None:
    await harness.next()
    await harness.until_watching()
    granted = granted_rules("gateway")
    for request in harness.server.requests:
        assert request.method == "GET"
        assert rbac_call(request) in granted, request
