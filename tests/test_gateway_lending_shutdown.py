"""A gateway replica leading the lending roles shuts down cleanly: its lending loop has
stopped before it hands the lease back (`RedisLendingShare.leave`), so no tick takes the
lease again behind the hand-back and the other replicas need not wait out its TTL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis
from support.client import eventually
from support.inproc import Servers
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.keys import LENDING
from laneway.gateway.serving.lending import Mode
from laneway.gateway.state.lending_share import RedisLendingShare

# Nothing listens on the discard port: no request is sent, the lease is taken all the same.
CHAT_URLS = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]


async def test_the_lease_is_handed_back_after_the_lending_loop_stopped(
    servers: Servers,
    tmp_path: Path,
    redis_server: LocalRedis,
    redis_client: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chat = pool_doc("chat", "interactive", "llama", CHAT_URLS)
    chat["spec"]["lending"] = {"borrower": "docs", "keepReplicas": 1, "headroom": 0}
    docs = pool_doc("docs", "batch", "llama", [])
    config = gateway_doc(lending={"lendAfterMillis": 0, "intervalMillis": 20})
    served = await servers.gateway(
        tmp_path / "gateway.yaml", [chat, docs, config], "--redis-url", redis_server.url
    )
    lending = served.runner.app[LENDING]
    assert lending is not None

    async def leads() -> bool:
        return lending.mode is Mode.LEADING

    await eventually(leads, "the only gateway replica leading")
    loops_at_leave: list[list[str]] = []
    leave = RedisLendingShare.leave

    async def leave_noting_the_loop(self: RedisLendingShare) -> None:
        running = [t.get_name() for t in asyncio.all_tasks() if not t.done()]
        loops_at_leave.append([name for name in running if name == "lending"])
        await leave(self)

    monkeypatch.setattr(RedisLendingShare, "leave", leave_noting_the_loop)
    assert served.listener is not None
    served.listener.close()
    await served.runner.cleanup()
    assert loops_at_leave == [[]]
    assert await redis_client.get("laneway:lending:leader") is None
