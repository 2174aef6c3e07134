"""`--redis-url`, LANEWAY_REDIS_URL and LANEWAY_REDIS_PASSWORD."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import AuthenticationError

from laneway.bench.harness.redis_server import LocalRedis
from laneway.errors import UsageError
from laneway.gateway.state.redis_store import (
    RedisSettings,
    connect,
    redis_client,
    redis_settings,
)


def test_flag_wins_over_env_and_password_comes_from_env() -> None:
    env = {"LANEWAY_REDIS_URL": "redis://env:6379/0", "LANEWAY_REDIS_PASSWORD": "s3cret"}
    assert redis_settings("redis://flag:6379/1", env) == RedisSettings(
        "redis://flag:6379/1", "s3cret"
    )
    assert redis_settings(None, env) == RedisSettings("redis://env:6379/0", "s3cret")
    assert redis_settings(None, {}) is None
    assert redis_settings("", env) is None  # an empty flag turns Redis off


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://redis:6379", "must start with redis://"),
        ("redis://:6379", "names no host"),
        ("redis://redis:port", "the port is not a number"),
    ],
)
def test_bad_urls_are_usage_errors(url: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        redis_settings(url, {})


async def test_the_password_from_the_environment_opens_a_protected_redis() -> None:
    with LocalRedis(password="s3cret") as server:
        env = {"LANEWAY_REDIS_PASSWORD": "s3cret"}
        for settings, works in (
            (redis_settings(server.url, env), True),
            (redis_settings(server.url, {}), False),
        ):
            assert settings is not None
            client = connect(settings)
            try:
                if works:
                    assert await client.ping()
                else:
                    with pytest.raises(AuthenticationError):
                        await client.ping()
            finally:
                await client.aclose()


async def test_a_cancel_that_arrives_as_a_command_is_sent_is_raised(
    redis_server: LocalRedis,
) -> None:
    """Python 3.11's wait_for, around redis-py's send, drops a cancel that arrives in the
    turns where the send has just finished; the gateway's client must raise it."""
    async with redis_client(RedisSettings(redis_server.url)) as client:

        async def ping() -> bool:
            return bool(await client.ping())

        await ping()  # connected: each send below starts without waiting on I/O
        # Every turn from "not started" to "answered", so the turns right after the send
        # are among them whatever the exact count.
        for turns in range(12):
            command = asyncio.create_task(ping())
            for _ in range(turns):
                await asyncio.sleep(0)
            if command.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await command
            else:
                assert await command  # answered before the cancel: nothing to raise
