"""The prompt positions one request's attempts prefilled, to count the tokens a resend
computes twice.

A batch request taken off a reclaimed replica is aborted and sent again. What its first
attempt prefilled is not lost where the engine's prefix cache still holds those blocks (its
full blocks, until evicted): the resend's prefill then starts past them. Whatever the
resend prefills that an ended attempt had prefilled already (a partial last block, blocks
evicted meanwhile, another replica without them) is computed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Span = tuple[int, int]  # prompt positions [start, end)


def covered(spans: list[Span], start: int, end: int) -> int:
    """How many positions of [start, end) lie in the union of `spans`."""
    total, reached = 0, start
    for low, high in sorted(spans):
        low, high = max(low, reached), min(high, end)
        if high > low:
            total += high - low
            reached = high
    return total


@dataclass(slots=True)
class PrefillSpans:
    ended: list[Span] = field(default_factory=list)  # of the attempts ended to requeue it
    current: Span | None = None  # what the current attempt has prefilled so far
    recomputed_tokens: int = 0

    def prefilled(self, start: int, tokens: int) -> None:
        """The current attempt's engine prefilled `tokens` prompt tokens from `start`."""
        end = start + tokens
        self.recomputed_tokens += covered(self.ended, start, end)
        self.current = (start, end) if self.current is None else (self.current[0], end)

    def attempt_ended(self) -> None:
        if self.current is not None:
            self.ended.append(self.current)
        self.current = None
