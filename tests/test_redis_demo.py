"""`laneway demo --redis-url`: the demo's gateway keeps its state in the given Redis."""

from __future__ import annotations

import subprocess

import redis

from laneway.bench.harness.procs import laneway_argv
from laneway.bench.harness.redis_server import LocalRedis


def test_the_demo_runs_on_redis_state(redis_server: LocalRedis) -> None:
    args = ["--duration", "2", "--sessions", "2", "--long-documents", "0", "--time-scale", "20"]
    done = subprocess.run(
        laneway_argv("demo", *args, "--port", "0", "--redis-url", redis_server.url),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "requests outside their lane: 0" in done.stdout
    store = redis.Redis.from_url(redis_server.url, decode_responses=True)
    # The gateway read and wrote the shared load with its scripts, then left cleanly: its
    # lease and share are gone, and no zero totals stay behind.
    calls = store.info("commandstats")
    assert calls["cmdstat_evalsha"]["calls"] > 0
    assert store.dbsize() == 0
    store.close()
