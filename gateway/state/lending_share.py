"""The lending roles shared between gateway replicas through Redis (issue 26).

One replica, the leader, decides every lending pool's roles: it holds a lease
(`{prefix}:lending:leader`, its replica name, set NX with a TTL and renewed on every
lending tick) and publishes the roles it decided to `{prefix}:lending:roles` (JSON: the
leader's term, a version, lender key -> endpoint -> role) with the same TTL. Each term
(`{prefix}:lending:term`, counted up by every new lease) and the publish are written by
scripts that check the lease first, so a replica that lost its lease writes nothing. The
others read the roles back and apply them to their own ledgers (`Ledger.adopt_roles`).

A lease or a roles key left by a replica that died expires after the TTL; until then the
others follow its last roles. Thin: what the roles are is the ledger's.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from redis.asyncio import Redis

from laneway.gateway.state.redis_store import REDIS_DOWN
from laneway.ledger import Role

# KEYS: leader, term. ARGV: this replica, TTL ms. This replica's term as leader, 0 when
# another replica holds the lease. A holder whose term key went (evicted, deleted) takes a
# new term: 0 would read as "another leads" on every replica, and none would lead again.
LEAD_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local term = tonumber(redis.call('GET', KEYS[2]) or '')
if holder and term then return term end
return redis.call('INCR', KEYS[2])
"""

# KEYS: leader, roles. ARGV: this replica, the roles' JSON, TTL ms. 1 when written.
PUBLISH_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: leader. ARGV: this replica. Hands the lease back (only its own).
LEAVE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

Roles = dict[str, dict[str, Role]]  # lender key -> endpoint -> role


@dataclass(frozen=True)
class Published:
    term: int
    version: int
    roles: Roles


class RedisLendingShare:
    def __init__(self, redis: Redis, prefix: str, replica: str) -> None:
        self._keys = {
            "leader": f"{prefix}:lending:leader",
            "term": f"{prefix}:lending:term",
            "roles": f"{prefix}:lending:roles",
        }
        self.replica = replica
        self._lead = redis.register_script(LEAD_LUA)
        self._publish = redis.register_script(PUBLISH_LUA)
        self._leave = redis.register_script(LEAVE_LUA)
        self._redis = redis

    async def lead(self, ttl_s: float) -> int:
        """Take or renew the lease for `ttl_s`: this replica's term as leader, 0 when
        another leads. Raises the Redis error while Redis is away."""
        term: int = await self._lead(
            keys=[self._keys["leader"], self._keys["term"]],
            args=[self.replica, int(ttl_s * 1000)],
        )
        return int(term)

    async def publish(self, published: Published, ttl_s: float) -> bool:
        """Write the roles, kept for `ttl_s`, if this replica still holds the lease."""
        body = json.dumps(
            {
                "term": published.term,
                "version": published.version,
                "roles": {key: dict(roles) for key, roles in published.roles.items()},
            }
        )
        written: int = await self._publish(
            keys=[self._keys["leader"], self._keys["roles"]],
            args=[self.replica, body, int(ttl_s * 1000)],
        )
        return bool(written)

    async def read(self) -> Published | None:
        """The roles the leader last published; None when there are none (no leader, or
        its last publish expired) or they cannot be read."""
        raw = await self._redis.get(self._keys["roles"])
        if raw is None:
            return None
        try:
            body = json.loads(raw)
            roles = {
                str(key): {str(url): Role(role) for url, role in of_pool.items()}
                for key, of_pool in body["roles"].items()
            }
            return Published(term=int(body["term"]), version=int(body["version"]), roles=roles)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    async def leave(self) -> None:
        """On a clean shutdown: hand the lease back so another replica leads at once."""
        with contextlib.suppress(*REDIS_DOWN):
            await self._leave(keys=[self._keys["leader"]], args=[self.replica])
