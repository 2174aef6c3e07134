"""Fixtures shared across the test suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from laneway.gateway.redis_server import LocalRedis


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    """A real redis-server on a free port, without persistence; stopped after the test."""
    with LocalRedis() as server:
        yield server
