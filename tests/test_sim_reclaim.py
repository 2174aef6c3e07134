"""Reclaiming a replica in the virtual runner: the document running there is aborted after
the engine's current step, requeued through the ledger and sent again; resent to the same
engine it resumes from the prefix cache, and its log counts the prompt tokens prefilled
twice."""

from __future__ import annotations

import dataclasses

from laneway.api import Lane
from laneway.ledger import RequestLog
from laneway.routing.picker import PickingSettings
from laneway.simulator.profiles import PROFILES
from laneway.simulator.replicas import Request
from laneway.simulator.runner import VirtualCluster, Workload
from laneway.simulator.seed import CHUNKED_LONG, LONG_CONTEXT, SimPool

DOCUMENT_TOKENS = 32768
RECLAIM_AT_S = 0.2  # a lone 32k prompt is prefilled 1,024 tokens a step for over a second


class ReclaimOnce(Workload):
    """One document at t = 0, its replica reclaimed at `RECLAIM_AT_S`."""

    def __init__(self) -> None:
        self.document: Request | None = None
        self.aborted_span: tuple[int, int] | None = None

    def start(self, cluster: VirtualCluster) -> None:
        cluster.schedule(0.0, 0)
        cluster.schedule(RECLAIM_AT_S, 1)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        if subject == 0:
            ids = list(range(DOCUMENT_TOKENS))
            self.document = cluster.submit(now, 0, DOCUMENT_TOKENS, 8, prompt_ids=ids)
        else:
            assert self.document is not None
            cluster.reclaim(now, self.document)

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        self.aborted_span = request.spans.ended[0] if request.spans.ended else None


def run(chunk_size: int, prefix_caching: bool) -> tuple[RequestLog, tuple[int, int], int]:
    """The document's log, the span its aborted attempt prefilled and all prompt tokens
    its engine prefilled."""
    engine = dataclasses.replace(
        CHUNKED_LONG, chunk_size=chunk_size, token_budget=chunk_size, prefix_caching=prefix_caching
    )
    docs = SimPool(
        name="batch",
        lane=Lane.BATCH,
        max_prompt_tokens=None,
        max_context_tokens=LONG_CONTEXT,
        replicas=1,
        engine=engine,
    )
    workload = ReclaimOnce()
    cluster = VirtualCluster(
        [docs],
        PROFILES["h200-llama3-8b"],
        PickingSettings(),
        workload,
        duration_s=RECLAIM_AT_S,
        tie_break="reclaim",
        scrape_interval_s=None,
    )
    cluster.run()
    assert not cluster.requests
    (log,) = cluster.logs
    assert workload.aborted_span is not None
    assert cluster.load(0).in_flight == 0
    return log, workload.aborted_span, cluster.replicas[0].computed_prompt_tokens


def test_a_reclaimed_document_resumes_from_the_blocks_its_engine_kept() -> None:
    log, (start, end), prefilled = run(chunk_size=1024, prefix_caching=True)
    assert (log.status, log.attempts, log.requeued) == (200, 2, 1)
    assert start == 0
    assert 0 < end < DOCUMENT_TOKENS  # aborted mid-prefill
    assert end % 1024 == 0  # after the step that was running: whole chunks
    # Every token it had computed is in full blocks, all still cached: nothing twice.
    assert log.recomputed_prompt_tokens == 0
    assert prefilled == DOCUMENT_TOKENS


def test_a_partial_last_block_is_prefilled_twice() -> None:
    log, (_, end), prefilled = run(chunk_size=1001, prefix_caching=True)
    assert end % 1001 == 0
    assert end % 16  # a chunk ends inside a block
    assert log.recomputed_prompt_tokens == end % 16  # only full blocks are cached
    assert prefilled == DOCUMENT_TOKENS + end % 16


def test_without_a_prefix_cache_the_resend_prefills_everything_again() -> None:
    log, (_, end), prefilled = run(chunk_size=1024, prefix_caching=False)
    assert log.requeued == 1
    assert log.recomputed_prompt_tokens == end
    assert prefilled == DOCUMENT_TOKENS + end
