"""The kopf handlers: thin shells around `reconcile`, and the demand loop around
`autoscaler.pool_step`.

A pool is reconciled when it is created, changed or found at startup, and whenever one of
its children (or its endpoints) changes, so a child edited by hand is put back within
moments and the status follows pods becoming ready. There is deliberately no timer: kopf
puts a finalizer on every object a timer runs for, and a finalizer would block deleting a
pool whenever the operator is down. Children carry owner references instead, so the
garbage collector removes them. The demand loop (autoscaling, SLO attainment) is therefore
one task the operator starts and stops itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import aiohttp
import kopf

from laneway.api import GROUP, KIND, PLURAL, POOL_LABEL, VERSION
from laneway.autoscale import Recommendation
from laneway.kube.client import KubeApi, KubeError, Manifest
from laneway.operator.autoscaler import (
    DEFAULT_INTERVAL_S,
    Demand,
    DemandUnavailable,
    FetchDemand,
    changed,
    gateway_demand,
    pool_step,
)
from laneway.operator.reconcile import (
    Cluster,
    Event,
    ReconcileOutcome,
    reconcile,
    reconcile_upstream,
)
from laneway.operator.render import MANAGED_BY, RenderOptions
from laneway.operator.upstream import PickerRef

log = logging.getLogger("laneway.operator")

RETRY_SECONDS = 10.0
EVENT_SOURCE = "laneway-operator"

registry = kopf.OperatorRegistry()


@dataclass(frozen=True)
class OperatorState:
    """What every handler needs, kept in kopf's memo."""

    cluster: Cluster
    options: RenderOptions
    # One pass per pool at a time: a pool's own event and its children's events arrive
    # together, and passes that overlap would each create the same child and announce it.
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # The demand loop: where the gateway serves its pools' demand (None: no loop), how
    # often to read it, the namespaces served (empty: all), and each pool's recent
    # recommendations (the stabilisation windows' memory; lost on restart, after which
    # a scale-down waits one whole down window again).
    gateway_url: str | None = None
    demand_interval_s: float = DEFAULT_INTERVAL_S
    namespaces: tuple[str, ...] = ()
    histories: dict[str, tuple[Recommendation, ...]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


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
    if state.options.picker is not None:
        await _upstream_pass(state, state.options.picker, namespace)


async def _upstream_pass(state: OperatorState, picker: PickerRef, namespace: str) -> None:
    """The namespace's upstream InferencePools, after any of its pools changed. One pass
    per namespace at a time ("NS/" is no pool's key), since each reads all its pools."""
    async with state.locks.setdefault(f"{namespace}/", asyncio.Lock()):
        try:
            changes = await reconcile_upstream(namespace, state.cluster, picker)
        except KubeError as error:
            if error.transient:
                raise kopf.TemporaryError(
                    f"Kubernetes API: {error}", delay=RETRY_SECONDS
                ) from error
            raise
    for change in changes:
        log.info(change)


def post_events(body: kopf.Body, outcome: ReconcileOutcome) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def event_manifest(pool: Mapping[str, Any], event: Event, now: str) -> Manifest:
    """A core/v1 Event about `pool`, as `kubectl describe lwpool` lists them."""
    metadata = pool["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": pool.get("apiVersion", f"{GROUP}/{VERSION}"),
            "kind": KIND,
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid", ""),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": EVENT_SOURCE},
        "reportingComponent": EVENT_SOURCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class ScalingCluster(Cluster, Protocol):
    """What the demand loop adds to a pass's calls: the scale subresource, and Events it
    creates itself (kopf.event works only inside kopf's handlers)."""

    async def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None: ...

    async def create_object(self, manifest: Manifest) -> Manifest: ...


async def demand_pass(state: OperatorState, fetch: FetchDemand, now_s: float) -> None:
    """One read of the gateway's demand, then each pool's step, under the pool's lock."""
    demand: Demand | None = None
    unavailable = ""
    try:
        demand = await fetch()
    except DemandUnavailable as error:
        unavailable = f"no demand from the gateway: {error}"
        log.warning(unavailable)
    cluster = cast(ScalingCluster, state.cluster)
    found: list[Manifest] = []
    for namespace in state.namespaces or (None,):
        found += (await cluster.list(KIND, namespace)).items
    keys = set()
    for listed in found:
        metadata = listed.get("metadata", {})
        namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
        key = f"{namespace}/{name}"
        keys.add(key)
        async with state.locks.setdefault(key, asyncio.Lock()):
            body = await cluster.get(KIND, namespace, name)
            if body is None:
                continue
            history = state.histories.get(key, ())
            step = pool_step(body, demand, unavailable, history, now_s, utc_now())
            if step is None:
                continue
            state.histories[key] = step.history
            if step.replicas is not None:
                await cluster.scale(KIND, namespace, name, step.replicas)
            if changed(step.status, body.get("status") or {}):
                await cluster.patch_status(KIND, namespace, name, step.status)
            for event in step.events:
                await cluster.create_object(event_manifest(body, event, utc_now()))
    for gone in state.histories.keys() - keys:
        del state.histories[gone]


async def demand_forever(state: OperatorState, fetch: FetchDemand) -> None:
    while True:
        try:
            await demand_pass(state, fetch, time.monotonic())
        except KubeError as error:
            log.warning("demand pass: Kubernetes API: %s", error)
        except Exception:
            # A bug must not end scaling for good: say so, and try again next interval.
            log.exception("demand pass failed")
        await asyncio.sleep(state.demand_interval_s)


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    state: OperatorState = memo["state"]
    if state.gateway_url is not None:
        state.tasks.append(asyncio.create_task(_demand_loop(state), name="demand"))


async def _demand_loop(state: OperatorState) -> None:
    assert state.gateway_url is not None
    async with aiohttp.ClientSession() as session:
        await demand_forever(state, gateway_demand(session, state.gateway_url))


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (exec plugins included)."""
    return kopf.login_via_client(**kwargs)


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in memo["state"].tasks:
        task.cancel()
    await asyncio.gather(*memo["state"].tasks, return_exceptions=True)
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
