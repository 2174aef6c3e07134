"""The kopf handlers: thin shells around `reconcile`.

A pool is reconciled when it is created, changed or found at startup, every
RESYNC_SECONDS, and whenever one of its children (or its endpoints) changes, so a child
edited by hand is put back within moments and the status follows pods becoming ready.
Children carry owner references, so deleting a pool lets the garbage collector remove
them; the operator needs no finalizer and never blocks a deletion.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from laneway.api import GROUP, KIND, PLURAL, VERSION
from laneway.operator.kube import ApiError, KubeApi
from laneway.operator.reconcile import Cluster, Outcome, reconcile
from laneway.operator.render import MANAGED_BY, POOL_LABEL, RenderOptions

RESYNC_SECONDS = 60.0
RETRY_SECONDS = 10.0

registry = kopf.OperatorRegistry()


@dataclass(frozen=True)
class OperatorState:
    """What every handler needs, kept in kopf's memo."""

    cluster: Cluster
    options: RenderOptions


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def configure(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping under our own annotations and its events to what matters."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="laneway.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="laneway.io")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300


async def reconcile_or_retry(body: Mapping[str, Any], state: OperatorState) -> Outcome:
    """Run one pass; a transient API error becomes kopf's retry after RETRY_SECONDS."""
    try:
        return await reconcile(body, state.cluster, state.options, utc_now())
    except ApiError as error:
        if error.transient:
            raise kopf.TemporaryError(f"Kubernetes API: {error}", delay=RETRY_SECONDS) from error
        raise


def post_events(body: kopf.Body, outcome: Outcome) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.startup(registry=registry)
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (exec plugins included)."""
    return kopf.login_via_client(**kwargs)


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    cluster = memo["state"].cluster
    if isinstance(cluster, KubeApi):
        await cluster.close()


async def reconcile_pool(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    outcome = await reconcile_or_retry(body, memo["state"])
    if outcome.status != dict(body.get("status") or {}):
        patch.status.update(outcome.status)
    post_events(body, outcome)


_CHILD_FILTER: dict[str, Any] = {
    "app.kubernetes.io/managed-by": MANAGED_BY,
    POOL_LABEL: kopf.PRESENT,
}


async def child_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child or the pool's endpoints changed: reconcile the owning pool now."""
    state: OperatorState = memo["state"]
    namespace = body.metadata.namespace or ""
    name = body.metadata.labels[POOL_LABEL]
    found = await state.cluster.get(KIND, namespace, name)
    if found is None:
        return  # the pool is gone; the garbage collector removes its children
    pool = kopf.Body(cast(kopf.RawBody, found))
    outcome = await reconcile_or_retry(pool, state)
    if outcome.status != dict(pool.get("status") or {}):
        await state.cluster.patch_status(KIND, namespace, name, outcome.status)
    post_events(pool, outcome)


# Registered by call rather than stacked decorators, so the functions keep their own
# signatures for type checkers and tests.
for _on_cause in (kopf.on.resume, kopf.on.create, kopf.on.update):
    _on_cause(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(reconcile_pool)
kopf.timer(GROUP, VERSION, PLURAL, id="resync", interval=RESYNC_SECONDS, registry=registry)(
    reconcile_pool
)
for _group, _version, _plural in (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
):
    kopf.on.event(_group, _version, _plural, labels=_CHILD_FILTER, registry=registry)(child_changed)
# EndpointSlices carry their Service's labels: readiness changes refresh the pool's status.
kopf.on.event(
    "discovery.k8s.io", "v1", "endpointslices", labels={POOL_LABEL: kopf.PRESENT}, registry=registry
)(child_changed)
