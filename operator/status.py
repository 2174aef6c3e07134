"""Pure computation of an InferencePool's status and conditions from what the cluster shows.

Conditions follow the Kubernetes conventions: `Ready` (the pool can serve), `Progressing`
(a rollout is under way) and `Degraded` (it should serve more than it does). Each carries a
CamelCase reason and a message for a person, saying what to change where something is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the operator saw of a pool's children after reconciling it."""

    generation: int
    desired_replicas: int | None  # None: adopted pods (selector mode), no count to meet
    deployment: Mapping[str, Any] | None  # the live Deployment, None when absent
    endpoints: tuple[str, ...]  # ready engine base URLs
    engine_args: tuple[str, ...]
    selector: str
    autoscaled: bool = False  # spec.autoscaling is set: the operator moves spec.replicas


def problem_conditions(reason: str, message: str) -> tuple[Condition, ...]:
    """A pool that cannot work as written: not ready, not progressing, degraded."""
    return (
        Condition(type="Ready", status=False, reason=reason, message=message),
        Condition(
            type="Progressing",
            status=False,
            reason=reason,
            message="nothing rolls out until this is fixed",
        ),
        Condition(type="Degraded", status=True, reason=reason, message=message),
    )


def serving_conditions(observed: Observed) -> tuple[Condition, ...]:
    ready = len(observed.endpoints)
    if observed.desired_replicas is None:
        if ready:
            readiness = Condition(
                type="Ready",
                status=True,
                reason="EndpointsReady",
                message=f"{ready} adopted pods ready",
            )
        else:
            readiness = Condition(
                type="Ready",
                status=False,
                reason="NoReadyPods",
                message=f"no ready pods match spec.selector ({observed.selector}): label the "
                "engine pods or fix spec.selector.matchLabels",
            )
        return (
            readiness,
            Condition(
                type="Progressing",
                status=False,
                reason="Adopted",
                message="pods are managed outside laneway",
            ),
            Condition(
                type="Degraded",
                status=False,
                reason="Adopted",
                message="pods are managed outside laneway",
            ),
        )

    desired = observed.desired_replicas
    rollout = _rollout(observed.deployment, desired)
    if desired == 0:
        zero = (
            "scaled to zero for want of demand: the gateway holds this pool's requests in "
            "line, and the operator wakes it when they arrive"
            if observed.autoscaled
            else "spec.replicas is 0: raise it to serve requests"
        )
        readiness = Condition(type="Ready", status=False, reason="ScaledToZero", message=zero)
    elif ready:
        readiness = Condition(
            type="Ready",
            status=True,
            reason="EndpointsReady",
            message=f"{ready}/{desired} replicas ready",
        )
    else:
        readiness = Condition(
            type="Ready",
            status=False,
            reason="NoReadyReplicas",
            message=f"0/{desired} replicas ready" + rollout.detail,
        )
    progressing = Condition(
        type="Progressing",
        status=rollout.in_progress,
        reason="RollingOut" if rollout.in_progress else "Complete",
        message=rollout.summary,
    )
    short = ready < desired and not rollout.in_progress
    if rollout.failure:
        degraded = Condition(
            type="Degraded",
            status=True,
            reason=rollout.failure,
            message=rollout.summary + rollout.detail,
        )
    elif short:
        degraded = Condition(
            type="Degraded",
            status=True,
            reason="ReplicasUnavailable",
            message=f"{ready}/{desired} replicas ready after the rollout finished" + rollout.detail,
        )
    else:
        degraded = Condition(
            type="Degraded",
            status=False,
            reason="AsExpected",
            message=f"{ready}/{desired} replicas ready",
        )
    return readiness, progressing, degraded


@dataclass(frozen=True)
class _Rollout:
    in_progress: bool
    summary: str
    detail: str  # the Deployment's own explanation, e.g. why pods cannot be scheduled
    failure: str  # a Degraded reason when the rollout failed, else ""


def _rollout(deployment: Mapping[str, Any] | None, desired: int) -> _Rollout:
    if deployment is None:
        return _Rollout(
            in_progress=True, summary="creating the engine Deployment", detail="", failure=""
        )
    status = deployment.get("status") or {}
    generation = deployment.get("metadata", {}).get("generation", 0)
    updated = int(status.get("updatedReplicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    total = int(status.get("replicas") or 0)
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    detail = ""
    for kind in ("ReplicaFailure", "Progressing", "Available"):
        condition = conditions.get(kind)
        if condition and condition.get("status") != "True" and condition.get("message"):
            detail = f": {condition['message']}"
            break
    failure = ""
    if conditions.get("ReplicaFailure", {}).get("status") == "True":
        failure = "ReplicaFailure"
        detail = f": {conditions['ReplicaFailure'].get('message', '')}"
    elif conditions.get("Progressing", {}).get("reason") == "ProgressDeadlineExceeded":
        failure = "ProgressDeadlineExceeded"
    seen = int(status.get("observedGeneration") or 0) >= int(generation or 0)
    in_progress = not failure and (
        not seen or updated < desired or total > updated or available < updated
    )
    summary = f"{updated}/{desired} replicas updated, {available} available"
    return _Rollout(in_progress=in_progress, summary=summary, detail=detail, failure=failure)


def status_document(
    observed: Observed,
    conditions: Sequence[Condition],
    previous: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """The `status` to write. `now` is an RFC 3339 time; a condition keeps its previous
    lastTransitionTime unless its status flipped."""
    ready = len(observed.endpoints)
    desired = observed.desired_replicas
    deployment_status = (observed.deployment or {}).get("status") or {}
    return {
        "observedGeneration": observed.generation,
        "replicas": int(deployment_status.get("replicas") or 0) if desired is not None else ready,
        "readyReplicas": ready,
        "ready": f"{ready}/{desired if desired is not None else ready}",
        "selector": observed.selector,
        "endpoints": list(observed.endpoints),
        "engineArgs": list(observed.engine_args),
        "conditions": _conditions(conditions, previous, observed.generation, now),
        # Written by the demand loop (operator/autoscaler.py); kept so a pass that changes
        # nothing else writes nothing.
        **{key: previous[key] for key in DEMAND_KEYS if key in previous},
    }


DEMAND_KEYS = ("sloAttainment", "autoscaling")


def with_condition(
    previous: Mapping[str, Any], condition: Condition, generation: int, now: str
) -> list[dict[str, Any]]:
    """The status's conditions with `condition` set, the others unchanged."""
    return _conditions([condition], previous, generation, now)


def _conditions(
    conditions: Sequence[Condition], previous: Mapping[str, Any], generation: int, now: str
) -> list[dict[str, Any]]:
    """`conditions` rendered in the previous order, new types last; previous ones of other
    types (SloMet, which the demand loop writes) kept as they were."""
    earlier = [dict(c) for c in previous.get("conditions") or ()]
    before = {c.get("type"): c for c in earlier}
    fresh = {}
    for condition in conditions:
        status = "True" if condition.status else "False"
        old = before.get(condition.type) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        fresh[condition.type] = {
            "type": condition.type,
            "status": status,
            "reason": condition.reason,
            "message": condition.message,
            "observedGeneration": generation,
            "lastTransitionTime": since or now,
        }
    kept = [fresh.pop(str(c.get("type")), c) for c in earlier]
    return kept + list(fresh.values())


def problem_status(
    generation: int, conditions: Sequence[Condition], previous: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """The `status` of a pool that cannot work: conditions only, the rest left as it was."""
    return {
        "observedGeneration": generation,
        "conditions": _conditions(conditions, previous, generation, now),
    }
