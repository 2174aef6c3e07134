"""The scorer contract: given a request's cycle (its candidate endpoints and the data its
scorers asked for), one score per candidate in [0, 1], 1 is best.

A scorer names the data it reads in `needs` (keys from `laneway.routing.cycle`, or its own
key with its own producer) and reads them from the cycle. Scores are relative to the
candidates, so a scorer returns the neutral 1.0 to all when they are equal, and 0.5 where it
knows nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from laneway.routing.cycle import CycleState, DataKey

UNKNOWN = 0.5


class Scorer(ABC):
    needs: ClassVar[frozenset[DataKey[Any]]]

    @abstractmethod
    def scores(self, cycle: CycleState) -> list[float]: ...


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


def fewer_is_better(values: Sequence[float]) -> list[float]:
    """For amounts with a true zero (tokens): 1 for the least, less by the excess over the
    largest. Unlike `lower_is_better`, 8,283 against 8,295 tokens is a near tie, not 1 to 0,
    so a difference too small to matter leaves the choice to the other scorers."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high <= low:
        return [1.0] * len(values)
    return [1.0 - (v - low) / high for v in values]
