"""The demand loop: every few seconds the operator reads each pool's demand from the
gateway (`GET /laneway/demand`, summed over its replicas through Redis), writes the lane's
SLO attainment and the `SloMet` condition into the pool's status, and, for pools with
`spec.autoscaling`, runs `laneway.autoscale.decide` and sets `spec.replicas` through the
scale subresource, the way `kubectl scale` would. No metrics adapter, no KEDA.

`pool_step` is the pure part (a pool, its demand, its history -> what to write); the loop
around it does the I/O. The loop runs as one task of the operator, not a kopf timer: kopf
puts a finalizer on every object a timer serves, and that finalizer would block deleting a
pool whenever the operator is down.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from laneway.api import InferencePool, Lane, SpecError, parse_pool
from laneway.autoscale import DEMAND_PATH, DemandCount, Recommendation, decide, first_sight
from laneway.operator.reconcile import Event
from laneway.operator.status import Condition, with_condition

log = logging.getLogger("laneway.operator.autoscaler")

# The HorizontalPodAutoscaler's default sync period: often enough to follow a chat peak,
# seldom enough that one scrape of the gateway per pass costs nothing.
DEFAULT_INTERVAL_S = 15.0
# What an interactive lane must reach when spec.autoscaling.minSloAttainment is not set.
# A batch lane has no such default: its long prompts miss a chat TTFT target by design.
INTERACTIVE_SLO_FLOOR = 0.99
FETCH_TIMEOUT_S = 5.0

Demand = Mapping[str, DemandCount]  # pool key (namespace/name) -> the gateway's counts


class DemandUnavailable(Exception):
    """The gateway could not say what its pools' demand is."""


@dataclass(frozen=True)
class PoolStep:
    """What one pass writes for one pool."""

    replicas: int | None  # spec.replicas to set through the scale subresource; None: leave it
    status: dict[str, Any]  # merged into the pool's status
    events: tuple[Event, ...]
    history: tuple[Recommendation, ...]  # the autoscaler's memory for the next pass


def slo_floor(pool: InferencePool) -> float | None:
    scaling = pool.spec.autoscaling
    if scaling is not None and scaling.min_slo_attainment is not None:
        return scaling.min_slo_attainment
    return INTERACTIVE_SLO_FLOOR if pool.spec.lane is Lane.INTERACTIVE else None


def slo_condition(pool: InferencePool, count: DemandCount) -> Condition | None:
    """SloMet: the share of the lane's recent streams whose first token met spec.slo."""
    floor = slo_floor(pool)
    if floor is None:
        return None
    target = pool.spec.slo.ttft_millis
    measured = count.ttft_met + count.ttft_missed
    if not measured:
        return Condition(
            type="SloMet",
            status=True,
            reason="NoRecentStreams",
            message="no streamed request finished recently",
        )
    attainment = count.ttft_met / measured
    summary = (
        f"{attainment:.1%} of the last {measured} streams had their first token within "
        f"{target} ms (spec.slo.ttftMillis); the floor is {floor:.1%}"
    )
    if attainment >= floor:
        return Condition(type="SloMet", status=True, reason="WithinSlo", message=summary)
    advice = (
        "the autoscaler adds replicas while it is missed"
        if pool.spec.autoscaling is not None
        else "add replicas, or set spec.autoscaling"
    )
    return Condition(
        type="SloMet", status=False, reason="SloMissed", message=f"{summary}: {advice}"
    )


def pool_step(
    body: Mapping[str, Any],
    demand: Demand | None,
    unavailable: str,
    history: tuple[Recommendation, ...],
    now_s: float,
    now: str,
) -> PoolStep | None:
    """One pool's pass; None for a pool whose spec cannot work (reconcile reports that).

    `demand` None means the gateway could not be asked (`unavailable` says why): the
    pool's replicas then stay as they are, since no demand is not the same as none seen."""
    try:
        pool = parse_pool(body)
    except SpecError:
        return None
    previous: Mapping[str, Any] = body.get("status") or {}
    generation = int(body.get("metadata", {}).get("generation") or 0)
    count = None if demand is None else demand.get(pool.key)
    if demand is not None and count is None:
        unavailable = "the gateway routes no requests to this pool (is it watching its namespace?)"
    status: dict[str, Any] = {}
    if count is not None:
        attainment = count.lane_demand().slo_attainment
        status["sloAttainment"] = "n/a" if attainment is None else f"{attainment:.1%}"
        condition = slo_condition(pool, count)
        if condition is not None:
            status["conditions"] = with_condition(previous, condition, generation, now)

    policy, current = pool.spec.autoscaling, pool.spec.replicas
    if policy is None:
        return PoolStep(replicas=None, status=status, events=(), history=())
    earlier: Mapping[str, Any] = previous.get("autoscaling") or {}
    if count is None:
        status["autoscaling"] = {
            **earlier,
            "desiredReplicas": current,
            "reason": f"holding {current}: {unavailable}",
        }
        return PoolStep(replicas=None, status=status, events=(), history=history)
    if not history:
        history = first_sight(policy, current, now_s)
    decision = decide(policy, count.lane_demand(), current, history, now_s)
    status["autoscaling"] = {
        **earlier,
        "desiredReplicas": decision.desired,
        "recommendation": decision.recommendation,
        "reason": decision.reason,
    }
    if not decision.changes(current):
        return PoolStep(replicas=None, status=status, events=(), history=decision.history)
    status["autoscaling"]["lastScaleTime"] = now
    why = "ScaledUp" if decision.desired > current else "ScaledDown"
    event = Event(type="Normal", reason=why, message=decision.reason)
    return PoolStep(
        replicas=decision.desired, status=status, events=(event,), history=decision.history
    )


def changed(status: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    return any(previous.get(key) != value for key, value in status.items())


FetchDemand = Callable[[], Awaitable[Demand]]


def gateway_demand(session: aiohttp.ClientSession, base_url: str) -> FetchDemand:
    """Reads `GET {base_url}/laneway/demand`; raises DemandUnavailable with the reason."""

    async def fetch() -> Demand:
        url = base_url.rstrip("/") + DEMAND_PATH
        try:
            timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
            async with session.get(url, timeout=timeout) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise DemandUnavailable(f"{url} answered HTTP {response.status}: {text}")
                document = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise DemandUnavailable(f"cannot read {url}: {error or type(error).__name__}") from None
        return parse_demand(document, url)

    return fetch


def parse_demand(document: object, source: str) -> Demand:
    pools = document.get("pools") if isinstance(document, dict) else None
    if not isinstance(pools, dict):
        raise DemandUnavailable(f"{source} answered without a 'pools' object")
    try:
        return {str(key): DemandCount.from_wire(count) for key, count in pools.items()}
    except ValueError as error:
        raise DemandUnavailable(f"{source}: {error}") from None
