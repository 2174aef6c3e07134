"""What the ledger is told that admits or refuses nobody: an engine's own KV events, which
endpoint stored which response, the other gateway replicas' load. Part of `Ledger`, kept
apart so that ledger.py reads as the requests' life and the gates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from laneway.ledger.decisions import LedgerSettings
from laneway.ledger.lines import Ticket
from laneway.ledger.reading import LedgerReads
from laneway.ledger.responses import StoredResponse
from laneway.ledger.tickets import TicketState
from laneway.routing.cycle import EndpointLoad
from laneway.routing.kv_events import EngineBlockFeed, KVEvent
from laneway.routing.prefix_index import PrefixIndex


class LedgerRecords(LedgerReads):
    settings: LedgerSettings
    prefix_index: PrefixIndex
    _feeds: dict[str, EngineBlockFeed]
    _requests: dict[Ticket, TicketState]

    def record_kv_events(self, url: str, events: Iterable[KVEvent]) -> None:
        """An engine's own KV cache events (the exact prefix feed) for `url`."""
        feed = self._feeds.get(url)
        if feed is None:
            feed = self._feeds[url] = EngineBlockFeed(url, self.prefix_index)
        feed.apply(events)

    def record_response(
        self, ticket: Ticket, response_id: str, now: float, context_tokens: int | None
    ) -> StoredResponse:
        """The endpoint the request was sent to last stored its response `response_id`:
        what continues that response, for the same tenant, goes there."""
        request = self._requests[ticket]
        assert request.tried is not None, "recorded before sent"
        assert request.plan is not None, "recorded before planned"
        stored = StoredResponse(
            endpoint=request.tried.url,
            pool=request.plan.pool.key,
            tenant=request.ask.tenant,
            model=request.ask.model,
            context_tokens=context_tokens,
            expires_at=now + self.settings.response_ttl_s,
        )
        self._responses.record(response_id, stored)
        return stored

    def forget_response(self, response_id: str) -> None:
        """Its holder answered that it does not have it (its engine restarted unseen)."""
        self._responses.forget(response_id)

    def adopt_response(self, response_id: str, stored: StoredResponse) -> None:
        """A response another gateway replica recorded (shared through Redis)."""
        self._responses.record(response_id, stored)

    def set_peer_loads(self, loads: Mapping[str, EndpointLoad]) -> None:
        """The other gateway replicas' load per endpoint, summed (replaces the last)."""
        self._load.set_peers(loads)
