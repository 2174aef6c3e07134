"""Predicting a request's time to first token on each endpoint, against the pool's SLO.

First-order model: before an engine sends a request's first token it works through the
prompt tokens ahead of it and its own, which the gateway knows as the endpoint's prefill
backlog (prompt tokens sent whose first token has not come back, `gateway/state/`) plus the
request's prompt. Each endpoint's rate, milliseconds per backlog token, is learned from the
first tokens of the streams it serves: the TTFT seen from the moment the request was sent,
divided by the backlog it joined. Learning and predicting from the same quantity keeps the
prediction calibrated even though the backlog overstates the work left (a prompt counts
fully until its first token, however much of it is done), and a rate per endpoint sees a
slower or busier engine as such.

What it ignores: an engine's fixed cost per step, which dominates small backlogs (so
backlogs under MIN_SAMPLE_TOKENS are not learned from, and predictions for them run low),
and load from clients that bypass the gateway (the rate absorbs it, slowly).
"""

from __future__ import annotations

from dataclasses import dataclass

# 10,000 prompt tokens/s: on the slow side for an 8B model on one modern GPU, so an
# endpoint is not over-trusted before its first observations.
PRIOR_MS_PER_TOKEN = 0.1
LEARNING_RATE = 0.2  # the newest observation's weight once learning has settled
# Below this, the engine's per-step overhead, not prefill, decides the TTFT.
MIN_SAMPLE_TOKENS = 256


@dataclass(frozen=True)
class PrefillRate:
    """One endpoint's learned prefill rate: an EWMA of milliseconds per backlog token."""

    ms_per_token: float = PRIOR_MS_PER_TOKEN
    samples: int = 0  # observations learned from

    def observed(self, backlog_tokens: int, ttft_ms: float) -> PrefillRate:
        if backlog_tokens < MIN_SAMPLE_TOKENS:
            return self
        # The prior counts as one observation: the first sample moves the rate halfway,
        # later ones by 1/(n+1) until the weight settles at LEARNING_RATE.
        weight = max(LEARNING_RATE, 1 / (self.samples + 2))
        sample = ttft_ms / backlog_tokens
        return PrefillRate(
            ms_per_token=self.ms_per_token + weight * (sample - self.ms_per_token),
            samples=self.samples + 1,
        )

    def predict_ttft_ms(self, backlog_tokens: int) -> float:
        return self.ms_per_token * backlog_tokens


# What an endpoint that has learned nothing yet predicts with (immutable, so shared).
PRIOR = PrefillRate()


def within_slo(seconds: float, slo_millis: int) -> bool:
    """The one comparison behind the SLO counters (matching a histogram bucket's `le`)."""
    return seconds <= slo_millis / 1000
