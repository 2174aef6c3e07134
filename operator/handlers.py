"""The kopf handlers: thin shells around `reconcile`.

A pool is reconciled when it is created, changed or found at startup, and whenever one of
its children (or its endpoints) changes, so a child edited by hand is put back within
moments and the status follows pods becoming ready. There is deliberately no timer: kopf
puts a finalizer on every object a timer runs for, and a finalizer would block deleting a
pool whenever the operator is down. Children carry owner references instead, so the
garbage collector removes them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from laneway.api import GROUP, KIND, PLURAL, POOL_LABEL, VERSION
from laneway.kube.client import KubeApi, KubeError
from laneway.operator.reconcile import Cluster, ReconcileOutcome, reconcile
from laneway.operator.render import MANAGED_BY, RenderOptions

RETRY_SECONDS = 10.0

registry = kopf.OperatorRegistry()


@dataclass(frozen=True)
class OperatorState:
    """What every handler needs, kept in kopf's memo."""

    cluster: Cluster
    options: RenderOptions
    # One pass per pool at a time: a pool's own event and its children's events arrive
    # together, and passes that overlap would each create the same child and announce it.
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def configure(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping under our own annotations, its events to what matters, and
    its API access to the namespaces it serves."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="laneway.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="laneway.io")
    settings.posting.level = logging.WARNING
    # The resources and namespaces to serve are known at start (the CRD is installed first):
    # without runtime scanning kopf needs no cluster-wide access to CRDs or namespaces.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300


async def reconcile_pool_named(state: OperatorState, namespace: str, name: str) -> None:
    """One pass over the pool as it is now, its status written back and its events posted.

    The pool is read inside the lock, so a pass never works from a copy that an earlier
    pass has already acted on. A transient API error becomes kopf's retry."""
    lock = state.locks.setdefault(f"{namespace}/{name}", asyncio.Lock())
    async with lock:
        try:
            found = await state.cluster.get(KIND, namespace, name)
            if found is None:
                return  # deleted meanwhile; the garbage collector removes its children
            pool = kopf.Body(cast(kopf.RawBody, found))
            outcome = await reconcile(pool, state.cluster, state.options, utc_now())
            if outcome.status != dict(pool.get("status") or {}):
                await state.cluster.patch_status(KIND, namespace, name, outcome.status)
        except KubeError as error:
            if error.transient:
                raise kopf.TemporaryError(
                    f"Kubernetes API: {error}", delay=RETRY_SECONDS
                ) from error
            raise
        post_events(pool, outcome)


def post_events(body: kopf.Body, outcome: ReconcileOutcome) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (exec plugins included)."""
    return kopf.login_via_client(**kwargs)


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    cluster = memo["state"].cluster
    if isinstance(cluster, KubeApi):
        await cluster.close()


async def reconcile_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The pool was created, changed, or found when the operator started."""
    await reconcile_pool_named(memo["state"], body.metadata.namespace or "", body.metadata.name)


async def child_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child or the pool's endpoints changed: reconcile the owning pool now."""
    namespace = body.metadata.namespace or ""
    await reconcile_pool_named(memo["state"], namespace, body.metadata.labels[POOL_LABEL])


_CHILD_FILTER: dict[str, Any] = {
    "app.kubernetes.io/managed-by": MANAGED_BY,
    POOL_LABEL: kopf.PRESENT,
}

# Registered by call rather than stacked decorators, so the functions keep their own
# signatures for type checkers and tests.
kopf.on.startup(registry=registry)(startup)
kopf.on.login(registry=registry)(login)
kopf.on.cleanup(registry=registry)(cleanup)
for _on_cause in (kopf.on.resume, kopf.on.create, kopf.on.update):
    _on_cause(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(reconcile_pool)
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
