"""The operator's demand loop: the gateway's demand in, spec.replicas (through the scale
subresource), status.autoscaling, status.sloAttainment, the SloMet condition and Events out.

The pure step is tested case by case; the loop against the recording cluster, with the
demand read over HTTP from a real gateway holding a request for a pool at zero."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.fake_cluster import FakeCluster, pool_document

from laneway.api import KIND, InferencePool, parse_pool
from laneway.autoscale import DemandCount
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, QueueSettings
from laneway.gateway.keys import LEDGER, WAITERS
from laneway.gateway.pools.sources import PoolUpdate
from laneway.operator.autoscaler import (
    DemandUnavailable,
    gateway_demand,
    parse_demand,
    pool_step,
)
from laneway.operator.handlers import OperatorState, demand_pass
from laneway.operator.reconcile import reconcile
from laneway.operator.render import RenderOptions

NOW = "2026-11-30T12:00:00Z"
BATCH = {
    "lane": "batch",
    "model": "m",
    "engine": {"kind": "simulator"},
    "replicas": 0,
    "autoscaling": {"minReplicas": 0, "maxReplicas": 4, "scaleDownWindowSeconds": 60},
}
CHAT = {"lane": "interactive", "model": "m", "engine": {"kind": "simulator"}, "replicas": 2}


def body(name: str, spec: Mapping[str, Any], **status: Any) -> dict[str, Any]:
    document = pool_document(name, spec)
    document["metadata"]["generation"] = 1
    document["status"] = status
    return document


def test_demand_for_a_pool_at_zero_wakes_it_and_says_why() -> None:
    demand = {"serving/docs": DemandCount(queued_requests=1, queued_prompt_tokens=65_536)}
    step = pool_step(body("docs", BATCH), demand, "", (), 0.0, NOW)
    assert step is not None
    assert step.replicas == 1
    scaling = step.status["autoscaling"]
    assert scaling["desiredReplicas"] == 1
    assert scaling["lastScaleTime"] == NOW
    assert "scaling up 0 -> 1" in scaling["reason"]
    assert "promptTokens 65536" in scaling["reason"]
    assert [(e.reason, e.message) for e in step.events] == [("ScaledUp", scaling["reason"])]


def test_a_quiet_pool_goes_back_to_zero_only_after_its_down_window() -> None:
    quiet = {"serving/docs": DemandCount()}
    running = body("docs", {**BATCH, "replicas": 1})
    first = pool_step(running, quiet, "", (), 100.0, NOW)
    assert first is not None
    assert first.replicas is None
    assert "holding 1" in first.status["autoscaling"]["reason"]
    early = pool_step(running, quiet, "", first.history, 150.0, NOW)
    assert early is not None
    assert early.replicas is None
    late = pool_step(running, quiet, "", early.history, 161.0, NOW)
    assert late is not None
    assert late.replicas == 0
    assert [e.reason for e in late.events] == ["ScaledDown"]


def test_without_the_gateways_demand_the_replicas_stay_and_the_status_says_why() -> None:
    running = body("docs", {**BATCH, "replicas": 3})
    step = pool_step(running, None, "no demand from the gateway: refused", (), 0.0, NOW)
    assert step is not None
    assert step.replicas is None
    assert not step.events
    assert step.status["autoscaling"]["reason"] == (
        "holding 3: no demand from the gateway: refused"
    )
    assert "sloAttainment" not in step.status

    unknown = pool_step(running, {"serving/other": DemandCount()}, "", (), 0.0, NOW)
    assert unknown is not None
    assert unknown.replicas is None
    assert "routes no requests to this pool" in unknown.status["autoscaling"]["reason"]


@pytest.mark.parametrize(
    ("met", "missed", "status", "reason", "attainment"),
    [
        (995, 5, "True", "WithinSlo", "99.5%"),
        (90, 10, "False", "SloMissed", "90.0%"),  # below the interactive floor of 99 %
        (0, 0, "True", "NoRecentStreams", "n/a"),  # nothing measured is no verdict
    ],
)
def test_slo_attainment_and_the_slo_met_condition(
    met: int, missed: int, status: str, reason: str, attainment: str
) -> None:
    demand = {"serving/chat": DemandCount(ttft_met=met, ttft_missed=missed)}
    previous = [{"type": "Ready", "status": "True", "reason": "EndpointsReady"}]
    step = pool_step(body("chat", CHAT, conditions=previous), demand, "", (), 0.0, NOW)
    assert step is not None
    assert step.replicas is None
    assert step.status["sloAttainment"] == attainment
    ready, slo = step.status["conditions"]
    assert ready == previous[0]  # others' conditions untouched
    assert (slo["type"], slo["status"], slo["reason"]) == ("SloMet", status, reason)
    if status == "False":
        assert "90.0% of the last 100 streams" in slo["message"]
        assert "300 ms" in slo["message"]
        assert "add replicas" in slo["message"]


def test_a_batch_lane_has_no_slo_verdict_unless_it_sets_a_floor() -> None:
    demand = {"serving/docs": DemandCount(ttft_met=1, ttft_missed=9)}
    plain = pool_step(body("docs", BATCH), demand, "", (), 0.0, NOW)
    assert plain is not None
    assert "conditions" not in plain.status
    scaling = {"minReplicas": 0, "maxReplicas": 4, "minSloAttainment": 0.5}
    floored = {**BATCH, "autoscaling": scaling}
    judged = pool_step(body("docs", floored), demand, "", (), 0.0, NOW)
    assert judged is not None
    assert judged.status["conditions"][-1]["reason"] == "SloMissed"
    assert "the autoscaler adds replicas" in judged.status["conditions"][-1]["message"]


def test_demand_documents_are_checked() -> None:
    good = {"pools": {"a/b": {"queuedRequests": 2, "ttftMet": 1}}}
    assert parse_demand(good, "gw") == {"a/b": DemandCount(queued_requests=2, ttft_met=1)}
    for bad, says in [
        ([], "without a 'pools' object"),
        ({"pools": {"a/b": {"queuedRequests": -1}}}, "queuedRequests must be a count"),
        ({"pools": {"a/b": "x"}}, "must be an object"),
    ]:
        with pytest.raises(DemandUnavailable, match=says):
            parse_demand(bad, "gw")


class OneSet:
    def __init__(self, pools: Sequence[InferencePool]) -> None:
        self._pools = pools

    async def run(self, update: PoolUpdate) -> None:
        update(self._pools)


async def test_the_loop_scales_a_pool_at_zero_on_a_real_gateways_demand() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("docs", BATCH))
    cluster.create(pool_document("chat", CHAT))
    state = OperatorState(cluster=cluster, options=RenderOptions())
    for name in ("docs", "chat"):
        outcome = await reconcile(cluster.pool("serving", name), cluster, state.options, NOW)
        await cluster.patch_status(KIND, "serving", name, outcome.status)
    zero = cluster.pool("serving", "docs")["status"]["conditions"][0]
    assert (zero["reason"], "wakes it" in zero["message"]) == ("ScaledToZero", True)

    pools = [parse_pool({**cluster.pool("serving", n), "status": {}}) for n in ("docs", "chat")]
    gateway = create_app(GatewaySettings(queue=QueueSettings(timeout_millis=60_000)), OneSet(pools))
    async with TestClient(TestServer(gateway)) as client, aiohttp.ClientSession() as session:
        waiting = asyncio.create_task(
            client.post(
                "/v1/completions",
                json={"model": "m", "prompt": "a document " * 300, "max_tokens": 2},
                headers={"x-laneway-lane": "batch"},
            )
        )
        fetch = gateway_demand(session, str(client.make_url("/")))
        async with asyncio.timeout(30):
            while not (await fetch()).get("serving/docs"):  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.02)
            while (await fetch())["serving/docs"].queued_requests != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        cluster.calls.clear()
        await demand_pass(state, fetch, now_s=0.0)
        # What shutdown does: the waiting request is answered.
        gateway[WAITERS].wake(gateway[LEDGER].drain())
        assert (await waiting).status == 503

    docs = cluster.pool("serving", "docs")
    assert docs["spec"]["replicas"] == 1
    assert docs["metadata"]["generation"] == 2  # the Deployment follows on the next pass
    assert "scaling up 0 -> 1" in docs["status"]["autoscaling"]["reason"]
    (event,) = [obj for (kind, _, _), obj in cluster.objects.items() if kind == "Event"]
    assert (event["reason"], event["message"]) == (
        "ScaledUp",
        docs["status"]["autoscaling"]["reason"],
    )
    assert event["involvedObject"]["uid"] == docs["metadata"]["uid"]
    scaled = [c for c in cluster.writes() if c.resource == "inferencepools/scale"]
    assert len(scaled) == 1  # the chat pool, without autoscaling, was not scaled
    chat = cluster.pool("serving", "chat")
    assert chat["status"]["sloAttainment"] == "n/a"
    assert chat["status"]["conditions"][-1]["type"] == "SloMet"

    # The next reconcile keeps what the loop wrote, and writes nothing when nothing changed.
    for name in ("docs", "chat"):
        before = cluster.pool("serving", name)["status"]
        outcome = await reconcile(cluster.pool("serving", name), cluster, state.options, NOW)
        for key in ("autoscaling", "sloAttainment"):
            assert outcome.status.get(key) == before.get(key)
        assert [c["type"] for c in outcome.status["conditions"]][: len(before["conditions"])] == [
            c["type"] for c in before["conditions"]
        ]
    chat_status = cluster.pool("serving", "chat")["status"]
    again = await reconcile(cluster.pool("serving", "chat"), cluster, state.options, NOW)
    assert again.status == chat_status


async def test_the_loop_holds_when_the_gateway_cannot_be_read() -> None:
    cluster = FakeCluster()
    cluster.create(pool_document("docs", {**BATCH, "replicas": 2}))
    state = OperatorState(cluster=cluster, options=RenderOptions())
    async with aiohttp.ClientSession() as session:
        # Port 9 (discard) refuses connections on loopback.
        await demand_pass(state, gateway_demand(session, "http://127.0.0.1:9"), now_s=0.0)
    docs = cluster.pool("serving", "docs")
    assert docs["spec"]["replicas"] == 2
    assert docs["status"]["autoscaling"]["reason"].startswith(
        "holding 2: no demand from the gateway: cannot read http://127.0.0.1:9/laneway/demand"
    )
