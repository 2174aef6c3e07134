"""What the shell has seen of one request: the decisions as they were made (by reference,
never copied) and what relaying it showed. The ledger holds the request's state; this holds
what only the HTTP side knows (the status it answered, whether the client has it all)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from laneway.gateway.serving.recompute import recomputed_at_most
from laneway.gateway.serving.request_body import ParsedRequest
from laneway.gateway.serving.responses import MadeResponse
from laneway.ledger import Ticket
from laneway.routing.lanes import Route

CLIENT_CLOSED = 499  # nginx's status for a client that went away; only in logs and metrics


@dataclass
class Outcome:
    parsed: ParsedRequest | None = None
    route: Route | None = None
    ticket: Ticket | None = None  # once the ledger admitted, queued or refused it
    prompt_tokens: int | None = None  # the exact count, once known
    status: int = 0
    error: str | None = None
    # The client has the whole response: a client that leaves after this is no 499.
    complete: bool = False
    # The stream whose head went out: past it, an error can only end the connection.
    stream: web.StreamResponse | None = None
    streamed: bool = False  # the stream's client was sent more than its head
    made: MadeResponse | None = None  # /v1/responses: the response the engine says it made
    # Taken off a reclaimed replica (`lending.py`): the attempts sent since, and what the
    # last answer said its engine took from the prefix cache, for `recomputed_prompt_tokens`.
    reclaimed: bool = False
    resends: int = 0
    cached_tokens: int | None = None

    def routing_headers(self) -> dict[str, str]:
        if self.route is None:
            return {}
        headers = {"x-laneway-pool": self.route.pool.name, "x-laneway-lane": self.route.lane.value}
        if self.prompt_tokens is not None:
            headers["x-laneway-prompt-tokens"] = str(self.prompt_tokens)
        return headers

    def recomputed_prompt_tokens(self) -> int:
        """Prefill tokens its resends computed twice, at most (`recompute.py`)."""
        if not self.resends:
            return 0
        prompt = self.prompt_tokens
        if prompt is None:  # no answer told it: the gateway's own count
            prompt = self.route.prefill_tokens if self.route is not None else 0
        return recomputed_at_most(
            prompt_tokens=prompt, resends=self.resends, cached_tokens=self.cached_tokens
        )

    def client_gone(self) -> None:
        """The client closed its connection: a 499 unless it already had the whole response
        (or was cut off for not reading, which says more)."""
        if not self.complete and self.status != CLIENT_CLOSED:
            self.status, self.error = CLIENT_CLOSED, "client_disconnected"
