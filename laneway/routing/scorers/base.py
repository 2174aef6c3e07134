"""The scorer contract: given the candidate endpoints, one score each in [0, 1], 1 is best.

A scorer sees the gateway's own accounting (always current) and the engine's scraped gauges
(None when never scraped or stale). Scores are relative to the candidates, so a scorer
returns the neutral 1.0 to all when they are equal, and 0.5 where it knows nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from laneway.routing.engine_metrics import EngineMetrics

UNKNOWN = 0.5


# Slotted, not frozen: two are built per endpoint per request (the gateway's, then the
# plan's with its predictions), and a frozen dataclass's __init__ costs several times more.
# Nothing assigns to one after it is built.
@dataclass(slots=True)
class EndpointView:
    url: str
    in_flight: int  # requests this gateway has sent and not yet finished
    prefill_tokens: int  # prompt tokens sent whose first token has not come back yet
    engine: EngineMetrics | None  # None: no fresh scrape
    predicted_ttft_ms: float | None = None  # this request's first token here (slo.py)
    ttft_slo_ms: int | None = None  # the pool's slo.ttftMillis
    cached_prompt_tokens: int | None = None  # of this prompt, estimated in its prefix cache
    session_key: str | None = None  # the request's session (x-laneway-session), if it has one
    # Prompt tokens this endpoint prefills before this request's first token: its backlog
    # plus the part of this prompt its prefix cache is not estimated to hold (plan.py).
    backlog_tokens: int | None = None


class Scorer(Protocol):
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]: ...


def lower_is_better(values: Sequence[float | None]) -> list[float]:
    """Normalise between the candidates' min and max; unknown values score UNKNOWN."""
    known = [v for v in values if v is not None]
    if not known:
        return [UNKNOWN] * len(values)
    low, high = min(known), max(known)
    if high == low:
        return [UNKNOWN if v is None else 1.0 for v in values]
    span = high - low
    if len(known) == len(values):  # the usual case, without a test per value
        return [(high - v) / span for v in known]
    return [UNKNOWN if v is None else (high - v) / span for v in values]


def fewer_is_better(values: Sequence[float | None]) -> list[float]:
    """For amounts with a true zero (tokens): 1 for the least, less by the excess over the
    largest. Unlike `lower_is_better`, 8,283 against 8,295 tokens is a near tie, not 1 to 0,
    so a difference too small to matter leaves the choice to the other scorers."""
    known = [v for v in values if v is not None]
    if not known:
        return [UNKNOWN] * len(values)
    low, high = min(known), max(known)
    if high <= low:
        return [UNKNOWN if v is None else 1.0 for v in values]
    return [UNKNOWN if v is None else 1.0 - (v - low) / high for v in values]
