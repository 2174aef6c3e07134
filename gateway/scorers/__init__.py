"""Endpoint scorers: one module each, combined with weights by `laneway.gateway.picker`."""

from __future__ import annotations

from laneway.gateway.scorers.base import EndpointView, Scorer
from laneway.gateway.scorers.in_flight import InFlightScorer
from laneway.gateway.scorers.kv_usage import KVUsageScorer
from laneway.gateway.scorers.prefill_tokens import PrefillTokensScorer
from laneway.gateway.scorers.queue_depth import QueueDepthScorer
from laneway.gateway.scorers.ttft_slo import TtftSloScorer

# Config name (GatewayConfig spec.picking.weights) -> scorer.
SCORERS: dict[str, Scorer] = {
    "queueDepth": QueueDepthScorer(),
    "kvCacheUsage": KVUsageScorer(),
    "inFlightRequests": InFlightScorer(),
    "prefillTokens": PrefillTokensScorer(),
    "ttftSlo": TtftSloScorer(),
}

__all__ = ["SCORERS", "EndpointView", "Scorer"]
