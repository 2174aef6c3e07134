"""Lending in the virtual runner: the ledger's role decisions acted on in virtual time. Idle
chat replicas are lent to the batch pool and fed documents; a burst of chat takes them back
(the documents there aborted after the engine's step, requeued and finished later); no
engine step ever holds a document's prefill and a chat turn at once."""

from __future__ import annotations

from laneway.api import Lane
from laneway.api.lending import LendingSpec
from laneway.ledger import Role
from laneway.routing.picker import PickingSettings
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.profiles import PROFILES
from laneway.simulator.replicas import Request
from laneway.simulator.runner import VirtualCluster, Workload
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import LONG_CONTEXT, SimPool

# One engine configuration for both roles (chunked, a 768-token step budget, the long
# context): what a lent replica must be to run the borrower's documents.
BOTH = SchedulerConfig(
    kind="chunked",
    token_budget=768,
    chunk_size=768,
    max_num_seqs=8,
    max_partial_prefills=8,
    max_context=LONG_CONTEXT,
)
DOCUMENTS, DOCUMENT_TOKENS = 40, 32768
CHAT_AT_S, CHAT_TURNS = 16.0, 40  # after the lull that lends; more than one replica holds


class LullThenBurst(Workload):
    def __init__(self) -> None:
        self.chat: list[Request] = []
        self.documents: list[Request] = []

    def start(self, cluster: VirtualCluster) -> None:
        cluster.schedule(0.0, 0)
        cluster.schedule(CHAT_AT_S, 1)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        if subject == 0:
            for index in range(DOCUMENTS):  # no two share a prefix
                ids = range(index * DOCUMENT_TOKENS, (index + 1) * DOCUMENT_TOKENS)
                doc = cluster.submit(now, 0, DOCUMENT_TOKENS, 64, prompt_ids=ids)
                assert doc is not None
                self.documents.append(doc)
            return
        for turn in range(CHAT_TURNS):
            request = cluster.submit(now, 1, 600 + turn, 40)
            assert request is not None
            self.chat.append(request)


def pools() -> list[SimPool]:
    chat = SimPool(
        name="realtime",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=2048,
        max_context_tokens=LONG_CONTEXT,
        replicas=4,
        engine=BOTH,
        lending=LendingSpec(borrower="batch", keep_replicas=1, headroom=0.25),
    )
    docs = SimPool(
        name="batch",
        lane=Lane.BATCH,
        max_prompt_tokens=None,
        max_context_tokens=LONG_CONTEXT,
        replicas=1,
        engine=BOTH,
        min_prompt_tokens=2049,
    )
    return [chat, docs]


def watch_steps(core: EngineCore, chat: set[str], mixed: list[StepOutcome]) -> None:
    """Record every step of `core` that prefills a document while a chat turn runs in it."""
    step = core.step

    def watched() -> StepOutcome | None:
        outcome = step()
        if outcome is not None:
            docs_prefilling = any(r not in chat for r in outcome.prefilled)
            chat_in_step = any(r in chat for r in (*outcome.prefilled, *outcome.tokens))
            if docs_prefilling and chat_in_step:
                mixed.append(outcome)
        return outcome

    core.step = watched  # type: ignore[method-assign]


def test_idle_replicas_are_lent_and_taken_back_for_a_chat_burst() -> None:
    workload = LullThenBurst()
    cluster = VirtualCluster(
        pools(),
        PROFILES["h200-llama3-8b"],
        PickingSettings(),
        workload,
        duration_s=CHAT_AT_S + 1,
        tie_break="lending",
        scrape_interval_s=0.25,
    )
    chat_ids: set[str] = set()
    mixed: list[StepOutcome] = []
    for replica in cluster.replicas:
        watch_steps(replica.core, chat_ids, mixed)
    original_submit = cluster.submit

    def submit(*args: object, **kwargs: object) -> Request | None:
        request = original_submit(*args, **kwargs)  # type: ignore[arg-type]
        if request is not None and request.route.lane is Lane.INTERACTIVE:
            chat_ids.add(request.request_id)
        return request

    cluster.submit = submit  # type: ignore[method-assign]
    cluster.run()

    assert not cluster.requests  # everything finished
    roles_by_time = [(at, change.role) for at, change in cluster.role_changes]
    lent_at = [at for at, role in roles_by_time if role is Role.LENT]
    reclaimed_at = [at for at, role in roles_by_time if role is Role.RECLAIMING]
    # Three of four lent during the lull (keepReplicas 1), one every lend_after_s.
    assert len([at for at in lent_at if at < CHAT_AT_S]) == 3
    # The burst takes lent replicas back at once, and each reports its latency.
    assert reclaimed_at
    assert min(reclaimed_at) == CHAT_AT_S
    # Lent again once the burst is over.
    assert max(lent_at) > CHAT_AT_S
    assert len(cluster.reclaim_ms) == len(reclaimed_at)
    assert max(cluster.reclaim_ms) < 100  # a step to abort, a chat prefill
    doc_logs = [log for log in cluster.logs if log.lane == "batch"]
    assert len(doc_logs) == DOCUMENTS
    assert all(log.status == 200 for log in doc_logs)
    assert sum(log.requeued for log in doc_logs) >= 1
    # Documents ran on lent replicas, not only on the batch pool's own.
    assert {log.endpoint for log in doc_logs} - {"http://batch-0.virtual"}
    chat_logs = [log for log in cluster.logs if log.lane == "interactive"]
    assert len(chat_logs) == CHAT_TURNS
    assert all(log.status == 200 for log in chat_logs)
    assert mixed == []  # never a document's prefill beside a chat turn
