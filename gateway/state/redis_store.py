"""Shared state in Redis: the connection settings and the replicas' shared endpoint load.

`RedisLoadShare` shares the ledger's endpoint load between several gateway replicas: the
ledger counts this replica's own load, and a pick reads the others' into it
(`Ledger.set_peer_loads`) before it plans. Every replica adds its own load to one shared
hash per gateway (`{prefix}:load`: `URL|in_flight` and
`URL|prefill` -> totals), so a pick sees what every replica has sent, one round trip per
read, and concurrent picks share one read. Changes are written in the background, many
requests' worth per round trip, so a request never waits for a write. Each replica also
keeps its contribution in its own hash and holds a lease (a key with a TTL) that a
heartbeat renews. When a replica dies, its lease expires and the next
heartbeat of any surviving replica subtracts the dead one's contribution from the totals:
a killed replica's load expires instead of leaking.

The heartbeat also rewrites this replica's contribution from its exact local counts and
moves the totals by the difference, which repairs whatever was missed while Redis was away
or lost in a Redis restart. While Redis is unreachable, picks use this replica's local
counts alone, and interactive traffic keeps flowing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from laneway.errors import UsageError
from laneway.gateway.errors import ApiError
from laneway.gateway.state.settings import REDIS_URL_ENV
from laneway.ledger import EndpointLoad

log = logging.getLogger("laneway.gateway.redis")


REDIS_PASSWORD_ENV = "LANEWAY_REDIS_PASSWORD"
DEFAULT_PREFIX = "laneway"
# Redis calls must fail fast when the server is away, never hang a request.
SOCKET_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 64
POOL_WAIT_S = 2.0
DEFAULT_LEASE_S = 6.0

# Errors that mean "Redis is not answering" rather than a bug in a command.
REDIS_DOWN = (RedisError, OSError, asyncio.TimeoutError)


@dataclass(frozen=True)
class RedisSettings:
    url: str
    password: str | None = None
    prefix: str = DEFAULT_PREFIX


def redis_settings(
    flag: str | None, environ: Mapping[str, str] = os.environ
) -> RedisSettings | None:
    """From `--redis-url` (or LANEWAY_REDIS_URL) and LANEWAY_REDIS_PASSWORD; None: in-memory."""
    url = flag if flag is not None else environ.get(REDIS_URL_ENV)
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise UsageError(f"--redis-url {url!r}: must start with redis://, rediss:// or unix://")
    if parts.scheme != "unix" and not parts.hostname:
        raise UsageError(f"--redis-url {url!r}: names no host (e.g. redis://redis:6379/0)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise UsageError(f"--redis-url {url!r}: the port is not a number") from None
    return RedisSettings(url=url, password=environ.get(REDIS_PASSWORD_ENV) or None)


def connect(settings: RedisSettings) -> Redis:
    """A client that fails fast while Redis is away and reconnects by itself when it returns.

    Its pool is bounded and blocking: under a burst, calls wait briefly for a connection
    instead of opening hundreds or failing.
    """
    pool = BlockingConnectionPool.from_url(
        settings.url,
        password=settings.password,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=5,
        # One immediate retry on a fresh connection: after a Redis restart every pooled
        # connection is stale, and the retry hides that; more retries would only stall
        # requests while Redis is really away.
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    pool.connection_class = _KEEPING_CANCELS[pool.connection_class]
    return Redis.from_pool(pool)


class _KeepsCancels(AbstractConnection):
    """Raises the cancel that Python 3.11's `asyncio.wait_for` drops while a command is sent.

    redis-py sends each command inside `wait_for(send, socket_timeout)`. Before 3.12, a
    cancel that arrives in the loop turns where the send has just finished is dropped and
    the send returns (python/cpython#86296; 3.12 rebuilt wait_for on asyncio.timeout). The
    task goes on as if never cancelled, and whoever cancelled it to shut down waits forever
    (a dispatcher kept dispatching through its gateway's shutdown). The task still counts
    the cancel as requested, so it is raised here, where it was lost.
    """

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        task = asyncio.current_task()
        requested = 0 if task is None else task.cancelling()
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > requested:
            # The reply will never be read: drop the connection, as redis-py does itself
            # when a send is interrupted.
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError


class _TcpKeepsCancels(_KeepsCancels, Connection):
    pass


class _TlsKeepsCancels(_KeepsCancels, SSLConnection):
    pass


class _UnixKeepsCancels(_KeepsCancels, UnixDomainSocketConnection):
    pass


_KEEPING_CANCELS: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _TcpKeepsCancels,
    SSLConnection: _TlsKeepsCancels,
    UnixDomainSocketConnection: _UnixKeepsCancels,
}


@contextlib.asynccontextmanager
async def redis_client(settings: RedisSettings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# KEYS: totals, contribution. ARGV: field, delta pairs. Moves both hashes together.
APPLY_LUA = """
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
"""

# KEYS: totals, contribution. ARGV: fields. The totals less this replica's own share.
OTHERS_LUA = """
local totals = redis.call('HMGET', KEYS[1], unpack(ARGV))
local mine = redis.call('HMGET', KEYS[2], unpack(ARGV))
local others = {}
for i = 1, #ARGV do
  others[i] = (tonumber(totals[i]) or 0) - (tonumber(mine[i]) or 0)
end
return others
"""

# KEYS: totals, replicas set. ARGV: prefix, this replica, lease ms, then field, value pairs
# of this replica's exact load. Renews this replica's lease, replaces its contribution and
# moves the totals by the difference, then reaps replicas whose lease has expired.
# Reaped replicas' keys are derived in the script: fine on a single Redis, not on Cluster.
SYNC_LUA = """
local prefix, me, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local function contribution(replica) return prefix .. ':load:replica:' .. replica end
local function lease(replica) return prefix .. ':load:lease:' .. replica end
redis.call('SET', lease(me), '1', 'PX', lease_ms)
redis.call('SADD', KEYS[2], me)
local mine = contribution(me)
local old = redis.call('HGETALL', mine)
local fresh = {}
for i = 4, #ARGV, 2 do fresh[ARGV[i]] = tonumber(ARGV[i + 1]) end
for i = 1, #old, 2 do
  local field, value = old[i], tonumber(old[i + 1])
  local delta = (fresh[field] or 0) - value
  if delta ~= 0 then redis.call('HINCRBY', KEYS[1], field, delta) end
  fresh[field] = nil
end
for field, value in pairs(fresh) do
  if value ~= 0 then redis.call('HINCRBY', KEYS[1], field, value) end
end
redis.call('DEL', mine)
for i = 4, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) ~= 0 then redis.call('HSET', mine, ARGV[i], ARGV[i + 1]) end
end
local reaped = 0
for _, replica in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', lease(replica)) == 0 then
    local dead = redis.call('HGETALL', contribution(replica))
    for i = 1, #dead, 2 do
      -- A field back at zero is common (HINCRBY keeps it), and -0 is "-0" to HINCRBY,
      -- which refuses it: the reap would stop halfway, and repeat that half forever.
      local value = tonumber(dead[i + 1])
      if value ~= 0 then redis.call('HINCRBY', KEYS[1], dead[i], -value) end
    end
    redis.call('DEL', contribution(replica))
    redis.call('SREM', KEYS[2], replica)
    reaped = reaped + 1
  end
end
-- Endpoints come and go: drop totals that are back to zero rather than keep them forever.
local totals = redis.call('HGETALL', KEYS[1])
for i = 1, #totals, 2 do
  if tonumber(totals[i + 1]) == 0 then redis.call('HDEL', KEYS[1], totals[i]) end
end
return reaped
"""


_NONE = EndpointLoad()


def _fields(endpoint: str) -> tuple[str, str]:
    return f"{endpoint}|in_flight", f"{endpoint}|prefill"


class RedisLoadShare:
    """This replica's load on the engines, published to Redis, and the other replicas' load
    read back: the ledger counts (its `own_loads`), this only shares."""

    def __init__(
        self,
        redis: Redis,
        prefix: str = DEFAULT_PREFIX,
        replica: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        what: str = "endpoint load",  # what it shares, for its log lines
    ) -> None:
        self._redis = redis
        self._what = what
        self._prefix = prefix
        self.replica = replica or replica_id()
        self._lease_ms = int(lease_s * 1000)
        self.heartbeat_s = lease_s / 3
        self._published: dict[str, EndpointLoad] = {}  # own load as last queued for Redis
        self._endpoints: set[str] = set()  # every endpoint this replica has load on
        self._totals = f"{prefix}:load"
        self._contribution = f"{prefix}:load:replica:{self.replica}"
        self._sync_keys = [self._totals, f"{prefix}:load:replicas"]
        self._apply = redis.register_script(APPLY_LUA)
        self._others = redis.register_script(OTHERS_LUA)
        self._sync = redis.register_script(SYNC_LUA)
        self.shared = True  # False while Redis is unreachable
        self._unsent: collections.Counter[str] = collections.Counter()  # field -> delta
        self._writer: asyncio.Task[None] | None = None
        # Held by each write and by the heartbeat's resync, which replaces the whole share
        # with a snapshot: a write landing after it must hold only changes made since.
        self._sending = asyncio.Lock()
        # One read in flight per set of endpoints, shared by the picks that want it.
        self._reads: dict[tuple[str, ...], asyncio.Future[list[int]]] = {}

    def publish(self, own: Mapping[str, EndpointLoad]) -> None:
        """Queue the change from the load last published to `own`: this replica's whole own
        load now, as the ledger counts it."""
        deltas: list[tuple[str, int]] = []
        for url in own.keys() | self._published.keys():
            new, old = own.get(url, _NONE), self._published.get(url, _NONE)
            if new != old:
                in_flight, prefill = _fields(url)
                deltas += [
                    (in_flight, new.in_flight - old.in_flight),
                    (prefill, new.prefill_tokens - old.prefill_tokens),
                ]
                if new != _NONE:
                    self._endpoints.add(url)
        self._published = dict(own)
        self._queue(*deltas)

    async def peers(self, urls: Sequence[str]) -> dict[str, EndpointLoad]:
        """The other replicas' load on `urls`, one round trip; none while Redis is away."""
        if not self.shared or not urls:  # HMGET of no field is an error, not "Redis away"
            return {}
        fields = tuple(field for url in urls for field in _fields(url))
        try:
            others = await asyncio.shield(self._read(fields))
        except REDIS_DOWN as error:
            self.went_down(error)
            return {}
        return {
            url: EndpointLoad(
                in_flight=max(0, others[2 * i]), prefill_tokens=max(0, others[2 * i + 1])
            )
            for i, url in enumerate(urls)
        }

    def _read(self, fields: tuple[str, ...]) -> asyncio.Future[list[int]]:
        """One read shared by every pick that asks for the same endpoints meanwhile."""
        read = self._reads.get(fields)
        if read is None:
            read = asyncio.ensure_future(self._read_others(fields))
            self._reads[fields] = read
            read.add_done_callback(lambda done: self._read_done(fields, done))
        return read

    async def _read_others(self, fields: tuple[str, ...]) -> list[int]:
        """The totals less this replica's contribution, read in one step."""
        others: list[int] = await self._others(
            keys=[self._totals, self._contribution], args=list(fields)
        )
        return others

    def _read_done(self, fields: tuple[str, ...], done: asyncio.Future[list[int]]) -> None:
        self._reads.pop(fields, None)
        if not done.cancelled():
            done.exception()  # retrieved here, whoever of its waiters went away

    def _queue(self, *deltas: tuple[str, int]) -> None:
        """Apply deltas in the background: picks never wait for a write to Redis."""
        if not self.shared:
            return  # the next heartbeat after Redis returns resyncs this replica's share
        for field, delta in deltas:
            self._unsent[field] += delta
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="load-writer")

    async def _write(self) -> None:
        """Send what is queued, many requests' changes per round trip, until nothing is left."""
        while self._unsent and self.shared:
            async with self._sending:
                sending, self._unsent = self._unsent, collections.Counter()
                args: list[str | int] = [x for f, d in sending.items() if d for x in (f, d)]
                try:
                    if args:
                        await self._apply(keys=[self._totals, self._contribution], args=args)
                except REDIS_DOWN as error:
                    self.went_down(error)
        if not self.shared:
            self._unsent.clear()

    async def flush(self) -> None:
        """Wait until every change made so far has reached Redis (or Redis has gone away)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def heartbeat(self, own: Callable[[], Mapping[str, EndpointLoad]]) -> int:
        """Renew the lease, resync this replica's share to `own()` (its exact load), reap
        dead replicas; how many reaped."""
        async with self._sending:
            # No write is under way: the snapshot holds every change not yet written, which
            # must not be written after it as well, and none made after it.
            exact = own()
            self._unsent.clear()
            snapshot = {url: exact.get(url, _NONE) for url in self._endpoints | exact.keys()}
            self._endpoints = {url for url, load in snapshot.items() if load != _NONE}
            args: list[str | int] = [self._prefix, self.replica, self._lease_ms]
            for url, load in snapshot.items():
                in_flight, prefill = _fields(url)
                args += [in_flight, load.in_flight, prefill, load.prefill_tokens]
            reaped: int = await self._sync(keys=self._sync_keys, args=args)
        if not self.shared:
            log.warning("redis is back: %s shared again", self._what)
            self.shared = True
        return reaped

    async def run(self, own: Callable[[], Mapping[str, EndpointLoad]]) -> None:
        """The heartbeat loop, until cancelled; survives Redis going away and coming back."""
        while True:
            try:
                reaped = await self.heartbeat(own)
                if reaped:
                    log.info("reaped the load of %d replica(s) whose lease expired", reaped)
            except REDIS_DOWN as error:
                self.went_down(error)
            await asyncio.sleep(self.heartbeat_s)

    async def leave(self) -> None:
        """On a clean shutdown: take this replica's load out of the totals now."""
        with contextlib.suppress(*REDIS_DOWN):
            await self.flush()
            # An empty snapshot takes this replica's share out of the totals.
            await self._sync(keys=self._sync_keys, args=[self._prefix, self.replica, 1])
            await self._redis.delete(f"{self._prefix}:load:lease:{self.replica}")
            await self._redis.srem(self._sync_keys[1], self.replica)

    def went_down(self, error: BaseException) -> None:
        """Redis did not answer: this replica's own counts alone until a heartbeat gets through."""
        if self.shared:
            log.warning(
                "laneway gateway: redis unreachable, %s kept per replica: %s", self._what, error
            )
            self.shared = False


class OutageLog:
    """Says that Redis went away once, then at most every `every_s` while it stays away.

    A loop that retries every second would otherwise log every second; the reminder says
    what to check, and a line when Redis answers again closes the story.
    """

    def __init__(
        self, what: str, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._what = what
        self._every_s = every_s
        self._clock = clock
        self._warned_at: float | None = None

    def down(self, error: BaseException) -> None:
        now = self._clock()
        if self._warned_at is not None and now - self._warned_at < self._every_s:
            return
        self._warned_at = now
        log.warning(
            "laneway gateway: %s paused, redis unreachable (%s); check that Redis is running "
            "and that --redis-url points at it. Retrying; this line repeats at most every %g s",
            self._what,
            error,
            self._every_s,
        )

    def up(self) -> None:
        if self._warned_at is not None:
            self._warned_at = None
            log.warning("laneway gateway: redis answers again, %s resumed", self._what)


UNAVAILABLE_RETRY_S = 5


def redis_unavailable(error: BaseException) -> ApiError:
    return ApiError(
        503,
        f"Shared state (Redis) is unreachable, try again shortly: {type(error).__name__}",
        "state_unavailable",
        retry_after=UNAVAILABLE_RETRY_S,
    )


def needs_redis(handler: Handler) -> Handler:
    """Answer 503 with Retry-After, instead of failing, while Redis is away."""

    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except REDIS_DOWN as error:
            raise redis_unavailable(error) from None

    return guarded
