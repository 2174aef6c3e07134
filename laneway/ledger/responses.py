"""Which endpoint holds which stored response (the Responses API's `store`).

An engine keeps the responses it made in its own memory (vLLM's `response_store`, for the
life of its process), so a request that continues one (`previous_response_id`), and a GET
or cancel of one, can only be served by that endpoint. The book maps each response id to
its holder: the endpoint, its pool, the tenant that made it (no other tenant may use it), the
model name the client asked for (a fetched response names it, not the engine's served name)
and the tokens the next turn's prompt starts with (the response's input and output, as the
engine counted them). An entry ends when it expires, when its endpoint leaves the pool
(another replica has no copy) or when its engine restarts (its store is gone with the
process): asked then, the book says the id is unknown, as the engine would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from laneway.api import InferencePool


@dataclass(frozen=True, slots=True)
class StoredResponse:
    endpoint: str  # the url of the engine that stored it
    pool: str  # that endpoint's pool key
    tenant: str  # who made it; "" for anonymous callers
    model: str  # the public name the client asked for ("" where a peer did not share it)
    context_tokens: int | None  # its input + output tokens: the next turn's history
    expires_at: float  # on the ledger's clock


class ResponseBook:
    """Response id -> its holder; the least recently recorded dropped past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held: OrderedDict[str, StoredResponse] = OrderedDict()

    def record(self, response_id: str, stored: StoredResponse) -> None:
        self._held[response_id] = stored
        self._held.move_to_end(response_id)
        while len(self._held) > self._capacity:
            self._held.popitem(last=False)

    def get(self, response_id: str, now: float) -> StoredResponse | None:
        """The holder, None where the id is unknown or expired."""
        stored = self._held.get(response_id)
        if stored is None:
            return None
        if stored.expires_at <= now:
            del self._held[response_id]
            return None
        return stored

    def holder(
        self, response_id: str, tenant: str, now: float, pools: Mapping[str, InferencePool]
    ) -> tuple[StoredResponse, InferencePool] | None:
        """The holder and its pool; None where no endpoint of a configured pool holds the
        response for `tenant`: unknown, expired, another tenant's, or made by an endpoint
        since gone from its pool (and its store with it)."""
        stored = self.get(response_id, now)
        if stored is None or stored.tenant != tenant:
            return None
        pool = pools.get(stored.pool)
        if pool is None or stored.endpoint not in pool.endpoints:
            self.forget_endpoint(stored.endpoint)
            return None
        return stored, pool

    def forget(self, response_id: str) -> None:
        self._held.pop(response_id, None)

    def forget_endpoint(self, url: str) -> None:
        """The endpoint's engine lost its store (restarted, or left its pool)."""
        gone = [rid for rid, stored in self._held.items() if stored.endpoint == url]
        for response_id in gone:
            del self._held[response_id]

    def __len__(self) -> int:
        return len(self._held)
