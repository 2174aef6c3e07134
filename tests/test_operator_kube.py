"""KubeApi's requests on the wire, against the scripted API server on loopback: server-side
apply, status patches, deletes, and how errors are classified for retries."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from support.apiserver import FakeApiServer

from laneway.kube.client import FIELD_MANAGER, RESOURCE_TYPES, ApiUnreachable, KubeApi, KubeError

DEPLOYMENT = "/apis/apps/v1/namespaces/serving/deployments/realtime"


@pytest.fixture
async def api_and_server(
    fake_apiserver: FakeApiServer,
) -> AsyncIterator[tuple[KubeApi, FakeApiServer]]:
    api = KubeApi(fake_apiserver.url, authorization=lambda: "Bearer t")
    yield api, fake_apiserver
    await api.close()


async def test_apply_is_a_forced_server_side_apply(
    api_and_server: tuple[KubeApi, FakeApiServer],
) -> None:
    api, server = api_and_server
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "realtime", "namespace": "serving"},
        "spec": {"replicas": 2},
    }
    server.responses[("PATCH", DEPLOYMENT)] = (200, {**manifest, "status": {"replicas": 0}})
    applied = await api.apply(manifest)
    assert applied["status"] == {"replicas": 0}
    request = server.requests[-1]
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    assert request.query == {"fieldManager": FIELD_MANAGER, "force": "true"}
    assert json.loads(request.body) == manifest
    assert request.headers["Authorization"] == "Bearer t"


async def test_status_patch_and_delete(api_and_server: tuple[KubeApi, FakeApiServer]) -> None:
    api, server = api_and_server
    pool = "/apis/laneway.io/v1alpha1/namespaces/serving/inferencepools/realtime"
    server.responses[("PATCH", pool + "/status")] = (200, {})
    server.responses[("DELETE", DEPLOYMENT)] = (200, {})
    await api.patch_status("InferencePool", "serving", "realtime", {"observedGeneration": 3})
    await api.delete("Deployment", "serving", "realtime")
    patch, delete = server.requests[-2:]
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch.body) == {"status": {"observedGeneration": 3}}
    assert json.loads(delete.body) == {"propagationPolicy": "Background"}


async def test_get_of_a_missing_object_is_none(
    api_and_server: tuple[KubeApi, FakeApiServer],
) -> None:
    api, _ = api_and_server
    assert await api.get("Service", "serving", "nothing") is None


@pytest.mark.parametrize(
    ("status", "transient"), [(409, True), (429, True), (500, True), (403, False), (422, False)]
)
async def test_errors_carry_the_servers_message_and_whether_to_retry(
    api_and_server: tuple[KubeApi, FakeApiServer], status: int, transient: bool
) -> None:
    api, server = api_and_server
    server.responses[("GET", DEPLOYMENT)] = (status, {"kind": "Status", "message": "said why"})
    with pytest.raises(KubeError) as caught:
        await api.get("Deployment", "serving", "realtime")
    assert (caught.value.status, caught.value.transient) == (status, transient)
    assert str(caught.value) == f"HTTP {status}: said why"


async def test_no_server_is_unreachable_and_transient() -> None:
    api = KubeApi("http://127.0.0.1:9", request_timeout=2)
    try:
        with pytest.raises(ApiUnreachable) as caught:
            await api.get("Deployment", "serving", "realtime")
    finally:
        await api.close()
    assert caught.value.transient


@pytest.mark.parametrize(
    ("kind", "namespace", "name", "path"),
    [
        ("Service", "ns", "a", "/api/v1/namespaces/ns/services/a"),
        ("Deployment", "ns", None, "/apis/apps/v1/namespaces/ns/deployments"),
        ("InferencePool", None, None, "/apis/laneway.io/v1alpha1/inferencepools"),
        ("EndpointSlice", None, None, "/apis/discovery.k8s.io/v1/endpointslices"),
    ],
)
def test_resource_paths(kind: str, namespace: str | None, name: str | None, path: str) -> None:
    assert RESOURCE_TYPES[kind].path(namespace, name) == path
