"""The TTFT prediction behind the ttftSlo scorer: a prefill rate learned per endpoint."""

from __future__ import annotations

import random

import pytest
from support.ledger import ask
from support.pools import simulated_pool

from laneway.api import InferencePool
from laneway.gateway.app import ledger_settings
from laneway.gateway.config import GatewaySettings
from laneway.ledger import Ledger
from laneway.routing.slo import (
    LEARNING_RATE,
    MIN_SAMPLE_TOKENS,
    PRIOR_MS_PER_TOKEN,
    PrefillRate,
    within_slo,
)

LEARNING = [
    # (case, observations as (backlog tokens, TTFT ms), expected ms per token)
    ("no observation: the prior", [], PRIOR_MS_PER_TOKEN),
    ("the prior weighs as one observation", [(1000, 300.0)], (0.1 + 0.3) / 2),
    ("the second moves it by a third", [(1000, 300.0), (1000, 600.0)], 0.2 + (0.6 - 0.2) / 3),
    (
        "a small backlog says more about step overhead than prefill: ignored",
        [(MIN_SAMPLE_TOKENS - 1, 900.0)],
        PRIOR_MS_PER_TOKEN,
    ),
    ("the smallest backlog learned from", [(MIN_SAMPLE_TOKENS, 128.0)], (0.1 + 0.5) / 2),
]


@pytest.mark.parametrize(
    ("observations", "expected"), [c[1:] for c in LEARNING], ids=[c[0] for c in LEARNING]
)
def test_learning(observations: list[tuple[int, float]], expected: float) -> None:
    rate = PrefillRate()
    for backlog, ttft_ms in observations:
        rate = rate.observed(backlog, ttft_ms)
    assert rate.ms_per_token == pytest.approx(expected)


def test_it_settles_into_an_ewma_that_follows_a_slower_engine() -> None:
    rate = PrefillRate()
    for _ in range(50):
        rate = rate.observed(4000, 4000 * 0.05)  # 20k tokens/s
    assert rate.ms_per_token == pytest.approx(0.05, rel=1e-4)  # the prior is forgotten
    assert rate.predict_ttft_ms(3000) == pytest.approx(150, rel=1e-4)
    slower = rate.observed(4000, 4000 * 0.25)  # the engine slowed down five times
    expected = rate.ms_per_token + LEARNING_RATE * (0.25 - rate.ms_per_token)
    assert slower.ms_per_token == pytest.approx(expected)
    assert slower.samples == 51


def test_within_slo_includes_the_target_like_a_histogram_bucket() -> None:
    assert within_slo(0.3, 300)
    assert not within_slo(0.3001, 300)
    assert within_slo(0.0, 1)


def test_the_ledger_learns_per_endpoint_and_forgets_removed_ones() -> None:
    def pool(*endpoints: str) -> list[InferencePool]:
        return [simulated_pool("chat", endpoints, model="m", routing={"models": ["llama"]})]

    ledger = Ledger(ledger_settings(GatewaySettings()), random.Random(0))
    ledger.update_pools(0.0, pool("http://a", "http://b"))
    ticket = ledger.admit(0.0, ask(pool("http://a", "http://b")[0])).ticket
    (on_a,) = [e for e in ledger.plan(ticket, 0.0).endpoints if e.url == "http://a"]
    ledger.sent(ticket, 0.0, on_a)
    ledger.first_token(ticket, read_at=1.0, written_at=1.0)
    ledger.finished(ticket, 1.0, status=200)
    assert ledger.prefill_rate("http://a").samples == 1
    assert ledger.prefill_rate("http://b") == PrefillRate()
    ledger.update_pools(2.0, pool("http://b"))
    ledger.update_pools(3.0, pool("http://a", "http://b"))
    assert ledger.prefill_rate("http://a") == PrefillRate()  # it came back as a new engine
