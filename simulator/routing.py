"""Lane and endpoint choice, as the gateway makes it, in two small pure functions.

1. Lane/pool: the first pool, in the configuration's order, whose prompt-token range holds
   the prompt and whose context cap holds prompt + max output. Interactive pools come first,
   and a long prompt is outside their range, so it can never land there.
2. Endpoint: within the pool, the replica with the fewest prompt tokens still waiting for
   their first token (the work that delays a newcomer's first token), then the fewest
   requests in flight, then the lowest index (deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Lane = Literal["interactive", "batch"]


@dataclass(frozen=True)
class PoolRoute:
    """What routing needs to know about a pool."""

    name: str
    lane: Lane
    min_prompt_tokens: int
    max_prompt_tokens: int | None  # None: no upper bound
    max_context_tokens: int

    def accepts(self, prompt_tokens: int, max_output_tokens: int) -> bool:
        if prompt_tokens < self.min_prompt_tokens:
            return False
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            return False
        return prompt_tokens + max_output_tokens <= self.max_context_tokens


@dataclass(frozen=True)
class EndpointLoad:
    """The gateway's own accounting of one endpoint."""

    in_flight: int  # requests sent and not finished
    pending_prefill_tokens: int  # prompt tokens of requests without a first token yet


def choose_pool(
    pools: Sequence[PoolRoute], prompt_tokens: int, max_output_tokens: int
) -> int | None:
    """Index of the pool that takes the request, or None if no pool can hold it."""
    for index, pool in enumerate(pools):
        if pool.accepts(prompt_tokens, max_output_tokens):
            return index
    return None


def pick_endpoint(loads: Sequence[EndpointLoad]) -> int:
    """Index of the least-loaded endpoint; `loads` must not be empty."""
    return min(
        range(len(loads)),
        key=lambda i: (loads[i].pending_prefill_tokens, loads[i].in_flight, i),
    )
