"""Pure status computation: conditions from what the Deployment and endpoints show."""

from __future__ import annotations

from typing import Any

import pytest

from laneway.operator.status import (
    Condition,
    Observed,
    problem_conditions,
    serving_conditions,
    status_document,
)


def deployment(
    generation: int = 1,
    observed: int = 1,
    replicas: int = 2,
    updated: int = 2,
    available: int = 2,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "availableReplicas": available,
            "conditions": conditions or [],
        },
    }


def observe(
    desired: int | None, live: dict[str, Any] | None, ready: int, selector: str = "app=x"
) -> Observed:
    endpoints = tuple(f"http://10.0.0.{i}:8000" for i in range(ready))
    return Observed(
        generation=1,
        desired_replicas=desired,
        deployment=live,
        endpoints=endpoints,
        engine_args=("laneway", "sim"),
        selector=selector,
    )


def summary(conditions: tuple[Condition, ...]) -> list[tuple[str, bool, str]]:
    return [(c.type, c.status, c.reason) for c in conditions]


# (case, observed, [(type, status, reason)] for Ready, Progressing, Degraded)
TABLE: list[tuple[str, Observed, list[tuple[str, bool, str]]]] = [
    (
        "just created",
        observe(2, None, 0),
        [
            ("Ready", False, "NoReadyReplicas"),
            ("Progressing", True, "RollingOut"),
            ("Degraded", False, "AsExpected"),
        ],
    ),
    (
        "all ready",
        observe(2, deployment(), 2),
        [
            ("Ready", True, "EndpointsReady"),
            ("Progressing", False, "Complete"),
            ("Degraded", False, "AsExpected"),
        ],
    ),
    (
        "rolling: new generation not yet observed",
        observe(2, deployment(generation=2, observed=1), 2),
        [
            ("Ready", True, "EndpointsReady"),
            ("Progressing", True, "RollingOut"),
            ("Degraded", False, "AsExpected"),
        ],
    ),
    (
        "rollout done but one replica missing",
        observe(2, deployment(available=1), 1),
        [
            ("Ready", True, "EndpointsReady"),
            ("Progressing", True, "RollingOut"),
            ("Degraded", False, "AsExpected"),
        ],
    ),
    (
        "pods cannot be created",
        observe(
            2,
            deployment(
                updated=0,
                available=0,
                replicas=0,
                conditions=[
                    {
                        "type": "ReplicaFailure",
                        "status": "True",
                        "message": 'pods "x" is forbidden: exceeded quota',
                    }
                ],
            ),
            0,
        ),
        [
            ("Ready", False, "NoReadyReplicas"),
            ("Progressing", False, "Complete"),
            ("Degraded", True, "ReplicaFailure"),
        ],
    ),
    (
        "rollout stuck past its deadline",
        observe(
            2,
            deployment(
                available=0,
                conditions=[
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": 'ReplicaSet "x" has timed out progressing.',
                    }
                ],
            ),
            0,
        ),
        [
            ("Ready", False, "NoReadyReplicas"),
            ("Progressing", False, "Complete"),
            ("Degraded", True, "ProgressDeadlineExceeded"),
        ],
    ),
    (
        "scaled to zero",
        observe(0, deployment(replicas=0, updated=0, available=0), 0),
        [
            ("Ready", False, "ScaledToZero"),
            ("Progressing", False, "Complete"),
            ("Degraded", False, "AsExpected"),
        ],
    ),
    (
        "adopted pods ready",
        observe(None, None, 3),
        [
            ("Ready", True, "EndpointsReady"),
            ("Progressing", False, "Adopted"),
            ("Degraded", False, "Adopted"),
        ],
    ),
    (
        "no adopted pods match",
        observe(None, None, 0),
        [
            ("Ready", False, "NoReadyPods"),
            ("Progressing", False, "Adopted"),
            ("Degraded", False, "Adopted"),
        ],
    ),
]


@pytest.mark.parametrize(("case", "observed", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_conditions(case: str, observed: Observed, expected: list[tuple[str, bool, str]]) -> None:
    assert summary(serving_conditions(observed)) == expected, case


def test_the_deployments_own_explanation_reaches_the_message() -> None:
    failed = TABLE[4][1]
    degraded = serving_conditions(failed)[2]
    assert "exceeded quota" in degraded.message


def test_transition_time_kept_until_the_status_flips() -> None:
    observed = observe(2, deployment(), 2)
    conditions = serving_conditions(observed)
    first = status_document(observed, conditions, {}, "2026-11-29T10:00:00Z")
    again = status_document(observed, conditions, first, "2026-11-29T10:05:00Z")
    assert [c["lastTransitionTime"] for c in again["conditions"]] == ["2026-11-29T10:00:00Z"] * 3
    broken = problem_conditions("InvalidSpec", "fix it")
    later = status_document(observed, broken, again, "2026-11-29T10:09:00Z")
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times == {
        "Ready": "2026-11-29T10:09:00Z",  # True -> False
        "Progressing": "2026-11-29T10:00:00Z",  # False -> False
        "Degraded": "2026-11-29T10:09:00Z",  # False -> True
    }


def test_status_document_fields() -> None:
    observed = observe(3, deployment(replicas=3), 2, selector="laneway.io/pool=p")
    status = status_document(observed, serving_conditions(observed), {}, "t")
    assert status["observedGeneration"] == 1
    assert (status["replicas"], status["readyReplicas"], status["ready"]) == (3, 2, "2/3")
    assert status["selector"] == "laneway.io/pool=p"
    assert status["endpoints"] == ["http://10.0.0.0:8000", "http://10.0.0.1:8000"]
    assert status["engineArgs"] == ["laneway", "sim"]
