"""spec.autoscaling: the wire form of `laneway.autoscale.ScalePolicy`, whose defaults depend
on the pool's lane."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from laneway.api.names import MAX_REPLICAS, MAX_TOKENS, MAX_WINDOW_SECONDS
from laneway.api.wire import Wire, rule, rules
from laneway.autoscale import ScalePolicy, ScaleSignal

# One type for the spec and the decision that reads it (`laneway.autoscale.decide`).
AutoscalingSpec = ScalePolicy
# A replica's share of demand when spec.autoscaling.targetPerReplica is left out: four
# 64k-token documents queued or in prefill, or 32 chat requests in flight.
DEFAULT_TARGET_PER_REPLICA = {
    ScaleSignal.PROMPT_TOKENS: 262_144,
    ScaleSignal.IN_FLIGHT_REQUESTS: 32,
}


class Autoscaling(Wire):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "self.maxReplicas >= self.minReplicas",
                ".maxReplicas",
                "autoscaling.maxReplicas must be >= minReplicas",
            )
        )
    )

    # A batch pool may sleep at zero: the gateway queues its work and wakes it.
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Fewest replicas. 0 (batch pools only): the pool sleeps when idle and the "
        "gateway queues its requests while the first replica starts.",
    )
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Most replicas.")
    # None: by lane (`policy`), so no API server default.
    signal: ScaleSignal | None = Field(
        default=None,
        description="The demand replicas follow: promptTokens (prompt tokens queued at the "
        "gateway plus in flight; the default for batch) or inFlightRequests (requests queued "
        "plus in flight; the default for interactive).",
    )
    target_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Demand one replica should carry, in the signal's unit. Defaults: "
        f"{DEFAULT_TARGET_PER_REPLICA[ScaleSignal.PROMPT_TOKENS]} prompt tokens, "
        f"{DEFAULT_TARGET_PER_REPLICA[ScaleSignal.IN_FLIGHT_REQUESTS]} requests.",
    )
    min_slo_attainment: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="While the lane's recent TTFT-SLO attainment is below this fraction (e.g. "
        "0.99), add a replica whatever the load says. Unset: load alone decides.",
    )
    scale_up_window_seconds: int = Field(
        default=0,
        ge=0,
        le=MAX_WINDOW_SECONDS,
        description="Scale up only to the lowest count recommended over this window.",
    )
    scale_down_window_seconds: int = Field(
        default=300,
        ge=0,
        le=MAX_WINDOW_SECONDS,
        description="Scale down only to the highest count recommended over this window.",
    )

    def policy(self, batch: bool) -> ScalePolicy:
        """The decision's knobs, with the defaults of a batch or an interactive lane: prompt
        tokens for batch (what costs GPU time there), requests in flight for interactive."""
        default_signal = ScaleSignal.PROMPT_TOKENS if batch else ScaleSignal.IN_FLIGHT_REQUESTS
        signal = self.signal or default_signal
        return ScalePolicy(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            signal=signal,
            target_per_replica=self.target_per_replica or DEFAULT_TARGET_PER_REPLICA[signal],
            scale_up_window_s=self.scale_up_window_seconds,
            scale_down_window_s=self.scale_down_window_seconds,
            min_slo_attainment=self.min_slo_attainment,
        )
