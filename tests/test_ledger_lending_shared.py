"""Lending shared between gateway replicas (issue 26), pure: the leader decides on every
replica's chat demand; a follower adopts the roles the leader published, sends its batch
to the lent replicas, stops its chat there, and on a reclaim ends its own borrowed
requests on the replica taken back. The shell's mode follows the lease and the roles."""

from __future__ import annotations

from support.ledger import ask, ledger_with
from test_ledger_lending import CHAT_URLS, chat_pool, docs_pool, lend_all_idle, roles, send_doc

from laneway.gateway.serving.lending import Mode, mode_after
from laneway.gateway.state.lending_share import Published
from laneway.ledger import Admitted, Ledger, PeerLending, Rebalanced, Role


def endpoints(ledger: Ledger, name: str) -> tuple[str, ...]:
    (found,) = [p for p in ledger.pools() if p.name == name]
    return found.endpoints


def test_the_leader_keeps_the_replicas_the_other_replicas_chat_needs() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    alone, leader = ledger_with(chat, docs), ledger_with(chat, docs)
    lend_all_idle(alone, chat)
    assert list(roles(alone, chat).values()).count(Role.LENT) == 3
    # Seven turns running and waiting on the other replicas: three replicas' worth (three
    # turns each within headroom), though this one has no chat at all.
    now = 0.0
    for _ in range(6):
        leader.rebalance(now, peers=PeerLending(demand={chat.key: 7}))
        now += 5.0
    assert list(roles(leader, chat).values()).count(Role.LENT) == 1
    # Their chat grows: the lent replica is taken back.
    answer = leader.rebalance(now, peers=PeerLending(demand={chat.key: 12}))
    assert [c.role for c in answer.changes] == [Role.RECLAIMING]
    assert Role.LENT not in roles(leader, chat).values()


def test_the_leader_lends_a_replica_once_no_gateway_replica_has_chat_there() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    leader = ledger_with(chat, docs)
    busy = PeerLending(in_flight=dict.fromkeys(CHAT_URLS, 1))  # a turn of theirs on each
    leader.rebalance(0.0, peers=busy)
    answer = leader.rebalance(5.0, peers=busy)
    ((draining, role),) = [(c.url, c.role) for c in answer.changes]
    assert role is Role.DRAINING
    assert draining not in endpoints(leader, "chat")
    assert draining not in endpoints(leader, "docs")
    assert roles(leader, chat)[draining] is Role.DRAINING
    # Their turn there ended: lent.
    answer = leader.rebalance(5.1, peers=PeerLending())
    assert (draining, Role.LENT) in [(c.url, c.role) for c in answer.changes]
    assert draining in endpoints(leader, "docs")


def test_the_leader_lends_no_replica_before_the_other_replicas_can_see_it_drain() -> None:
    """The others plan chat on a replica until they adopt its draining role, on their next
    tick: lent at once (no chat of theirs there yet, as Redis said a moment ago), a replica
    would get the leader's documents beside the chat they still send it."""
    chat, docs = chat_pool(keep=1), docs_pool()
    leader = ledger_with(chat, docs)
    idle = PeerLending(settle_s=1.0)  # the others adopt a role within a second
    leader.rebalance(0.0, peers=idle)
    answer = leader.rebalance(5.0, peers=idle)
    ((draining, role),) = [(c.url, c.role) for c in answer.changes]
    assert role is Role.DRAINING
    assert leader.rebalance(5.5, peers=idle).changes == ()
    assert draining not in endpoints(leader, "docs")
    answer = leader.rebalance(6.0, peers=idle)
    assert (draining, Role.LENT) in [(c.url, c.role) for c in answer.changes]
    assert draining in endpoints(leader, "docs")


def test_the_leader_lends_no_replica_while_the_others_load_cannot_be_read() -> None:
    """Right after Redis comes back the leader may hold the lease before its load share
    reads again: no reading of the others' requests is not a reading of none."""
    chat, docs = chat_pool(keep=1), docs_pool()
    leader = ledger_with(chat, docs)
    unread = PeerLending(loads_known=False)
    leader.rebalance(0.0, peers=unread)
    answer = leader.rebalance(5.0, peers=unread)
    ((draining, role),) = [(c.url, c.role) for c in answer.changes]
    assert role is Role.DRAINING  # the least busy one is still chosen to drain
    later = leader.rebalance(10.0, peers=unread)
    assert Role.LENT not in [c.role for c in later.changes]
    assert Role.LENT not in roles(leader, chat).values()
    assert draining not in endpoints(leader, "docs")
    # Read again, and no request of theirs there: lent.
    answer = leader.rebalance(10.1, peers=PeerLending())
    assert (draining, Role.LENT) in [(c.url, c.role) for c in answer.changes]


def test_a_follower_sends_batch_to_the_lent_replica_and_chat_elsewhere() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    follower = ledger_with(chat, docs)
    lent = CHAT_URLS[1:]
    published = {chat.key: {url: Role.LENT if url in lent else Role.SERVING for url in CHAT_URLS}}
    answer = follower.adopt_roles(0.0, published)
    assert {(c.url, c.role) for c in answer.changes} == {(url, Role.LENT) for url in lent}
    assert answer.reclaims == ()
    assert endpoints(follower, "chat") == CHAT_URLS[:1]
    assert set(lent) <= set(endpoints(follower, "docs"))
    docs_on = [send_doc(follower, docs, 0.0)[1] for _ in range(8)]
    assert set(docs_on) & set(lent)
    # The same roles again change nothing.
    assert follower.adopt_roles(0.1, published) == Rebalanced()


def test_a_follower_that_cannot_end_borrowed_requests_sends_no_batch_to_a_lent_replica() -> None:
    """The endpoint picker's ledger (`borrow_lent=False`): Envoy holds its requests, so it
    could not end one on a replica taken back. Its chat leaves the lent replicas all the
    same; its batch stays on the borrower's own."""
    chat, docs = chat_pool(keep=1), docs_pool()
    picker = ledger_with(chat, docs, borrow_lent=False)
    lent = CHAT_URLS[1:]
    published = {chat.key: {url: Role.LENT if url in lent else Role.SERVING for url in CHAT_URLS}}
    answer = picker.adopt_roles(0.0, published)
    assert {(c.url, c.role) for c in answer.changes} == {(url, Role.LENT) for url in lent}
    assert endpoints(picker, "chat") == CHAT_URLS[:1]
    assert endpoints(picker, "docs") == docs.endpoints
    # Taken back: chat there at once.
    published[chat.key][lent[0]] = Role.RECLAIMING
    picker.adopt_roles(1.0, published)
    assert endpoints(picker, "chat") == (CHAT_URLS[0], lent[0])


def test_a_follower_ends_its_own_documents_on_a_replica_the_leader_took_back() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    follower = ledger_with(chat, docs)
    lent = CHAT_URLS[1:]
    published = {chat.key: {url: Role.LENT if url in lent else Role.SERVING for url in CHAT_URLS}}
    follower.adopt_roles(0.0, published)
    docs_on = dict(send_doc(follower, docs, 0.0) for _ in range(8))
    back = next(url for url in lent if url in docs_on.values())
    published[chat.key][back] = Role.RECLAIMING
    answer = follower.adopt_roles(1.0, published)
    (reclaim,) = answer.reclaims
    assert reclaim.url == back
    assert set(reclaim.tickets) == {t for t, url in docs_on.items() if url == back}
    assert back in endpoints(follower, "chat")
    assert back not in endpoints(follower, "docs")
    for ticket in reclaim.tickets:
        follower.requeue(ticket, 1.0)
    # Chat is planned there at once.
    turn = follower.admit(1.0, ask(chat, 1.0))
    assert isinstance(turn, Admitted)
    assert follower.plan(turn.ticket, 1.0, subset=[back]).endpoints[0].url == back
    # The leader says serving once its own are gone: nothing more to end here.
    published[chat.key][back] = Role.SERVING
    assert follower.adopt_roles(2.0, published).reclaims == ()


def test_an_endpoint_the_leader_does_not_know_serves_chat() -> None:
    chat, docs = chat_pool(keep=1), docs_pool()
    follower = ledger_with(chat, docs)
    follower.adopt_roles(0.0, {chat.key: {url: Role.LENT for url in CHAT_URLS[1:]}})
    answer = follower.adopt_roles(1.0, {})  # a leader with no lending pool of that name
    assert {c.url for c in answer.changes} == set(CHAT_URLS[1:])
    assert set(roles(follower, chat).values()) == {Role.SERVING}
    assert len(answer.reclaims) == 3


def test_the_mode_follows_the_lease_and_the_published_roles() -> None:
    some = Published(term=3, version=9, roles={})
    assert mode_after(None, None) is Mode.UNSHARED  # Redis did not answer
    assert mode_after(2, None) is Mode.LEADING
    assert mode_after(0, some) is Mode.FOLLOWING
    assert mode_after(0, None) is Mode.UNSHARED  # a leader that has published nothing
