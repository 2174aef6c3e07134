"""Talking to a gateway or an engine under test, process or in-process alike: the official
openai client, its /metrics parsed, and waiting for what it reports."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


class Listening(Protocol):
    """A server under test: a process (harness.procs.ChildProcess) or a support.inproc.Served."""

    @property
    def url(self) -> str: ...


def client(gateway: Listening) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


async def scrape(url: str) -> Samples:
    """Every sample on `url`/metrics, parsed by prometheus-client: name -> (labels, value)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for found, value in samples.get(name, [])
        if all(found.get(k) == v for k, v in labels.items())
    )


async def requests_by_status(gateway: Listening, pool: str) -> dict[str, float]:
    """`pool`'s requests counted so far by the gateway, by status."""
    samples = await scrape(gateway.url)
    return {
        labels["status"]: value
        for labels, value in samples.get("laneway_gateway_requests_total", [])
        if labels.get("pool") == pool
    }


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float = 60) -> None:
    """Poll `check` until it holds; fail naming `what` after `within` seconds (a generous
    bound for a loaded machine, not a budget the behaviour is judged by)."""
    try:
        async with asyncio.timeout(within):
            # Polling a server over HTTP: there is no event to wait on.
            while not await check():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"gave up after {within:g} s waiting for {what}") from None


async def one_waits_in_line(gateway: Listening, pool: str, what: str) -> None:
    """Until exactly one request waits in the gateway's line for `pool`."""

    async def queued() -> bool:
        return total(await scrape(gateway.url), "laneway_gateway_queue_depth", pool=pool) == 1

    await eventually(queued, what)
