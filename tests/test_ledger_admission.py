"""The ledger's pool gates: slots per available endpoint, a line of tickets in admission
order, refusals as data, and every slot that frees handing itself on."""

from __future__ import annotations

import pytest
from support.ledger import ask, ledger_with, pool

from laneway.api import Lane
from laneway.ledger import Admitted, Queued, Refused, Wakes


def granted(wakes: Wakes) -> list[int]:
    return [admitted.ticket for admitted in wakes.granted]


def test_a_pool_admits_max_concurrent_requests_per_available_endpoint() -> None:
    chat = pool(limits={"maxConcurrentRequests": 2})
    ledger = ledger_with(chat)
    decisions = [ledger.admit(0.0, ask(chat)) for _ in range(5)]
    assert [type(d) for d in decisions] == [Admitted] * 4 + [Queued]
    assert ledger.gate(chat).active == 4
    assert ledger.gate(chat).waiting == 1


def test_interactive_leaves_the_line_first_then_batch_in_fair_share() -> None:
    docs = pool("docs", ["http://a"], lane="batch")
    ledger = ledger_with(docs)
    running = ledger.admit(0.0, ask(docs, lane=Lane.BATCH, tenant="bulk"))
    assert isinstance(running, Admitted)
    names: dict[int, str] = {}
    for index in range(3):
        queued = ledger.admit(0.0, ask(docs, lane=Lane.BATCH, tenant="bulk"))
        names[queued.ticket] = f"bulk-{index}"
    queued = ledger.admit(0.0, ask(docs, lane=Lane.BATCH, tenant="small"))
    names[queued.ticket] = "small-0"
    queued = ledger.admit(0.0, ask(docs, lane=Lane.INTERACTIVE))
    names[queued.ticket] = "chat"
    order = []
    ticket = running.ticket
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        finished = ledger.finished(ticket, now, status=200)
        (ticket,) = granted(finished.wakes)
        order.append(names[ticket])
        assert finished.wakes.granted[0].queue_ms == pytest.approx(now * 1000)
    assert order == ["chat", "bulk-0", "small-0", "bulk-1", "bulk-2"]


@pytest.mark.parametrize(
    ("case", "max_waiting", "endpoints", "ejected", "reason"),
    [
        ("the line is full", 1, ["http://a"], [], "queue_full"),
        ("every endpoint ejected: said at once", 10, ["http://a"], ["http://a"], "all_ejected"),
    ],
)
def test_refusals_say_why(
    case: str, max_waiting: int, endpoints: list[str], ejected: list[str], reason: str
) -> None:
    chat = pool(endpoints=endpoints)
    ledger = ledger_with(chat, max_waiting=max_waiting, failures_to_eject=1)
    first = ledger.admit(0.0, ask(chat))
    assert isinstance(first, Admitted)
    for url in ejected:
        plan = ledger.plan(first.ticket, 0.0)
        ledger.sent(first.ticket, 0.0, plan.endpoints[0])
        assert ledger.failed(first.ticket, 0.0).endpoint == url
    if not ejected:
        assert isinstance(ledger.admit(0.0, ask(chat)), Queued)
    refused = ledger.admit(0.0, ask(chat))
    assert isinstance(refused, Refused), case
    assert refused.reason == reason
    assert refused.gate.active == 1


def test_a_pool_at_zero_queues_until_its_first_endpoint_arrives() -> None:
    empty = pool(endpoints=[])
    ledger = ledger_with(empty)
    queued = ledger.admit(0.0, ask(empty))
    assert isinstance(queued, Queued)
    assert ledger.demand(1.0)[empty.key].queued_requests == 1
    wakes = ledger.update_pools(60.0, [pool(endpoints=["http://a"])])
    assert granted(wakes) == [queued.ticket]
    assert wakes.granted[0].queue_ms == pytest.approx(60_000)
    demand = ledger.demand(60.0)[empty.key]
    assert (demand.queued_requests, demand.in_flight_requests) == (0, 1)


def test_a_removed_pool_refuses_its_line_and_lets_running_requests_finish() -> None:
    chat = pool(endpoints=["http://a"])
    ledger = ledger_with(chat)
    running = ledger.admit(0.0, ask(chat))
    waiting = ledger.admit(0.0, ask(chat))
    wakes = ledger.update_pools(1.0, [])
    assert [(r.ticket, r.reason) for r in wakes.refused] == [(waiting.ticket, "pool_removed")]
    late = ledger.admit(1.0, ask(chat))
    assert isinstance(late, Refused)
    assert late.reason == "pool_removed"
    finished = ledger.finished(running.ticket, 2.0, status=200)
    assert not finished.wakes
    for ticket in (waiting.ticket, late.ticket):
        assert ledger.finished(ticket, 2.0, status=503).log.status == 503
    assert ledger.demand(2.0) == {}


def test_draining_refuses_the_lines_and_every_newcomer() -> None:
    chat = pool(endpoints=["http://a"])
    ledger = ledger_with(chat)
    ledger.admit(0.0, ask(chat))
    waiting = ledger.admit(0.0, ask(chat))
    wakes = ledger.drain()
    assert [(r.ticket, r.reason) for r in wakes.refused] == [(waiting.ticket, "shutting_down")]
    newcomer = ledger.admit(0.0, ask(chat))
    assert isinstance(newcomer, Refused)
    assert newcomer.reason == "shutting_down"


def test_a_withdrawn_ticket_leaves_no_trace_and_a_slot_granted_meanwhile_moves_on() -> None:
    chat = pool(endpoints=["http://a"])
    ledger = ledger_with(chat)
    running = ledger.admit(0.0, ask(chat))
    gave_up = ledger.admit(0.0, ask(chat))
    withdrawn = ledger.withdraw(gave_up.ticket, 30.0)
    assert withdrawn.refused.reason == "timeout"
    assert not withdrawn.wakes
    assert (ledger.gate(chat).active, ledger.gate(chat).waiting) == (1, 0)
    # Granted in the same tick as its waiter gave up: the slot goes to the next in line.
    second, third = ledger.admit(31.0, ask(chat)), ledger.admit(31.0, ask(chat))
    assert granted(ledger.finished(running.ticket, 32.0, status=200).wakes) == [second.ticket]
    assert granted(ledger.withdraw(second.ticket, 32.0).wakes) == [third.ticket]
    assert (ledger.gate(chat).active, ledger.gate(chat).waiting) == (1, 0)


def test_an_ejection_lowers_the_limit_and_a_passing_probe_raises_it_again() -> None:
    chat = pool()
    ledger = ledger_with(chat, failures_to_eject=1)
    first = ledger.admit(0.0, ask(chat))
    plan = ledger.plan(first.ticket, 0.0)
    ledger.sent(first.ticket, 0.0, plan.endpoints[0])
    failed = ledger.failed(first.ticket, 0.0)
    assert failed.ejected
    assert failed.retry == plan.endpoints[1]
    assert ledger.gate(chat).limit == 1
    assert ledger.ejected() == [failed.endpoint]
    waiting = ledger.admit(0.0, ask(chat))
    assert isinstance(waiting, Queued)
    assert not ledger.record_probe(failed.endpoint, 1.0, passed=False)
    assert granted(ledger.record_probe(failed.endpoint, 2.0, passed=True)) == [waiting.ticket]
    assert ledger.gate(chat).limit == 2
