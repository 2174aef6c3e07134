"""How many prefill tokens a reclaimed request's resends computed twice, as far as the gateway
can tell (issue 26). Pure: the handler calls it once, when the request ends, and the ledger's
`finished` records it in the request's log line.

A batch request taken off a reclaimed replica is aborted and sent again. Resent to the same
replica, the engine's prefix cache still holds the full blocks its ended attempt prefilled
(until evicted) and the resend's prefill starts past them; what the resend prefills of what
an ended attempt had prefilled (a partial last block, blocks evicted meanwhile, all of it on
another replica) is computed twice.

The resend's answer says how much of its prompt came from the cache
(`usage.prompt_tokens_details.cached_tokens`, `engine_usage.py`). Nothing says how far an
ended attempt got: its upstream request was closed, and the gateway never saw the first
token of an attempt it resends (a non-streaming answer shows none before it is whole, and a
stream is resent only while its client has had nothing but the stream's head). So every
ended attempt is taken to have prefilled the whole prompt, and each resend's prefill counts
whole: its prompt less its cached tokens where its answer told them, its whole prompt where
it did not (a resend ended again or failed, a stream whose client asked for no usage; a
stream's prompt is the gateway's count, an answer's the engine's). The count is an upper
bound: exact where the reclaim came after the ended attempt's prefill (a document decoding,
the common case: a long prompt's decode outlasts its prefill), over by the part of the
prompt an attempt ended in its prefill never reached.

The virtual runner counts exactly, from the prompt positions each attempt prefilled
(simulator/recompute.py), into the same log field.
"""

from __future__ import annotations


def recomputed_at_most(*, prompt_tokens: int, resends: int, cached_tokens: int | None) -> int:
    """The prefill tokens computed twice at most by `resends` attempts sent after a reclaim
    ended one, the last of which answered with `cached_tokens` from the prefix cache (None:
    it did not say, or did not answer) for a prompt of `prompt_tokens`."""
    if prompt_tokens < 0 or resends < 0 or (cached_tokens is not None and cached_tokens < 0):
        raise ValueError(
            f"counts must be >= 0: prompt_tokens={prompt_tokens}, resends={resends}, "
            f"cached_tokens={cached_tokens}"
        )
    if resends == 0:
        return 0
    cached = min(cached_tokens or 0, prompt_tokens)
    return resends * prompt_tokens - cached
