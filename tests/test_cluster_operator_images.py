"""`laneway operator --allowed-image-prefix --allowed-env-secret` against a real API server,
as the chart's operator account: a pool whose engine image is outside the allowed
registries, whose env reads a Secret outside the allowed ones, or whose selector would adopt
pods that never opted in is reported, not run; moved into what is allowed, it runs.
tests/test_operator_reconcile.py and tests/test_operator_access.py check the decisions in
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
ALLOWED_SECRET = "hf-token"
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
                *("--allowed-env-secret", ALLOWED_SECRET),
            ],
            kube.service_account_kubeconfig(name, account),
            kube.log_path("operator-images"),
        )
        operator.start()
        yield name
        operator.stop()


def pool(image: str, name: str = "guarded", **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "laneway.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "lane": "interactive",
            "model": "llama-3.1-8b-instruct",
            "engine": {"kind": "simulator", "image": image},
            "replicas": 1,
            **spec,
        },
    }


def refused_for(kube: Cluster, namespace: str, name: str, reason: str) -> dict[str, str]:
    def refused() -> bool:
        ready = condition(kube.get("lwpool", name, "-n", namespace), "Ready")
        return ready.get("reason") == reason

    eventually(f"the pool is refused with {reason}", refused, TIMEOUT_S)
    ready = condition(kube.get("lwpool", name, "-n", namespace), "Ready")
    assert ready["status"] == "False"
    return ready


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


def test_env_reading_a_secret_outside_the_allowed_ones_is_reported_not_run(
    kube: Cluster, namespace: str
) -> None:
    """The hostile tenant's pool: its engine env takes the gateway's API-key Secret."""
    image = f"{ALLOWED}/laneway:1"
    stolen = {"secretKeyRef": {"name": "lwimg-laneway-api-key", "key": "tenants.yaml"}}
    engine = {"kind": "simulator", "image": image, "env": [{"name": "K", "valueFrom": stolen}]}
    kube.apply([pool(image, "thief", engine=engine)], "-n", namespace)
    ready = refused_for(kube, namespace, "thief", "SecretNotAllowed")
    assert "reads Secret 'lwimg-laneway-api-key'" in ready["message"]
    assert f"the Secrets it allows are {ALLOWED_SECRET}" in ready["message"]
    for kind in ("deployment", "service", "poddisruptionbudget"):
        assert not kube.exists(kind, "thief", "-n", namespace), kind

    token = {"secretKeyRef": {"name": ALLOWED_SECRET, "key": "token"}}
    engine["env"] = [{"name": "HF_TOKEN", "valueFrom": token}]
    kube.apply([pool(image, "thief", engine=engine)], "-n", namespace)
    eventually(
        "the pool reading the allowed Secret runs",
        lambda: kube.exists("deployment", "thief", "-n", namespace),
        TIMEOUT_S,
    )
    [container] = kube.get("deployment", "thief", "-n", namespace)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["env"] == engine["env"]


def test_a_selector_that_would_adopt_foreign_pods_is_reported_not_served(
    kube: Cluster, namespace: str
) -> None:
    """A selector naming the bundled Redis's labels renders no Service onto Redis."""
    redis = {"app.kubernetes.io/component": "redis"}
    kube.apply([pool(f"{ALLOWED}/laneway:1", "adopter", selector={"matchLabels": redis})],
               "-n", namespace)  # fmt: skip
    ready = refused_for(kube, namespace, "adopter", "SelectorNotAllowed")
    assert "add laneway.io/pool: adopter" in ready["message"]
    for kind in ("deployment", "service", "poddisruptionbudget"):
        assert not kube.exists(kind, "adopter", "-n", namespace), kind
