"""The Helm chart installed into a real cluster with every values set of charts/laneway/ci/:
the API server admits every rendered object (schemas, RBAC escalation checks, admission), and
`helm uninstall` leaves nothing of the release behind. tests/test_chart_helm.py checks the
rendered objects offline; this is the install a user runs."""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube.cluster import Cluster
from support.kube.laneway import CHART, helm, helm_available
from support.kube.processes import eventually

pytestmark = pytest.mark.cluster

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "lw"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"

# The production values ask for a Prometheus Operator ServiceMonitor. That operator is not
# part of this cluster, so its kind is registered with an open schema: enough for the API
# server to store what the chart renders.
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "ServiceMonitor",
            "plural": "servicemonitors",
            "listKind": "ServiceMonitorList",
            "singular": "servicemonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module", autouse=True)
def prerequisites(kube: Cluster) -> None:
    if not helm_available():
        pytest.skip("helm is not installed: scripts/install-tools.sh installs it")
    kube.install_crds()
    # Never over a real one (a cluster with the Prometheus Operator).
    if not kube.exists("crd", SERVICE_MONITOR_CRD["metadata"]["name"]):
        kube.apply([SERVICE_MONITOR_CRD])
    kube.wait_established("servicemonitors.monitoring.coreos.com")


def release_objects(kube: Cluster, namespace: str) -> list[str]:
    """Every object labelled as the release's, namespaced (in `namespace`) or cluster-wide."""
    found = []
    for namespaced in ("true", "false"):
        kinds = kube.kubectl(
            "api-resources", "--verbs=list", f"--namespaced={namespaced}", "-o", "name"
        ).stdout.split()
        scope = ["-n", namespace] if namespaced == "true" else []
        listed = kube.kubectl(
            "get", ",".join(kinds), *scope, "-l", INSTANCE, "-o", "name", "--ignore-not-found"
        ).stdout.split()
        found += listed
    return found


@pytest.mark.parametrize(
    "values", [None, *CI_VALUES], ids=["default", *(p.name for p in CI_VALUES)]
)
def test_chart_installs_into_a_real_cluster_and_uninstalls_cleanly(
    kube: Cluster, kube_namespace: str, values: Path | None
) -> None:
    flags = ["-f", str(values)] if values else []
    overlay = yaml.safe_load(values.read_text()) if values else {}
    with contextlib.ExitStack() as namespaces:
        # The other namespaces whose engines the release guards exist before it does.
        for other in overlay.get("networkPolicy", {}).get("engineNamespaces", []):
            namespaces.enter_context(kube.namespace(other))
        install_and_uninstall(kube, kube_namespace, flags)


def install_and_uninstall(kube: Cluster, kube_namespace: str, flags: list[str]) -> None:
    helm(kube, "install", RELEASE, str(CHART), "-n", kube_namespace, *flags)

    manifest = [
        d
        for d in yaml.safe_load_all(helm(kube, "get", "manifest", RELEASE, "-n", kube_namespace))
        if d
    ]
    assert manifest
    for obj in manifest:
        # kubectl ignores -n for cluster-scoped kinds.
        assert kube.exists(obj["kind"], obj["metadata"]["name"], "-n", where(obj)), obj
    assert release_objects(kube, kube_namespace)

    helm(kube, "uninstall", RELEASE, "-n", kube_namespace, "--wait", "--timeout=180s")
    eventually(
        "nothing of the release is left",
        lambda: release_objects(kube, kube_namespace) == [],
        180,
    )
    for obj in manifest:
        assert not kube.exists(obj["kind"], obj["metadata"]["name"], "-n", where(obj)), obj
    assert "lw" not in helm(kube, "list", "-n", kube_namespace, "-q").split()


def where(obj: dict[str, Any]) -> str:
    namespace: str = obj["metadata"].get("namespace", "default")  # default: cluster-scoped
    return namespace


def api_key(kube: Cluster, namespace: str) -> str:
    secret = kube.get("secret", f"{RELEASE}-laneway-api-key", "-n", namespace)
    return base64.b64decode(secret["data"]["api-key"]).decode()


def test_the_generated_api_key_survives_an_upgrade(kube: Cluster, kube_namespace: str) -> None:
    """helm's lookup reads the key back, so an upgrade does not lock every client out."""
    helm(kube, "install", RELEASE, str(CHART), "-n", kube_namespace)
    key = api_key(kube, kube_namespace)
    helm(
        kube, "upgrade", RELEASE, str(CHART), "-n", kube_namespace, "--reuse-values",
        "--set", "gateway.config.queue.maxWaiting=10",
    )  # fmt: skip
    assert api_key(kube, kube_namespace) == key
    other = "lw2"
    helm(
        kube, "install", other, str(CHART), "-n", kube_namespace,
        "--set", "operator.enabled=false", "--set", "examplePools.enabled=false",
    )  # fmt: skip
    secret = kube.get("secret", f"{other}-laneway-api-key", "-n", kube_namespace)
    assert base64.b64decode(secret["data"]["api-key"]).decode() != key, "a key per release"
    for release in (RELEASE, other):
        helm(kube, "uninstall", release, "-n", kube_namespace, "--wait", "--timeout=180s")
