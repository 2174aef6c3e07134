"""`laneway operator` against a real API server, as the ServiceAccount the chart creates (a
token the server issued to it, the Role the chart grants): pools created, changed, scaled,
adopting pods and deleted; status and printer columns as kubectl shows them; owner references
and the garbage collector; the operator killed mid-reconcile and the API server restarted.
KWOK plays the engine pods, so Deployments become available without a kubelet.

tests/test_operator_reconcile.py checks the reconciler's decisions against a recording fake,
fast and in detail; kopf's own behaviour (watches, retries, events, annotations) and the
RBAC it needs are checked only here, where they are real."""

from __future__ import annotations

import copy
import functools
import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from support.kube.cluster import HOST_NODE_NAME, HOST_NODE_TAINT, Cluster
from support.kube.kubelet import kubelet_argv
from support.kube.laneway import (
    Laneway,
    Release,
    condition,
    engine_for_pool,
    released,
    wait_listening,
)
from support.kube.processes import eventually, free_port

from laneway.gateway.pools.kv_events import endpoint_of_topic
from laneway.operator.render import POD_IP_ENV

# Each step waits generously for a loaded machine; a whole test may take more than the
# suite-wide 300 s before it is judged hung.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

CHILD_KINDS = ("deployment", "service", "poddisruptionbudget")
READY_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def release(kube: Cluster) -> Iterator[Release]:
    with released(kube, "lwop", "lw-operator") as installed:
        yield installed


@pytest.fixture
def operator(kube: Cluster, release: Release) -> Iterator[Laneway]:
    account = release.service_accounts["operator"]
    process = Laneway(
        ["operator", "--namespace", release.namespace, "--health-port", str(free_port())],
        kube.service_account_kubeconfig(release.namespace, account),
        kube.log_path("operator"),
    )
    restarts = kube.apiserver_restarts
    process.start()
    yield process
    process.stop()
    # A restarted API server refuses requests (403) until its RBAC caches are filled, so the
    # check only holds where the API server stayed up.
    if kube.apiserver_restarts == restarts:
        assert "Forbidden" not in process.output(), "the operator's RBAC lacks a permission"


def pool(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "lane": "interactive",
            "model": "llama-3.1-8b-instruct",
            "engine": {"kind": "simulator"},
            "replicas": 2,
            "prefill": {"chunkSize": 512, "tokenBudget": 2048},
            "limits": {"maxContextTokens": 4096, "maxConcurrentRequests": 64},
            "routing": {"models": [name]},
            **spec,
        },
    }


class Pools:
    """kubectl on the pools of the release's namespace."""

    def __init__(self, kube: Cluster, namespace: str) -> None:
        self.kube, self.ns = kube, namespace

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kube.apply(list(docs), "-n", self.ns)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return self.kube.get(kind, name, "-n", self.ns)

    def exists(self, kind: str, name: str) -> bool:
        return self.kube.exists(kind, name, "-n", self.ns)

    def absent(self, kind: str, name: str) -> bool:
        return not self.exists(kind, name)

    def kubectl(self, *args: str) -> str:
        return self.kube.kubectl(*args, "-n", self.ns).stdout

    def converged(self, name: str, ready: int) -> bool:
        """The status describes the current spec with `ready` of `ready` replicas ready."""
        current = self.get("lwpool", name)
        status = current.get("status", {})
        return (
            status.get("observedGeneration") == current["metadata"]["generation"]
            and status.get("ready") == f"{ready}/{ready}"
            and condition(current, "Ready").get("status") == "True"
        )

    def wait_converged(self, name: str, ready: int) -> None:
        eventually(
            f"pool {name} reports {ready}/{ready} ready for its current spec",
            lambda: self.converged(name, ready),
            READY_TIMEOUT_S,
        )

    def events(self, name: str) -> list[tuple[str, str]]:
        """The reasons and messages of the events posted about pool `name`."""
        events = self.kube.get(
            "events", "-n", self.ns, "--field-selector",
            f"involvedObject.kind=InferencePool,involvedObject.name={name}",
        )  # fmt: skip
        return [(str(e.get("reason")), str(e.get("message"))) for e in events["items"]]

    def event_reasons(self, name: str) -> list[str]:
        return [reason for reason, _ in self.events(name)]

    def engine_args(self, name: str) -> list[str]:
        container = self.get("deployment", name)["spec"]["template"]["spec"]["containers"][0]
        return [*container.get("command", []), *container.get("args", [])]


@pytest.fixture
def pools(kube: Cluster, release: Release) -> Pools:
    return Pools(kube, release.namespace)


def test_a_pool_becomes_owned_children_ready_status_and_a_printed_row(
    operator: Laneway, pools: Pools
) -> None:
    pools.apply(pool("created"))
    pools.wait_converged("created", 2)
    uid = pools.get("lwpool", "created")["metadata"]["uid"]
    for kind in CHILD_KINDS:
        owners = pools.get(kind, "created")["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o.get("controller")) for o in owners] == [
            ("InferencePool", uid, True)
        ], kind
    status = pools.get("lwpool", "created")["status"]
    assert len(status["endpoints"]) == 2
    assert status["selector"] == "laneway.io/pool=created"
    assert "4096" in status["engineArgs"]
    row = pools.kubectl("get", "lwpool", "created", "--no-headers").split()
    assert row[:6] == [
        "created",
        "interactive",
        "simulator",
        "llama-3.1-8b-instruct",
        "2/2",
        "4096",
    ]
    # Every child was applied by the operator's own field manager (server-side apply).
    managed = pools.kube.get("deployment", "created", "-n", pools.ns, "--show-managed-fields")
    managers = {m["manager"] for m in managed["metadata"]["managedFields"]}
    assert "laneway-operator" in managers
    assert sorted(pools.event_reasons("created")).count("Created") == len(CHILD_KINDS)
    # No finalizer: deleting a pool never waits for the operator.
    assert "finalizers" not in pools.get("lwpool", "created")["metadata"]


def test_a_child_edited_by_hand_is_put_back_with_a_warning(operator: Laneway, pools: Pools) -> None:
    pools.apply(pool("meddled", replicas=1))
    pools.wait_converged("meddled", 1)
    pools.kubectl("scale", "deployment", "meddled", "--replicas=5")
    eventually(
        "the operator puts the Deployment's replicas back",
        lambda: pools.get("deployment", "meddled")["spec"]["replicas"] == 1,
        READY_TIMEOUT_S,
    )
    eventually(
        "a Restored event names what was put back",
        lambda: "Restored" in pools.event_reasons("meddled"),
        READY_TIMEOUT_S,
    )


def test_a_changed_and_scaled_pool_rolls_its_deployment(operator: Laneway, pools: Pools) -> None:
    pools.apply(pool("changed", replicas=1))
    pools.wait_converged("changed", 1)
    changed = pool("changed", replicas=1)
    changed["spec"]["limits"]["maxContextTokens"] = 8192
    pools.apply(changed)
    eventually(
        "the Deployment runs the new context cap", lambda: "8192" in pools.engine_args("changed")
    )
    pools.wait_converged("changed", 1)

    pools.kubectl("scale", "lwpool", "changed", "--replicas=3")
    eventually(
        "the Deployment follows `kubectl scale lwpool`",
        lambda: pools.get("deployment", "changed")["spec"]["replicas"] == 3,
    )
    pools.wait_converged("changed", 3)


def test_a_pool_with_a_selector_adopts_pods_and_drops_its_deployment(
    operator: Laneway, pools: Pools
) -> None:
    pools.apply(pool("adopter", replicas=1))
    pools.wait_converged("adopter", 1)
    # Engines started by hand, from the same pod template the operator rendered (so that
    # they start wherever the operator's do, KWOK's nodes or a real cluster's).
    template = copy.deepcopy(pools.get("deployment", "adopter")["spec"]["template"])
    # They opt in to adoption, as the operator requires (not with laneway.io/pool: adopter,
    # which the pool's own Deployment still selects by until it is deleted).
    hand_made = {"app": "hand-made", "laneway.io/adoptable": "true"}
    template["metadata"] = {"labels": hand_made}
    pods: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hand-made-engines"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": hand_made},
            "template": template,
        },
    }
    pools.apply(pods)
    adopting = pool("adopter", selector={"matchLabels": hand_made})
    del adopting["spec"]["replicas"]
    pools.apply(adopting)
    eventually(
        "the pool's own Deployment is deleted", lambda: not pools.exists("deployment", "adopter")
    )
    service = pools.get("service", "adopter")
    assert service["spec"]["selector"] == hand_made
    eventually(
        "the adopted pods are the pool's ready endpoints",
        lambda: len(pools.get("lwpool", "adopter").get("status", {}).get("endpoints", [])) == 2,
        READY_TIMEOUT_S,
    )
    assert pools.exists("deployment", "hand-made-engines")


def test_a_pool_asking_for_kv_events_gets_each_pod_naming_its_own_endpoint(
    operator: Laneway, pools: Pools
) -> None:
    """spec.engine.kvEvents through the real API server: the Deployment it stores carries the
    rendered --kv-events-config and the downward-API env its topic reads, and the topic the
    kubelet would expand for the running pod names the endpoint the pool reports, the way
    the gateway's subscriber files the pod's events."""
    endpoint = f"tcp://laneway-gateway-kv-events.{pools.ns}.svc:5557"
    engine = {"kind": "simulator", "kvEvents": {"endpoint": endpoint}}
    pools.apply(pool("publisher", replicas=1, engine=engine))
    pools.wait_converged("publisher", 1)
    (container,) = pools.get("deployment", "publisher")["spec"]["template"]["spec"]["containers"]
    (pod_ip_var,) = [var for var in container["env"] if var["name"] == POD_IP_ENV]
    assert pod_ip_var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    config = json.loads(container["args"][container["args"].index("--kv-events-config") + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": f"kv@$({POD_IP_ENV}):8000",
    }
    (pod,) = pools.kube.get("pods", "-n", pools.ns, "-l", "laneway.io/pool=publisher")["items"]
    argv = kubelet_argv(container, pod["status"]["podIP"])
    topic = json.loads(argv[argv.index("--kv-events-config") + 1])["topic"]
    (url,) = pools.get("lwpool", "publisher")["status"]["endpoints"]
    assert endpoint_of_topic(topic.encode(), [url]) == url


def test_a_deleted_pool_takes_its_children_with_it(operator: Laneway, pools: Pools) -> None:
    pools.apply(pool("deleted", replicas=1))
    pools.wait_converged("deleted", 1)
    pools.kubectl("delete", "lwpool", "deleted", "--wait=true")
    for kind in CHILD_KINDS:
        gone = functools.partial(pools.absent, kind, "deleted")
        eventually(f"the garbage collector removes the pool's {kind}", gone, READY_TIMEOUT_S)
    eventually(
        "the engine pods are gone",
        lambda: (
            not pools.kubectl("get", "pods", "-l", "laneway.io/pool=deleted", "-o", "name").strip()
        ),
        READY_TIMEOUT_S,
    )


def test_an_operator_killed_mid_reconcile_finishes_after_a_restart(
    operator: Laneway, pools: Pools
) -> None:
    pools.apply(pool("interrupted", replicas=2))
    eventually("the operator starts on the pool", lambda: pools.exists("deployment", "interrupted"))
    operator.stop(signal.SIGKILL)
    # While it is away the pool changes; nothing acts on it.
    changed = pool("interrupted", replicas=2)
    changed["spec"]["limits"]["maxContextTokens"] = 16384
    pools.apply(changed)
    operator.start()
    pools.wait_converged("interrupted", 2)
    assert "16384" in pools.engine_args("interrupted")


def test_the_operator_rides_out_an_api_server_restart(
    kube: Cluster, operator: Laneway, pools: Pools
) -> None:
    if not kube.local:
        pytest.skip("restarting the API server needs the local control plane")
    pools.apply(pool("restarted", replicas=1))
    pools.wait_converged("restarted", 1)
    kube.restart_apiserver()
    assert operator.running()
    pools.kubectl("scale", "lwpool", "restarted", "--replicas=2")
    pools.wait_converged("restarted", 2)
    assert operator.running()


@pytest.fixture
def scaling_gateway(kube: Cluster, release: Release) -> Iterator[str]:
    """The gateway, watching the release's namespace, and an operator that reads its demand
    every second and scales on it; yields the gateway's URL."""
    if not kube.local or kube.pod_network is None:
        pytest.skip(
            "the gateway probes the pods it routes to and the test plays their engine: this "
            "needs the local control plane and a network namespace (root, `ip netns`)"
        )
    ns = release.namespace
    url = f"http://127.0.0.1:{free_port()}"
    gateway = Laneway(
        [
            "gateway", "--kubernetes", "--namespace", ns,
            "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1],
        ],
        kube.service_account_kubeconfig(ns, release.service_accounts["gateway"]),
        kube.log_path("scaling-gateway"),
    )  # fmt: skip
    operator = Laneway(
        [
            "operator", "--namespace", ns, "--health-port", str(free_port()),
            "--gateway-url", url, "--demand-interval", "1",
        ],
        kube.service_account_kubeconfig(ns, release.service_accounts["operator"]),
        kube.log_path("scaling-operator"),
    )  # fmt: skip
    gateway.start()
    operator.start()
    try:
        yield url
    finally:
        operator.stop()
        gateway.stop()
    for process in (gateway, operator):
        assert "Forbidden" not in process.output(), f"RBAC refused a call:\n{process.output()}"


def served_models(url: str) -> set[str]:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            return {m["id"] for m in json.load(response)["data"]}
    except (urllib.error.URLError, OSError):
        return set()


def test_a_pool_at_zero_wakes_on_the_gateways_demand_and_sleeps_after_it(
    kube: Cluster, scaling_gateway: str, pools: Pools
) -> None:
    """The demand loop on the real control plane: a request for a batch pool at zero waits
    at the gateway, the operator reads that demand and scales the pool through its scale
    subresource, the Deployment follows, the request is answered, and once the demand is
    gone for the down window the pool goes back to zero; each move with its reason in the
    pool's status and an Event."""
    sleeper = pool(
        "sleeper",
        lane="batch",
        replicas=0,
        port=free_port(),
        nodeSelector={"kubernetes.io/hostname": HOST_NODE_NAME},
        tolerations=[{**HOST_NODE_TAINT, "operator": "Equal"}],
        autoscaling={
            "minReplicas": 0,
            "maxReplicas": 2,
            "signal": "inFlightRequests",
            "targetPerReplica": 1,
            "scaleDownWindowSeconds": 5,
        },
    )
    pools.apply(sleeper)
    eventually(
        "the pool reports it is scaled to zero",
        lambda: condition(pools.get("lwpool", "sleeper"), "Ready").get("reason") == "ScaledToZero",
        READY_TIMEOUT_S,
    )
    assert pools.get("deployment", "sleeper")["spec"]["replicas"] == 0
    engine = engine_for_pool(kube, pools.ns, "sleeper", READY_TIMEOUT_S)
    engine.start()  # answers for the pod once there is one
    client = openai.OpenAI(
        base_url=f"{scaling_gateway}/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        wait_listening(kube, pools.ns, "sleeper", READY_TIMEOUT_S)
        eventually(
            "the gateway serves the pool's model",
            lambda: "sleeper" in served_models(scaling_gateway),
            READY_TIMEOUT_S,
        )

        def ask() -> tuple[str, str | None]:
            raw = client.chat.completions.with_raw_response.create(
                model="sleeper",
                messages=[{"role": "user", "content": "Summarise the quarterly report."}],
                max_tokens=8,
            )
            return raw.headers["x-laneway-pool"], raw.parse().choices[0].message.content

        with ThreadPoolExecutor(1) as background:
            answer = background.submit(ask)
            eventually(
                "the operator scales the Deployment up on the waiting request",
                lambda: pools.get("deployment", "sleeper")["spec"]["replicas"] == 1,
                READY_TIMEOUT_S,
            )
            pool_name, text = answer.result(timeout=READY_TIMEOUT_S)
        assert pool_name == "sleeper"
        assert text
    finally:
        client.close()
        engine.stop()

    woken = dict(pools.events("sleeper")).get("ScaledUp", "")
    assert woken.startswith("scaling up 0 -> 1: inFlightRequests 1 at 1 per replica"), woken
    # Through the scale subresource, as `kubectl scale` would: that write owns spec.replicas.
    managed = pools.kube.get("lwpool", "sleeper", "-n", pools.ns, "--show-managed-fields")
    assert any(m.get("subresource") == "scale" for m in managed["metadata"]["managedFields"])

    eventually(
        "the pool goes back to zero once the demand has been gone for the down window",
        lambda: pools.get("deployment", "sleeper")["spec"]["replicas"] == 0,
        READY_TIMEOUT_S,
    )
    slept = dict(pools.events("sleeper")).get("ScaledDown", "")
    assert slept.startswith("scaling down 1 -> 0: inFlightRequests 0 at 1 per replica"), slept
    current = pools.get("lwpool", "sleeper")
    assert current["spec"]["replicas"] == 0
    autoscaling = current["status"]["autoscaling"]
    assert autoscaling["desiredReplicas"] == 0
    assert autoscaling["reason"].startswith(("scaling down 1 -> 0", "steady at 0")), autoscaling
    assert autoscaling["lastScaleTime"]
    eventually(
        "the engine pod is gone",
        lambda: (
            not pools.kubectl("get", "pods", "-l", "laneway.io/pool=sleeper", "-o", "name").strip()
        ),
        READY_TIMEOUT_S,
    )
