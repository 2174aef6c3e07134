"""One request's life through the ledger: plan, sent, first token, finished (and failed),
with the load, prefix index, prefill rates, demand and log it changes on the way."""

from __future__ import annotations

import dataclasses
import random

import pytest
from support.given_facts import GivenFacts, cycle_over
from support.ledger import ask, ledger_with, pool

from laneway.ledger import Admitted, EndpointLoad, Ledger, PromptBlocks, RequestLog
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.kv_events import BlockStored, token_block_keys
from laneway.routing.picker import PickingSettings
from laneway.routing.plan import plan_cycle
from laneway.routing.slo import PRIOR_MS_PER_TOKEN

CHAT = pool(slo={"ttftMillis": 200}, limits={"maxConcurrentRequests": 8})


def admitted(ledger: Ledger, now: float = 0.0, **kwargs: object) -> int:
    decision = ledger.admit(now, ask(CHAT, now, **kwargs))  # type: ignore[arg-type]
    assert isinstance(decision, Admitted)
    return decision.ticket


def test_the_plan_is_the_cycles_over_the_ledgers_own_load_and_gauges() -> None:
    ledger = ledger_with(CHAT)
    busy = admitted(ledger)
    ledger.sent(busy, 0.0, ledger.plan(busy, 0.0).endpoints[0])
    ledger.record_scrape("http://a", 0.0, EngineMetrics(waiting=3, running=2, kv_usage=0.5))
    ticket = admitted(ledger, 0.1)
    plan = ledger.plan(ticket, 0.2)
    urls = ("http://a", "http://b")
    loads = {url: ledger.load(url) for url in urls}
    gauges = {url: m for url in urls if (m := ledger.fresh_metrics(url, 0.2)) is not None}
    facts = GivenFacts(loads=loads, gauges=gauges)
    # The ledger's generator drew once for the first plan; a copy replays the second.
    rng = random.Random(0)
    profile = PickingSettings().profile()
    plan_cycle(cycle_over(plan.route, urls, facts), profile, rng)
    expected = plan_cycle(cycle_over(plan.route, urls, facts, elapsed_ms=100.0), profile, rng)
    assert plan == expected
    assert sum(load.in_flight for load in loads.values()) == 1


def test_load_counts_from_sent_until_the_first_token_and_the_end() -> None:
    ledger = ledger_with(CHAT)
    ticket = admitted(ledger)
    best = ledger.plan(ticket, 0.0).endpoints[0]
    ledger.sent(ticket, 0.0, best)
    assert ledger.load(best.url) == EndpointLoad(in_flight=1, prefill_tokens=1000)
    first = ledger.first_token(ticket, read_at=0.150, written_at=0.151)
    assert first.met_slo
    assert first.ttft_ms == pytest.approx(151)
    assert ledger.load(best.url) == EndpointLoad(in_flight=1, prefill_tokens=0)
    # Only the first one counts: a second changes neither the load nor the SLO window.
    assert ledger.first_token(ticket, read_at=0.3, written_at=0.3) == first
    assert ledger.load(best.url) == EndpointLoad(in_flight=1, prefill_tokens=0)
    assert ledger.demand(0.5)[CHAT.key].ttft_met == 1
    ledger.finished(ticket, 1.0, status=200)
    assert ledger.load(best.url) == EndpointLoad()


def test_a_failed_attempt_gives_its_load_back_and_names_the_retry() -> None:
    ledger = ledger_with(CHAT)
    ticket = admitted(ledger)
    plan = ledger.plan(ticket, 0.0)
    ledger.sent(ticket, 0.0, plan.endpoints[0])
    failed = ledger.failed(ticket, 0.1)
    assert (failed.endpoint, failed.ejected, failed.retry) == (
        plan.endpoints[0].url,
        False,
        plan.endpoints[1],
    )
    assert ledger.load(plan.endpoints[0].url) == EndpointLoad()
    sent = ledger.sent(ticket, 0.1, plan.endpoints[1])
    assert sent.attempt == 2
    assert ledger.failed(ticket, 0.2).retry is None  # two attempts at most
    log = ledger.finished(ticket, 0.3, status=503, error="no_healthy_endpoint").log
    assert (log.attempts, log.endpoint) == (2, plan.endpoints[1].url)


def test_the_prefill_rate_learns_from_the_first_token_read_since_sent() -> None:
    ledger = ledger_with(CHAT)
    ticket = admitted(ledger)
    best = ledger.plan(ticket, 0.0).endpoints[0]
    ledger.sent(ticket, 1.0, best)
    ledger.first_token(ticket, read_at=1.5, written_at=1.6)
    rate = ledger.prefill_rate(best.url)
    assert rate.samples == 1
    # The prior counts as one observation: halfway to 500 ms over 1,000 backlog tokens.
    assert rate.ms_per_token == pytest.approx((PRIOR_MS_PER_TOKEN + 0.5) / 2)
    # A peer that has learned nothing predicts with the learned one's rate.
    other = admitted(ledger, 2.0)
    plan = ledger.plan(other, 2.0)
    predicted = [e.predicted_ttft_ms for e in plan.endpoints]
    assert predicted == [pytest.approx(rate.ms_per_token * 1000)] * 2


def test_the_estimated_index_records_every_endpoint_tried() -> None:
    ledger = ledger_with(CHAT)
    assert ledger.wants_prefix_blocks
    blocks = PromptBlocks(hashes=(11, 22, 33, 44))
    ticket = admitted(ledger)
    plan = ledger.plan(ticket, 0.0, blocks)
    ledger.sent(ticket, 0.0, plan.endpoints[0])
    ledger.failed(ticket, 0.0)
    ledger.sent(ticket, 0.0, plan.endpoints[1])
    assert ledger.prefix_index.matched_blocks(blocks.hashes) == {
        "http://a": 4,
        "http://b": 4,
    }


def test_the_exact_index_is_fed_by_kv_events_and_never_by_routing() -> None:
    ledger = ledger_with(CHAT)
    ids = list(range(64))
    ledger.record_kv_events(
        "http://b",
        [BlockStored(block_hashes=(1, 2), parent_block_hash=None, token_ids=tuple(ids[:32]),
                     block_size=16)],
    )  # fmt: skip
    blocks = PromptBlocks(hashes=token_block_keys(ids, 16), exact_block_size=16)
    ticket = admitted(ledger)
    plan = ledger.plan(ticket, 0.0, blocks)
    by_url = {e.url: e for e in plan.endpoints}
    assert by_url["http://b"].prefill_tokens == 1000 - 32
    assert by_url["http://a"].prefill_tokens == 1000
    ledger.sent(ticket, 0.0, by_url["http://a"])
    assert ledger.prefix_index.blocks_of("http://a") == 0


def test_an_engine_restart_seen_in_its_gauges_forgets_its_blocks() -> None:
    ledger = ledger_with(CHAT)
    ledger.prefix_index.record("http://a", (1, 2, 3))
    before = EngineMetrics(waiting=0, running=0, kv_usage=0.0, prefix_queries=500)
    after = EngineMetrics(waiting=0, running=0, kv_usage=0.0, prefix_queries=10)
    assert not ledger.record_scrape("http://a", 0.0, before).reset
    assert ledger.record_scrape("http://a", 1.0, after).reset
    assert ledger.prefix_index.blocks_of("http://a") == 0


@pytest.mark.parametrize(
    ("case", "age_s", "fresh"),
    [("just taken", 0.0, True), ("at the limit", 5.0, True), ("past it", 5.01, False)],
)
def test_scraped_gauges_go_stale(case: str, age_s: float, fresh: bool) -> None:
    ledger = ledger_with(CHAT, stale_after_s=5.0)
    gauges = EngineMetrics(waiting=1, running=1, kv_usage=0.1)
    ledger.record_scrape("http://a", 10.0, gauges)
    assert (ledger.fresh_metrics("http://a", 10.0 + age_s) is not None) is fresh, case


def test_peer_loads_add_to_this_replicas_own_and_are_not_published_again() -> None:
    ledger = ledger_with(CHAT)
    ticket = admitted(ledger)
    mine = ledger.plan(ticket, 0.0).endpoints[0]
    ledger.sent(ticket, 0.0, mine)
    other = "http://b" if mine.url == "http://a" else "http://a"
    ledger.set_peer_loads({other: EndpointLoad(in_flight=3, prefill_tokens=9000)})
    assert ledger.own_loads() == {mine.url: EndpointLoad(in_flight=1, prefill_tokens=1000)}
    assert ledger.load(other) == EndpointLoad(in_flight=3, prefill_tokens=9000)
    # The peers' requests make the other endpoint the busier one.
    assert ledger.plan(admitted(ledger), 0.0).endpoints[0].url == mine.url


def test_demand_counts_the_line_the_engines_and_the_ttft_window() -> None:
    one = pool(endpoints=["http://a"], slo={"ttftMillis": 200})
    ledger = ledger_with(one)
    running = ledger.admit(0.0, ask(one, tokens=700))
    ledger.admit(0.0, ask(one, tokens=300))
    ledger.sent(running.ticket, 0.0, ledger.plan(running.ticket, 0.0).endpoints[0])
    ledger.first_token(running.ticket, read_at=0.5, written_at=0.5)  # a miss
    count = ledger.demand(1.0)[one.key]
    assert (count.queued_requests, count.queued_prompt_tokens) == (1, 300)
    assert (count.in_flight_requests, count.in_flight_prompt_tokens) == (1, 700)
    assert (count.ttft_met, count.ttft_missed) == (0, 1)
    assert ledger.demand(301.0)[one.key].ttft_missed == 0  # out of the window


def test_finished_returns_the_request_log() -> None:
    ledger = ledger_with(CHAT)
    ticket = admitted(ledger, 10.0)
    plan = ledger.plan(ticket, 10.0)
    ledger.sent(ticket, 10.0, plan.endpoints[0])
    ledger.first_token(ticket, read_at=10.1, written_at=10.1)
    log = ledger.finished(ticket, 11.0, status=200, prompt_tokens=1000).log
    assert log.total_ms == pytest.approx(1000)
    assert log.ttft_ms == pytest.approx(100)
    assert dataclasses.replace(log, total_ms=1000.0, ttft_ms=100.0) == RequestLog(
        path="/v1/chat/completions",
        status=200,
        total_ms=1000.0,
        model="llama",
        pool="chat",
        lane="interactive",
        reason=plan.reason,
        endpoint=plan.endpoints[0].url,
        prompt_tokens=1000,
        stream=True,
        attempts=1,
        queue_ms=0.0,
        predicted_ttft_ms=plan.endpoints[0].predicted_ttft_ms,
        ttft_ms=100.0,
    )
    line = log.line(at=1700000000.12345)
    assert list(line) == [
        "ts", "path", "status", "total_ms", "model", "pool", "lane", "reason", "endpoint",
        "prompt_tokens", "stream", "attempts", "queue_ms", "predicted_ttft_ms", "ttft_ms",
    ]  # fmt: skip
    assert line["ts"] == 1700000000.123
    assert RequestLog(path="/v1/models", status=404, total_ms=1.234).line(0.0) == {
        "ts": 0.0,
        "path": "/v1/models",
        "status": 404,
        "total_ms": 1.23,
        "stream": False,
        "attempts": 0,
    }


def test_a_step_out_of_order_is_a_clear_error() -> None:
    ledger = ledger_with(pool(endpoints=["http://a"]))
    ledger.admit(0.0, ask(pool(endpoints=["http://a"])))
    queued = ledger.admit(0.0, ask(pool(endpoints=["http://a"])))
    with pytest.raises(ValueError, match="holds no slot"):
        ledger.plan(queued.ticket, 0.0)
