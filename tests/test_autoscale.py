"""The scaling decision on traces, and spec.autoscaling's parsing."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from laneway import api
from laneway.autoscale import LaneDemand, Recommendation, ScalePolicy, ScaleSignal, decide

BATCH = ScalePolicy(
    min_replicas=0,
    max_replicas=8,
    signal=ScaleSignal.PROMPT_TOKENS,
    target_per_replica=100_000,
    scale_up_window_s=0,
    scale_down_window_s=300,
)
CHAT = ScalePolicy(
    min_replicas=1,
    max_replicas=10,
    signal=ScaleSignal.IN_FLIGHT_REQUESTS,
    target_per_replica=20,
    scale_up_window_s=30,
    scale_down_window_s=300,
    min_slo_attainment=0.99,
)


def replay(
    policy: ScalePolicy, trace: list[tuple[float, LaneDemand]], start: int
) -> list[tuple[float, int, str]]:
    """Run the decision over (time, demand) as the operator's loop does; (time, replicas,
    reason) after each step."""
    current, history = start, tuple[Recommendation, ...]()
    seen: list[tuple[float, int, str]] = []
    for now, demand in trace:
        decision = decide(policy, demand, current, history, now)
        current, history = decision.desired, decision.history
        seen.append((now, current, decision.reason))
    return seen


def tokens(n: int) -> LaneDemand:
    return LaneDemand(queued_prompt_tokens=n)


def test_a_batch_pool_wakes_at_once_and_sleeps_after_the_down_window() -> None:
    trace = [(0.0, tokens(0)), (15.0, tokens(350_000))]
    trace += [(15.0 + 15 * i, tokens(50_000)) for i in range(1, 4)]
    trace += [(75.0 + 15 * i, tokens(0)) for i in range(1, 40)]
    seen = replay(BATCH, trace, start=0)
    assert seen[0][1] == 0
    assert seen[1][1] == 4  # 350k tokens at 100k per replica, no waiting to wake
    assert "scaling up 0 -> 4" in seen[1][2]
    at_four = [t for t, n, _ in seen if n == 4]
    # Demand fell at 30 s; the highest recommendation over the next 300 s keeps 4 until then.
    assert max(at_four) < 15 + 300 + 15
    asleep = [t for t, n, _ in seen if n == 0 and t > 15]
    assert asleep
    assert min(asleep) >= 15 + 300
    assert seen[-1][1] == 0


def test_a_scale_up_waits_for_the_whole_up_window() -> None:
    quiet = LaneDemand(in_flight_requests=20, slo_attainment=1.0)
    busy = LaneDemand(in_flight_requests=60, slo_attainment=1.0)
    trace = [(0.0, quiet)] + [(float(t), busy) for t in range(10, 61, 10)]
    seen = replay(CHAT, trace, start=1)
    # Busy from 10 s; the count moves once 30 s of recommendations all ask for 3.
    assert [n for _, n, _ in seen] == [1, 1, 1, 1, 3, 3, 3]
    assert "asks 3, not yet for the up window" in seen[1][2]


def test_missing_the_slo_adds_a_replica_whatever_the_load_says() -> None:
    policy = ScalePolicy(
        min_replicas=1,
        max_replicas=10,
        signal=ScaleSignal.IN_FLIGHT_REQUESTS,
        target_per_replica=20,
        min_slo_attainment=0.99,
    )
    late = LaneDemand(in_flight_requests=10, slo_attainment=0.9)
    decision = decide(policy, late, 2, (), 0.0)
    assert decision.desired == 3
    assert "SLO attainment 90.0% is below 99.0%" in decision.reason


def test_bounds_hold_and_say_so() -> None:
    flood = tokens(10_000_000)
    decision = decide(BATCH, flood, 2, (), 0.0)
    assert decision.desired == 8
    assert "held at maxReplicas 8" in decision.reason
    floor = ScalePolicy(
        min_replicas=2,
        max_replicas=8,
        signal=ScaleSignal.PROMPT_TOKENS,
        target_per_replica=100_000,
        scale_down_window_s=0,
    )
    assert decide(floor, tokens(0), 5, (), 0.0).desired == 2


def test_demand_within_the_tolerance_changes_nothing() -> None:
    # 4 replicas sized for 400k; 430k is 7.5 % over.
    decision = decide(BATCH, tokens(430_000), 4, (), 0.0)
    assert (decision.desired, decision.recommendation) == (4, 4)
    assert decision.reason.startswith("steady at 4")


@pytest.mark.parametrize("level", [0.45, 1.0, 2.5, 3.5, 5.05, 6.5])
@pytest.mark.parametrize("policy", [BATCH, CHAT], ids=["batch", "chat"])
def test_no_flapping_on_a_steady_noisy_load(policy: ScalePolicy, level: float) -> None:
    """A steady load with +-15 % noise each 15 s scrape: at most one change in any
    stabilisation window, over six hours."""
    rng = random.Random(f"{policy.signal}/{level}")
    trace = []
    for step in range(6 * 240):
        load = max(0, round(level * policy.target_per_replica * rng.uniform(0.85, 1.15)))
        demand = (
            tokens(load)
            if policy.signal is ScaleSignal.PROMPT_TOKENS
            else LaneDemand(in_flight_requests=load, slo_attainment=1.0)
        )
        trace.append((15.0 * step, demand))
    seen = replay(policy, trace, start=policy.min_replicas)
    changes = [t for (t, n, _), (_, before, _) in zip(seen[1:], seen, strict=False) if n != before]
    window = max(policy.scale_up_window_s, policy.scale_down_window_s)
    for first, second in itertools.pairwise(changes):
        assert second - first > window, (level, changes)
    # and it settled where the load is: within the noise of level replicas
    final = seen[-1][1]
    assert level * 0.85 - 1 <= final <= level * 1.15 + 1


def test_history_older_than_both_windows_is_forgotten() -> None:
    old = (Recommendation(at_s=0.0, replicas=8), Recommendation(at_s=500.0, replicas=2))
    decision = decide(BATCH, tokens(200_000), 2, old, 600.0)
    assert [r.at_s for r in decision.history] == [500.0, 600.0]


def pool_with(autoscaling: Any, lane: str = "batch") -> api.InferencePool:
    return api.parse_pool(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "p"},
            "spec": {
                "lane": lane,
                "model": "m",
                "engine": {"kind": "simulator"},
                "autoscaling": autoscaling,
            },
        }
    )


def test_the_signal_and_target_default_by_lane() -> None:
    batch = pool_with({"minReplicas": 0, "maxReplicas": 4}).spec.autoscaling
    assert batch is not None
    assert (batch.signal, batch.target_per_replica) == (ScaleSignal.PROMPT_TOKENS, 262_144)
    assert (batch.scale_up_window_s, batch.scale_down_window_s) == (0, 300)
    chat = pool_with({"maxReplicas": 4, "minSloAttainment": 0.99}, "interactive").spec.autoscaling
    assert chat is not None
    assert (chat.signal, chat.target_per_replica) == (ScaleSignal.IN_FLIGHT_REQUESTS, 32)
    assert (chat.min_replicas, chat.min_slo_attainment) == (1, 0.99)


@pytest.mark.parametrize(
    ("autoscaling", "lane", "message"),
    [
        ({"minReplicas": 0, "maxReplicas": 2}, "interactive", "spec.autoscaling.minReplicas: "),
        ({"minReplicas": 3}, "batch", "spec.autoscaling.maxReplicas: is required"),
        ({"maxReplicas": 2, "signal": "gpus"}, "batch", "spec.autoscaling.signal: must be one of"),
        ({"maxReplicas": 2, "targetPerReplica": 0}, "batch", "targetPerReplica: must be >= 1"),
        ({"maxReplicas": 2, "minSloAttainment": 1.5}, "batch", "minSloAttainment: must be above"),
        ({"maxReplicas": 2, "scaleDownWindowSeconds": 7200}, "batch", "must be <= 3600"),
        ({"maxReplicas": 2, "targetQueueDepth": 4}, "batch", "targetQueueDepth: is not a field"),
    ],
)
def test_bad_autoscaling_is_refused_with_the_field(
    autoscaling: dict[str, Any], lane: str, message: str
) -> None:
    with pytest.raises(api.SpecError, match=message):
        pool_with(autoscaling, lane)
