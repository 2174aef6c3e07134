"""The batch lane fed per replica: a document goes to a replica when its prefill has room
(a first token there frees it), within the replica's maxConcurrentRequests and KV room,
not through one pool-wide count."""

from __future__ import annotations

from support.ledger import ask, ledger_with, pool

from laneway.api import InferencePool, Lane
from laneway.ledger import Admitted, EndpointLoad, Ledger, Queued, Wakes
from laneway.ledger.feeding import prefill_slots
from laneway.routing.engine_metrics import EngineMetrics

# A budget of one chunk: the engine prefills one prompt per step, so a replica takes two
# (the one prefilling and the next, waiting in its engine for the budget the first leaves).
ONE_CHUNK = {"chunkedPrefill": True, "chunkSize": 2048, "tokenBudget": 2048}


def docs_pool(
    max_concurrent: int = 8, endpoints: tuple[str, ...] = ("http://a", "http://b")
) -> InferencePool:
    return pool(
        "docs",
        endpoints,
        lane="batch",
        prefill=ONE_CHUNK,
        limits={"maxConcurrentRequests": max_concurrent, "maxContextTokens": 131072},
    )


def start(ledger: Ledger, docs: InferencePool, ticket: int, now: float = 0.0) -> str:
    """Plan and send an admitted document; the endpoint it went to."""
    plan = ledger.plan(ticket, now)
    ledger.sent(ticket, now, plan.endpoints[0])
    return plan.endpoints[0].url


def granted(wakes: Wakes) -> list[int]:
    return [admitted.ticket for admitted in wakes.granted]


def admit_all(ledger: Ledger, docs: InferencePool, count: int) -> list[int]:
    decisions = [ledger.admit(0.0, ask(docs, tokens=40000, lane=Lane.BATCH)) for _ in range(count)]
    return [d.ticket for d in decisions if isinstance(d, Admitted)]


def test_prefill_slots_follow_the_engines_step_budget() -> None:
    cases = [
        # (prefill spec, slots): the chunks one step holds, plus the next prompt waiting
        (ONE_CHUNK, 2),
        ({"chunkedPrefill": True, "chunkSize": 1024, "tokenBudget": 2048}, 3),
        ({"chunkedPrefill": False, "chunkSize": 1024, "tokenBudget": 2048}, 2),
    ]
    for spec, slots in cases:
        assert prefill_slots(pool("docs", lane="batch", prefill=spec)) == slots, spec


def test_a_replica_takes_the_next_document_when_one_of_its_prefills_ends() -> None:
    docs = docs_pool()
    ledger = ledger_with(docs)
    running = admit_all(ledger, docs, 6)
    # Two prefill slots on each of two replicas, though maxConcurrentRequests is 8 each.
    assert len(running) == 4
    assert ledger.gate(docs).waiting == 2
    on = {ticket: start(ledger, docs, ticket) for ticket in running}
    assert sorted(on.values()) == ["http://a", "http://a", "http://b", "http://b"]
    first_on_b = next(t for t, url in on.items() if url == "http://b")
    first = ledger.first_token(first_on_b, read_at=1.0, written_at=1.0)
    (next_doc,) = granted(first.wakes)
    # It goes where the prefill freed, though the other replica runs as many requests.
    assert start(ledger, docs, next_doc, 1.0) == "http://b"
    # A second call for the same first token admits nobody again.
    assert not ledger.first_token(first_on_b, read_at=1.1, written_at=1.1).wakes


def test_max_concurrent_requests_still_bounds_each_replica() -> None:
    docs = docs_pool(max_concurrent=1, endpoints=("http://a",))
    ledger = ledger_with(docs)
    (ticket,) = admit_all(ledger, docs, 3)
    start(ledger, docs, ticket)
    assert not ledger.first_token(ticket, read_at=1.0, written_at=1.0).wakes
    (next_doc,) = granted(ledger.finished(ticket, 2.0, status=200).wakes)
    assert start(ledger, docs, next_doc, 2.0) == "http://a"


def test_a_replica_whose_kv_is_full_takes_no_document_until_a_scrape_shows_room() -> None:
    docs = docs_pool(endpoints=("http://a",))
    ledger = ledger_with(docs)
    full = EngineMetrics(waiting=0, running=2, kv_usage=0.95)
    assert not ledger.record_scrape("http://a", 0.0, full).wakes
    assert admit_all(ledger, docs, 2) == []
    assert ledger.gate(docs).waiting == 2
    room = EngineMetrics(waiting=0, running=1, kv_usage=0.4)
    scraped = ledger.record_scrape("http://a", 1.0, room)
    assert len(granted(scraped.wakes)) == 2


def test_a_peer_gateways_prefill_takes_one_of_the_replicas_slots() -> None:
    docs = docs_pool(endpoints=("http://a",))
    ledger = ledger_with(docs)
    ledger.set_peer_loads({"http://a": EndpointLoad(in_flight=1, prefill_tokens=50000)})
    assert len(admit_all(ledger, docs, 3)) == 2  # before the peers' load was counted
    ledger = ledger_with(docs)
    ledger.set_peer_loads({"http://a": EndpointLoad(in_flight=1, prefill_tokens=50000)})
    ledger.update_pools(0.0, [docs])  # the limit follows the load the gateway now knows
    assert len(admit_all(ledger, docs, 3)) == 1


def test_a_document_that_ends_before_its_first_token_frees_its_slot() -> None:
    docs = docs_pool(endpoints=("http://a",))
    ledger = ledger_with(docs)
    first, second = admit_all(ledger, docs, 3)
    start(ledger, docs, first)
    # The second was granted but not sent: it still holds its slot, so nobody else comes.
    assert ledger.gate(docs).waiting == 1
    (third,) = granted(ledger.finished(first, 1.0, status=499).wakes)
    assert {start(ledger, docs, second, 1.0), start(ledger, docs, third, 1.0)} == {"http://a"}
    assert ledger.gate(docs).active == 2


def test_feeding_off_gives_the_batch_pool_one_pool_wide_count() -> None:
    docs = docs_pool()
    ledger = ledger_with(docs, feed_batch_per_replica=False)
    decisions = [ledger.admit(0.0, ask(docs, lane=Lane.BATCH)) for _ in range(17)]
    assert [type(d) for d in decisions] == [Admitted] * 16 + [Queued]


def test_the_interactive_lane_is_not_fed() -> None:
    chat = pool("chat", prefill=ONE_CHUNK, limits={"maxConcurrentRequests": 4})
    ledger = ledger_with(chat)
    decisions = [ledger.admit(0.0, ask(chat)) for _ in range(9)]
    assert [type(d) for d in decisions] == [Admitted] * 8 + [Queued]
