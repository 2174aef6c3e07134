"""`laneway operator --allowed-image-prefix` against a real API server, as the chart's
operator account: a pool whose engine image is outside the allowed registries is reported,
not run; moved into one, it runs. tests/test_operator_reconcile.py checks the decision in
detail against a recording fake; here kopf's handlers, the status subresource and Events are
real."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.kube.cluster import Cluster
from support.kube.laneway import Laneway, condition, released
from support.kube.processes import eventually, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ALLOWED = "registry.example.com/inference"
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def namespace(kube: Cluster) -> Iterator[str]:
    with released(kube, "lwimg", "lw-images") as release:
        name = release.namespace
        account = release.service_accounts["operator"]
        operator = Laneway(
            [
                *("operator", "--namespace", name, "--health-port", str(free_port())),
                *("--allowed-image-prefix", ALLOWED),
            ],
            kube.service_account_kubeconfig(name, account),
            kube.log_path("operator-images"),
        )
        operator.start()
        yield name
        operator.stop()


def pool(image: str) -> dict[str, object]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "guarded"},
        "spec": {
            "lane": "interactive",
            "model": "llama-3.1-8b-instruct",
            "engine": {"kind": "simulator", "image": image},
            "replicas": 1,
        },
    }


def test_an_image_outside_the_allowed_registries_is_reported_not_run(
    kube: Cluster, namespace: str
) -> None:
    kube.apply([pool("evil.example/miner:1")], "-n", namespace)

    def refused() -> bool:
        ready = condition(kube.get("lwpool", "guarded", "-n", namespace), "Ready")
        return ready.get("reason") == "ImageNotAllowed"

    eventually("the pool is refused for its image", refused, TIMEOUT_S)
    ready = condition(kube.get("lwpool", "guarded", "-n", namespace), "Ready")
    assert ready["status"] == "False"
    assert "'evil.example/miner:1'" in ready["message"]
    assert ALLOWED in ready["message"]
    for kind in ("deployment", "service", "poddisruptionbudget"):
        assert not kube.exists(kind, "guarded", "-n", namespace), kind
    events = kube.get(
        "events", "-n", namespace, "--field-selector",
        "involvedObject.kind=InferencePool,involvedObject.name=guarded",
    )  # fmt: skip
    assert "ImageNotAllowed" in {e.get("reason") for e in events["items"]}

    allowed_image = f"{ALLOWED}/laneway:1"
    kube.apply([pool(allowed_image)], "-n", namespace)
    eventually(
        "the pool's Deployment runs the allowed image",
        lambda: kube.exists("deployment", "guarded", "-n", namespace),
        TIMEOUT_S,
    )
    deployment = kube.get("deployment", "guarded", "-n", namespace)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == allowed_image
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
