"""The operator as it runs in a cluster: kopf itself, with our registry, logging in through
a kubeconfig, discovering resources, watching pools and children, and writing status and
events, against the scripted API server on loopback (no real one runs on these machines)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from aiohttp.test_utils import TestClient, TestServer
from crd_tools import load_crd
from fake_apiserver import FakeApiServer
from kubernetes.config import kube_config
from rbac_rules import granted_rules, rbac_call

from laneway.api import parse_pool
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, QueueSettings
from laneway.gateway.keys import REGISTRY
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.kube.client import KubeApi
from laneway.operator.handlers import OperatorState, registry
from laneway.operator.render import RenderOptions

WAIT = 20.0
POOLS = "/apis/laneway.io/v1alpha1/namespaces/serving/inferencepools"
DEPLOYMENTS = "/apis/apps/v1/namespaces/serving/deployments"
SERVICES = "/api/v1/namespaces/serving/services"
EVENTS = "/api/v1/namespaces/serving/events"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    server.serve_discovery(
        [
            ("laneway.io", "v1alpha1", "InferencePool", "inferencepools"),
            ("apps", "v1", "Deployment", "deployments"),
            ("", "v1", "Service", "services"),
            ("", "v1", "Event", "events"),
            ("", "v1", "Namespace", "namespaces"),
            ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets"),
            ("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
            ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
            ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"),
        ],
        cluster_scoped={"customresourcedefinitions", "namespaces"},
    )
    server.put(CRDS, load_crd())
    server.put(
        POOLS,
        {
            "apiVersion": "laneway.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {
                "name": "realtime",
                "namespace": "serving",
                "uid": "pool-uid",
                "generation": 1,
            },
            "spec": {
                "lane": "interactive",
                "model": "llama",
                "engine": {"kind": "simulator"},
                "replicas": 2,
            },
        },
    )
    await server.start()
    kubeconfig = tmp_path / "config"
    server.write_kubeconfig(kubeconfig, "operator-token")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # The kubernetes package reads $KUBECONFIG once, at import; a process started with the
    # variable set (as in a pod or a shell) sees it there.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield server
    await server.stop()


@contextlib.asynccontextmanager
async def running_operator(
    server: FakeApiServer, gateway_url: str | None = None
) -> AsyncIterator[None]:
    api = KubeApi(server.url, authorization=lambda: "Bearer operator-token")
    stop = asyncio.Event()
    state = OperatorState(
        cluster=api,
        options=RenderOptions(),
        gateway_url=gateway_url,
        demand_interval_s=1.0,
        namespaces=("serving",),
    )
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            standalone=True,
            namespaces=["serving"],
            memo=kopf.Memo(state=state),
            stop_flag=stop,
        )
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)
        await api.close()


def status(server: FakeApiServer) -> dict[str, Any]:
    pool = server.find(POOLS, "realtime") or {}
    found: dict[str, Any] = pool.get("status") or {}
    return found


async def test_kopf_runs_the_operator_end_to_end(cluster: FakeApiServer) -> None:
    async with running_operator(cluster):
        await asyncio.wait_for(cluster.until(lambda: bool(status(cluster).get("conditions"))), WAIT)
        deployment = cluster.find(DEPLOYMENTS, "realtime")
        assert deployment is not None
        assert deployment["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
        assert cluster.find(SERVICES, "realtime") is not None
        assert status(cluster)["observedGeneration"] == 1
        assert status(cluster)["engineArgs"][:2] == ["laneway", "sim"]

        # Someone scales the Deployment by hand: the child watch puts it back.
        meddled = dict(deployment, spec={**deployment["spec"], "replicas": 9})
        cluster.put(DEPLOYMENTS, meddled, "MODIFIED")
        await asyncio.wait_for(
            cluster.until(
                lambda: (cluster.find(DEPLOYMENTS, "realtime") or {})["spec"]["replicas"] == 2
            ),
            WAIT,
        )
        await asyncio.wait_for(
            cluster.until(
                lambda: any(
                    e.get("reason") == "Restored" for e in cluster.collections[EVENTS].values()
                )
            ),
            WAIT,
        )
    reasons = sorted(str(e.get("reason")) for e in cluster.collections[EVENTS].values())
    assert reasons == ["Created", "Created", "Created", "Restored"]
    pool = cluster.find(POOLS, "realtime")
    assert pool is not None
    assert "finalizers" not in pool["metadata"]  # deleting a pool never waits for us
    tokens = {r.headers.get("Authorization") for r in cluster.requests}
    assert tokens == {"Bearer operator-token"}
    granted = granted_rules("operator")
    for request in cluster.requests:
        if request.path in ("/api", "/apis", "/version") or request.path.count("/") <= 3:
            continue  # discovery: open to every authenticated client
        assert rbac_call(request) in granted, request


async def test_a_change_made_while_the_api_was_away_is_applied_when_it_returns(
    cluster: FakeApiServer,
) -> None:
    async with running_operator(cluster):
        await asyncio.wait_for(cluster.until(lambda: bool(status(cluster).get("conditions"))), WAIT)
        await cluster.stop()
        # While the operator cannot reach it, someone changes the pool.
        pool = cluster.find(POOLS, "realtime")
        assert pool is not None
        pool["spec"]["prefill"] = {"chunkSize": 256}
        pool["metadata"]["generation"] = 2
        cluster.put(POOLS, pool)
        cluster.compact()
        await cluster.start()

        def rolled() -> bool:
            deployment = cluster.find(DEPLOYMENTS, "realtime") or {}
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            return bool(args[args.index("--chunk-size") + 1] == "256")

        await asyncio.wait_for(cluster.until(rolled), WAIT)
        await asyncio.wait_for(
            cluster.until(lambda: status(cluster).get("observedGeneration") == 2), WAIT
        )


async def queued(client: TestClient[Any, Any], pool: str) -> int:
    demand = await (await client.get("/laneway/demand")).json()
    return int(demand["pools"].get(pool, {}).get("queuedRequests", 0))


async def test_the_demand_loop_wakes_a_pool_at_zero_for_a_request_waiting_at_the_gateway(
    cluster: FakeApiServer,
) -> None:
    docs = {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "docs", "namespace": "serving", "uid": "docs-uid", "generation": 1},
        "spec": {
            "lane": "batch",
            "model": "llama",
            "engine": {"kind": "simulator"},
            "replicas": 0,
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2},
        },
    }
    cluster.put(POOLS, docs)
    source = StaticPoolSource([parse_pool(docs)])
    gateway = create_app(GatewaySettings(queue=QueueSettings(timeout_millis=60_000)), source)
    async with TestClient(TestServer(gateway)) as client:
        waiting = asyncio.create_task(
            client.post(
                "/v1/completions",
                json={"model": "llama", "prompt": "a long report " * 100, "max_tokens": 2},
            )
        )
        # Queued before kopf starts: kopf cancels the tasks it finds begun under it on exit.
        async with asyncio.timeout(WAIT):
            while await queued(client, "serving/docs") != 1:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.02)
        async with running_operator(cluster, str(client.make_url("/"))):

            def woken() -> bool:
                deployment = cluster.find(DEPLOYMENTS, "docs") or {}
                return bool(deployment.get("spec", {}).get("replicas") == 1)

            await asyncio.wait_for(cluster.until(woken), WAIT)
            await asyncio.wait_for(
                cluster.until(
                    lambda: any(
                        e.get("reason") == "ScaledUp" for e in cluster.collections[EVENTS].values()
                    )
                ),
                WAIT,
            )
        gateway[REGISTRY].drain()
        assert (await waiting).status == 503
    pool = cluster.find(POOLS, "docs")
    assert pool is not None
    assert pool["spec"]["replicas"] == 1
    assert "scaling up 0 -> 1" in pool["status"]["autoscaling"]["reason"]
    assert "finalizers" not in pool["metadata"]
    granted = granted_rules("operator")
    scaled = [r for r in cluster.requests if r.path.endswith("/inferencepools/docs/scale")]
    assert scaled
    for request in cluster.requests:
        if request.path in ("/api", "/apis", "/version") or request.path.count("/") <= 3:
            continue  # discovery: open to every authenticated client
        assert rbac_call(request) in granted, request
