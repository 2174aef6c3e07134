"""`--redis-url`, LANEWAY_REDIS_URL and LANEWAY_REDIS_PASSWORD."""

from __future__ import annotations

import pytest

from laneway.errors import UsageError
from laneway.gateway.redis_state import RedisSettings, redis_settings


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
