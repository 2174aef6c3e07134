"""Prefer the endpoint with the fewest prompt tokens still to prefill.

Outstanding prefill is what delays the next request's first token, so one 64k document
outweighs dozens of short chats that the in-flight count would treat alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.scorers.base import EndpointView, lower_is_better


class PrefillTokensScorer:
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]:
        return lower_is_better([e.prefill_tokens for e in endpoints])
