"""`laneway gateway --kubernetes` against a real API server, as the chart's gateway
ServiceAccount, next to `laneway operator` as the operator's: pools and their EndpointSlices
appear, change and go; the gateway keeps routing while the API server is away and catches up
when it is back. Then the whole path: pools applied, the operator renders the engines, KWOK
makes their pods Ready on addresses of the run's own network namespace, the test starts each
engine there exactly as the operator rendered it (`status.engineArgs`), and the official
OpenAI client's short and long requests reach their lanes through the gateway.

tests/test_discovery_watch.py covers the watch protocol's corners against a scripted server
(dropped streams, ERROR events); this is the real one."""

from __future__ import annotations

import copy
import functools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai.types.chat import ChatCompletion
from prometheus_client.parser import text_string_to_metric_families
from support.kube.cluster import HOST_NODE_NAME, HOST_NODE_TAINT, Cluster
from support.kube.laneway import (
    Laneway,
    Release,
    check_long_request_streams_to_batch,
    condition,
    engine_for_pool,
    lane_pool,
    public_model,
    released,
    wait_listening,
)
from support.kube.processes import eventually, free_port

# Each step waits generously for a loaded machine; a whole test may take more than the
# suite-wide 300 s before it is judged hung.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "manifests" / "examples" / "simulator-pools.yaml"
READY_TIMEOUT_S = 180.0


@dataclass
class Stack:
    kube: Cluster
    release: Release
    operator: Laneway
    gateway: Laneway
    url: str
    engines: list[Laneway] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return self.release.namespace

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.kube.kubectl(*args, "-n", self.ns, stdin=stdin).stdout

    def pool_ready(self, name: str) -> bool:
        pool = self.kube.get("lwpool", name, "-n", self.ns)
        return condition(pool, "Ready").get("status") == "True"

    def models(self) -> set[str]:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as response:
                return {m["id"] for m in json.load(response)["data"]}
        except (urllib.error.URLError, OSError):
            return set()

    def endpoints(self, pool: str) -> float:
        """How many endpoints of `pool` the gateway knows, in any state."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "laneway_gateway_endpoints" and sample.labels.get("pool") == pool
        )

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="test", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def stack(kube: Cluster) -> Iterator[Stack]:
    if kube.local and kube.pod_network is None:
        # The gateway scrapes and probes every pod it discovers: only addresses of the run's
        # own namespace may be its targets.
        pytest.skip("the gateway tests need a network namespace for the pods (root, `ip netns`)")
    with released(kube, "lwgw", "lw-gateway") as release:
        namespace = release.namespace

        def as_account(component: str) -> Path:
            return kube.service_account_kubeconfig(namespace, release.service_accounts[component])

        operator = Laneway(
            ["operator", "--namespace", namespace, "--health-port", str(free_port())],
            as_account("operator"),
            kube.log_path("gateway-stack-operator"),
        )
        port = free_port()
        gateway = Laneway(
            [
                "gateway",
                "--kubernetes",
                "--namespace",
                namespace,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            as_account("gateway"),
            kube.log_path("gateway"),
        )
        stack = Stack(kube, release, operator, gateway, f"http://127.0.0.1:{port}")
        restarts = kube.apiserver_restarts
        operator.start()
        gateway.start()
        try:
            yield stack
        finally:
            for process in (*stack.engines, gateway, operator):
                process.stop()
        if kube.apiserver_restarts == restarts:  # see test_cluster_operator.operator
            for process in (operator, gateway):
                assert "Forbidden" not in process.output(), f"RBAC refused:\n{process.output()}"


def fake_address_pool(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "lane": "interactive",
            "model": name,
            "engine": {"kind": "simulator"},
            "replicas": replicas,
            "routing": {"maxPromptTokens": 1024},
            "prefill": {"chunkSize": 512, "tokenBudget": 2048},
            "limits": {"maxContextTokens": 4096, "maxConcurrentRequests": 64},
        },
    }


def test_the_gateway_follows_pools_and_endpoint_slices(stack: Stack) -> None:
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(fake_address_pool("followed", 2)))
    eventually(
        "the gateway lists the new pool's model",
        lambda: "followed" in stack.models(),
        READY_TIMEOUT_S,
    )
    eventually(
        "the gateway knows both endpoints",
        lambda: stack.endpoints("followed") == 2,
        READY_TIMEOUT_S,
    )

    stack.kubectl("scale", "lwpool", "followed", "--replicas=3")
    eventually(
        "the gateway follows the scale-up",
        lambda: stack.endpoints("followed") == 3,
        READY_TIMEOUT_S,
    )

    stack.kubectl("delete", "lwpool", "followed", "--wait=true")
    eventually(
        "the deleted pool's model goes", lambda: "followed" not in stack.models(), READY_TIMEOUT_S
    )
    eventually("its endpoints go", lambda: stack.endpoints("followed") == 0, READY_TIMEOUT_S)
    for process in (stack.operator, stack.gateway):
        assert "Forbidden" not in process.output(), f"RBAC refused a call:\n{process.output()}"


def served_pools(stack: Stack) -> list[dict[str, Any]]:
    """The example simulator pools, one replica each on the node whose pods get the pod
    network's fixed address, each on a free port."""
    pools = [d for d in yaml.safe_load_all(EXAMPLES.read_text()) if d]
    out = []
    for pool in pools:
        pool = copy.deepcopy(pool)
        pool["metadata"]["namespace"] = stack.ns
        spec = pool["spec"]
        spec["replicas"] = 1
        spec["port"] = free_port()
        spec["nodeSelector"] = {"kubernetes.io/hostname": HOST_NODE_NAME}
        spec["tolerations"] = [{**HOST_NODE_TAINT, "operator": "Equal"}]
        out.append(pool)
    return out


def start_engine(stack: Stack, name: str) -> None:
    """Once the pool's pod is Ready, run its engine as the operator rendered it, on the
    address KWOK gave the pod, inside the run's pod network namespace."""
    engine = engine_for_pool(stack.kube, stack.ns, name, READY_TIMEOUT_S)
    engine.start()
    stack.engines.append(engine)
    wait_listening(stack.kube, stack.ns, name, READY_TIMEOUT_S)


@pytest.fixture(scope="module")
def served(stack: Stack) -> list[dict[str, Any]]:
    if not stack.kube.local or stack.kube.pod_network is None:
        pytest.skip(
            "engines answering for pods need the local control plane and a network namespace "
            "for the pods (root and iproute2's `ip netns`)"
        )
    pools = served_pools(stack)
    stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(pools))
    for pool in pools:
        start_engine(stack, pool["metadata"]["name"])
    for pool in pools:
        name = pool["metadata"]["name"]
        ready = functools.partial(stack.pool_ready, name)
        eventually(f"pool {name} is Ready", ready, READY_TIMEOUT_S)
    return pools


def short_request(
    stack: Stack, pools: list[dict[str, Any]]
) -> openai._legacy_response.LegacyAPIResponse[ChatCompletion]:
    with stack.client() as api:
        return api.chat.completions.with_raw_response.create(
            model=public_model(lane_pool(pools, "interactive")),
            messages=[{"role": "user", "content": "Where is my order?"}],
            max_tokens=8,
        )


def test_the_whole_path_routes_short_and_long_requests_to_their_lanes(
    stack: Stack, served: list[dict[str, Any]]
) -> None:
    name: str = lane_pool(served, "interactive")["metadata"]["name"]

    def routable() -> bool:
        try:
            return short_request(stack, served).headers["x-laneway-pool"] == name
        except openai.APIError:
            return False

    eventually("the gateway routes to the interactive pool", routable, READY_TIMEOUT_S)
    raw = short_request(stack, served)
    assert raw.headers["x-laneway-lane"] == "interactive"
    assert raw.parse().choices[0].message.content

    with stack.client() as api:
        check_long_request_streams_to_batch(api, served)


def test_the_gateway_routes_while_the_api_server_is_away_and_resyncs_after(
    stack: Stack, served: list[dict[str, Any]]
) -> None:
    interactive = lane_pool(served, "interactive")
    answered: list[str] = []

    def while_down() -> None:
        raw = short_request(stack, served)
        answered.append(raw.headers["x-laneway-pool"])

    stack.kube.restart_apiserver(while_down)
    assert answered == [interactive["metadata"]["name"]]
    # A restarted API server's watch cache starts at the current revision, which node
    # heartbeats and the server's own start-up writes have moved past the gateway's: its
    # watches get 410 Gone and it must list again.
    eventually(
        "the gateway lists again after 410 Gone",
        lambda: "expired (410 Gone); listing again" in stack.gateway.output(),
        READY_TIMEOUT_S,
    )
    # Back: a pool created now reaches the gateway through its re-established watches.
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(fake_address_pool("after-restart", 1)))
    eventually(
        "the gateway sees a pool created after the restart",
        lambda: "after-restart" in stack.models(),
        READY_TIMEOUT_S,
    )
    stack.kubectl("delete", "lwpool", "after-restart")
    assert stack.gateway.running()
