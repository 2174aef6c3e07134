"""Fixtures shared across the test suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from marked_processes import marked_run
from redis.asyncio import Redis

from laneway.bench.redis_server import LocalRedis


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    """A real redis-server on a free port, without persistence; stopped after the test."""
    with LocalRedis() as server:
        yield server


@pytest.fixture
async def redis_client(redis_server: LocalRedis) -> AsyncIterator[Redis]:
    """An asyncio client of redis_server, closed after the test."""
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def marker() -> Iterator[str]:
    """A fresh process marker; whatever still carries it when the test ends is killed."""
    with marked_run() as mark:
        yield mark
