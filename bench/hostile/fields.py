"""The body-field cases of `laneway bench hostile` (issue 29): fields a tenant sends to steer
the engine rather than its own request.

- Engine-control fields (`kv_transfer_params` and the rest of
  `laneway.gateway.serving.engine_body.ENGINE_CONTROL`): each must be refused with a 400
  that names it.
- `"priority": -1000` from one tenant while another's request waits on the same
  priority-scheduled engine (a `laneway sim --scheduling-policy priority` with one seat):
  the gateway sets the level from the tenant, so the hostile request must queue behind the
  one that waited first, not jump it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from laneway.bench.chaos.fleet import metric_samples, sum_of
from laneway.gateway.serving.engine_body import ENGINE_CONTROL

ORDERED_MODEL = "ordered"  # the model of the bench's priority-scheduled pool
HOSTILE_PRIORITY = -1000
# The seat holder's tokens: long enough that two requests queue behind it on a loaded
# machine, short enough to finish in a few seconds at the simulator's decode pace.
HOLDER_TOKENS = 600


@dataclass(frozen=True)
class PriorityRun:
    order: tuple[str, ...]  # tenants in the order their queued requests finished
    statuses: dict[str, int]  # tenant -> its queued request's answer status


async def engine_control_cases(
    session: aiohttp.ClientSession, url: str, auth: dict[str, str], model: str
) -> dict[str, str]:
    """Field -> the answer's status, suffixed when a 400 does not name the field."""
    found: dict[str, str] = {}
    for field in sorted(ENGINE_CONTROL):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], field: "x"}
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=auth) as reply:
            answer = await reply.json(content_type=None)
        error = answer.get("error") or {} if isinstance(answer, dict) else {}
        named = error.get("param") == field and field in str(error.get("message"))
        found[f"body field {field}"] = str(reply.status) + ("" if named else " (unnamed)")
    return found


async def _waiting(session: aiohttp.ClientSession, engine_url: str) -> int:
    return int(sum_of(await metric_samples(session, engine_url), "vllm:num_requests_waiting"))


async def _until_waiting(session: aiohttp.ClientSession, engine_url: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while await _waiting(session, engine_url) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ordered engine never had {count} requests waiting")
        await asyncio.sleep(0.01)


async def priority_case(
    session: aiohttp.ClientSession,
    url: str,
    engine_url: str,
    victim_auth: dict[str, str],
    hostile_auth: dict[str, str],
) -> PriorityRun:
    """The victim holds the engine's one seat and queues a request; the hostile tenant then
    queues one asking `priority` -1000; which of the two finishes first."""
    order: list[str] = []
    statuses: dict[str, int] = {}

    async def ask(tenant: str, auth: dict[str, str], extra: dict[str, int]) -> None:
        body = {
            "model": ORDERED_MODEL,
            "messages": [{"role": "user", "content": f"from {tenant}"}],
            "max_tokens": 4,
            **extra,
        }
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=auth) as reply:
            await reply.read()
            statuses[tenant] = reply.status
        order.append(tenant)

    holder_body = {
        "model": ORDERED_MODEL,
        "messages": [{"role": "user", "content": "hold the seat"}],
        "max_tokens": HOLDER_TOKENS,
        "stream": True,
    }
    async with session.post(
        f"{url}/v1/chat/completions", json=holder_body, headers=victim_auth
    ) as holder:
        await holder.content.readline()  # its first chunk: it runs, the seat is taken
        victim = asyncio.create_task(ask("victim", victim_auth, {}))
        await _until_waiting(session, engine_url, 1)
        hostile = asyncio.create_task(ask("hostile", hostile_auth, {"priority": HOSTILE_PRIORITY}))
        await _until_waiting(session, engine_url, 2)
        await holder.read()  # the seat frees when the holder finishes
    await asyncio.gather(victim, hostile)
    return PriorityRun(order=tuple(order), statuses=statuses)


def render_priority(run: PriorityRun) -> str:
    answers = ", ".join(f"{tenant} {status}" for tenant, status in run.statuses.items())
    kept = "kept its place" if run.order[0] == "victim" else "was jumped"
    return (
        f'"priority": {HOSTILE_PRIORITY} from another tenant: the victim\'s queued request '
        f"{kept} (finished: {', '.join(run.order)}; {answers})"
    )
