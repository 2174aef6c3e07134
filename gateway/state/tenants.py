"""Tenants: API keys that name them, and their per-minute limits on requests and tokens.

Keys come from a YAML file (or a directory of them: a Kubernetes Secret mounted as a volume
holds one file per key of the Secret):

    tenants:
      - name: acme
        apiKeys: [sk-acme-1, sk-acme-2]
        requestsPerMinute: 600      # optional; absent: unlimited
        tokensPerMinute: 200000     # optional; prompt tokens + max_tokens, charged up front
        weight: 2                   # optional; the tenant's share in the batch lane
        priority: 0                 # optional; its engine priority level, lower first
        maxFiles: 100               # optional; files kept at once (default: the gateway's)
        maxFileBytes: 1073741824    # optional; their bytes together (default: the gateway's)
        maxBatchTokens: 50000000    # optional; tokens of batch items not yet run (same)
        maxConcurrentRequests: 8    # optional; its requests running in one pool at once
        maxQueuedRequests: 16       # optional; its requests waiting in one pool's line
        maxConcurrentPromptTokens: 16000  # optional; their prompt tokens running in one pool

Limits are token buckets that refill continuously: a bucket holds at most one minute's
allowance and refills at allowance/60 per second. One request takes one unit from the
request bucket and its tokens from the token bucket, both or neither. `take` is the pure
core; the in-memory limiter applies it to local state and the Redis limiter runs the same
arithmetic in a Lua script, so every replica draws from one bucket in one round trip.

The concurrency caps count the tenant's requests in each pool (and the prompt tokens of the
running ones) over every replica; the ledger enforces them
(`laneway.routing.fairshare.TenantCaps`). A tenant without its own takes the gateway's
(`--tenant-max-concurrent`, `--tenant-max-queued`, `--tenant-max-concurrent-prompt-tokens`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from redis.asyncio import Redis

from laneway.errors import UsageError
from laneway.gateway.state.redis_store import REDIS_DOWN
from laneway.routing.fairshare import NO_CAPS, TenantCaps
from laneway.yaml_files import mapping, read_yaml

log = logging.getLogger("laneway.gateway.state.tenants")

ANONYMOUS = "anonymous"  # the tenant of every request when auth is off
# The batch dispatcher's calls on loopback say whose item they carry with these two headers.
INTERNAL_HEADER = "x-laneway-internal"  # a per-process secret: this request comes from us
TENANT_HEADER = "x-laneway-tenant"  # whose item it is; trusted only with the secret
SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True)
class Tenant:
    name: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    weight: float = 1.0
    priority: int = 0  # its requests' level at a priority-scheduled engine, lower first
    max_files: int | None = None  # None: the gateway's default quota
    max_file_bytes: int | None = None
    max_batch_tokens: int | None = None
    # maxConcurrentRequests, maxQueuedRequests, maxConcurrentPromptTokens per pool
    caps: TenantCaps = NO_CAPS


ANONYMOUS_TENANT = Tenant(ANONYMOUS)


@dataclass(frozen=True)
class TenantDirectory:
    """API key -> tenant; built once from the keys file."""

    by_key: Mapping[str, Tenant]

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        return tuple({t.name: t for t in self.by_key.values()}.values())

    def authenticate(self, authorization: str | None) -> Tenant | None:
        """The tenant of an `Authorization: Bearer KEY` header; None when missing or unknown."""
        if not authorization:
            return None
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.by_key.get(key.strip())

    def named(self, name: str) -> Tenant | None:
        return next((t for t in self.by_key.values() if t.name == name), None)


class TenantKeys:
    """The keys file as last read; `refresh` reads it again when its content changed.

    A Kubernetes Secret mounted as a volume is updated in place when it is rotated, so new
    keys take effect without a restart. A file that stops parsing keeps the previous keys.
    """

    def __init__(self, path: str | Path, default_caps: TenantCaps = NO_CAPS) -> None:
        self.path = Path(path)
        self._default_caps = default_caps
        self._fingerprint = _fingerprint(self.path)
        self.directory = load_tenants(self.path, default_caps)

    def refresh(self) -> bool:
        """True when the keys changed."""
        fingerprint = _fingerprint(self.path)
        if fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint  # a broken file is reported once, not every check
        try:
            self.directory = load_tenants(self.path, self._default_caps)
        except UsageError as error:
            log.warning("keeping the previous tenant keys: %s", error)
            return False
        log.info("tenant keys reloaded from %s", self.path)
        return True


def _fingerprint(path: Path) -> bytes:
    digest = hashlib.sha256()
    files = (
        sorted(p for p in path.iterdir() if not p.name.startswith(".")) if path.is_dir() else [path]
    )
    for file in files:
        with contextlib.suppress(OSError):
            digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.digest()


def load_tenants(path: str | Path, default_caps: TenantCaps = NO_CAPS) -> TenantDirectory:
    """Read a tenants file, or every file in a directory; UsageError naming file and field.
    `default_caps` are the caps of a tenant whose entry sets none of its own."""
    path = Path(path)
    if path.is_dir():
        # A mounted Secret also holds `..data` links and hidden timestamped folders.
        files = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
        if not files:
            raise UsageError(f"tenants directory {path} holds no files")
    else:
        files = [path]
    by_key: dict[str, Tenant] = {}
    for file in files:
        for key, tenant in _read_tenants_file(file, default_caps):
            if key in by_key:
                raise UsageError(f"{file}: API key of tenant {tenant.name!r} is used twice")
            by_key[key] = tenant
    return TenantDirectory(by_key)


def _read_tenants_file(file: Path, default_caps: TenantCaps) -> list[tuple[str, Tenant]]:
    document = read_yaml(file, "tenants file")
    if not isinstance(document, Mapping) or not isinstance(document.get("tenants"), list):
        raise UsageError(f"{file}: must be a mapping with a list under 'tenants'")
    pairs: list[tuple[str, Tenant]] = []
    seen_names: set[str] = set()
    for index, entry in enumerate(document["tenants"]):
        where = f"{file}: tenants[{index}]"
        tenant, keys = _parse_tenant(entry, where, default_caps)
        if tenant.name in seen_names:
            raise UsageError(f"{where}.name: tenant {tenant.name!r} is defined twice")
        seen_names.add(tenant.name)
        pairs.extend((key, tenant) for key in keys)
    return pairs


KNOWN_FIELDS = (
    *("name", "apiKeys", "requestsPerMinute", "tokensPerMinute", "weight", "priority"),
    *("maxFiles", "maxFileBytes", "maxBatchTokens"),
    *("maxConcurrentRequests", "maxQueuedRequests", "maxConcurrentPromptTokens"),
)


def _parse_tenant(value: object, where: str, default_caps: TenantCaps) -> tuple[Tenant, list[str]]:
    entry = mapping(value, where)
    for field in entry:
        if field not in KNOWN_FIELDS:
            raise UsageError(f"{where}.{field}: unknown field; known: {', '.join(KNOWN_FIELDS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"{where}.name: must be a non-empty string")
    keys = entry.get("apiKeys")
    if (
        not isinstance(keys, list)
        or not keys
        or not all(isinstance(k, str) and k.strip() == k and k for k in keys)
    ):
        raise UsageError(
            f"{where}.apiKeys: must be a non-empty list of keys without surrounding spaces"
        )
    weight = entry.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise UsageError(f"{where}.weight: must be a number above 0, got {weight!r}")
    priority = entry.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31:
        raise UsageError(f"{where}.priority: must be a whole number, got {priority!r}")
    tenant = Tenant(
        name=name,
        priority=priority,
        requests_per_minute=_optional_limit(entry, "requestsPerMinute", where),
        tokens_per_minute=_optional_limit(entry, "tokensPerMinute", where),
        weight=float(weight),
        max_files=_optional_limit(entry, "maxFiles", where),
        max_file_bytes=_optional_limit(entry, "maxFileBytes", where),
        max_batch_tokens=_optional_limit(entry, "maxBatchTokens", where),
        caps=_caps(entry, where, default_caps),
    )
    return tenant, list(keys)


def _caps(entry: Mapping[str, Any], where: str, defaults: TenantCaps) -> TenantCaps:
    running = _optional_limit(entry, "maxConcurrentRequests", where)
    waiting = _optional_limit(entry, "maxQueuedRequests", where)
    tokens = _optional_limit(entry, "maxConcurrentPromptTokens", where)
    return TenantCaps(
        max_running=defaults.max_running if running is None else running,
        max_waiting=defaults.max_waiting if waiting is None else waiting,
        max_running_tokens=defaults.max_running_tokens if tokens is None else tokens,
    )


def _optional_limit(entry: Mapping[str, Any], field: str, where: str) -> int | None:
    value = entry.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            f"{where}.{field}: must be a whole number of at least 1, got {value!r} (tenant "
            f"{entry.get('name')!r}: write a whole number of at least 1, or leave {field} out)"
        )
    return value


# ---- the pure core: token buckets ----


@dataclass(frozen=True)
class Bucket:
    level: float  # units available at `at`
    at: float  # seconds


@dataclass(frozen=True)
class LimitDecision:
    allowed: bool
    retry_after_s: float = 0.0  # when refused: how long until both buckets hold enough
    exceeded: str = ""  # "requests" or "tokens" when refused
    # True when the request alone costs more than a full bucket: waiting will not help.
    never: bool = False


ALLOWED = LimitDecision(allowed=True)


def refill(bucket: Bucket | None, per_minute: int, now: float) -> float:
    if bucket is None:
        return float(per_minute)
    elapsed = max(0.0, now - bucket.at)
    return min(float(per_minute), bucket.level + elapsed * per_minute / SECONDS_PER_MINUTE)


def take(
    buckets: Sequence[Bucket | None],
    limits: Sequence[int | None],
    costs: Sequence[int],
    now: float,
) -> tuple[LimitDecision, tuple[Bucket | None, ...]]:
    """Charge every bucket or none: the decision, and the buckets afterwards.

    Buckets, limits and costs line up (requests first, then tokens); a None limit is
    unlimited and keeps no bucket.
    """
    names = ("requests", "tokens")
    levels: list[float | None] = []
    refusal: LimitDecision | None = None
    for name, bucket, limit, cost in zip(names, buckets, limits, costs, strict=True):
        if limit is None:
            levels.append(None)
            continue
        level = refill(bucket, limit, now)
        levels.append(level)
        if cost > limit:
            return LimitDecision(allowed=False, exceeded=name, never=True), tuple(buckets)
        if level < cost:
            wait = (cost - level) * SECONDS_PER_MINUTE / limit
            if refusal is None or wait > refusal.retry_after_s:
                refusal = LimitDecision(allowed=False, retry_after_s=wait, exceeded=name)
    if refusal is not None:
        return refusal, tuple(buckets)
    after = tuple(
        None if level is None else Bucket(level=level - cost, at=now)
        for level, cost in zip(levels, costs, strict=True)
    )
    return ALLOWED, after


def retry_after_header(decision: LimitDecision) -> str:
    return str(max(1, math.ceil(decision.retry_after_s)))


# ---- the shells: in-memory and Redis ----


class RateLimiter(Protocol):
    async def admit(self, tenant: Tenant, tokens: int) -> LimitDecision: ...


Clock = Callable[[], float]


class InMemoryRateLimiter:
    """Buckets in this process: exact for one replica, per replica when Redis is away."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[Bucket | None, ...]] = {}

    async def admit(self, tenant: Tenant, tokens: int) -> LimitDecision:
        return self.admit_now(tenant, tokens)

    def admit_now(self, tenant: Tenant, tokens: int) -> LimitDecision:
        limits = (tenant.requests_per_minute, tenant.tokens_per_minute)
        if limits == (None, None):
            return ALLOWED
        current = self._buckets.get(tenant.name, (None, None))
        decision, after = take(current, limits, (1, tokens), self._clock())
        self._buckets[tenant.name] = after
        return decision


# The Lua twin of `take` for two buckets (requests, tokens), each a hash {level, at} keyed
# by tenant. ARGV: limit_requests, limit_tokens (0: unlimited), cost_tokens, now (empty:
# the server's clock, the one clock every replica shares). Returns {allowed, wait_ms,
# which (0 none, 1 requests, 2 tokens), never}. Waits come back as integer milliseconds
# because Lua numbers would be truncated to integers on the way out.
TAKE_LUA = """
local limits = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local costs = {1, tonumber(ARGV[3])}
local now
if ARGV[4] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[4])
end
local levels = {}
local refused_wait = -1
local refused_which = 0
for i = 1, 2 do
  local limit = limits[i]
  if limit > 0 then
    local level = limit
    local stored = redis.call('HMGET', KEYS[i], 'level', 'at')
    if stored[1] then
      local elapsed = math.max(0, now - tonumber(stored[2]))
      level = math.min(limit, tonumber(stored[1]) + elapsed * limit / 60)
    end
    levels[i] = level
    if costs[i] > limit then
      return {0, 0, i, 1}
    end
    if level < costs[i] then
      local wait = (costs[i] - level) * 60 / limit
      if wait > refused_wait then
        refused_wait = wait
        refused_which = i
      end
    end
  end
end
if refused_which > 0 then
  return {0, math.ceil(refused_wait * 1000), refused_which, 0}
end
for i = 1, 2 do
  if limits[i] > 0 then
    redis.call('HSET', KEYS[i], 'level', tostring(levels[i] - costs[i]), 'at', tostring(now))
    -- A bucket left alone for a minute is full again, the same as no bucket.
    redis.call('PEXPIRE', KEYS[i], 61000)
  end
end
return {1, 0, 0, 0}
"""

WHICH = {0: "", 1: "requests", 2: "tokens"}


class RedisRateLimiter:
    """One bucket pair per tenant shared by every replica; local buckets while Redis is away.

    After a failed call it stays on local buckets for `recheck_s` before asking Redis again,
    so an unreachable Redis costs one timeout per interval, not one per request.
    """

    def __init__(
        self,
        redis: Redis,
        prefix: str = "laneway",
        clock: Clock = time.monotonic,
        recheck_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._script = redis.register_script(TAKE_LUA)
        self._clock = clock
        self._recheck_s = recheck_s
        self._fallback = InMemoryRateLimiter(clock)
        self._local_until: float | None = None  # set while Redis is considered away

    async def admit(self, tenant: Tenant, tokens: int, now: float | None = None) -> LimitDecision:
        limits = (tenant.requests_per_minute, tenant.tokens_per_minute)
        if limits == (None, None):
            return ALLOWED
        if self._local_until is not None and self._clock() < self._local_until:
            return self._fallback.admit_now(tenant, tokens)
        keys = [
            f"{self._prefix}:limit:{tenant.name}:requests",
            f"{self._prefix}:limit:{tenant.name}:tokens",
        ]
        args: list[str | int] = [
            limits[0] or 0,
            limits[1] or 0,
            tokens,
            "" if now is None else repr(now),
        ]
        try:
            allowed, wait_ms, which, never = await self._script(keys=keys, args=args)
        except REDIS_DOWN as error:
            if self._local_until is None:
                log.warning(
                    "laneway gateway: redis unreachable, enforcing tenant limits per replica: %s",
                    error,
                )
            self._local_until = self._clock() + self._recheck_s
            return self._fallback.admit_now(tenant, tokens)
        if self._local_until is not None:
            log.warning("laneway gateway: redis is back, tenant limits are shared again")
            self._local_until = None
        if allowed:
            return ALLOWED
        return LimitDecision(
            allowed=False,
            retry_after_s=int(wait_ms) / 1000.0,
            exceeded=WHICH[int(which)],
            never=bool(never),
        )
