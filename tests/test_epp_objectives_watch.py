"""`laneway epp --kubernetes --watch-objectives`: the cluster's InferenceObjectives, listed
and watched on a scripted API server over loopback (support/apiserver.py, as
test_discovery_watch.py drives the pool discovery), an objective applied, changed and
deleted without a restart, an invalid one left out, an expired watch listed again, a
cluster without the CRD retried, every request one the gateway's RBAC grants; and the
flags' rules."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apiserver import FakeApiServer
from support.client import eventually
from support.pools import gateway_doc, pool_doc
from support.rbac import granted_rules, rbac_call

from laneway.bench.harness.envoy import free_port
from laneway.bench.harness.procs import Children
from laneway.errors import UsageError
from laneway.gateway.config import load_config
from laneway.gateway.epp.cli import PickerOptions, picker_app, serve, watched_objectives
from laneway.gateway.epp.objectives import from_cluster
from laneway.gateway.epp.objectives_watch import WatchedObjectives
from laneway.gateway.pools.discovery import Backoff, Retry
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.kube.client import KubeApi

OBJECTIVES = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/serving/inferenceobjectives"
WAIT = 60.0  # patience on a loaded machine, not a budget


def objective(name: str, priority: Any = None, namespace: str = "serving") -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": "chat"}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


class Harness:
    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.api = KubeApi(server.url, authorization=lambda: "Bearer test-token")
        self.delays: list[float] = []

        async def sleep(delay: float) -> None:
            self.delays.append(delay)
            await asyncio.sleep(0.01)

        retry = Retry(backoff=Backoff(initial=0.1, maximum=0.8), rng=random.Random(7), sleep=sleep)
        self.watched = WatchedObjectives("serving", api=self.api, retry=retry)

    async def until(self, priorities: dict[str, int]) -> None:
        async def settled() -> bool:
            return dict(self.watched.current.priorities) == priorities

        await eventually(settled, f"the objectives {priorities}", WAIT)

    async def until_watching(self) -> None:
        await asyncio.wait_for(self.server.until_watched(OBJECTIVES), WAIT)


@pytest.fixture
async def harness(fake_apiserver: FakeApiServer) -> AsyncIterator[Harness]:
    fake_apiserver.put(OBJECTIVES, objective("premium", 5))
    fake_apiserver.put(OBJECTIVES, objective("plain"))
    running = Harness(fake_apiserver)
    task = asyncio.create_task(running.watched.run())
    yield running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await running.api.close()


async def test_objectives_are_applied_changed_and_deleted_without_a_restart(
    harness: Harness,
) -> None:
    await harness.until({"premium": 5, "plain": 0})
    assert harness.watched.priority("premium") == 5
    assert harness.watched.priority("unknown") == 0
    await harness.until_watching()
    harness.server.put(OBJECTIVES, objective("best-effort", -2), "ADDED")
    await harness.until({"premium": 5, "plain": 0, "best-effort": -2})
    harness.server.put(OBJECTIVES, objective("premium", 8), "MODIFIED")
    await harness.until({"premium": 8, "plain": 0, "best-effort": -2})
    harness.server.delete(OBJECTIVES, "plain")
    await harness.until({"premium": 8, "best-effort": -2})
    assert harness.watched.priority("plain") == 0


async def test_an_invalid_objective_is_left_out_and_the_rest_served(harness: Harness) -> None:
    await harness.until({"premium": 5, "plain": 0})
    await harness.until_watching()
    harness.server.put(OBJECTIVES, objective("broken", "high"), "ADDED")
    harness.server.put(OBJECTIVES, objective("fine", 1), "ADDED")
    await harness.until({"premium": 5, "plain": 0, "fine": 1})


async def test_an_expired_watch_lists_again(harness: Harness) -> None:
    await harness.until({"premium": 5, "plain": 0})
    await harness.until_watching()
    harness.server.put(OBJECTIVES, objective("missed", 3))  # no event for it
    harness.server.compact()
    harness.server.expire_watches(OBJECTIVES)
    await harness.until({"premium": 5, "plain": 0, "missed": 3})


async def test_every_request_is_granted_by_the_gateway_rbac(harness: Harness) -> None:
    await harness.until({"premium": 5, "plain": 0})
    await harness.until_watching()
    granted = granted_rules("gateway")
    for request in harness.server.requests:
        assert request.method == "GET"
        assert rbac_call(request) in granted, request
        assert request.headers["Authorization"] == "Bearer test-token"


async def test_a_cluster_without_the_crd_is_retried_with_none_in_force(
    fake_apiserver: FakeApiServer,
) -> None:
    running = Harness(fake_apiserver)  # nothing served at OBJECTIVES: 404
    task = asyncio.create_task(running.watched.run())
    try:

        async def retried() -> bool:
            return len(running.delays) >= 3

        await eventually(retried, "three retries", WAIT)
        assert running.watched.priority("premium") == 0
        # Backing off: the first three delays double (later ones sit at the maximum).
        assert running.delays[:3] == sorted(running.delays[:3])
        # The CRD and an objective arrive: the next list finds it.
        fake_apiserver.put(OBJECTIVES, objective("premium", 5))
        await running.until({"premium": 5})
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await running.api.close()


def test_one_name_in_several_namespaces_counts_at_its_lowest_priority() -> None:
    seen = {
        "a/premium": objective("premium", 5, "a"),
        "b/premium": objective("premium", 2, "b"),
        "b/bad": objective("bad", 1.5, "b"),
    }
    objectives, rejected = from_cluster(seen)
    assert dict(objectives.priorities) == {"premium": 2}
    assert list(rejected) == ["b/bad"]
    assert "spec.priority must be an integer" in rejected["b/bad"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"kubernetes": False}, "--watch-objectives needs --kubernetes"),
        ({"objectives": "objectives.yaml"}, "--objectives FILE or --watch-objectives, not both"),
    ],
)
def test_the_flags_rules(flags: dict[str, Any], message: str) -> None:
    given = {"watch_objectives": True, "kubernetes": True, "objectives": None,
             "namespace": "serving", "all_namespaces": False, **flags}  # fmt: skip
    with pytest.raises(UsageError, match=message):
        watched_objectives(argparse.Namespace(**given))
    fine = {**given, **{"kubernetes": True, "objectives": None}}
    watched = watched_objectives(argparse.Namespace(**fine))
    assert watched is not None
    assert watched.namespace == "serving"


@pytest.fixture
def children() -> Iterator[Children]:
    with Children(stop_grace=10) as started:
        yield started


async def test_laneway_epp_watches_the_objectives_while_it_serves(
    children: Children, tmp_path: Path, fake_apiserver: FakeApiServer
) -> None:
    """The flag reaches the running picker: beside its pools, it watches InferenceObjectives
    with its own credentials."""
    fake_apiserver.put(OBJECTIVES, objective("premium", 5))
    kubeconfig = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig, token="picker-token")
    args = ["--kubernetes", "--namespace", "serving", "--watch-objectives", "--host", "127.0.0.1",
            "--port", str(free_port()), "--metrics-port", str(free_port())]  # fmt: skip
    await children.start_laneway_async("epp", args, env={"KUBECONFIG": str(kubeconfig)})
    await asyncio.wait_for(fake_apiserver.until_watched(OBJECTIVES), WAIT)
    listed = [r for r in fake_apiserver.requests if r.path == OBJECTIVES]
    assert listed[0].headers["Authorization"] == "Bearer picker-token"


class FailingWatch(WatchedObjectives):
    async def run(self) -> None:
        raise RuntimeError("the watch broke")


async def test_a_watch_that_dies_stops_the_picker_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kubernetes errors are retried inside the watch; one that ends anyway must not leave
    the picker serving objectives that no longer follow the cluster."""
    config = tmp_path / "pools.yaml"
    config.write_text(yaml.safe_dump_all([pool_doc("chat", "interactive", "m", []), gateway_doc()]))
    loaded = load_config(config)
    app = picker_app(loaded.settings, StaticPoolSource(loaded.pools), None)
    watched = FailingWatch("serving")
    exit_code = await asyncio.wait_for(
        serve(app, "127.0.0.1", 0, 0, PickerOptions(objectives=watched, watched=watched)), WAIT
    )
    assert exit_code == 1
    assert "the InferenceObjectives watch failed: RuntimeError: the watch broke" in (
        capsys.readouterr().err
    )
