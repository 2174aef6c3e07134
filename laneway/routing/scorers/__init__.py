"""Endpoint scorers: one module each, combined with weights by `laneway.routing.picker`."""

from __future__ import annotations

from laneway.routing.scorers.base import Scorer
from laneway.routing.scorers.in_flight import InFlightScorer
from laneway.routing.scorers.kv_usage import KVUsageScorer
from laneway.routing.scorers.prefill_tokens import PrefillTokensScorer
from laneway.routing.scorers.prefix_affinity import PrefixAffinityScorer
from laneway.routing.scorers.queue_depth import QueueDepthScorer
from laneway.routing.scorers.session_hash import SessionHashScorer
from laneway.routing.scorers.ttft_slo import TtftSloScorer

# Config name (GatewayConfig spec.picking.weights) -> scorer.
SCORERS: dict[str, Scorer] = {
    "queueDepth": QueueDepthScorer(),
    "kvCacheUsage": KVUsageScorer(),
    "inFlightRequests": InFlightScorer(),
    "prefillTokens": PrefillTokensScorer(),
    "ttftSlo": TtftSloScorer(),
    "prefixAffinity": PrefixAffinityScorer(),
    "sessionHash": SessionHashScorer(),
}

__all__ = ["SCORERS", "Scorer"]
