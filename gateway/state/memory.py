"""The gateway's own load accounting per endpoint: requests in flight, prefill outstanding.

Behind the `LoadTracker` protocol so that a shared backend (Redis, for several replicas) can
replace the in-memory one; its methods are async for that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


# Slotted, not frozen: one is built per endpoint per request; nothing assigns to one after.
@dataclass(slots=True)
class EndpointLoad:
    in_flight: int = 0
    prefill_tokens: int = 0  # prompt tokens sent whose first token has not come back


@dataclass(frozen=True)
class Lease:
    """One request's claim on an endpoint, returned by `start` and handed back to the rest."""

    endpoint: str
    prefill_tokens: int


class LoadTracker(Protocol):
    async def start(self, endpoint: str, prefill_tokens: int) -> Lease: ...

    async def prefill_done(self, lease: Lease) -> None:
        """The first token came back: the prompt no longer waits to be prefilled."""

    async def finish(self, lease: Lease, prefill_done: bool) -> None: ...

    async def loads(self, endpoints: Iterable[str]) -> Mapping[str, EndpointLoad]: ...


class InMemoryLoadTracker:
    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}
        self._prefill: dict[str, int] = {}

    async def start(self, endpoint: str, prefill_tokens: int) -> Lease:
        self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
        self._prefill[endpoint] = self._prefill.get(endpoint, 0) + prefill_tokens
        return Lease(endpoint, prefill_tokens)

    async def prefill_done(self, lease: Lease) -> None:
        self._prefill[lease.endpoint] -= lease.prefill_tokens

    async def finish(self, lease: Lease, prefill_done: bool) -> None:
        self._in_flight[lease.endpoint] -= 1
        if not prefill_done:
            self._prefill[lease.endpoint] -= lease.prefill_tokens

    async def loads(self, endpoints: Iterable[str]) -> Mapping[str, EndpointLoad]:
        return {
            url: EndpointLoad(self._in_flight.get(url, 0), self._prefill.get(url, 0))
            for url in endpoints
        }
