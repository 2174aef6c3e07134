"""Which endpoint stored which response, shared by the gateway replicas through Redis.

The ledger keeps the holders this replica recorded (laneway/ledger/responses.py); a
response made through another replica is found here: one key per response id
(`{prefix}:response:{id}`, a JSON holder), expiring when the ledger's entry does. Redis
being away loses nothing this replica recorded itself; a holder only a peer knows is then
unknown here, and the client is told so (the response id is not found), never answered
without its history.
"""

from __future__ import annotations

import logging

import orjson
from redis.asyncio import Redis

from laneway.gateway.state.redis_store import REDIS_DOWN
from laneway.ledger import StoredResponse

log = logging.getLogger("laneway.gateway.state")


class RedisResponseShare:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    def _key(self, response_id: str) -> str:
        return f"{self._prefix}:response:{response_id}"

    async def publish(self, response_id: str, stored: StoredResponse, now: float) -> None:
        """Tell the peers; `now` on the ledger's clock, which `expires_at` is on too."""
        ttl_ms = max(1, int((stored.expires_at - now) * 1000))
        holder = {"endpoint": stored.endpoint, "pool": stored.pool, "tenant": stored.tenant,
                  "model": stored.model, "context_tokens": stored.context_tokens}  # fmt: skip
        try:
            await self._redis.set(self._key(response_id), orjson.dumps(holder), px=ttl_ms)
        except REDIS_DOWN as error:
            log.warning("laneway gateway: response %s not shared, redis: %s", response_id, error)

    async def lookup(self, response_id: str, now: float) -> StoredResponse | None:
        """A peer's holder of `response_id`, its expiry put on this replica's clock."""
        try:
            key = self._key(response_id)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(key)
                pipe.pttl(key)
                raw, ttl_ms = await pipe.execute()
        except REDIS_DOWN as error:
            log.warning("laneway gateway: response %s not looked up, redis: %s", response_id, error)
            return None
        if raw is None or ttl_ms is None or ttl_ms < 0:
            return None
        try:
            holder = orjson.loads(raw)
            tokens = holder["context_tokens"]
            return StoredResponse(
                endpoint=str(holder["endpoint"]),
                pool=str(holder["pool"]),
                tenant=str(holder["tenant"]),
                # A holder a replica from before this field wrote: fetched, the response
                # then names the engine's served model.
                model=str(holder.get("model") or ""),
                context_tokens=tokens if isinstance(tokens, int) else None,
                expires_at=now + ttl_ms / 1000,
            )
        except (ValueError, KeyError, TypeError):
            return None  # not a holder this gateway wrote
