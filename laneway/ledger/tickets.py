"""One ticket's state in the ledger, and the log line it ends with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from laneway.ledger.decisions import NO_BLOCKS, Admission, FirstToken, PromptBlocks
from laneway.ledger.lines import PoolGate, Ticket
from laneway.ledger.log import RequestLog
from laneway.routing.plan import PlannedEndpoint, RoutingPlan

State = Literal["queued", "running", "refused"]


@dataclass(slots=True)
class TicketState:
    """One ticket's state; only the ledger changes it."""

    ticket: Ticket
    ask: Admission
    gate: PoolGate  # its pool's gate when it was admitted (a removed pool's, while it drains)
    state: State
    joined_at: float
    queue_ms: float | None = None
    plan: RoutingPlan | None = None
    blocks: PromptBlocks = NO_BLOCKS
    tried: PlannedEndpoint | None = None  # the endpoint tried last
    attempts: int = 0
    on: PlannedEndpoint | None = None  # the endpoint its current attempt holds load on
    sent_at: float = 0.0
    first: FirstToken | None = None  # the current attempt's first token, once it came
    # Holds a prefill slot of a pool fed per replica (`feeding.py`): from its admission to
    # its first token.
    feeding: bool = False
    fed: bool = False  # admitted to such a pool: its slot is given back at its first token
    requeued: int = 0  # times the shell ended an attempt to take its replica back

    def log(
        self,
        now: float,
        status: int,
        error: str | None,
        prompt_tokens: int | None,
        recomputed_prompt_tokens: int,
    ) -> RequestLog:
        ask, tried = self.ask, self.tried
        route = self.plan.route if self.plan is not None else ask.route
        return RequestLog(
            path=ask.path,
            status=status,
            total_ms=(now - ask.arrived) * 1000,
            model=ask.model,
            pool=route.pool.name,
            lane=route.lane.value,
            reason=route.reason,
            endpoint=tried.url if tried else "",
            prompt_tokens=prompt_tokens,
            stream=ask.stream,
            attempts=self.attempts,
            requeued=self.requeued,
            recomputed_prompt_tokens=recomputed_prompt_tokens,
            queue_ms=self.queue_ms,
            predicted_ttft_ms=tried.predicted_ttft_ms if tried else None,
            ttft_ms=self.first.ttft_ms if self.first else None,
            error=error,
        )


def running_on(requests: Mapping[Ticket, TicketState], url: str, pool: str) -> tuple[Ticket, ...]:
    """The pool's requests whose current attempt runs on `url`."""
    return tuple(
        ticket
        for ticket, request in requests.items()
        if request.on is not None and request.on.url == url and request.ask.route.pool.key == pool
    )
