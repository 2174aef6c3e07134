"""A ledger that keeps every answer it gives: two shells driven through one request trace
(the gateway over HTTP, the virtual runner in virtual time) must get the same decisions.

`steps` holds each call's answer as given; `decisions()` the same without the times, which
no two shells share (a wall clock against a virtual one): what must be identical.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool
from laneway.ledger.decisions import (
    NO_BLOCKS,
    Admission,
    AdmitDecision,
    Failed,
    Finished,
    FirstToken,
    LedgerSettings,
    PromptBlocks,
    Sent,
    Wakes,
    Withdrawn,
)
from laneway.ledger.ledger import Ledger
from laneway.ledger.lines import Ticket
from laneway.routing.plan import PlannedEndpoint, RoutingPlan

Answer = AdmitDecision | RoutingPlan | Sent | FirstToken | Failed | Finished | Withdrawn | Wakes


@dataclass(frozen=True)
class Step:
    call: str  # the ledger method
    ticket: Ticket  # 0 for a change to the pools
    at: float  # the call's `now` (a first token's `written_at`)
    answer: Answer


@dataclass(frozen=True)
class Decision:
    """One step less its times: the answer's kind and what it chose."""

    call: str
    ticket: Ticket
    chose: tuple[object, ...]


class RecordingLedger(Ledger):
    def __init__(self, settings: LedgerSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        self.steps: list[Step] = []

    def _keep(self, call: str, ticket: Ticket, at: float, answer: Answer) -> None:
        self.steps.append(Step(call=call, ticket=ticket, at=at, answer=answer))

    def update_pools(self, now: float, pools: Sequence[InferencePool]) -> Wakes:
        wakes = super().update_pools(now, pools)
        if wakes:  # a change that admitted or refused someone is a decision too
            self._keep("update_pools", 0, now, wakes)
        return wakes

    def admit(self, now: float, ask: Admission) -> AdmitDecision:
        decision = super().admit(now, ask)
        self._keep("admit", decision.ticket, now, decision)
        return decision

    def withdraw(self, ticket: Ticket, now: float) -> Withdrawn:
        withdrawn = super().withdraw(ticket, now)
        self._keep("withdraw", ticket, now, withdrawn)
        return withdrawn

    def plan(
        self,
        ticket: Ticket,
        now: float,
        blocks: PromptBlocks = NO_BLOCKS,
        subset: Iterable[str] | None = None,
    ) -> RoutingPlan:
        plan = super().plan(ticket, now, blocks, subset)
        self._keep("plan", ticket, now, plan)
        return plan

    def sent(self, ticket: Ticket, now: float, endpoint: PlannedEndpoint) -> Sent:
        sent = super().sent(ticket, now, endpoint)
        self._keep("sent", ticket, now, sent)
        return sent

    def first_token(self, ticket: Ticket, *, read_at: float, written_at: float) -> FirstToken:
        first = super().first_token(ticket, read_at=read_at, written_at=written_at)
        self._keep("first_token", ticket, written_at, first)
        return first

    def failed(self, ticket: Ticket, now: float, *, counts: bool = True) -> Failed:
        failed = super().failed(ticket, now, counts=counts)
        self._keep("failed", ticket, now, failed)
        return failed

    def finished(
        self,
        ticket: Ticket,
        now: float,
        *,
        status: int,
        error: str | None = None,
        prompt_tokens: int | None = None,
        recomputed_prompt_tokens: int = 0,
    ) -> Finished:
        finished = super().finished(
            ticket,
            now,
            status=status,
            error=error,
            prompt_tokens=prompt_tokens,
            recomputed_prompt_tokens=recomputed_prompt_tokens,
        )
        self._keep("finished", ticket, now, finished)
        return finished

    def requeue(self, ticket: Ticket, now: float) -> Wakes:
        wakes = super().requeue(ticket, now)
        self._keep("requeue", ticket, now, wakes)
        return wakes

    def decisions(self) -> list[Decision]:
        return [_timeless(step) for step in self.steps]


def _timeless(step: Step) -> Decision:
    answer = step.answer
    chose: tuple[object, ...]
    if isinstance(answer, RoutingPlan):
        chose = tuple((e.url, e.backlog_tokens, e.prefill_tokens) for e in answer.endpoints)
    elif isinstance(answer, Sent):
        chose = (answer.endpoint.url, answer.attempt)
    elif isinstance(answer, Failed):
        chose = (answer.endpoint, answer.ejected, answer.retry.url if answer.retry else None)
    elif isinstance(answer, Finished):
        log = dataclasses.replace(
            answer.log, total_ms=0.0, queue_ms=None, predicted_ttft_ms=None, ttft_ms=None
        )
        chose = (log, tuple(a.ticket for a in answer.wakes.granted))
    elif isinstance(answer, Withdrawn):
        chose = (answer.refused.reason, tuple(a.ticket for a in answer.wakes.granted))
    elif isinstance(answer, Wakes):
        granted = tuple(a.ticket for a in answer.granted)
        chose = (granted, tuple((r.ticket, r.reason) for r in answer.refused))
    elif isinstance(answer, FirstToken):
        # Whether it met the SLO is a matter of time; whom its free prefill admitted is not.
        chose = tuple(a.ticket for a in answer.wakes.granted)
    else:
        chose = (type(answer).__name__,)
    return Decision(call=step.call, ticket=step.ticket, chose=chose)
