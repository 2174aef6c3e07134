"""Prefer the endpoint with the least prefill ahead of this request's first token, counting
the prompt prefix it is estimated to hold in its prefix cache as work it will not redo.

Load and affinity in one unit, tokens: an endpoint's backlog is the prefill queued there
plus the part of this prompt it would compute (`cycle.BACKLOG_TOKENS`). An endpoint
that caches 3,000 of the prompt's tokens but has 10,000 queued loses to an idle one, so
affinity never recreates the head-of-line blocking the lanes exist to prevent.

Scores are relative to the largest backlog, not spread between the smallest and largest:
when a replica holding the document is busy prefilling another one, its 8,283 tokens ahead
against an idle replica's 8,295 to recompute is a tie in TTFT, and scoring it 1 against 0
would keep piling sessions on the busy replica while the idle one waits (the live document
pool's imbalance of 1.37). Near ties go to the in-flight and queue scorers instead.

The estimate comes from `prefix_index.PrefixIndex` (what the gateway routed where); without
one every endpoint's cached estimate is None and the score ranks outstanding prefill alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.cycle import BACKLOG_TOKENS, CACHED_PROMPT_TOKENS, CycleState
from laneway.routing.scorers.base import Scorer, fewer_is_better


class PrefixAffinityScorer(Scorer):
    # The cached prompt tokens are what make the backlog an affinity: asking for them is
    # what has the shell cut the prompt into prefix blocks.
    needs = frozenset({BACKLOG_TOKENS, CACHED_PROMPT_TOKENS})

    def scores(self, cycle: CycleState) -> list[float]:
        backlogs: Sequence[int] = cycle[BACKLOG_TOKENS]
        return fewer_is_better(backlogs)
