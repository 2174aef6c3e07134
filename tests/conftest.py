"""Fixtures shared across the test suite."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kube_cluster import Cluster, cluster_for_tests
from marked_processes import marked_run
from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis


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


@pytest.fixture(scope="session")
def kube() -> Iterator[Cluster]:
    """A real Kubernetes control plane for the whole run (tests/kube_cluster.py), or the
    cluster $LANEWAY_TEST_KUBECONFIG names. $LANEWAY_TEST_CLUSTER_LOGS keeps its logs."""
    logs = os.environ.get("LANEWAY_TEST_CLUSTER_LOGS")
    with cluster_for_tests(Path(logs) if logs else None) as cluster:
        if isinstance(cluster, str):
            pytest.skip(cluster)
        yield cluster


_namespaces = itertools.count(1)


@pytest.fixture
def kube_namespace(kube: Cluster) -> Iterator[str]:
    """A fresh namespace in the cluster for one test, deleted after it."""
    with kube.namespace(f"t{os.getpid()}-{next(_namespaces)}") as name:
        yield name
