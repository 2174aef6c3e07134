"""One request trace through the real gateway and through the ledger as the virtual runner
drives it: the same ledger decisions and the same request logs.

The runner side is `laneway.simulator.trace.run_trace`. The gateway side is the app factory
in-process with a recording ledger of the same settings and generator seed, in front of two
scripted engines; the test replays the runner's trace on it event by event: each request
is sent when the runner's arrived, each engine sends its first token and its end when the
runner's did, and the gateway's clock reads the runner's time meanwhile. Only the endpoint
names differ (the runner's replica names, the engines' URLs).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from laneway.api import Lane
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, ScrapeSettings
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.gateway.serving.request_body import Endpoint, parse_request
from laneway.ledger import RequestLog, Sent
from laneway.ledger.recording import Decision, RecordingLedger
from laneway.simulator.elastic import Arrival
from laneway.simulator.profiles import PROFILES
from laneway.simulator.runner import ledger_settings
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import PUBLIC_MODEL, SEED_PICKING, SimPool
from laneway.simulator.trace import run_trace
from laneway.tokens import default_tokenizer

H200 = PROFILES["h200-llama3-8b"]
# Two requests at a time per replica, so the trace has requests waiting in the line.
ENGINE = SchedulerConfig(
    kind="chunked", token_budget=2048, chunk_size=1024, max_num_seqs=2, max_context=8192
)
POOLS = [SimPool("chat", Lane.INTERACTIVE, None, 8192, 2, ENGINE)]
OUTPUT_TOKENS = 30
PATIENCE_S = 60.0
TRIGGERS = ("admit", "first_token", "finished")  # the steps the trace's events cause


def body(index: int) -> dict[str, Any]:
    """Request `index`'s body; `user` names it to the scripted engine."""
    prompt = " ".join(["parcel"] * (300 + 97 * index))
    return {
        "model": PUBLIC_MODEL,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS,
        "stream": True,
        "user": str(index),
    }


def prompt_tokens(index: int) -> int:
    """Request `index`'s prompt as the gateway counts it: the runner's arrival has as many."""
    parsed = parse_request(orjson.dumps(body(index)), Endpoint.COMPLETIONS)
    return parsed.count(default_tokenizer())


ARRIVALS = [
    Arrival(at_s=0.01 * i, prompt_tokens=prompt_tokens(i), output_tokens=OUTPUT_TOKENS)
    for i in range(12)
]


class Clock:
    """The gateway's clock, set by the test to the runner's time of each event."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Engines:
    """Scripted engines that stream each request's first token and its end when told."""

    def __init__(self) -> None:
        self.first_token = [asyncio.Event() for _ in ARRIVALS]
        self.end = [asyncio.Event() for _ in ARRIVALS]

    def app(self) -> web.Application:
        # No /metrics and no /health: the runner in this trace scrapes no gauges either.
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def complete(self, request: web.Request) -> web.StreamResponse:
        index = int((await request.json())["user"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await self.first_token[index].wait()
        await response.write(b'data: {"choices": [{"index": 0, "text": " parcel"}]}\n\n')
        await self.end[index].wait()
        await response.write(b"data: [DONE]\n\n")
        return response


@contextlib.asynccontextmanager
async def serving(engines: Engines) -> AsyncIterator[list[str]]:
    async with TestServer(engines.app()) as first, TestServer(engines.app()) as second:
        yield [f"http://127.0.0.1:{server.port}" for server in (first, second)]


async def until(recorded: RecordingLedger, steps: int) -> None:
    """Until the gateway's ledger has answered `steps` calls."""
    async with asyncio.timeout(PATIENCE_S):
        while len(recorded.steps) < steps:  # noqa: ASYNC110 - the gateway's own progress
            await asyncio.sleep(0.005)


def renamed(decisions: list[Decision], urls: dict[str, str]) -> list[Decision]:
    """The runner's decisions with its replica names replaced by the engines' URLs."""

    def name(value: object) -> object:
        if isinstance(value, str):
            return urls.get(value, value)
        if isinstance(value, RequestLog):
            return dataclasses.replace(value, endpoint=urls.get(value.endpoint, value.endpoint))
        if isinstance(value, tuple):
            return tuple(name(item) for item in value)
        return value

    return [dataclasses.replace(d, chose=tuple(name(c) for c in d.chose)) for d in decisions]


async def test_the_gateway_and_the_runner_make_the_same_decisions() -> None:
    runner, _ = run_trace(POOLS, ARRIVALS, H200, SEED_PICKING, tie_break="trace")
    (pool,) = runner.pools()
    engines = Engines()
    async with serving(engines) as urls:
        clock = Clock()
        ledger = RecordingLedger(ledger_settings(SEED_PICKING, None), random.Random("trace"))
        settings = GatewaySettings(
            picking=SEED_PICKING, scrape=ScrapeSettings(interval_millis=600_000)
        )
        ours = dataclasses.replace(pool, endpoints=tuple(urls))
        app = create_app(settings, StaticPoolSource([ours]), clock=clock, ledger=ledger)
        async with TestClient(TestServer(app)) as client:
            async with asyncio.timeout(PATIENCE_S):
                while not ledger.pools():  # noqa: ASYNC110 - the source's first update
                    await asyncio.sleep(0.01)
            requests: list[asyncio.Task[bytes]] = []

            async def send(index: int) -> bytes:
                response = await client.post("/v1/completions", json=body(index))
                assert response.status == 200
                return await response.read()

            steps = runner.steps
            for position, step in enumerate(steps):
                if step.call not in TRIGGERS:
                    continue
                clock.now = step.at
                if step.call == "admit":
                    requests.append(asyncio.create_task(send(len(requests))))
                elif step.call == "first_token":
                    engines.first_token[step.ticket - 1].set()
                else:
                    engines.end[step.ticket - 1].set()
                following = next(
                    (i for i in range(position + 1, len(steps)) if steps[i].call in TRIGGERS),
                    len(steps),
                )
                await until(ledger, following)
            relayed = await asyncio.gather(*requests)
    assert all(answer.endswith(b"data: [DONE]\n\n") for answer in relayed)
    names = dict(zip(pool.endpoints, urls, strict=True))
    assert len(ledger.steps) == len(steps)
    assert ledger.decisions() == renamed(runner.decisions(), names)
    # The trace was worth comparing: requests waited in line, and both engines served.
    assert sum(d.call == "admit" and d.chose == ("Queued",) for d in ledger.decisions()) == 8
    sent = [step.answer for step in ledger.steps if isinstance(step.answer, Sent)]
    assert {answer.endpoint.url for answer in sent} == set(urls)
