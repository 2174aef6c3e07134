"""What reaches the engine of a request's body: the allowed fields only, no engine-control
field (refused with 400 naming it), and a `priority` the gateway sets from the tenant and
the lane, which a client may only lower (a larger value), in each engine's direction.

A recording engine (it keeps every body it gets) behind a priority-scheduled pool, a real
`laneway sim` behind an fcfs one, in-process gateways with two tenants' keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from support.engines import engine_app
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc, simulated_pool

from laneway.api import Lane
from laneway.gateway.serving.engine_body import ENGINE_CONTROL, engine_body
from laneway.routing.priority import engine_priority, gateway_level

TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
  - name: beta
    apiKeys: [sk-beta]
    priority: 5
"""


class Recorded:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def generate(self, request: web.Request) -> web.Response:
        self.bodies.append(orjson.loads(await request.read()))
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        return web.json_response(answer)


@pytest.fixture
async def gateway(servers: Servers, tmp_path: Path) -> AsyncIterator[tuple[Served, Recorded]]:
    recorded = Recorded()
    runner = web.AppRunner(engine_app(recorded.generate))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        sim = await servers.sim("fcfs-served", "--time-scale", "20")
        ordered = pool_doc("ordered", "interactive", "served", [url], {"models": ["ordered"]})
        ordered["spec"]["scheduling"] = {"policy": "priority"}
        fcfs = pool_doc("fcfs", "interactive", "fcfs-served", [sim.url], {"models": ["fcfs"]})
        (tmp_path / "tenants.yaml").write_text(TENANTS)
        served = await servers.gateway(
            tmp_path / "gateway.yaml",
            [ordered, fcfs, gateway_doc()],
            "--tenants",
            str(tmp_path / "tenants.yaml"),
        )
        yield served, recorded
    finally:
        await runner.cleanup()


async def post(
    gateway: Served, key: str, lane: str | None = None, /, **fields: Any
) -> tuple[int, dict[str, Any]]:
    """A chat completion with `key`, asking for `lane` (x-laneway-lane) where given."""
    body = {"model": "ordered", "messages": [{"role": "user", "content": "hi"}], **fields}
    headers = {"Authorization": f"Bearer {key}"}
    if lane is not None:
        headers["x-laneway-lane"] = lane
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_client_may_lower_its_priority_never_raise_it(
    gateway: tuple[Served, Recorded],
) -> None:
    served, recorded = gateway
    # -1000 would jump every other tenant's queued requests at the engine: the tenant's
    # level (0) is sent instead. A later place (3) is the client's to ask for.
    for asked, sent in ((-1000, 0), (3, 3), (None, 0)):
        fields = {} if asked is None else {"priority": asked}
        status, _ = await post(served, "sk-acme", **fields)
        assert status == 200
        assert recorded.bodies[-1]["priority"] == sent
    # beta's tenants entry sets level 5: that is its floor.
    assert (await post(served, "sk-beta", priority=1))[0] == 200
    assert recorded.bodies[-1]["priority"] == 5


async def test_asking_for_the_batch_lane_lowers_the_level_where_the_pin_is_not_honoured(
    gateway: tuple[Served, Recorded],
) -> None:
    served, recorded = gateway
    # The interactive pool cannot take a batch pin (the Batches dispatcher's header), yet the
    # request asked for a later place: the batch level, one behind the tenant's chat. Asking
    # for the interactive lane raises nothing, and a client's own later place still holds.
    for lane, asked, sent in (("batch", None, 1), ("interactive", None, 0), ("batch", 4, 4)):
        fields = {} if asked is None else {"priority": asked}
        status, _ = await post(served, "sk-acme", lane, **fields)
        assert status == 200
        assert recorded.bodies[-1]["priority"] == sent
    assert (await post(served, "sk-beta", "batch"))[0] == 200
    assert recorded.bodies[-1]["priority"] == 6  # beta's 5, plus the batch class's 1


async def test_unknown_fields_are_dropped_and_sampling_ones_kept(
    gateway: tuple[Served, Recorded],
) -> None:
    served, recorded = gateway
    status, _ = await post(served, "sk-acme", top_k=5, temperature=0.5, x_custom={"a": 1})
    assert status == 200
    body = recorded.bodies[-1]
    assert body["model"] == "served"
    assert (body["top_k"], body["temperature"]) == (5, 0.5)
    assert "x_custom" not in body


@pytest.mark.parametrize(
    "field", ["kv_transfer_params", "bootstrap_room", "data_parallel_rank", "cache_salt"]
)
async def test_engine_control_fields_are_refused_naming_the_field(
    gateway: tuple[Served, Recorded], field: str
) -> None:
    served, recorded = gateway
    status, error = await post(served, "sk-acme", **{field: {"remote_host": "10.0.0.9"}})
    assert status == 400
    assert error["error"]["param"] == field
    assert f"'{field}' controls the engine" in error["error"]["message"]
    assert recorded.bodies == []  # nothing reached the engine


async def test_an_fcfs_pool_gets_no_priority(gateway: tuple[Served, Recorded]) -> None:
    served, _ = gateway
    # The simulator refuses a non-zero priority on fcfs as vLLM does (400): dropped, it runs.
    status, answer = await post(served, "sk-acme", model="fcfs", priority=7, max_tokens=2)
    assert status == 200, answer


@pytest.mark.parametrize(
    ("case", "tenant", "lane", "asked", "level"),
    [
        ("the tenant's level", 0, Lane.INTERACTIVE, None, 0),
        ("batch goes behind the same tenant's interactive work", 0, Lane.BATCH, None, 1),
        ("an earlier place asked for is refused", 2, Lane.INTERACTIVE, -5, 2),
        ("a later place asked for is kept", 2, Lane.INTERACTIVE, 9, 9),
    ],
)
def test_the_gateway_level(
    case: str, tenant: int, lane: Lane, asked: int | None, level: int
) -> None:
    assert gateway_level(tenant, lane, asked) == level


@pytest.mark.parametrize(
    ("case", "engine", "selector", "sent"),
    [
        ("vLLM runs lower values first", "vllm", None, 3),
        ("SGLang as laneway renders it (low values first)", "sglang", None, 3),
        ("adopted SGLang pods keep SGLang's default: higher first", "sglang", {"app": "x"}, -3),
    ],
)
def test_each_engine_gets_the_level_in_its_own_direction(
    case: str, engine: str, selector: dict[str, str] | None, sent: int
) -> None:
    spec: dict[str, Any] = {"engine": {"kind": engine}, "scheduling": {"policy": "priority"}}
    if selector is not None:
        spec["selector"] = {"matchLabels": selector}
    assert engine_priority(simulated_pool("p", ["http://a"], **spec), 3) == sent
    fcfs = simulated_pool("p", ["http://a"], engine={"kind": engine})
    assert engine_priority(fcfs, 3) is None


def test_a_body_with_nothing_to_change_is_forwarded_as_sent() -> None:
    body = b'{"model":"m","messages":[],"priority":0}'
    payload = orjson.loads(body)
    assert engine_body(payload, "/v1/chat/completions", body, "m", 0) is body
    assert orjson.loads(engine_body(payload, "/v1/chat/completions", body, "m", None)) == {
        "model": "m",
        "messages": [],
    }
    assert "kv_transfer_params" in ENGINE_CONTROL


def test_a_response_keeps_its_own_fields_and_loses_unknown_ones() -> None:
    payload = {
        "model": "public",
        "input": "hi",
        "instructions": "be brief",
        "previous_response_id": "resp_1",
        "store": True,
        "max_output_tokens": 8,
        "top_k": 4,
        "for_another_service": 1,
    }
    body = orjson.dumps(payload)
    sent = orjson.loads(engine_body(payload, "/v1/responses", body, "served", None))
    assert sent == {k: v for k, v in payload.items() if k != "for_another_service"} | {
        "model": "served"
    }
