"""`laneway epp --kubernetes --watch-objectives`'s watch (gateway/epp/objectives_watch.py)
against a real API server serving the Gateway API Inference Extension's InferenceObjective
CRD (`inference.networking.x-k8s.io/v1alpha2`, written for the tests from its published
API): an objective there before the watch starts is listed, and ones applied, changed and
deleted after take effect. tests/test_epp_objectives_watch.py checks expiry, backoff and
invalid objectives against a scripted API server; this is the real one's paths, schema and
watch events."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.kube.cluster import Cluster

from laneway.gateway.epp.objectives_watch import WatchedObjectives
from laneway.kube.client import KubeApi

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TIMEOUT_S = 60.0


def objective(name: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "laneway-demo"}, "priority": priority},
    }


async def until(what: str, check: Callable[[], bool]) -> None:
    """Poll `check` while the watch runs on this loop (a bound for a loaded machine)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT_S:.0f} s waiting until {what}")
        await asyncio.sleep(0.1)


async def test_the_watch_follows_objectives_on_a_real_api_server(
    kube: Cluster, kube_namespace: str, objective_crd: str
) -> None:
    kube.apply([objective("interactive-chat", 5)], "-n", kube_namespace)
    api = KubeApi.from_environment(str(kube.kubeconfig))
    watched = WatchedObjectives(kube_namespace, api)
    task = asyncio.create_task(watched.run())
    try:
        await until(
            "the listed objective counts", lambda: watched.priority("interactive-chat") == 5
        )

        kube.apply([objective("batch-docs", -3)], "-n", kube_namespace)
        await until("an added objective counts", lambda: watched.priority("batch-docs") == -3)

        kube.apply([objective("interactive-chat", 9)], "-n", kube_namespace)
        await until("a changed priority counts", lambda: watched.priority("interactive-chat") == 9)

        kube.kubectl("delete", objective_crd, "batch-docs", "-n", kube_namespace, "--wait")
        await until(
            "a deleted objective is dropped",
            lambda: dict(watched.current.priorities) == {"interactive-chat": 9},
        )
        assert not task.done(), task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
