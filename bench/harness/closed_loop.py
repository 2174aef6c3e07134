"""Closed-loop clients: each sends its next request as one ends, or after a think time."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiohttp

from laneway.bench.harness.stream import StreamResult, stream_request

T = TypeVar("T")


def think_time(mean_ms: float, rng: random.Random) -> Callable[[], float] | None:
    """Draws of a client's think time in seconds, exponential of mean `mean_ms`: each client's
    requests then arrive as a Poisson process, independent of the others' and of when the
    engine ends their streams. None for no think time."""
    if mean_ms == 0:
        return None
    rate = 1000 / mean_ms
    return lambda: rng.expovariate(rate)


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str | Iterator[str],
    body: dict[str, Any],
    concurrency: int,
    requests: int,
    think: Callable[[], float] | None = None,
) -> list[StreamResult]:
    """`concurrency` workers send `requests` in all to `url` (or to each next URL it gives),
    each the next as soon as one ends, or `think()` seconds after it and before the first."""
    urls = itertools.repeat(url) if isinstance(url, str) else url
    return await in_closed_loop(
        lambda: stream_request(session, next(urls), body), concurrency, requests, think
    )


async def in_closed_loop(
    job: Callable[[], Awaitable[T]],
    concurrency: int,
    count: int,
    think: Callable[[], float] | None = None,
) -> list[T]:
    """`concurrency` workers run `job` `count` times in all, each again as soon as it ends,
    or where `think` is given, `think()` seconds after it, and as long before its first."""
    results: list[T] = []
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            # Claimed before thinking, so that no other worker starts a job past `count`.
            remaining -= 1
            if think is not None:
                await asyncio.sleep(think())
            results.append(await job())

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return results
