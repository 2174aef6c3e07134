"""The ledger's book of stored responses: which endpoint holds a response id, for whom,
until when, and what ends an entry (expiry, the endpoint leaving its pool, its engine
restarting), table-driven where the cases are alike."""

from __future__ import annotations

import dataclasses

import pytest
from support.ledger import ask, ledger_with, pool

from laneway.ledger import Admitted, Ledger, StoredResponse
from laneway.routing.engine_metrics import EngineMetrics

CHAT = pool(limits={"maxConcurrentRequests": 8})
TTL_S = 100.0
WITHOUT_B = dataclasses.replace(CHAT, endpoints=("http://a",))


def made_on(ledger: Ledger, endpoint: str, response_id: str, tenant: str = "acme") -> None:
    """A request of `tenant` sent to `endpoint`, whose engine stored `response_id`."""
    decision = ledger.admit(0.0, ask(CHAT, 0.0, tenant=tenant))
    assert isinstance(decision, Admitted)
    plan = ledger.plan(decision.ticket, 0.0, subset=[endpoint])
    ledger.sent(decision.ticket, 0.0, plan.endpoints[0])
    stored = ledger.record_response(decision.ticket, response_id, 1.0, context_tokens=42)
    assert stored == StoredResponse(endpoint, CHAT.key, tenant, "llama", 42, 1.0 + TTL_S)
    ledger.finished(decision.ticket, 1.0, status=200)


def test_a_response_is_held_by_the_endpoint_its_request_was_sent_to() -> None:
    ledger = ledger_with(CHAT, response_ttl_s=TTL_S)
    made_on(ledger, "http://b", "resp_1")
    found = ledger.response_holder("resp_1", "acme", 2.0)
    assert found is not None
    stored, holder_pool = found
    assert (stored.endpoint, stored.context_tokens, holder_pool.key) == ("http://b", 42, CHAT.key)


@pytest.mark.parametrize(
    ("case", "tenant", "now", "pools"),
    [
        ("another tenant's id", "beta", 2.0, [CHAT]),
        ("an anonymous caller", "", 2.0, [CHAT]),
        ("expired", "acme", 1.0 + TTL_S, [CHAT]),
        ("its endpoint left the pool", "acme", 2.0, [WITHOUT_B]),
        ("its pool was removed", "acme", 2.0, []),
    ],
)  # fmt: skip
def test_a_response_no_endpoint_holds_for_the_caller_is_unknown(
    case: str, tenant: str, now: float, pools: list[object]
) -> None:
    ledger = ledger_with(CHAT, response_ttl_s=TTL_S)
    made_on(ledger, "http://b", "resp_1")
    ledger.update_pools(now, pools)  # type: ignore[arg-type]
    assert ledger.response_holder("resp_1", tenant, now) is None, case


def test_an_engine_restart_seen_in_its_gauges_forgets_its_responses() -> None:
    ledger = ledger_with(CHAT, response_ttl_s=TTL_S)
    made_on(ledger, "http://a", "resp_on_a")
    made_on(ledger, "http://b", "resp_on_b")
    before = EngineMetrics(waiting=0, running=0, kv_usage=0.0, prefix_queries=500)
    after = EngineMetrics(waiting=0, running=0, kv_usage=0.0, prefix_queries=10)
    ledger.record_scrape("http://a", 1.0, before)
    assert ledger.record_scrape("http://a", 2.0, after).reset
    assert ledger.response_holder("resp_on_a", "acme", 2.0) is None
    assert ledger.response_holder("resp_on_b", "acme", 2.0) is not None


def test_a_peers_record_is_adopted_and_the_oldest_dropped_past_capacity() -> None:
    ledger = ledger_with(CHAT, response_ttl_s=TTL_S, response_capacity=2)
    peer = StoredResponse("http://a", CHAT.key, "acme", "llama", None, 50.0)
    ledger.adopt_response("resp_peer", peer)
    made_on(ledger, "http://b", "resp_2")
    made_on(ledger, "http://b", "resp_3")
    assert ledger.response_holder("resp_peer", "acme", 2.0) is None  # dropped first
    assert ledger.response_holder("resp_2", "acme", 2.0) is not None
    assert ledger.response_holder("resp_3", "acme", 2.0) is not None
