"""Tenants: keys files (plain and a mounted Secret) and per-minute limits, local and in Redis."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis
from laneway.errors import UsageError
from laneway.gateway.state.tenants import (
    Bucket,
    InMemoryRateLimiter,
    LimitDecision,
    RedisRateLimiter,
    Tenant,
    TenantKeys,
    load_tenants,
    retry_after_header,
    take,
)
from laneway.routing.fairshare import TenantCaps

TENANTS_YAML = """
tenants:
  - name: acme
    apiKeys: [sk-acme-1, sk-acme-2]
    requestsPerMinute: 60
    tokensPerMinute: 6000
    weight: 2
  - name: free
    apiKeys: [sk-free]
"""


def test_keys_file_maps_keys_to_tenants(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS_YAML)
    directory = load_tenants(path)
    acme = directory.authenticate("Bearer sk-acme-2")
    assert acme == Tenant("acme", requests_per_minute=60, tokens_per_minute=6000, weight=2.0)
    assert directory.authenticate("bearer sk-free") == Tenant("free")
    assert directory.authenticate("Bearer sk-nope") is None
    assert directory.authenticate("Basic sk-free") is None
    assert directory.authenticate(None) is None
    assert sorted(t.name for t in directory.tenants) == ["acme", "free"]


def test_concurrency_caps_come_from_the_entry_else_the_gateways_defaults(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        "  - {name: acme, apiKeys: [k1], maxConcurrentRequests: 4, maxQueuedRequests: 8}\n"
        "  - {name: free, apiKeys: [k2], maxQueuedRequests: 2}\n"
    )
    defaults = TenantCaps(max_running=1, max_waiting=3)
    caps = {t.name: t.caps for t in load_tenants(path, defaults).tenants}
    assert caps == {
        "acme": TenantCaps(max_running=4, max_waiting=8),
        "free": TenantCaps(max_running=1, max_waiting=2),  # its own where it sets one
    }
    assert {t.name: t.caps for t in load_tenants(path).tenants}["free"] == TenantCaps(max_waiting=2)


def test_the_prompt_token_cap_comes_from_the_entry_else_the_gateways_default(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        "  - {name: acme, apiKeys: [k1], maxConcurrentPromptTokens: 16000}\n"
        "  - {name: free, apiKeys: [k2]}\n"
    )
    defaults = TenantCaps(max_running_tokens=4000)
    caps = {t.name: t.caps for t in load_tenants(path, defaults).tenants}
    assert caps == {
        "acme": TenantCaps(max_running_tokens=16000),
        "free": TenantCaps(max_running_tokens=4000),
    }


def test_a_mounted_secret_directory_is_read_without_its_hidden_entries(tmp_path: Path) -> None:
    # What the kubelet writes for a Secret volume: a hidden timestamped folder, a ..data
    # link to it, and one visible link per key.
    hidden = tmp_path / "..2026_11_29_09_00_00.000000001"
    hidden.mkdir()
    (hidden / "tenants.yaml").write_text(TENANTS_YAML)
    os.symlink(hidden.name, tmp_path / "..data")
    os.symlink("..data/tenants.yaml", tmp_path / "tenants.yaml")
    directory = load_tenants(tmp_path)
    assert directory.authenticate("Bearer sk-acme-1") is not None
    assert len(directory.by_key) == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("tenants: 5", "must be a mapping with a list under 'tenants'"),
        ("tenants: [{name: a}]", "tenants[0].apiKeys: must be a non-empty list"),
        ("tenants: [{name: '', apiKeys: [k]}]", "tenants[0].name: must be a non-empty string"),
        ("tenants: [{name: a, apiKeys: [k], rpm: 5}]", "tenants[0].rpm: unknown field"),
        (
            "tenants: [{name: a, apiKeys: [k], requestsPerMinute: 0}]",
            "tenants[0].requestsPerMinute: must be a whole number of at least 1, got 0",
        ),
        ("tenants: [{name: a, apiKeys: [k], weight: -1}]", "tenants[0].weight: must be a number"),
        (
            "tenants: [{name: a, apiKeys: [k], priority: high}]",
            "tenants[0].priority: must be a whole number, got 'high'",
        ),
        (
            "tenants: [{name: a, apiKeys: [k], maxConcurrentRequests: 0}]",
            "tenants[0].maxConcurrentRequests: must be a whole number of at least 1, got 0",
        ),
        (
            "tenants: [{name: a, apiKeys: [k], maxConcurrentPromptTokens: 0}]",
            "tenants[0].maxConcurrentPromptTokens: must be a whole number of at least 1, got 0 "
            "(tenant 'a': write a whole number of at least 1, or leave "
            "maxConcurrentPromptTokens out)",
        ),
        (
            "tenants: [{name: a, apiKeys: [k], maxConcurrentPromptTokens: 2.5}]",
            "tenants[0].maxConcurrentPromptTokens: must be a whole number of at least 1, got 2.5",
        ),
        (
            "tenants: [{name: a, apiKeys: [k]}, {name: b, apiKeys: [k]}]",
            "API key of tenant 'b' is used twice",
        ),
        (
            "tenants: [{name: a, apiKeys: [k]}, {name: a, apiKeys: [j]}]",
            "tenants[1].name: tenant 'a' is defined twice",
        ),
        ("tenants: [", "not valid YAML"),
    ],
)
def test_bad_keys_files_name_the_file_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(content)
    with pytest.raises(UsageError, match=r"tenants\.yaml") as caught:
        load_tenants(path)
    assert message in str(caught.value)


def test_a_missing_keys_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read tenants file"):
        load_tenants(tmp_path / "absent.yaml")


LIMITS = (60, 6000)  # per minute: 1 request and 100 tokens per second


@pytest.mark.parametrize(
    ("buckets", "cost", "now", "decision"),
    [
        # A tenant never seen has full buckets.
        ((None, None), 100, 0.0, LimitDecision(True)),
        # Empty request bucket: one request refills in one second.
        ((Bucket(0.0, 10.0), None), 100, 10.0, LimitDecision(False, 1.0, "requests")),
        # Half a second later only half a request has come back.
        ((Bucket(0.0, 10.0), None), 100, 10.5, LimitDecision(False, 0.5, "requests")),
        # Tokens short by 300 at 100/s: three seconds, the longer wait wins.
        ((Bucket(0.0, 10.0), Bucket(0.0, 10.0)), 300, 10.0, LimitDecision(False, 3.0, "tokens")),
        # More tokens than a whole minute's allowance: waiting will never help.
        ((None, None), 6001, 0.0, LimitDecision(False, 0.0, "tokens", never=True)),
    ],
)
def test_take_decides_from_refilled_buckets(
    buckets: tuple[Bucket | None, Bucket | None], cost: int, now: float, decision: LimitDecision
) -> None:
    got, after = take(buckets, LIMITS, (1, cost), now)
    assert got == decision
    if not got.allowed:
        assert after == buckets  # a refusal charges nothing


def test_take_charges_both_buckets_or_neither() -> None:
    decision, after = take((None, None), LIMITS, (1, 250), now=5.0)
    assert decision.allowed
    assert after == (Bucket(59.0, 5.0), Bucket(5750.0, 5.0))
    unlimited, kept = take((None, None), (None, None), (1, 10**9), now=5.0)
    assert unlimited.allowed
    assert kept == (None, None)


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert retry_after_header(LimitDecision(False, 0.2, "requests")) == "1"
    assert retry_after_header(LimitDecision(False, 2.01, "tokens")) == "3"


async def test_in_memory_limiter_refills_with_its_clock() -> None:
    now = [0.0]
    limiter = InMemoryRateLimiter(clock=lambda: now[0])
    tenant = Tenant("t", requests_per_minute=2)
    assert (await limiter.admit(tenant, 1)).allowed
    assert (await limiter.admit(tenant, 1)).allowed
    refused = await limiter.admit(tenant, 1)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(30.0)
    now[0] = 30.0
    assert (await limiter.admit(tenant, 1)).allowed
    assert (await limiter.admit(Tenant("unlimited"), 10**9)).allowed


async def test_the_lua_script_decides_exactly_as_the_python_core(redis_client: Redis) -> None:
    """Same requests at the same injected times: the shared and local limiters agree."""
    rng = random.Random(7)
    tenant = Tenant("twin", requests_per_minute=30, tokens_per_minute=3000)
    now = [1000.0]
    local = InMemoryRateLimiter(clock=lambda: now[0])
    shared = RedisRateLimiter(redis_client, prefix="twin-test")
    outcomes = []
    for _ in range(300):
        now[0] += rng.choice([0.0, 0.01, 0.3, 1.0, 4.0])
        tokens = rng.choice([1, 50, 200, 900, 3001])
        want = await local.admit(tenant, tokens)
        got = await shared.admit(tenant, tokens, now=now[0])
        assert got.allowed == want.allowed
        assert got.exceeded == want.exceeded
        assert got.never == want.never
        # Lua hands back whole milliseconds, rounded up.
        assert want.retry_after_s <= got.retry_after_s <= want.retry_after_s + 0.001
        outcomes.append(got.allowed)
    assert 50 < sum(outcomes) < 250  # the sequence exercised both answers


async def test_two_limiters_on_one_redis_share_the_bucket(redis_server: LocalRedis) -> None:
    tenant = Tenant("shared", requests_per_minute=10)
    first, second = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    try:
        replicas = [RedisRateLimiter(first), RedisRateLimiter(second)]
        allowed = [(await replicas[i % 2].admit(tenant, 1)).allowed for i in range(20)]
        assert sum(allowed) == 10
    finally:
        await first.aclose()
        await second.aclose()


async def test_redis_limiter_falls_back_to_local_buckets_and_recovers(
    redis_server: LocalRedis,
) -> None:
    tenant = Tenant("fallback", requests_per_minute=3)
    redis = Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    now = [0.0]
    limiter = RedisRateLimiter(redis, clock=lambda: now[0], recheck_s=1.0)
    try:
        assert (await limiter.admit(tenant, 1)).allowed
        redis_server.stop()
        # Redis away: the replica enforces the same limit on its own buckets.
        local = [(await limiter.admit(tenant, 1)).allowed for _ in range(5)]
        assert local == [True, True, True, False, False]
        redis_server.start()
        # Within the recheck interval it stays local (and refuses, its bucket is empty).
        assert not (await limiter.admit(tenant, 1)).allowed
        now[0] = 1.5
        # Back (empty, no persistence): shared buckets again, full after the restart.
        shared = [(await limiter.admit(tenant, 1)).allowed for _ in range(4)]
        assert shared == [True, True, True, False]
        assert await redis.exists("laneway:limit:fallback:requests") == 1
    finally:
        await redis.aclose()


def test_rotated_keys_take_effect_and_a_broken_file_keeps_the_old_ones(tmp_path: Path) -> None:
    # A Secret volume as the kubelet rotates it: new folder, then the ..data link swapped.
    first = tmp_path / "..2026_11_29_09_00_00.1"
    first.mkdir()
    (first / "tenants.yaml").write_text("tenants: [{name: a, apiKeys: [sk-old]}]")
    os.symlink(first.name, tmp_path / "..data")
    os.symlink("..data/tenants.yaml", tmp_path / "tenants.yaml")
    keys = TenantKeys(tmp_path)
    assert not keys.refresh()  # nothing changed
    assert keys.directory.authenticate("Bearer sk-old") == Tenant("a")

    second = tmp_path / "..2026_11_29_10_00_00.2"
    second.mkdir()
    (second / "tenants.yaml").write_text("tenants: [{name: a, apiKeys: [sk-new]}]")
    os.symlink(second.name, tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert keys.refresh()
    assert keys.directory.authenticate("Bearer sk-new") == Tenant("a")
    assert keys.directory.authenticate("Bearer sk-old") is None

    (second / "tenants.yaml").write_text("tenants: [{name: a}]")  # no apiKeys: invalid
    assert not keys.refresh()
    assert keys.directory.authenticate("Bearer sk-new") == Tenant("a")
