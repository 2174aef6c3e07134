"""Fixtures shared across the test suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from marked_processes import marked_run

from laneway.gateway.redis_server import LocalRedis


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    """A real redis-server on a free port, without persistence; stopped after the test."""
    with LocalRedis() as server:
        yield server


@pytest.fixture
def marker() -> Iterator[str]:
    """A fresh process marker; whatever still carries it when the test ends is killed."""
    with marked_run() as mark:
        yield mark
