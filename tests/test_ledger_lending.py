"""Lending whole replicas in the ledger (`laneway.ledger.lending`): chat packed onto as few
replicas as keep the SLO with headroom, never below keepReplicas; a replica to lend drains
first (no new chat turn) and is lent once its chats are done; taken back at once when chat
needs it, with the borrower's requests there to abort and requeue."""

from __future__ import annotations

import pytest
from support.ledger import ask, ledger_with, pool

from laneway.api import InferencePool, Lane
from laneway.ledger import Admitted, Ledger, Rebalanced, Role

CHAT_URLS = ("http://c0", "http://c1", "http://c2", "http://c3")
DOC_URLS = ("http://d0",)
ONE_CHUNK = {"chunkedPrefill": True, "chunkSize": 2048, "tokenBudget": 2048}
LEND_AFTER_S = 5.0


def chat_pool(keep: int = 1) -> InferencePool:
    # 4 turns per replica of which 3 (headroom 0.25) are filled before another is needed.
    return pool(
        "chat",
        CHAT_URLS,
        limits={"maxConcurrentRequests": 4, "maxContextTokens": 131072},
        lending={"borrower": "docs", "keepReplicas": keep, "headroom": 0.25},
    )


def docs_pool() -> InferencePool:
    return pool(
        "docs",
        DOC_URLS,
        lane="batch",
        prefill=ONE_CHUNK,
        limits={"maxConcurrentRequests": 8, "maxContextTokens": 131072},
    )


def roles(ledger: Ledger, chat: InferencePool) -> dict[str, Role]:
    return dict(ledger.roles(chat))


def count(ledger: Ledger, chat: InferencePool, role: Role) -> int:
    return sum(1 for r in ledger.roles(chat).values() if r is role)


def lend_all_idle(ledger: Ledger, chat: InferencePool, start: float = 0.0) -> float:
    """Rebalance every LEND_AFTER_S with no chat until nothing changes; the time reached."""
    now = start
    while True:
        changed = ledger.rebalance(now).changes
        now += LEND_AFTER_S
        if not changed and now > start + 2 * LEND_AFTER_S:
            return now


def chat_turn(ledger: Ledger, chat: InferencePool, now: float) -> tuple[int, str]:
    decision = ledger.admit(now, ask(chat, now))
    assert isinstance(decision, Admitted), decision
    endpoint = ledger.plan(decision.ticket, now).endpoints[0]
    ledger.sent(decision.ticket, now, endpoint)
    return decision.ticket, endpoint.url


def send_doc(ledger: Ledger, docs: InferencePool, now: float) -> tuple[int, str]:
    decision = ledger.admit(now, ask(docs, now, tokens=40000, lane=Lane.BATCH))
    assert isinstance(decision, Admitted), decision
    endpoint = ledger.plan(decision.ticket, now).endpoints[0]
    ledger.sent(decision.ticket, now, endpoint)
    return decision.ticket, endpoint.url


def test_idle_chat_replicas_are_lent_one_at_a_time_down_to_keep_replicas() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    assert set(roles(ledger, chat).values()) == {Role.SERVING}
    # A lull shorter than lend_after_s lends nothing.
    assert ledger.rebalance(0.0) == Rebalanced()
    assert ledger.rebalance(LEND_AFTER_S - 0.1) == Rebalanced()
    first = ledger.rebalance(LEND_AFTER_S)
    # An idle replica drains and, no chat to finish there, is lent at once.
    assert [(c.url, c.role) for c in first.changes] == [
        (first.changes[0].url, Role.DRAINING),
        (first.changes[0].url, Role.LENT),
    ]
    lend_all_idle(ledger, chat, LEND_AFTER_S)
    assert count(ledger, chat, Role.LENT) == 3
    assert count(ledger, chat, Role.SERVING) == 1  # keepReplicas
    # The borrower's line is fed on its own replica and the lent ones.
    (docs_now,) = [p for p in ledger.pools() if p.name == "docs"]
    lent = {url for url, role in roles(ledger, chat).items() if role is Role.LENT}
    assert set(docs_now.endpoints) == set(DOC_URLS) | lent
    (chat_now,) = [p for p in ledger.pools() if p.name == "chat"]
    assert set(chat_now.endpoints).isdisjoint(lent)


def draining_with_a_turn(ledger: Ledger, chat: InferencePool) -> tuple[dict[int, str], str, float]:
    """One turn on each chat replica (demand 4: two replicas needed), and the lull after
    which one of them drains: the turns, the draining replica, the time."""
    turns = [chat_turn(ledger, chat, 0.0) for _ in CHAT_URLS]
    assert sorted(url for _, url in turns) == sorted(CHAT_URLS)
    ledger.rebalance(0.0)
    (change,) = ledger.rebalance(LEND_AFTER_S).changes
    assert change.role is Role.DRAINING
    return dict(turns), change.url, LEND_AFTER_S


def test_a_draining_replica_takes_no_new_chat_and_is_lent_once_its_chats_end() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    on, draining, now = draining_with_a_turn(ledger, chat)
    # While its turn runs it is not lent, and no new turn goes there.
    for step in range(1, 4):
        ledger.rebalance(now + step * 0.1)
        assert roles(ledger, chat)[draining] is Role.DRAINING
        ticket, url = chat_turn(ledger, chat, now + step * 0.1)
        assert url != draining
        ledger.finished(ticket, now + step * 0.1, status=200)
    (own,) = [t for t, url in on.items() if url == draining]
    ledger.finished(own, now + 1, status=200)
    (lent,) = ledger.rebalance(now + 1).changes
    assert (lent.url, lent.role) == (draining, Role.LENT)


def test_a_draining_replica_serves_again_before_any_lent_one_is_reclaimed() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    _, draining, now = draining_with_a_turn(ledger, chat)
    for _ in range(6):  # demand 10: all four replicas needed
        ledger.admit(now, ask(chat, now))
    answer = ledger.rebalance(now)
    assert answer.reclaims == ()
    (back,) = answer.changes
    assert (back.url, back.role) == (draining, Role.SERVING)


def test_chat_demand_takes_a_lent_replica_back_with_its_documents_to_requeue() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    now = lend_all_idle(ledger, chat)
    lent = sorted(url for url, role in roles(ledger, chat).items() if role is Role.LENT)
    docs_on = dict(send_doc(ledger, docs, now) for _ in range(8))
    on_lent = {t: url for t, url in docs_on.items() if url in lent}
    assert on_lent, docs_on  # the lent replicas serve the borrower
    # Four chat turns: more than the one serving replica's three within headroom.
    for _ in range(4):
        ledger.admit(now, ask(chat, now))
    answer = ledger.rebalance(now)
    (reclaim,) = answer.reclaims
    assert roles(ledger, chat)[reclaim.url] is Role.RECLAIMING
    assert set(reclaim.tickets) == {t for t, url in on_lent.items() if url == reclaim.url}
    # The replica the fewest documents run on is the one taken back.
    assert len(reclaim.tickets) == min(list(on_lent.values()).count(url) for url in lent)
    # Chat goes there at once, the documents are no longer fed there.
    (chat_now,) = [p for p in ledger.pools() if p.name == "chat"]
    (docs_now,) = [p for p in ledger.pools() if p.name == "docs"]
    assert reclaim.url in chat_now.endpoints
    assert reclaim.url not in docs_now.endpoints
    for ticket in reclaim.tickets:
        ledger.requeue(ticket, now + 0.01)
    ledger.rebalance(now + 0.02)
    assert roles(ledger, chat)[reclaim.url] is Role.SERVING
    # Its first chat token reports the reclaim's latency; a later one none.
    turn = ledger.admit(now + 0.02, ask(chat, now + 0.02))
    assert isinstance(turn, Admitted)
    plan = ledger.plan(turn.ticket, now + 0.02, subset=[reclaim.url])
    ledger.sent(turn.ticket, now + 0.02, plan.endpoints[0])
    first = ledger.first_token(turn.ticket, read_at=now + 0.07, written_at=now + 0.07)
    assert first.reclaim_ms == pytest.approx(70.0)


def test_the_borrowers_own_replicas_are_never_taken_for_chat() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    now = lend_all_idle(ledger, chat)
    for _ in range(40):  # far more chat than the lender's four replicas hold
        ledger.admit(now, ask(chat, now))
    ledger.rebalance(now)
    ledger.rebalance(now)
    assert count(ledger, chat, Role.SERVING) == len(CHAT_URLS)
    (docs_now,) = [p for p in ledger.pools() if p.name == "docs"]
    assert docs_now.endpoints == DOC_URLS  # the batch lane keeps its own share
    assert DOC_URLS[0] not in ledger.roles(chat)


def test_a_pool_without_a_borrower_in_the_set_lends_nothing() -> None:
    chat = chat_pool()
    ledger = ledger_with(chat)  # no pool 'docs'
    assert ledger.roles(chat) == {}
    assert ledger.rebalance(100.0) == Rebalanced()


def test_without_lend_every_lent_replica_is_taken_back_and_none_lent() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    ledger = ledger_with(chat, docs)
    now = lend_all_idle(ledger, chat)
    lent = {url for url, role in roles(ledger, chat).items() if role is Role.LENT}
    docs_on = dict(send_doc(ledger, docs, now) for _ in range(8))
    # No chat at all, yet the shell cannot lend (more than one gateway replica).
    answer = ledger.rebalance(now, lend=False)
    assert {r.url for r in answer.reclaims} == lent
    assert {t for r in answer.reclaims for t in r.tickets} == {
        t for t, url in docs_on.items() if url in lent
    }
    for reclaim in answer.reclaims:
        for ticket in reclaim.tickets:
            ledger.requeue(ticket, now)
    ledger.rebalance(now + LEND_AFTER_S, lend=False)
    ledger.rebalance(now + 2 * LEND_AFTER_S, lend=False)
    assert set(roles(ledger, chat).values()) == {Role.SERVING}
