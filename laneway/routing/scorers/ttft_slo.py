"""Prefer endpoints where this request's first token is predicted within the pool's TTFT SLO.

Absolute, not relative: every endpoint predicted to meet the SLO scores 1 (meeting it is
meeting it; the other scorers choose among them), and one predicted to miss scores
SLO / prediction, so a near miss beats a certain one. The prediction is `slo.PrefillRate`'s.
"""

from __future__ import annotations

from laneway.routing.cycle import PREDICTED_TTFT_MS, TTFT_SLO_MS, CycleState
from laneway.routing.scorers.base import Scorer


class TtftSloScorer(Scorer):
    needs = frozenset({PREDICTED_TTFT_MS, TTFT_SLO_MS})

    def scores(self, cycle: CycleState) -> list[float]:
        return [
            _score(predicted, slo)
            for predicted, slo in zip(cycle[PREDICTED_TTFT_MS], cycle[TTFT_SLO_MS], strict=True)
        ]


def _score(predicted_ms: float, slo_ms: int) -> float:
    return 1.0 if predicted_ms <= slo_ms else slo_ms / predicted_ms
