"""How many replicas a lane's pool should run: one pure decision, shared by the operator
(which applies it through the pool's scale subresource) and the virtual-time runner (which
starts and stops simulated replicas with it), so a benchmark measures the policy the
cluster runs.

The rule is the HorizontalPodAutoscaler's, fed with what the gateway sees before any
engine metric moves:

1. A recommendation: the lane's demand over the target per replica, rounded up and kept
   within [minReplicas, maxReplicas]. Demand is the prompt tokens queued at the gateway
   plus those in flight (what costs GPU time), or the requests queued plus in flight. While
   the lane's recent SLO attainment is below the pool's floor, the recommendation is at
   least one replica more than now, whatever the load says.
2. Stabilisation: a scale-up takes the lowest recommendation seen over the up window, a
   scale-down the highest over the down window. A count therefore moves only when every
   recommendation in the window agrees it should, and a steady load changes it at most once
   per window: the next move the other way needs a whole window of recommendations that
   disagree with the first.
3. Waking from zero never waits: a request that waits for a first replica already pays the
   replica's cold start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# Demand within this fraction of what the current replicas are sized for changes nothing
# (the HorizontalPodAutoscaler's default tolerance): noise alone never moves the count.
TOLERANCE = 0.1


class ScaleSignal(StrEnum):
    PROMPT_TOKENS = "promptTokens"  # queued + in-flight prompt tokens (batch lanes)
    IN_FLIGHT_REQUESTS = "inFlightRequests"  # queued + in-flight requests (interactive lanes)


@dataclass(frozen=True)
class ScalePolicy:
    """The decision's knobs; `laneway.api.AutoscalingSpec` carries them for a pool."""

    min_replicas: int
    max_replicas: int
    signal: ScaleSignal
    target_per_replica: int  # demand (in the signal's unit) one replica should carry
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    # Below this recent TTFT-SLO attainment the pool grows whatever the load says; None: off.
    min_slo_attainment: float | None = None


@dataclass(frozen=True)
class LaneDemand:
    """What the gateway replicas see of one pool, summed over them."""

    queued_requests: int = 0  # waiting at the gateway (no replica, or the pool is full)
    queued_prompt_tokens: int = 0
    in_flight_requests: int = 0  # sent to an engine and not finished
    in_flight_prompt_tokens: int = 0
    slo_attainment: float | None = None  # of recent finished requests; None: none finished

    def load(self, signal: ScaleSignal) -> int:
        if signal is ScaleSignal.PROMPT_TOKENS:
            return self.queued_prompt_tokens + self.in_flight_prompt_tokens
        return self.queued_requests + self.in_flight_requests


# Where each gateway replica serves its pools' demand (open like /metrics), as a JSON
# document {"pools": {"namespace/name": {wire name: count}}, "replicas": n}.
DEMAND_PATH = "/laneway/demand"
# The wire names of `DemandCount`'s fields.
_WIRE_FIELDS = {
    "queuedRequests": "queued_requests",
    "queuedPromptTokens": "queued_prompt_tokens",
    "inFlightRequests": "in_flight_requests",
    "inFlightPromptTokens": "in_flight_prompt_tokens",
    "ttftMet": "ttft_met",
    "ttftMissed": "ttft_missed",
}


@dataclass(frozen=True)
class DemandCount:
    """One gateway replica's counts for one pool, in the form that adds up across replicas
    (attainment does not add; the counts it comes from do). The gateway serves it, the
    operator sums and reads it."""

    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    in_flight_requests: int = 0
    in_flight_prompt_tokens: int = 0
    ttft_met: int = 0  # streamed requests over the recent window whose TTFT met the SLO
    ttft_missed: int = 0

    def plus(self, other: DemandCount) -> DemandCount:
        return DemandCount(
            **{name: getattr(self, name) + getattr(other, name) for name in _WIRE_FIELDS.values()}
        )

    def lane_demand(self) -> LaneDemand:
        measured = self.ttft_met + self.ttft_missed
        return LaneDemand(
            queued_requests=self.queued_requests,
            queued_prompt_tokens=self.queued_prompt_tokens,
            in_flight_requests=self.in_flight_requests,
            in_flight_prompt_tokens=self.in_flight_prompt_tokens,
            slo_attainment=self.ttft_met / measured if measured else None,
        )

    def to_wire(self) -> dict[str, int]:
        return {wire: getattr(self, name) for wire, name in _WIRE_FIELDS.items()}

    @classmethod
    def from_wire(cls, document: object) -> DemandCount:
        """Raise ValueError, saying which field, on anything but counts."""
        if not isinstance(document, dict):
            raise ValueError(f"a pool's demand must be an object, not {document!r}")
        values = {}
        for wire, name in _WIRE_FIELDS.items():
            value = document.get(wire, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{wire} must be a count (an integer >= 0), not {value!r}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class Recommendation:
    at_s: float
    replicas: int


# How far outside the up window first_sight places the remembered count.
FIRST_SIGHT_S = 0.001


def first_sight(policy: ScalePolicy, current: int, now_s: float) -> tuple[Recommendation, ...]:
    """The history for a pool first seen now (a new pool, a restarted operator, the start of
    a simulated day): the current count, as if recommended just outside the up window, so a
    scale-down still waits a whole down window while a scale-up is not delayed."""
    return (
        Recommendation(at_s=now_s - policy.scale_up_window_s - FIRST_SIGHT_S, replicas=current),
    )


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    recommendation: int  # before stabilisation
    reason: str  # for a person: the pool's status and the scaling Event
    history: tuple[Recommendation, ...]  # pass to the next decision

    def changes(self, current: int) -> bool:
        return self.desired != current


def recommend(policy: ScalePolicy, demand: LaneDemand, current: int) -> tuple[int, str]:
    """The replica count for this instant's demand, and why."""
    load = demand.load(policy.signal)
    wanted = math.ceil(load / policy.target_per_replica)
    if current > 0 and abs(load / (current * policy.target_per_replica) - 1) <= TOLERANCE:
        wanted = current
    why = f"{policy.signal.value} {load} at {policy.target_per_replica} per replica"
    floor = policy.min_slo_attainment
    attainment = demand.slo_attainment
    missing = floor is not None and attainment is not None and attainment < floor
    if missing and current > 0 and current + 1 > wanted:
        wanted = current + 1
        why = f"SLO attainment {attainment:.1%} is below {floor:.1%}"
    bounded = min(max(wanted, policy.min_replicas), policy.max_replicas)
    if bounded != wanted:
        limit = "minReplicas" if bounded > wanted else "maxReplicas"
        why += f", held at {limit} {bounded}"
    return bounded, why


def decide(
    policy: ScalePolicy,
    demand: LaneDemand,
    current: int,
    history: Sequence[Recommendation],
    now_s: float,
) -> ScaleDecision:
    """The replica count to run now, given the recommendations of earlier calls."""
    recommended, why = recommend(policy, demand, current)
    keep = max(policy.scale_up_window_s, policy.scale_down_window_s)
    recent = [r for r in history if now_s - r.at_s < keep]
    remembered = (*recent, Recommendation(at_s=now_s, replicas=recommended))

    def within(window_s: float) -> list[int]:
        return [r.replicas for r in remembered if now_s - r.at_s <= window_s]

    if recommended > current:
        desired = max(current, min(within(policy.scale_up_window_s)))
        if current == 0 and recommended > 0:
            desired = max(desired, 1)
        if desired == current:
            reason = f"holding {current}: {why} asks {recommended}, not yet for the up window"
        else:
            reason = f"scaling up {current} -> {desired}: {why}"
    elif recommended < current:
        desired = min(current, max(within(policy.scale_down_window_s)))
        if desired == current:
            reason = f"holding {current}: {why} asks {recommended}, not yet for the down window"
        else:
            reason = f"scaling down {current} -> {desired}: {why}"
    else:
        desired, reason = current, f"steady at {current}: {why}"
    return ScaleDecision(
        desired=desired, recommendation=recommended, reason=reason, history=remembered
    )
