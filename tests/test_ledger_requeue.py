"""Requeue: the shell ends a running request's attempt to take its replica back; the ledger
releases what the attempt held, puts the request back in its pool's line, and its log says
so."""

from __future__ import annotations

import pytest
from support.ledger import ask, ledger_with, pool

from laneway.api import Lane
from laneway.ledger import Admitted, Queued


def test_a_requeued_request_gives_its_slot_to_the_one_waiting_and_waits_behind_it() -> None:
    chat = pool("chat", ("http://a",), limits={"maxConcurrentRequests": 1})
    ledger = ledger_with(chat)
    first = ledger.admit(0.0, ask(chat, tokens=3000))
    second = ledger.admit(0.1, ask(chat, tokens=500))
    assert isinstance(first, Admitted)
    assert isinstance(second, Queued)
    endpoint = ledger.plan(first.ticket, 0.2).endpoints[0]
    ledger.sent(first.ticket, 0.2, endpoint)
    assert ledger.load("http://a").in_flight == 1

    wakes = ledger.requeue(first.ticket, 0.5)

    assert [a.ticket for a in wakes.granted] == [second.ticket]
    assert ledger.load("http://a").in_flight == 0  # the aborted attempt holds nothing
    assert ledger.gate(chat).waiting == 1
    assert "http://a" not in ledger.ejected()  # a reclaim is no failure of the endpoint
    done = ledger.finished(second.ticket, 0.6, status=200)
    assert [a.ticket for a in done.wakes.granted] == [first.ticket]
    resent = ledger.plan(first.ticket, 0.6).endpoints[0]
    ledger.sent(first.ticket, 0.6, resent)
    log = ledger.finished(first.ticket, 1.0, status=200, recomputed_prompt_tokens=7).log
    assert (log.attempts, log.requeued, log.recomputed_prompt_tokens) == (2, 1, 7)
    assert log.queue_ms == pytest.approx(100.0)  # its second wait, from the requeue to its grant
    assert log.line(1.0)["requeued"] == 1


def test_a_requeued_document_with_room_is_granted_again_at_once() -> None:
    limits = {"maxConcurrentRequests": 4, "maxContextTokens": 131072}
    docs = pool("docs", ("http://a",), lane="batch", limits=limits)
    ledger = ledger_with(docs)
    admitted = ledger.admit(0.0, ask(docs, tokens=40000, lane=Lane.BATCH))
    assert isinstance(admitted, Admitted)
    ledger.sent(admitted.ticket, 0.0, ledger.plan(admitted.ticket, 0.0).endpoints[0])

    wakes = ledger.requeue(admitted.ticket, 1.0)

    assert [a.ticket for a in wakes.granted] == [admitted.ticket]
    assert ledger.gate(docs).waiting == 0


def test_a_request_not_running_cannot_be_requeued() -> None:
    chat = pool("chat", ("http://a",), limits={"maxConcurrentRequests": 1})
    ledger = ledger_with(chat)
    ledger.admit(0.0, ask(chat))
    waiting = ledger.admit(0.0, ask(chat))
    with pytest.raises(ValueError, match="holds no slot"):
        ledger.requeue(waiting.ticket, 0.1)
