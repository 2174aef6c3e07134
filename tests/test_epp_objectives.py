"""InferenceObjectives behind Envoy: `laneway epp --objectives` reads the ecosystem's
InferenceObjective documents, and the objective a request names moves its priority at a
priority-scheduled pool (higher earlier). In-process picker over loopback gRPC, the test in
Envoy's place (support/epp.py), `laneway sim` engines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.epp import Exchange, Picker, chat, request_body, request_headers, start_picker
from support.inproc import Servers

from laneway.errors import UsageError
from laneway.gateway.epp.objectives import load_objectives

OBJECTIVES = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: premium}
spec: {priority: 5, poolRef: {name: chat}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: best-effort}
spec: {priority: -2, poolRef: {name: chat}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: plain}
spec: {poolRef: {name: chat}}
"""


@pytest.fixture
async def engines(servers: Servers) -> tuple[str, str, str]:
    a, b, long = [await servers.sim("llama-small", "--time-scale", "20") for _ in range(3)]
    return a.url, b.url, long.url


@pytest.fixture
async def picker(tmp_path: Path, engines: tuple[str, str, str]) -> AsyncIterator[Picker]:
    path = tmp_path / "objectives.yaml"
    path.write_text(OBJECTIVES)
    async for started in start_picker(
        tmp_path,
        engines,
        objectives=load_objectives(path),
        chat_scheduling={"policy": "priority"},
    ):
        yield started


async def forwarded(picker: Picker, headers: dict[str, str]) -> dict[str, Any]:
    exchange = Exchange(picker)
    exchange.send(request_headers(extra=headers), request_body(chat(max_tokens=4)))
    assert (await exchange.read()).HasField("request_headers")
    body = (await exchange.read()).request_body.response.body_mutation.streamed_response.body
    await exchange.close()
    return dict(json.loads(body))


@pytest.mark.parametrize(
    ("headers", "priority"),
    [
        ({"x-gateway-inference-objective": "premium"}, -5),  # vLLM: lower earlier
        ({"x-llm-d-inference-objective": "best-effort"}, 2),
        ({"x-gateway-inference-objective": "plain"}, 0),
        ({"x-gateway-inference-objective": "unknown"}, 0),
        ({}, 0),
    ],
)
async def test_the_objectives_priority_goes_to_the_engine(
    picker: Picker, headers: dict[str, str], priority: int
) -> None:
    assert (await forwarded(picker, headers))["priority"] == priority


async def test_a_client_may_still_ask_for_a_later_place_only(picker: Picker) -> None:
    # As at the gateway: a client's own priority can only lower its place.
    exchange = Exchange(picker)
    body = chat(max_tokens=4, priority=-50)
    headers = {"x-gateway-inference-objective": "premium"}
    exchange.send(request_headers(extra=headers), request_body(body))
    await exchange.read()
    sent = (await exchange.read()).request_body.response.body_mutation.streamed_response.body
    await exchange.close()
    assert json.loads(sent)["priority"] == -5


FIRST = OBJECTIVES.split("---")[0]
HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: InferencePool\napiVersion: v1\n", "must be a InferenceObjective"),
        (FIRST + "---" + FIRST, "'premium' is defined twice"),
        (FIRST.replace("priority: 5", "priority: high"), "spec.priority must be an integer"),
        (HEAD + "metadata: {}\n", "metadata.name"),
        ("{}\n", "must be a InferenceObjective"),  # an empty mapping is no objective
    ],
)
def test_bad_objectives_are_usage_errors_naming_the_document(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_objectives(path)
