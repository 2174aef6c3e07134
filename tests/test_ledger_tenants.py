"""Tenants in a shared pool: caps on what each runs and queues, turns in the line, a fair
share of a full line, and the other gateway replicas' counts against the same caps."""

from __future__ import annotations

from dataclasses import replace

from support.ledger import ask, ledger_with, pool

from laneway.ledger import Admitted, Queued, Refused
from laneway.ledger.tenants import TenantCount
from laneway.routing.fairshare import TenantCaps, line_place_for


def test_a_tenant_at_its_running_cap_waits_while_another_takes_the_free_slots() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 4})
    ledger = ledger_with(chat)
    capped = TenantCaps(max_running=2)
    flood = [ledger.admit(0.0, replace(ask(chat, tenant="a"), caps=capped)) for _ in range(3)]
    assert [type(d) for d in flood] == [Admitted, Admitted, Queued]
    assert ledger.gate(chat).active == 2  # two slots stay free for others
    other = ledger.admit(0.0, ask(chat, tenant="b"))
    assert isinstance(other, Admitted)
    # b's request ending frees a slot, but a is still at its cap: nobody is granted.
    assert not ledger.finished(other.ticket, 1.0, status=200).wakes
    # One of a's own ending lets its waiting one run.
    wakes = ledger.finished(flood[0].ticket, 2.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [flood[2].ticket]
    assert ledger.tenant_count(chat, "a") == TenantCount(running=2, running_tokens=2000)


def test_a_tenant_over_its_cap_of_waiting_requests_is_refused_for_that() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 1})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_waiting=2)
    decisions = [ledger.admit(0.0, replace(ask(chat, tenant="a"), caps=caps)) for _ in range(4)]
    assert [type(d) for d in decisions] == [Admitted, Queued, Queued, Refused]
    refused = decisions[3]
    assert isinstance(refused, Refused)
    assert refused.reason == "tenant_queue_full"
    # Another tenant still joins the line: a's cap is a's alone.
    assert isinstance(ledger.admit(0.0, ask(chat, tenant="b")), Queued)


def test_a_full_line_gives_another_tenants_first_request_a_place() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 1})
    ledger = ledger_with(chat, max_waiting=4)
    flood = [ledger.admit(0.0, ask(chat, tenant="a")) for _ in range(5)]
    assert [type(d) for d in flood] == [Admitted] + [Queued] * 4
    first = ledger.admit(1.0, ask(chat, tenant="b"))
    assert isinstance(first, Queued)
    # a's newest request gave its place up, and its client is told why.
    (gave_up,) = first.wakes.refused
    assert (gave_up.ticket, gave_up.reason) == (flood[4].ticket, "line_share")
    assert ledger.tenant_count(chat, "a").waiting == 3
    # Up to an equal share each: b gets one more place, then both hold two.
    second = ledger.admit(1.0, ask(chat, tenant="b"))
    assert isinstance(second, Queued)
    assert len(second.wakes.refused) == 1
    third = ledger.admit(1.0, ask(chat, tenant="b"))
    assert isinstance(third, Refused)
    assert third.reason == "queue_full"
    again = ledger.admit(1.0, ask(chat, tenant="a"))
    assert isinstance(again, Refused)
    assert again.reason == "queue_full"


def test_tenants_take_turns_in_the_interactive_line() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 1})
    ledger = ledger_with(chat)
    running = ledger.admit(0.0, ask(chat, tenant="a"))
    backlog = [ledger.admit(0.0, ask(chat, tenant="a")).ticket for _ in range(5)]
    newcomer = ledger.admit(1.0, ask(chat, tenant="b")).ticket
    order = []
    ticket = running.ticket
    for now in (2.0, 3.0, 4.0):
        (granted,) = ledger.finished(ticket, now, status=200).wakes.granted
        ticket = granted.ticket
        order.append(ticket)
    # Turns by requests served: a has had one (the request that ran at once) when b's first
    # arrives, so b's leaves after one more of a's, ahead of the rest of a's backlog.
    assert order == [backlog[0], newcomer, backlog[1]]


def test_other_replicas_requests_count_against_the_cap() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 4})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running=2)
    ledger.set_peer_tenants(0.0, {(chat.key, "a"): TenantCount(running=2)})
    waiting = ledger.admit(0.0, replace(ask(chat, tenant="a"), caps=caps))
    assert isinstance(waiting, Queued)
    assert ledger.tenant_count(chat, "a") == TenantCount(running=2, waiting=1)
    assert ledger.own_tenants() == {(chat.key, "a"): TenantCount(running=0, waiting=1)}
    # The peer's requests ended: the waiting one runs here.
    wakes = ledger.set_peer_tenants(1.0, {(chat.key, "a"): TenantCount()})
    assert [g.ticket for g in wakes.granted] == [waiting.ticket]


def test_each_replica_keeps_to_its_part_of_a_cap() -> None:
    # Readings of the other replicas are never a reservation: two replicas admitting at the
    # same moment both see 0 there. Each keeping to half of the cap bounds the total anyway.
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    ledger.set_peer_tenants(0.0, {}, replicas=2)
    caps = TenantCaps(max_running=4)
    decisions = [ledger.admit(0.0, replace(ask(chat, tenant="a"), caps=caps)) for _ in range(3)]
    assert [type(d) for d in decisions] == [Admitted, Admitted, Queued]
    # Alone again: the whole cap is this replica's, and the waiting request runs.
    wakes = ledger.set_peer_tenants(1.0, {}, replicas=1)
    assert [g.ticket for g in wakes.granted] == [decisions[2].ticket]


def test_a_line_place_goes_from_the_largest_holder_up_to_an_equal_share() -> None:
    assert line_place_for("b", {"a": 8}, 8) == "a"
    assert line_place_for("b", {"a": 4, "b": 4}, 8) is None  # b has its share
    assert line_place_for("c", {"a": 5, "b": 3}, 8) == "a"
    assert line_place_for("c", {"a": 3, "b": 3, "c": 2}, 8) is None  # nobody over 8/3
    assert line_place_for("a", {"a": 8}, 8) is None  # alone: the line is its own


def test_a_tie_of_turns_goes_to_the_tenant_with_fewer_running() -> None:
    # The flood holds both slots and keeps two more in line. A request of the other tenant
    # arrives: returning from idle, its turn count is lifted to the flood's, a tie, and the
    # flood's queued requests arrived first. The freed slot still goes to the tenant with
    # none running, not to the flood's older request.
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 2})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running=2)
    flood = [ledger.admit(0.0, replace(ask(chat, tenant="flood"), caps=caps)) for _ in range(4)]
    assert [type(d) for d in flood] == [Admitted, Admitted, Queued, Queued]
    steady = ledger.admit(1.0, ask(chat, tenant="steady"))
    assert isinstance(steady, Queued)
    wakes = ledger.finished(flood[0].ticket, 2.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [steady.ticket]
    # Then the flood's turn: its oldest queued request.
    wakes = ledger.finished(flood[1].ticket, 3.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [flood[2].ticket]


def test_a_tenant_at_its_cap_of_running_prompt_tokens_waits_while_another_runs() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=5000)
    flood = [
        ledger.admit(0.0, replace(ask(chat, tokens=2000, tenant="a"), caps=caps)) for _ in range(3)
    ]
    # 2000 + 2000 fit in 5000; a third would make 6000, so it waits with five slots free.
    assert [type(d) for d in flood] == [Admitted, Admitted, Queued]
    assert ledger.tenant_count(chat, "a") == TenantCount(running=2, waiting=1, running_tokens=4000)
    other = ledger.admit(0.0, ask(chat, tokens=3000, tenant="b"))
    assert isinstance(other, Admitted)
    # b's request ending frees nothing of a's: a's waiting one still does not fit.
    assert not ledger.finished(other.ticket, 1.0, status=200).wakes
    wakes = ledger.finished(flood[0].ticket, 2.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [flood[2].ticket]
    assert ledger.tenant_count(chat, "a") == TenantCount(running=2, running_tokens=4000)
    for decision in flood[1:]:
        ledger.finished(decision.ticket, 3.0, status=200)
    assert ledger.own_tenants() == {}  # every token given back at the end


def test_a_prompt_longer_than_the_token_cap_still_runs_alone() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=1000)
    long = ledger.admit(0.0, replace(ask(chat, tokens=3000, tenant="a"), caps=caps))
    assert isinstance(long, Admitted)  # running nothing, it may run whatever its size
    short = ledger.admit(0.0, replace(ask(chat, tokens=100, tenant="a"), caps=caps))
    assert isinstance(short, Queued)  # 3000 + 100 is over the cap
    wakes = ledger.finished(long.ticket, 1.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [short.ticket]


def test_a_short_request_does_not_pass_its_tenants_longer_one_waiting() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=3000)
    first, long = (
        ledger.admit(0.0, replace(ask(chat, tokens=2000, tenant="a"), caps=caps)) for _ in range(2)
    )
    assert isinstance(first, Admitted)
    assert isinstance(long, Queued)
    # 2000 + 500 would fit, but a's 2000 waits ahead of it: it keeps its place behind.
    short = ledger.admit(0.0, replace(ask(chat, tokens=500, tenant="a"), caps=caps))
    assert isinstance(short, Queued)
    wakes = ledger.finished(first.ticket, 1.0, status=200).wakes
    assert [g.ticket for g in wakes.granted] == [long.ticket, short.ticket]


def test_other_replicas_prompt_tokens_count_against_the_token_cap() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=4000)
    peers = {(chat.key, "a"): TenantCount(running=1, running_tokens=3000)}
    ledger.set_peer_tenants(0.0, peers, replicas=2)
    # a's first fits this replica's part (1000 of 2000) and the cap over both (3000 there).
    # Its second fits this replica's part (2000 of 4000), not the cap over both: 3000 there
    # and 2000 here.
    first = ledger.admit(0.0, replace(ask(chat, tokens=1000, tenant="a"), caps=caps))
    assert isinstance(first, Admitted)
    second = ledger.admit(0.0, replace(ask(chat, tokens=1000, tenant="a"), caps=caps))
    assert isinstance(second, Queued)
    assert ledger.held_in_line(second.ticket) == "running_tokens"
    # Alone, the whole cap is this replica's: 1000 + 1000 fit once the peer's ended.
    wakes = ledger.set_peer_tenants(1.0, {(chat.key, "a"): TenantCount()}, replicas=1)
    assert [g.ticket for g in wakes.granted] == [second.ticket]
    # Up to the cap exactly, and not a token past it.
    third = ledger.admit(1.0, replace(ask(chat, tokens=2000, tenant="a"), caps=caps))
    assert isinstance(third, Admitted)
    fourth = ledger.admit(1.0, replace(ask(chat, tokens=1, tenant="a"), caps=caps))
    assert isinstance(fourth, Queued)


def test_a_prompt_past_the_replicas_part_waits_while_another_replica_runs_the_tenants() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=4000)
    ledger.set_peer_tenants(
        0.0, {(chat.key, "a"): TenantCount(running=1, running_tokens=3000)}, replicas=2
    )
    # Running none here but one of 3000 there: a second long prompt would make two at once
    # over both replicas, 6000 against the cap of 4000. It waits for the other replica's.
    long = ledger.admit(0.0, replace(ask(chat, tokens=3000, tenant="a"), caps=caps))
    assert isinstance(long, Queued)
    assert ledger.held_in_line(long.ticket) == "running_tokens"
    # The other replica's ended: running none anywhere, it runs, longer than this part.
    wakes = ledger.set_peer_tenants(1.0, {(chat.key, "a"): TenantCount()}, replicas=2)
    assert [g.ticket for g in wakes.granted] == [long.ticket]


def test_what_holds_a_request_in_line_is_its_tenants_first_one_there() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 2})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=2500)
    running = ledger.admit(0.0, replace(ask(chat, tokens=2000, tenant="a"), caps=caps))
    long, short = (
        ledger.admit(0.0, replace(ask(chat, tokens=tokens, tenant="a"), caps=caps))
        for tokens in (2000, 100)
    )
    assert isinstance(running, Admitted)
    # The short one would fit (2100), but it keeps its place behind a's long one, which the
    # cap holds: the cap is what it waits for, not a slot.
    assert ledger.held_in_line(long.ticket) == ledger.held_in_line(short.ticket) == "running_tokens"
    # b's takes the pool's last slot, and b's next waits for a slot: no cap of b's holds it.
    assert isinstance(ledger.admit(0.0, ask(chat, tenant="b")), Admitted)
    waiting = ledger.admit(0.0, ask(chat, tenant="b"))
    assert isinstance(waiting, Queued)
    assert ledger.held_in_line(waiting.ticket) is None
    assert ledger.held_in_line(running.ticket) is None  # running, not in line


def test_beside_other_replicas_a_lone_prompt_runs_only_under_the_lease() -> None:
    chat = pool(endpoints=["http://a"], limits={"maxConcurrentRequests": 8})
    ledger = ledger_with(chat)
    caps = TenantCaps(max_running_tokens=4000)
    ledger.set_peer_tenants(0.0, {(chat.key, "a"): TenantCount()}, replicas=2)
    ledger.set_lone_leases(0.0, needed=True)
    key = (chat.key, "a")
    # Running none anywhere, but another replica may be reading "none" at this moment too:
    # the prompt past this replica's part (2000) waits for the tenant's lease in the pool.
    long = ledger.admit(0.0, replace(ask(chat, tokens=3000, tenant="a"), caps=caps))
    assert isinstance(long, Queued)
    assert ledger.held_in_line(long.ticket) == "running_tokens"
    assert ledger.lone_wanted() == [key]
    assert ledger.lone_to_release() == []
    # A prompt within the part needs no lease: the parts bound those.
    short = ledger_with(chat)
    short.set_peer_tenants(0.0, {}, replicas=2)
    short.set_lone_leases(0.0, needed=True)
    within = short.admit(0.0, replace(ask(chat, tokens=2000, tenant="a"), caps=caps))
    assert isinstance(within, Admitted)
    # Under the lease it runs; the lease is used, to be handed back once its count is out.
    wakes = ledger.take_lone(1.0, key)
    assert [g.ticket for g in wakes.granted] == [long.ticket]
    assert ledger.lone_wanted() == []
    assert ledger.lone_to_release() == [key]
    ledger.released_lone(key)
    assert ledger.lone_to_release() == []
    # One lease, one prompt: the tenant's next long one waits for a lease of its own, even
    # once the first has ended and the tenant runs none anywhere again.
    after = ledger.admit(2.0, replace(ask(chat, tokens=3000, tenant="a"), caps=caps))
    assert isinstance(after, Queued)
    assert not ledger.finished(long.ticket, 3.0, status=200).wakes
    assert ledger.lone_wanted() == [key]
    # A lease no request here can use (the tenant now runs one elsewhere) goes back unused.
    ledger.set_peer_tenants(4.0, {key: TenantCount(running=1, running_tokens=3000)})
    assert not ledger.take_lone(4.0, key)
    assert ledger.lone_to_release() == [key]
    # Without the leases (one replica, or Redis away) the reading alone lets it run.
    ledger.released_lone(key)
    ledger.set_peer_tenants(5.0, {key: TenantCount()})
    assert [g.ticket for g in ledger.set_lone_leases(5.0, needed=False).granted] == [after.ticket]
