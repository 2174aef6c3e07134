"""The scorer contract: given a request's cycle (its candidate endpoints and the data its
scorers asked for), one score per candidate in [0, 1], 1 is best.

A scorer names the data it reads in `needs` (keys from `laneway.routing.cycle`, or its own
key with its own producer) and reads them from the cycle. Scores are relative to the
candidates, so a scorer returns the neutral 1.0 to all when they are equal, and 0.5 where it
knows nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from laneway.routing.cycle import (
    BACKLOG_TOKENS,
    CACHED_PROMPT_TOKENS,
    ENGINE,
    IN_FLIGHT,
    PREDICTED_TTFT_MS,
    PREFILL_TOKENS,
    SESSION_KEY,
    TTFT_SLO_MS,
    CycleRequest,
    CycleState,
    DataKey,
    EndpointLoad,
)
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route
from laneway.routing.slo import PrefillRate

UNKNOWN = 0.5


class Scorer(ABC):
    needs: ClassVar[frozenset[DataKey[Any]]]

    @abstractmethod
    def scores(self, cycle: CycleState) -> list[float]: ...

    def score(self, endpoints: CycleState | Sequence[EndpointView]) -> list[float]:
        """The scores of a cycle, or of flat views (the old form, until its last caller
        builds cycles)."""
        cycle = endpoints if isinstance(endpoints, CycleState) else views_cycle(endpoints)
        return self.scores(cycle)


@dataclass(slots=True)
class EndpointView:
    """Every built-in scorer's inputs for one endpoint, flat: the old form of a cycle."""

    url: str
    in_flight: int
    prefill_tokens: int
    engine: EngineMetrics | None
    predicted_ttft_ms: float | None = None
    ttft_slo_ms: int | None = None
    cached_prompt_tokens: int | None = None
    session_key: str | None = None
    backlog_tokens: int | None = None


class ViewFacts:
    """The `Facts` that flat views hold, with the learned `rates` beside them."""

    def __init__(self, views: Sequence[EndpointView], rates: Mapping[str, PrefillRate]) -> None:
        self._views = {view.url: view for view in views}
        self._rates = rates

    def load(self, url: str) -> EndpointLoad:
        view = self._views[url]
        return EndpointLoad(in_flight=view.in_flight, prefill_tokens=view.prefill_tokens)

    def engine(self, url: str) -> EngineMetrics | None:
        return self._views[url].engine

    def prefill_rate(self, url: str) -> PrefillRate | None:
        return self._rates.get(url)

    def cached_prompt_tokens(self, url: str) -> int | None:
        return self._views[url].cached_prompt_tokens

    def healthy(self, url: str) -> bool:
        return True


def views_cycle(views: Sequence[EndpointView]) -> CycleState:
    """A cycle holding the views' values as given (None where a view has none); no route
    is read, every datum derived from it being given."""
    request = CycleRequest(route=cast(Route, None))
    cycle = CycleState(request, [v.url for v in views], ViewFacts(views, {}))
    cycle.given(IN_FLIGHT, [v.in_flight for v in views])
    cycle.given(PREFILL_TOKENS, [v.prefill_tokens for v in views])
    cycle.given(ENGINE, [v.engine for v in views])
    cycle.given(CACHED_PROMPT_TOKENS, [v.cached_prompt_tokens for v in views])
    cycle.given(SESSION_KEY, [v.session_key for v in views])
    # Unknown where a view leaves them out: the scorers read None as unknown.
    cycle.given(PREDICTED_TTFT_MS, cast(list[float], [v.predicted_ttft_ms for v in views]))
    cycle.given(TTFT_SLO_MS, cast(list[int], [v.ttft_slo_ms for v in views]))
    cycle.given(BACKLOG_TOKENS, cast(list[int], [v.backlog_tokens for v in views]))
    return cycle


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
