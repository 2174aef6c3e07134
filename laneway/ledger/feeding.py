"""Per-replica feeding of a batch pool: the next document goes to a replica once the one it
is prefilling has its first token, not whenever a pool-wide count of slots has room.

A replica prefilling one long prompt and then decoding it spends most of its time in slow
decode steps; keeping one prompt always prefilling on each replica keeps its prefill busy,
which is what a batch lane's throughput is made of. So a feeding pool's slot is a prefill
slot: a request holds one from its admission to its first token, and a replica takes one
more document when it

- has fewer prompts awaiting their first token there (this gateway's and its peers') than
  its engine prefills in one step (`prefill_slots`),
- runs fewer than the pool's `maxConcurrentRequests` (its engine's `--max-num-seqs`), and
- has KV room: its engine's last fresh KV usage gauge is below the ledger's limit (a
  replica whose KV is full would hold the document in its own queue, unprefilled, while
  another replica could start it).

Pure functions of what the ledger knows; the ledger calls them whenever one of those facts
changes (a first token, a request's end, a scrape, the endpoints).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.ledger.endpoints import EndpointBook
from laneway.ledger.load import LoadBook


def feeds(pool: InferencePool, enabled: bool) -> bool:
    """Whether the ledger feeds `pool` per replica: the batch lane's pools, when enabled."""
    return enabled and pool.spec.lane is Lane.BATCH


def prefill_slots(pool: InferencePool) -> int:
    """Prompts a replica of the pool prefills in one step: as many chunks as its token
    budget holds (vLLM V1 schedules waiting prompts into one step until the budget is spent,
    each capped at `--long-prefill-token-threshold`; `--max-num-partial-prefills` it
    ignores); one where prompts are prefilled whole."""
    prefill = pool.spec.prefill
    if not prefill.chunked_prefill:
        return 2
    return max(1, prefill.token_budget // prefill.chunk_size) + 1


def free_slots(
    pool: InferencePool,
    urls: Sequence[str],
    counts: FeedCounts,
) -> dict[str, int]:
    """Of `urls` (the pool's available endpoints), those that take more documents now, and
    how many each takes."""
    most, slots = pool.spec.limits.max_concurrent_requests, prefill_slots(pool)
    free = {}
    for url in urls:
        # Peer gateways' prompts there count as one (their load is summed in tokens).
        prefilling = counts.own.get(url, 0) + (counts.load.peer_prefill_tokens(url) > 0)
        room = min(slots - prefilling, most - counts.load.of(url).in_flight)
        gauges = counts.endpoints.fresh_metrics(url, counts.now)
        if room > 0 and (gauges is None or gauges.kv_usage < counts.kv_limit):
            free[url] = room
    return free


def fed_candidates(
    pool: InferencePool, subset: Iterable[str] | None, counts: FeedCounts
) -> Iterable[str] | None:
    """A fed request's candidates: the endpoints free for a new document (of `subset` where
    the caller gives one); `subset` itself when none is (a peer gateway took the last)."""
    urls = counts.endpoints.available(pool)
    if subset is not None:
        allowed = set(subset)
        urls = tuple(url for url in urls if url in allowed)
    return tuple(free_slots(pool, urls, counts)) or subset


@dataclass(frozen=True)
class FeedCounts:
    """What the ledger knows of the fed replicas at one moment."""

    load: LoadBook
    endpoints: EndpointBook
    own: Mapping[str, int]  # endpoint -> this gateway's prompts there awaiting a first token
    now: float
    kv_limit: float


def feeding_limit(prefilling: int, unsent: int, free_endpoints: int) -> int:
    """The pool gate's limit: its prefill slots in use plus one per endpoint free for a new
    document, less the granted requests not yet sent (each will take one of those)."""
    return prefilling - unsent + free_endpoints
