"""Both CRDs named InferencePool on one real API server: laneway's (`laneway.io`, short name
`lwpool`) and the Gateway API Inference Extension's (`inference.networking.k8s.io`, short
name `infpool`, written for the tests from its v1 API). Each is addressed by its qualified
or short name, and `laneway operator --picker-service` (as the chart's ServiceAccount)
renders one upstream pool per model over laneway's pools, which the garbage collector
removes with the last of them. tests/test_operator_upstream.py checks the rendering and the
reconciler in detail against a recording fake."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.crd import UPSTREAM_CRD_PATH
from support.kube.cluster import Cluster
from support.kube.laneway import Laneway, released
from support.kube.processes import eventually, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

UPSTREAM_CRD = "inferencepools.inference.networking.k8s.io"
UPSTREAM = "inferencepools.inference.networking.k8s.io"
PICKER = "lwup-laneway-picker"
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def namespace(kube: Cluster) -> Iterator[str]:
    kube.kubectl("apply", "-f", str(UPSTREAM_CRD_PATH))
    kube.wait_established(UPSTREAM_CRD)
    try:
        with released(kube, "lwup", "lw-upstream") as release:
            name = release.namespace
            operator = Laneway(
                [
                    *("operator", "--namespace", name, "--health-port", str(free_port())),
                    *("--picker-service", PICKER, "--picker-failure-mode", "FailOpen"),
                ],
                kube.service_account_kubeconfig(name, release.service_accounts["operator"]),
                kube.log_path("operator-upstream"),
            )
            operator.start()
            try:
                yield name
            finally:
                operator.stop()
            assert "Forbidden" not in operator.output(), "the operator's RBAC lacks a permission"
    finally:
        # Other modules' tests say `inferencepools` and mean laneway's alone.
        kube.kubectl("delete", "crd", UPSTREAM_CRD, "--wait", "--timeout=120s", timeout=150)


def pool(name: str, lane: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "lane": lane,
            "model": "llama-3-8b",
            "servedModelName": f"llama-3-8b-{name}",
            "engine": {"kind": "simulator"},
            "replicas": 1,
            **spec,
        },
    }


CHAT = pool("chat", "interactive", routing={"models": ["laneway-demo"], "maxPromptTokens": 3584},
            limits={"maxContextTokens": 4096})  # fmt: skip
DOCUMENTS = pool("documents", "batch", routing={"models": ["laneway-demo"],
                 "minPromptTokens": 3585}, limits={"maxContextTokens": 131072})  # fmt: skip


def names(kube: Cluster, resource: str, namespace: str) -> list[str]:
    return sorted(i["metadata"]["name"] for i in kube.get(resource, "-n", namespace)["items"])


def test_both_crds_are_served_and_each_is_addressed_by_its_own_names(
    kube: Cluster, namespace: str
) -> None:
    resources = kube.kubectl("api-resources", "--no-headers").stdout.splitlines()
    rows = {tuple(line.split()) for line in resources if line.startswith("inferencepools ")}
    assert ("inferencepools", "lwpool", "laneway.io/v1alpha1", "true", "InferencePool") in rows
    assert (
        "inferencepools", "infpool", "inference.networking.k8s.io/v1", "true", "InferencePool"
    ) in rows  # fmt: skip

    kube.apply([CHAT, DOCUMENTS], "-n", namespace)
    eventually(
        "the operator renders the model's upstream pool",
        lambda: kube.exists(UPSTREAM, "laneway-demo", "-n", namespace),
        TIMEOUT_S,
    )
    for laneway in ("lwpool", "inferencepools.laneway.io", "inferencepool.laneway.io"):
        assert names(kube, laneway, namespace) == ["chat", "documents"], laneway
    for upstream in ("infpool", UPSTREAM):
        assert names(kube, upstream, namespace) == ["laneway-demo"], upstream

    upstream_pool = kube.get(UPSTREAM, "laneway-demo", "-n", namespace)
    assert upstream_pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": PICKER,
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    owners = sorted(o["name"] for o in upstream_pool["metadata"]["ownerReferences"])
    assert owners == ["chat", "documents"]
    # Its selector finds the engine pods of both lanes, which the Deployments run.
    [(label, value)] = upstream_pool["spec"]["selector"]["matchLabels"].items()

    def both_lanes_selected() -> bool:
        pods = kube.get("pods", "-n", namespace, "-l", f"{label}={value}")["items"]
        return sorted(p["metadata"]["labels"]["laneway.io/pool"] for p in pods) == [
            "chat",
            "documents",
        ]

    eventually("the upstream selector finds both lanes' engine pods", both_lanes_selected,
               TIMEOUT_S)  # fmt: skip

    # The last laneway pool serving the model takes the upstream pool with it.
    kube.kubectl("delete", "lwpool", "chat", "-n", namespace, "--wait")
    assert kube.exists(UPSTREAM, "laneway-demo", "-n", namespace)
    kube.kubectl("delete", "inferencepools.laneway.io", "documents", "-n", namespace, "--wait")
    eventually(
        "the garbage collector removes the upstream pool",
        lambda: not kube.exists(UPSTREAM, "laneway-demo", "-n", namespace),
        TIMEOUT_S,
    )
