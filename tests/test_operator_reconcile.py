"""The operator's reconciliation and its kopf handlers, driven through create, a second
pass, readiness, update, drift, delete and API errors. A recording `FakeCluster` stands in
for the API server (none runs on these machines); events go through kopf's real posting
path into a queue the tests read."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._core.engines import posting
from support.fake_cluster import FakeCluster, pool_document

from laneway.api import KIND
from laneway.kube.client import ApiUnreachable, KubeError
from laneway.operator.handlers import (
    RETRY_SECONDS,
    OperatorState,
    child_changed,
    reconcile_pool,
    registry,
)
from laneway.operator.reconcile import ReconcileOutcome, drift, reconcile
from laneway.operator.render import RenderOptions

NOW = "2026-11-29T10:00:00Z"
SPEC: dict[str, Any] = {
    "lane": "interactive",
    "model": "llama-3.1-8b-instruct",
    "engine": {"kind": "simulator"},
    "replicas": 2,
    "prefill": {"chunkSize": 512, "tokenBudget": 2048},
    "limits": {"maxContextTokens": 4096},
}


@pytest.fixture
async def events() -> AsyncIterator[asyncio.Queue[Any]]:
    """kopf.event() posts into this queue, as it would into the operator's poster."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    tokens = (
        posting.settings_var.set(kopf.OperatorSettings()),
        posting.event_queue_var.set(queue),
        posting.event_queue_loop_var.set(asyncio.get_running_loop()),
    )
    yield queue
    posting.event_queue_loop_var.reset(tokens[2])
    posting.event_queue_var.reset(tokens[1])
    posting.settings_var.reset(tokens[0])


def drained(queue: asyncio.Queue[Any]) -> list[tuple[str, str, str]]:
    found = []
    while not queue.empty():
        event = queue.get_nowait()
        found.append((event.type, event.reason, event.message))
    return found


async def run_pass(cluster: FakeCluster, name: str = "realtime") -> ReconcileOutcome:
    """One pass as the kopf update handler runs it, with the status written back."""
    outcome = await reconcile(cluster.pool("serving", name), cluster, RenderOptions(), now=NOW)
    cluster.objects[(KIND, "serving", name)]["status"] = copy.deepcopy(outcome.status)
    return outcome


def condition(outcome: ReconcileOutcome, kind: str) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = outcome.status["conditions"]
    return next(c for c in conditions if c["type"] == kind)


def children(cluster: FakeCluster) -> list[tuple[str, str]]:
    return sorted((k, n) for (k, _, n) in cluster.objects if k != KIND)


def make_ready(cluster: FakeCluster, name: str, ips: list[str]) -> None:
    """What the Deployment controller and the EndpointSlice controller would do."""

    def rolled_out(deployment: dict[str, Any]) -> None:
        replicas = deployment["spec"]["replicas"]
        deployment["status"] = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": len(ips),
            "availableReplicas": len(ips),
        }

    cluster.edit("Deployment", "serving", name, rolled_out)
    cluster.create(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-abcde",
                "namespace": "serving",
                "labels": {"kubernetes.io/service-name": name, "laneway.io/pool": name},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips],
        }
    )


async def test_create_then_second_pass_changes_nothing() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    first = await run_pass(cluster)
    assert children(cluster) == [
        ("Deployment", "realtime"),
        ("PodDisruptionBudget", "realtime"),
        ("Service", "realtime"),
    ]
    uid = cluster.pool("serving", "realtime")["metadata"]["uid"]
    for kind, name in children(cluster):
        refs = cluster.objects[(kind, "serving", name)]["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [(KIND, uid, True)]
    assert [e.reason for e in first.events] == ["Created", "Created", "Created"]
    assert first.status["observedGeneration"] == 1
    assert first.status["engineArgs"][:2] == ["laneway", "sim"]
    assert condition(first, "Ready")["status"] == "False"
    assert condition(first, "Progressing")["status"] == "True"

    cluster.calls.clear()
    second = await run_pass(cluster)
    assert cluster.writes() == []
    assert second.events == ()
    assert second.status == first.status


async def test_ready_replicas_become_endpoints_and_conditions() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    await run_pass(cluster)
    make_ready(cluster, "realtime", ["10.0.0.5", "10.0.0.6"])
    outcome = await run_pass(cluster)
    assert outcome.status["endpoints"] == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert (outcome.status["readyReplicas"], outcome.status["ready"]) == (2, "2/2")
    assert outcome.status["selector"] == "laneway.io/pool=realtime"
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == (
        "True",
        "EndpointsReady",
        NOW,
    )
    assert condition(outcome, "Progressing")["status"] == "False"
    assert condition(outcome, "Degraded")["status"] == "False"
    assert [(e.type, e.reason) for e in outcome.events] == [("Normal", "Ready")]


async def test_changed_spec_rolls_the_deployment_only() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    await run_pass(cluster)
    cluster.edit(KIND, "serving", "realtime", lambda p: p["spec"]["prefill"].update(chunkSize=256))
    cluster.calls.clear()
    outcome = await run_pass(cluster)
    assert [(c.verb, c.resource) for c in cluster.writes()] == [("patch", "deployments")]
    args = cluster.objects[("Deployment", "serving", "realtime")]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert args[args.index("--chunk-size") + 1] == "256"
    (event,) = outcome.events
    assert (event.type, event.reason) == ("Normal", "Updated")
    assert "containers[0].args" in event.message
    assert outcome.status["observedGeneration"] == 2


async def test_a_child_edited_by_hand_is_put_back() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    await run_pass(cluster)

    def meddle(deployment: dict[str, Any]) -> None:
        deployment["spec"]["replicas"] = 7
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"

    cluster.edit("Deployment", "serving", "realtime", meddle)
    cluster.edit("Service", "serving", "realtime", lambda s: s["spec"].update(selector={}))
    outcome = await run_pass(cluster)
    deployment = cluster.objects[("Deployment", "serving", "realtime")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:latest"
    service = cluster.objects[("Service", "serving", "realtime")]
    assert service["spec"]["selector"] == {"laneway.io/pool": "realtime"}
    restored = {e.message.split()[2]: e for e in outcome.events}
    assert restored["Deployment/realtime"].type == "Warning"
    assert ".spec.replicas" in restored["Deployment/realtime"].message
    assert "Service/realtime" in restored


async def test_drift_ignores_what_the_api_server_adds() -> None:
    desired = {"spec": {"ports": [{"port": 80}], "resources": {"cpu": "500m"}}}
    live = {"spec": {"ports": [{"port": 80, "protocol": "TCP"}], "resources": {"cpu": "0.5"}}}
    assert drift(desired, live) == []
    assert drift(desired, {"spec": {"ports": [], "resources": {"cpu": "1"}}}) == [
        ".spec.ports",
        ".spec.resources.cpu",
    ]


async def test_deleting_the_pool_lets_the_garbage_collector_remove_children() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    cluster.create(pool_document("other", {**SPEC, "routing": {"minPromptTokens": 4000}}))
    await run_pass(cluster)
    await run_pass(cluster, "other")
    cluster.remove(KIND, "serving", "realtime")
    assert children(cluster) == [
        ("Deployment", "other"),
        ("PodDisruptionBudget", "other"),
        ("Service", "other"),
    ]
    assert "metadata" in cluster.pool("serving", "other")
    assert "finalizers" not in cluster.pool("serving", "other")["metadata"]
    # No deletion handler and no timer or daemon means kopf adds no finalizer: deleting a
    # pool is never blocked, even while the operator is down.
    changing = registry._changing.get_all_handlers()
    assert all(h.reason is not kopf.Reason.DELETE for h in changing)
    assert registry._spawning.get_all_handlers() == []


async def test_switching_to_selector_mode_deletes_the_owned_deployment() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    await run_pass(cluster)
    cluster.edit(
        KIND,
        "serving",
        "realtime",
        lambda p: p["spec"].update(selector={"matchLabels": {"laneway.io/adoptable": "true"}}),
    )
    outcome = await run_pass(cluster)
    assert ("Deployment", "realtime") not in children(cluster)
    assert ("Normal", "Deleted") in [(e.type, e.reason) for e in outcome.events]
    service = cluster.objects[("Service", "serving", "realtime")]
    assert service["spec"]["selector"] == {"laneway.io/adoptable": "true"}
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoReadyPods")
    assert "laneway.io/adoptable=true" in ready["message"]


async def test_a_spec_that_cannot_work_ends_not_ready_with_what_to_change() -> None:
    # CEL rules do not re-check objects stored before a CRD upgrade added them, so the
    # operator sees such specs; it must explain, not crash-loop or touch anything.
    cluster = FakeCluster()
    bad = {**SPEC, "prefill": {"chunkSize": 4096, "tokenBudget": 2048}}
    cluster.create(pool_document("realtime", bad))
    outcome = await run_pass(cluster)
    assert children(cluster) == []
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "lower chunkSize or raise tokenBudget" in ready["message"]
    assert condition(outcome, "Degraded")["status"] == "True"
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "InvalidSpec")]
    again = await run_pass(cluster)
    assert again.events == ()  # said once, not on every resync


async def test_kv_events_the_operator_cannot_render_end_not_ready_with_what_to_change() -> None:
    # An SGLang pool with engine.kvEvents, stored before the CRD's rule refused it.
    cluster = FakeCluster()
    engine = {"kind": "sglang", "kvEvents": {"endpoint": "tcp://laneway-gateway-kv-events:5557"}}
    cluster.create(pool_document("realtime", {**SPEC, "engine": engine}))
    outcome = await run_pass(cluster)
    assert children(cluster) == []
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.engine.kvEvents: is for engine kind vllm or simulator" in ready["message"]
    assert "remove engine.kvEvents" in ready["message"]


async def test_an_image_outside_the_allowed_registries_is_refused_and_nothing_applied() -> None:
    cluster = FakeCluster()
    allowed = RenderOptions(allowed_image_prefixes=("registry.example.com/inference",))
    spec = {**SPEC, "engine": {"kind": "simulator", "image": "evil.io/miner:1"}}
    cluster.create(pool_document("realtime", spec))
    outcome = await reconcile(cluster.pool("serving", "realtime"), cluster, allowed, now=NOW)
    assert cluster.writes() == []
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ImageNotAllowed")
    assert "'evil.io/miner:1'" in ready["message"]
    assert "registry.example.com/inference" in ready["message"]
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "ImageNotAllowed")]

    # Moved to an allowed image, the pool runs; moved out again, the running Deployment
    # keeps the allowed image.
    good = "registry.example.com/inference/laneway:1"
    cluster.edit(KIND, "serving", "realtime", lambda p: p["spec"]["engine"].update(image=good))
    await reconcile(cluster.pool("serving", "realtime"), cluster, allowed, now=NOW)
    deployment = cluster.objects[("Deployment", "serving", "realtime")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == good
    before = len(cluster.writes())
    bad = "registry.example.com/inference-b/laneway:1"
    cluster.edit(KIND, "serving", "realtime", lambda p: p["spec"]["engine"].update(image=bad))
    again = await reconcile(cluster.pool("serving", "realtime"), cluster, allowed, now=NOW)
    assert len(cluster.writes()) == before
    assert condition(again, "Ready")["reason"] == "ImageNotAllowed"
    deployment = cluster.objects[("Deployment", "serving", "realtime")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == good


async def test_an_object_the_pool_does_not_own_is_left_alone() -> None:
    cluster = FakeCluster()
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "realtime", "namespace": "serving"},
            "spec": {"selector": {"app": "someone-else"}},
        }
    )
    cluster.create(pool_document("realtime", SPEC))
    outcome = await run_pass(cluster)
    assert cluster.writes() == []
    assert cluster.objects[("Service", "serving", "realtime")]["spec"]["selector"] == {
        "app": "someone-else"
    }
    ready = condition(outcome, "Ready")
    assert ready["reason"] == "ChildConflict"
    assert "rename the pool or delete that object" in ready["message"]


async def test_the_newer_of_two_overlapping_interactive_pools_is_flagged() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    cluster.create(pool_document("realtime-2", SPEC))
    older = await run_pass(cluster, "realtime")
    newer = await run_pass(cluster, "realtime-2")
    assert condition(older, "Ready")["reason"] != "RoutingConflict"
    ready = condition(newer, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RoutingConflict")
    assert "higher routing.priority" in ready["message"]


async def test_a_rejected_child_is_reported_not_retried() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    original_apply = cluster.apply

    async def reject(manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] == "Deployment":
            raise KubeError(422, 'Deployment.apps "realtime" is invalid: resources: bad quantity')
        return await original_apply(manifest)

    cluster.apply = reject  # type: ignore[method-assign]
    outcome = await run_pass(cluster)
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyRejected")
    assert "bad quantity" in ready["message"]


async def test_kopf_handler_writes_status_and_posts_events(
    events: asyncio.Queue[Any],
) -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    memo = kopf.Memo(state=OperatorState(cluster=cluster, options=RenderOptions()))
    body = kopf.Body(cluster.pool("serving", "realtime"))  # type: ignore[arg-type]
    await reconcile_pool(body=body, memo=memo)
    status = cluster.pool("serving", "realtime")["status"]
    assert status["observedGeneration"] == 1
    assert [c["type"] for c in status["conditions"]] == [
        "Ready",
        "Progressing",
        "Degraded",
    ]
    assert [r for _, r, _ in drained(events)] == ["Created", "Created", "Created"]


@pytest.mark.parametrize(
    "error",
    [ApiUnreachable("connection refused"), KubeError(503, "etcd leader changed")],
    ids=["unreachable", "503"],
)
async def test_api_errors_become_kopf_retries_and_the_next_pass_recovers(
    events: asyncio.Queue[Any], error: KubeError
) -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    memo = kopf.Memo(state=OperatorState(cluster=cluster, options=RenderOptions()))
    body = kopf.Body(cluster.pool("serving", "realtime"))  # type: ignore[arg-type]
    cluster.failures = [error]
    with pytest.raises(kopf.TemporaryError) as caught:
        await reconcile_pool(body=body, memo=memo)
    assert caught.value.delay == RETRY_SECONDS
    assert str(error) in str(caught.value)
    await reconcile_pool(body=body, memo=memo)
    assert len(children(cluster)) == 3
    assert cluster.pool("serving", "realtime")["status"]["observedGeneration"] == 1


async def test_a_child_event_reconciles_its_pool(events: asyncio.Queue[Any]) -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("realtime", SPEC))
    await run_pass(cluster)
    cluster.edit("Deployment", "serving", "realtime", lambda d: d["spec"].update(replicas=0))
    memo = kopf.Memo(state=OperatorState(cluster=cluster, options=RenderOptions()))
    deployment = cluster.objects[("Deployment", "serving", "realtime")]
    await child_changed(body=kopf.Body(copy.deepcopy(deployment)), memo=memo)  # type: ignore[arg-type]
    assert cluster.objects[("Deployment", "serving", "realtime")]["spec"]["replicas"] == 2
    assert [r for _, r, _ in drained(events)] == ["Restored"]


async def test_a_child_event_for_a_deleted_pool_does_nothing() -> None:
    cluster = FakeCluster()
    memo = kopf.Memo(state=OperatorState(cluster=cluster, options=RenderOptions()))
    orphan = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gone", "namespace": "serving", "labels": {"laneway.io/pool": "gone"}},
    }
    await child_changed(body=kopf.Body(orphan), memo=memo)  # type: ignore[arg-type]
    assert cluster.writes() == []


async def test_a_pool_lending_to_a_batch_pool_its_engine_cannot_serve_is_not_ready() -> None:
    """Ready=False says what to change: the borrower's prompts exceed the lender's context
    cap; raising the cap makes it Ready."""
    docs = {**SPEC, "lane": "batch", "limits": {"maxContextTokens": 131072}}
    lender = {**SPEC, "lending": {"borrower": "docs"}}
    cluster = FakeCluster()
    cluster.create(pool_document("docs", docs))
    cluster.create(pool_document("realtime", lender))
    outcome = await run_pass(cluster)
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LendingMismatch")
    assert "raise this pool's limits.maxContextTokens" in ready["message"]
    assert "131072" in ready["message"]
    assert condition(outcome, "Degraded")["reason"] == "LendingMismatch"

    cluster.edit(
        KIND, "serving", "realtime", lambda p: p["spec"]["limits"].update(maxContextTokens=131072)
    )
    fixed = await run_pass(cluster)
    assert condition(fixed, "Ready")["reason"] != "LendingMismatch"
