"""Prefer the endpoint with the fewest prompt tokens still to prefill.

Outstanding prefill is what delays the next request's first token, so one 64k document
outweighs dozens of short chats that the in-flight count would treat alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.cycle import PREFILL_TOKENS, CycleState
from laneway.routing.scorers.base import Scorer, lower_is_better


class PrefillTokensScorer(Scorer):
    needs = frozenset({PREFILL_TOKENS})

    def scores(self, cycle: CycleState) -> list[float]:
        counts: Sequence[int] = cycle[PREFILL_TOKENS]
        return lower_is_better(counts)
