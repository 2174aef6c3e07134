"""One reconciliation pass of one InferencePool: render, compare, apply what differs, prune
what is no longer rendered, and compute the status. The kopf handlers call this; tests
drive it with a recording cluster in place of an API server.

A pass writes nothing when the cluster already matches (idempotent), puts back a child
that was edited by hand (drift), and never crash-loops on a pool that cannot work: that
pool ends as `Ready=False` with a message saying what to change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from laneway.api import KIND, InferencePool, SpecError, check_pool_set, parse_pool
from laneway.kube.client import UPSTREAM_POOL, KubeError, ListResult, Manifest
from laneway.kube.endpoints import SERVICE_NAME_LABEL, ready_endpoint_urls
from laneway.operator.render import (
    CHILD_KINDS,
    MANAGED_BY,
    RenderOptions,
    refusal,
    render_pool,
    selector_string,
)
from laneway.operator.status import (
    Condition,
    Observed,
    problem_conditions,
    problem_status,
    serving_conditions,
    status_document,
)
from laneway.operator.upstream import PickerRef, upstream_pools


class Cluster(Protocol):
    """The API calls a pass makes; `laneway.kube.client.KubeApi` is the real one."""

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None: ...

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> ListResult: ...

    async def apply(self, manifest: Manifest) -> Manifest: ...

    async def delete(self, kind: str, namespace: str, name: str) -> None: ...

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None: ...


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class ReconcileOutcome:
    status: dict[str, Any]
    events: tuple[Event, ...]


def drift(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` differs from `desired`. Fields only in `live` (defaults the API
    server filled in, status) are not drift; a list must match item by item."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [path or "."]
        found: list[str] = []
        for key, value in desired.items():
            found += drift(value, live.get(key), f"{path}.{key}")
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        found = []
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            found += drift(want, have, f"{path}[{index}]")
        return found
    return [] if desired == live or _same_quantity(desired, live) else [path]


_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def _quantity(value: object) -> Decimal | None:
    """A Kubernetes resource quantity's value: "500m" and "0.5" are the same CPU."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    match = _QUANTITY.match(str(value))
    if match is None:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:])) if suffix else number


def _same_quantity(desired: object, live: object) -> bool:
    """The API server returns quantities in canonical form ("1Gi" for "1024Mi")."""
    wanted, found = _quantity(desired), _quantity(live)
    return wanted is not None and wanted == found


def owned_by(live: Mapping[str, Any], uid: str) -> bool:
    return any(
        ref.get("kind") == KIND and ref.get("uid") == uid
        for ref in live.get("metadata", {}).get("ownerReferences") or ()
    )


async def reconcile(
    body: Mapping[str, Any], cluster: Cluster, options: RenderOptions, now: str
) -> ReconcileOutcome:
    """Bring one pool's children in line with its spec and say how it stands.

    Transient API errors propagate (the caller retries); the API server rejecting a
    rendered object is reported in the status, since retrying cannot fix it."""
    metadata = body.get("metadata", {})
    generation = int(metadata.get("generation") or 0)
    previous: Mapping[str, Any] = body.get("status") or {}
    try:
        pool = parse_pool(body)
    except SpecError as error:
        message = f"the spec cannot work: {error}"
        return _problem(generation, previous, now, "InvalidSpec", message)
    refused = refusal(pool, options)
    if refused is not None:
        # Nothing is applied: running children keep what was allowed before, unless they
        # themselves reach what the pool may not.
        withdrawn = await _delete_owned(pool, cluster, CHILD_KINDS) if refused.withdraw else []
        problem = _problem(generation, previous, now, refused.reason, refused.message)
        return ReconcileOutcome(status=problem.status, events=(*withdrawn, *problem.events))

    events: list[Event] = []
    spec_changed = generation != previous.get("observedGeneration")
    rendered = render_pool(pool, options)
    live_children: dict[str, Manifest] = {}
    for desired in rendered.children:
        kind = desired["kind"]
        live = await cluster.get(kind, pool.namespace, pool.name)
        if live is not None and not owned_by(live, pool.uid):
            message = (
                f"a {kind} named {pool.name} already exists and is not owned by this pool: "
                "rename the pool or delete that object"
            )
            return _problem(generation, previous, now, "ChildConflict", message)
        differences = [] if live is None else drift(desired, live)
        if live is None or differences:
            try:
                live = await cluster.apply(desired)
            except KubeError as error:
                if error.transient:
                    raise
                message = f"the API server rejected {kind}/{pool.name}: {error}"
                return _problem(generation, previous, now, "ApplyRejected", message)
            events.append(_change_event(kind, pool.name, differences, spec_changed))
        live_children[kind] = live
    stale = [kind for kind in CHILD_KINDS if rendered.child(kind) is None]
    events += await _delete_owned(pool, cluster, stale)

    slices = await cluster.list(
        "EndpointSlice", pool.namespace, f"{SERVICE_NAME_LABEL}={pool.name}"
    )
    deployment = live_children.get("Deployment")
    desired_replicas: int | None = None
    if deployment is not None:
        desired_replicas = int(deployment.get("spec", {}).get("replicas", pool.spec.replicas))
    observed = Observed(
        generation=generation,
        desired_replicas=desired_replicas,
        deployment=deployment,
        endpoints=ready_endpoint_urls(slices.items),
        engine_args=rendered.engine.argv,
        selector=selector_string(pool),
        autoscaled=pool.spec.autoscaling is not None,
    )
    conditions = list(serving_conditions(observed))
    reason, conflict = await _pool_set_problem(pool, cluster)
    if conflict:
        conditions = [
            Condition(type="Ready", status=False, reason=reason, message=conflict),
            conditions[1],
            Condition(type="Degraded", status=True, reason=reason, message=conflict),
        ]
    events += _transition_events(conditions, previous)
    return ReconcileOutcome(
        status=status_document(observed, conditions, previous, now), events=tuple(events)
    )


async def reconcile_upstream(namespace: str, cluster: Cluster, picker: PickerRef) -> list[str]:
    """Bring the namespace's upstream InferencePools (operator/upstream.py) in line with its
    laneway pools: apply what differs, delete the ones no pool serves any more. Returns
    what it changed, for the log. Where the upstream CRD is not installed, nothing.

    An upstream pool of the same name that laneway did not make is left alone."""
    try:
        live = await cluster.list(UPSTREAM_POOL, namespace, f"{_MANAGED_BY_LABEL}={MANAGED_BY}")
    except KubeError as error:
        if error.status == 404:
            return []  # no such resource: the Gateway API Inference Extension is not installed
        raise
    pools = []
    for document in (await cluster.list(KIND, namespace)).items:
        try:
            pools.append(parse_pool(document))
        except SpecError:
            continue  # each invalid pool reports itself
    ours = {str(obj["metadata"]["name"]): obj for obj in live.items}
    changes = []
    desired = upstream_pools(pools, picker)
    for manifest in desired:
        name = manifest["metadata"]["name"]
        current = ours.get(name)
        if current is None and await cluster.get(UPSTREAM_POOL, namespace, name) is not None:
            changes.append(
                f"left {UPSTREAM_POOL} {namespace}/{name} alone: laneway did not make it"
            )
            continue
        if current is None or drift(manifest, current):
            await cluster.apply(manifest)
            changes.append(f"applied {UPSTREAM_POOL} {namespace}/{name}")
    for name in sorted(ours.keys() - {m["metadata"]["name"] for m in desired}):
        await cluster.delete(UPSTREAM_POOL, namespace, name)
        changes.append(f"deleted {UPSTREAM_POOL} {namespace}/{name}: no pool serves its model")
    return changes


_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


async def _delete_owned(pool: InferencePool, cluster: Cluster, kinds: Sequence[str]) -> list[Event]:
    """Delete the pool's children of `kinds` that exist and that it owns."""
    events = []
    for kind in kinds:
        stale = await cluster.get(kind, pool.namespace, pool.name)
        if stale is not None and owned_by(stale, pool.uid):
            await cluster.delete(kind, pool.namespace, pool.name)
            events.append(
                Event(type="Normal", reason="Deleted", message=f"deleted {kind}/{pool.name}")
            )
    return events


async def _pool_set_problem(pool: InferencePool, cluster: Cluster) -> tuple[str, str]:
    """What this pool should resolve among its namespace's pools, if anything: its reason
    and message. A lending pool whose engine cannot serve its borrower's prompts is
    `LendingMismatch`; an overlap with another interactive pool is `RoutingConflict`, and
    of two overlapping pools the newer one is flagged, so the older keeps serving."""
    found = await cluster.list(KIND, pool.namespace)
    ordered = sorted(
        found.items,
        key=lambda d: (
            str(d.get("metadata", {}).get("creationTimestamp", "")),
            str(d.get("metadata", {}).get("name", "")),
        ),
    )
    pools = []
    for document in ordered:
        try:
            pools.append(parse_pool(document))
        except SpecError:
            continue  # each invalid pool reports itself
    errors = [e for e in check_pool_set(pools) if e.path.startswith(f"{pool.key}.")]
    lending = [e for e in errors if e.path.startswith(f"{pool.key}.spec.lending")]
    reason = "LendingMismatch" if lending else "RoutingConflict"
    return reason, "; ".join(e.message for e in lending or errors)


def _problem(
    generation: int, previous: Mapping[str, Any], now: str, reason: str, message: str
) -> ReconcileOutcome:
    conditions = problem_conditions(reason, message)
    return ReconcileOutcome(
        status=problem_status(generation, conditions, previous, now),
        events=tuple(_transition_events(conditions, previous)),
    )


def _change_event(kind: str, name: str, differences: Sequence[str], spec_changed: bool) -> Event:
    if not differences:
        return Event(type="Normal", reason="Created", message=f"created {kind}/{name}")
    fields = ", ".join(differences[:5]) + (" ..." if len(differences) > 5 else "")
    if spec_changed:
        return Event(
            type="Normal",
            reason="Updated",
            message=f"updated {kind}/{name} to the new spec ({fields})",
        )
    return Event(
        type="Warning",
        reason="Restored",
        message=f"put back {kind}/{name} after a manual edit ({fields})",
    )


def _transition_events(conditions: Sequence[Condition], previous: Mapping[str, Any]) -> list[Event]:
    """Events for what a person should see: the pool became ready, or went wrong."""
    before = {c.get("type"): c for c in previous.get("conditions") or ()}
    events = []
    for condition in conditions:
        old = before.get(condition.type) or {}
        status = "True" if condition.status else "False"
        if old.get("status") == status and old.get("reason") == condition.reason:
            continue
        if condition.type == "Ready" and condition.status:
            events.append(Event(type="Normal", reason="Ready", message=condition.message))
        elif condition.type == "Degraded" and condition.status:
            events.append(Event(type="Warning", reason=condition.reason, message=condition.message))
    return events
