"""Engine metrics parsing (vLLM and SGLang names), endpoint health, and the pools as the
gateway's ledger keeps them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.ledger import ask
from support.pools import simulated_pool

from laneway.api import InferencePool
from laneway.gateway.app import ledger_settings
from laneway.gateway.config import GatewaySettings, HealthSettings, ScrapeSettings
from laneway.ledger import Ledger
from laneway.routing.engine_metrics import (
    EngineMetrics,
    EngineMetricsError,
    parse_engine_metrics,
    prefix_cache_reset,
)
from laneway.routing.health import Health, after_failure, after_probe, after_success

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="llama"} 12345.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 9000.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 4.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="a"} 2.0
sglang:num_running_reqs{model_name="b",note="x} y"} 3.0 1700000000000
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="a"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage 0.5
"""

OLD_VLLM = VLLM.replace("kv_cache_usage_perc", "gpu_cache_usage_perc")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, EngineMetrics(waiting=3.0, running=7.0, kv_usage=0.42, prefix_queries=9000.0)),
        (SGLANG, EngineMetrics(waiting=1.0, running=5.0, kv_usage=0.5)),  # labels summed
        (OLD_VLLM, EngineMetrics(waiting=3.0, running=7.0, kv_usage=0.42, prefix_queries=9000.0)),
    ],
    ids=["vllm", "sglang", "vllm-before-v1"],
)
def test_engine_metrics_from_either_engine(text: str, expected: EngineMetrics) -> None:
    assert parse_engine_metrics(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("# TYPE foo gauge\nfoo 1\n", "none of vllm:num_requests_waiting"),
        ('vllm:num_requests_waiting{model_name="m"} many\n', "not Prometheus text"),
        ("vllm:num_requests_waiting\n", "not Prometheus text"),
    ],
)
def test_unusable_metrics_are_an_error(text: str, complaint: str) -> None:
    with pytest.raises(EngineMetricsError, match=complaint):
        parse_engine_metrics(text)


@pytest.mark.parametrize(
    ("case", "before", "after", "reset"),
    [
        ("the first sample", None, 10.0, False),
        ("the counter grew", 10.0, 25.0, False),
        ("the counter went back: a restart", 25.0, 3.0, True),
        ("an engine without the counter (SGLang)", None, None, False),
    ],
)
def test_a_prefix_counter_going_back_means_the_cache_was_reset(
    case: str, before: float | None, after: float | None, reset: bool
) -> None:
    previous = None if before is None else EngineMetrics(0, 0, 0, prefix_queries=before)
    assert prefix_cache_reset(previous, EngineMetrics(0, 0, 0, prefix_queries=after)) is reset, case


def test_health_ejects_after_consecutive_failures_and_only_a_probe_readmits() -> None:
    health = Health()
    health = after_failure(health, 2)
    assert not health.ejected
    health = after_success(health)  # a success resets the streak
    health = after_failure(after_failure(health, 2), 2)
    assert health.ejected
    assert after_success(health).ejected  # a late success on an old request is not a probe
    assert after_probe(health, passed=False).ejected
    assert after_probe(health, passed=True) == Health()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(name: str, endpoints: list[str], **limits: Any) -> InferencePool:
    limits = {"maxConcurrentRequests": 4, **limits}
    return simulated_pool(name, endpoints, limits=limits, routing={"models": ["llama"]})


SETTINGS = GatewaySettings(
    health=HealthSettings(failures_to_eject=2),
    scrape=ScrapeSettings(interval_millis=500, stale_after_millis=2000),
)


def ledger_of(settings: GatewaySettings = SETTINGS) -> Ledger:
    """The ledger the gateway builds from these settings."""
    return Ledger(ledger_settings(settings), random.Random(0))


def fail(ledger: Ledger, target: InferencePool, url: str) -> bool:
    """One request to `target` that fails on `url`: True when that ejected the endpoint."""
    ticket = ledger.admit(0.0, ask(target)).ticket
    plan = ledger.plan(ticket, 0.0)
    (planned,) = [endpoint for endpoint in plan.endpoints if endpoint.url == url]
    ledger.sent(ticket, 0.0, planned)
    ejected = ledger.failed(ticket, 0.0).ejected
    ledger.finished(ticket, 0.0, status=503)
    return ejected


def test_limits_follow_healthy_endpoints() -> None:
    ledger = ledger_of()
    realtime = pool("realtime", ["http://a:1", "http://b:1"])
    ledger.update_pools(0.0, [realtime])
    assert ledger.ready()
    assert ledger.gate(realtime).limit == 8  # 4 per replica x 2
    assert not fail(ledger, realtime, "http://a:1")
    assert fail(ledger, realtime, "http://a:1")  # this one ejects
    assert ledger.available(realtime) == ("http://b:1",)
    assert ledger.ejected() == ["http://a:1"]
    assert ledger.gate(realtime).limit == 4
    ledger.record_probe("http://a:1", 0.0, passed=True)
    assert ledger.gate(realtime).limit == 8


def test_updates_are_diffed_and_removed_pools_drained() -> None:
    ledger = ledger_of()
    assert not ledger.ready()
    first, second = pool("first", ["http://a:1"]), pool("second", ["http://b:1"])
    ledger.update_pools(0.0, [first, second])
    running = ledger.admit(0.0, ask(first)).ticket  # admitted requests keep their slots
    fail(ledger, pool("first", ["http://a:1"]), "http://a:1")
    moved = pool("first", ["http://a:1", "http://c:1"])
    ledger.update_pools(0.0, [moved])
    assert [p.name for p in ledger.pools()] == ["first"]
    assert ledger.gate(moved).active == 1
    assert ledger.current(second) is None
    assert ledger.endpoints() == ["http://a:1", "http://c:1"]
    ledger.finished(running, 0.0, status=200)
    fail(ledger, moved, "http://a:1")  # the failure streak survived the update
    assert ledger.ejected() == ["http://a:1"]


def test_scraped_metrics_go_stale() -> None:
    ledger = ledger_of()
    ledger.update_pools(0.0, [pool("p", ["http://a:1"])])
    sample = EngineMetrics(waiting=1, running=2, kv_usage=0.3)
    ledger.record_scrape("http://a:1", 0.0, sample)
    ledger.record_scrape("http://gone:1", 0.0, sample)  # not an endpoint any more: ignored
    assert ledger.fresh_metrics("http://a:1", 2.0) == sample
    assert ledger.fresh_metrics("http://a:1", 2.1) is None
    assert ledger.fresh_metrics("http://gone:1", 2.0) is None
