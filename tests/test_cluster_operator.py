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
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kube_cluster import Cluster, eventually, free_port
from kube_laneway import Laneway, Release, condition, helm, helm_available, install_release

# Each step waits generously for a loaded machine; a whole test may take more than the
# suite-wide 300 s before it is judged hung.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

CHILD_KINDS = ("deployment", "service", "poddisruptionbudget")
READY_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def release(kube: Cluster) -> Iterator[Release]:
    if not helm_available():
        pytest.skip("helm is not installed: scripts/install-tools.sh installs it")
    kube.install_crds()
    with kube.namespace("lw-operator") as namespace:
        installed = install_release(kube, "lwop", namespace)
        yield installed
        helm(kube, "uninstall", installed.name, "-n", namespace, "--wait")


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

    def event_reasons(self, name: str) -> list[str]:
        """The reasons of the events posted about pool `name`."""
        events = self.kube.get(
            "events", "-n", self.ns, "--field-selector",
            f"involvedObject.kind=InferencePool,involvedObject.name={name}",
        )  # fmt: skip
        return [str(e.get("reason")) for e in events["items"]]

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
    template["metadata"] = {"labels": {"app": "hand-made"}}
    pods: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hand-made-engines"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "hand-made"}},
            "template": template,
        },
    }
    pools.apply(pods)
    adopting = pool("adopter", selector={"matchLabels": {"app": "hand-made"}})
    del adopting["spec"]["replicas"]
    pools.apply(adopting)
    eventually(
        "the pool's own Deployment is deleted", lambda: not pools.exists("deployment", "adopter")
    )
    service = pools.get("service", "adopter")
    assert service["spec"]["selector"] == {"app": "hand-made"}
    eventually(
        "the adopted pods are the pool's ready endpoints",
        lambda: len(pools.get("lwpool", "adopter").get("status", {}).get("endpoints", [])) == 2,
        READY_TIMEOUT_S,
    )
    assert pools.exists("deployment", "hand-made-engines")


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
