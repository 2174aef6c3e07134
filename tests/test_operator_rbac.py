"""Least privilege: every API call the operator makes, through a full life cycle of pools,
is granted by manifests/rbac/operator.yaml, and the role grants nothing beyond what the
operator and kopf use."""

from __future__ import annotations

from collections.abc import Iterator

import kopf
import pytest
from kopf._core.engines import posting
from support.fake_cluster import FakeCluster, pool_document
from support.rbac import granted_rules

from laneway.api import KIND
from laneway.autoscale import DemandCount
from laneway.operator.autoscaler import Demand
from laneway.operator.handlers import OperatorState, child_changed, demand_pass
from laneway.operator.reconcile import reconcile, reconcile_upstream
from laneway.operator.render import RenderOptions
from laneway.operator.upstream import PickerRef

# What kopf itself does besides the operator's calls (tests/test_cluster_operator.py runs
# it under this role in a real cluster): watch what it serves (including the children the
# drift handler follows), keep progress in annotations, post events.
KOPF_CALLS = {
    ("laneway.io", "inferencepools", "watch"),
    ("laneway.io", "inferencepools", "list"),
    ("laneway.io", "inferencepools", "patch"),
    ("", "events", "create"),
} | {
    (group, resource, verb)
    for group, resource in [
        ("apps", "deployments"),
        ("", "services"),
        ("policy", "poddisruptionbudgets"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("discovery.k8s.io", "endpointslices"),
    ]
    for verb in ("list", "watch")
}


@pytest.fixture(autouse=True)
def no_event_posting() -> Iterator[None]:
    """kopf.event() needs the operator's settings; these tests do not read events."""
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    token = posting.settings_var.set(settings)
    yield
    posting.settings_var.reset(token)


async def life_cycle(cluster: FakeCluster) -> None:
    """Create, autoscale (the demand loop), change, drift, switch to adopted pods, report
    status."""
    # With laneway's picker: the upstream InferencePools are created, changed and pruned.
    picker = PickerRef(service="picker")
    options = RenderOptions(picker=picker)
    memo = kopf.Memo(state=OperatorState(cluster=cluster, options=options))
    spec = {"lane": "batch", "model": "m", "engine": {"kind": "sglang"}}
    pool = cluster.create(pool_document("p", spec))
    # What an earlier version rendered for spec.autoscaling: pruned on the first pass.
    owner = {"kind": KIND, "name": "p", "uid": pool["metadata"]["uid"]}
    cluster.create(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "p", "namespace": "serving", "ownerReferences": [owner]},
            "spec": {},
        }
    )

    async def once() -> None:
        outcome = await reconcile(cluster.pool("serving", "p"), cluster, options, "t")
        await cluster.patch_status(KIND, "serving", "p", outcome.status)
        await reconcile_upstream("serving", cluster, picker)

    await once()
    cluster.edit(KIND, "serving", "p", lambda p: p["spec"].update(autoscaling={"maxReplicas": 3}))
    await once()

    async def demand() -> Demand:  # enough queued prompt tokens for three replicas
        return {"serving/p": DemandCount(queued_prompt_tokens=700_000)}

    await demand_pass(memo["state"], demand, now_s=0.0)
    assert cluster.pool("serving", "p")["spec"]["replicas"] == 3
    await once()
    cluster.edit(KIND, "serving", "p", lambda p: p["spec"].update(autoscaling={"maxReplicas": 5}))
    cluster.edit(KIND, "serving", "p", lambda p: p["spec"].update(prefill={"chunkSize": 512}))
    await once()
    cluster.edit(KIND, "serving", "p", lambda p: p["spec"].update(port=8001))
    await once()  # the upstream pool's targetPorts follow
    cluster.edit(KIND, "serving", "p", lambda p: p["spec"].update(servedModelName="m2"))
    await once()  # another model: its upstream pool made, the old one deleted
    cluster.edit("Service", "serving", "p", lambda s: s["spec"].update(selector={}))
    await child_changed(body=kopf.Body(cluster.objects[("Service", "serving", "p")]), memo=memo)  # type: ignore[arg-type]
    cluster.edit(
        KIND,
        "serving",
        "p",
        lambda p: p["spec"].update(
            selector={"matchLabels": {"laneway.io/adoptable": "true"}}, autoscaling=None
        ),
    )
    del cluster.objects[(KIND, "serving", "p")]["spec"]["autoscaling"]
    await once()


async def test_every_operator_call_is_granted() -> None:
    cluster = FakeCluster()
    await life_cycle(cluster)
    used = {(c.api_group, c.resource, c.verb) for c in cluster.calls}
    assert {verb for _, _, verb in used} >= {"get", "list", "create", "patch", "delete"}
    granted = granted_rules("operator")
    assert used <= granted, used - granted


async def test_the_role_grants_nothing_unused() -> None:
    cluster = FakeCluster()
    await life_cycle(cluster)
    used = {(c.api_group, c.resource, c.verb) for c in cluster.calls} | KOPF_CALLS
    # events.k8s.io and the event patch are kept for kopf's event aggregation.
    allowed_spares = {
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("", "events", "patch"),
    }
    granted = granted_rules("operator")
    assert granted - used <= allowed_spares, granted - used - allowed_spares
