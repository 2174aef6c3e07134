"""Prefer the endpoint with the least prefill ahead of this request's first token, counting
the prompt prefix it is estimated to hold in its prefix cache as work it will not redo.

Load and affinity in one unit, tokens: an endpoint that caches 3,000 of the prompt's tokens
but has 10,000 queued tokens to prefill first loses to an idle one, so affinity never
recreates the head-of-line blocking the lanes exist to prevent. The estimate comes from
`prefix_index.PrefixIndex` (what the gateway routed where); without one every endpoint's
estimate is None and the score is `PrefillTokensScorer`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.scorers.base import EndpointView, lower_is_better


class PrefixAffinityScorer:
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]:
        return lower_is_better(
            [float(e.prefill_tokens - (e.cached_prompt_tokens or 0)) for e in endpoints]
        )
