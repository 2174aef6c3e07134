"""The gateway's count of prefill tokens a reclaimed request's resends computed twice: an
upper bound, every ended attempt taken to have prefilled its whole prompt
(laneway/gateway/serving/recompute.py)."""

from __future__ import annotations

import pytest

from laneway.gateway.serving.recompute import recomputed_at_most

PROMPT = 8000


@pytest.mark.parametrize(
    ("resends", "cached", "expected"),
    [
        # (attempts sent after a reclaim, the last one's cached tokens, the count)
        (0, None, 0),  # never reclaimed: nothing prefilled twice
        (0, 7984, 0),  # its one answer hit the cache: not a resend's
        (1, 7984, 16),  # resent where its blocks were kept: the partial last block again
        (1, 0, PROMPT),  # resent where nothing was cached: the whole prompt again
        (1, None, PROMPT),  # the resend's answer did not say: as if nothing was cached
        (2, 7984, PROMPT + 16),  # reclaimed twice: the middle attempt counts whole
        (1, PROMPT + 5, 0),  # an engine reporting more cached than the prompt: capped
    ],
)
def test_each_resend_counts_its_prompt_less_what_its_engine_had_cached(
    resends: int, cached: int | None, expected: int
) -> None:
    assert recomputed_at_most(prompt_tokens=PROMPT, resends=resends, cached_tokens=cached) == (
        expected
    )


@pytest.mark.parametrize(
    ("prompt", "resends", "cached"), [(-1, 1, 0), (PROMPT, -1, 0), (PROMPT, 1, -3)]
)
def test_a_negative_count_is_refused(prompt: int, resends: int, cached: int) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        recomputed_at_most(prompt_tokens=prompt, resends=resends, cached_tokens=cached)
