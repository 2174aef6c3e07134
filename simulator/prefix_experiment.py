"""The prefix-affinity experiment in virtual time: multi-turn chat and document sessions on
engines with automatic prefix caching, under three pickers on the same GPUs.

Prompts are synthetic token streams, so both caches see real prefixes: a chat turn sends
its application's system prompt, the whole history and a new message (the assistant's
answers join the history); a document session asks several questions of one long
document, one after another, pinned to the batch lane (as a client does with the
`x-laneway-lane` header). Token ids are fresh integers per piece of content, so two prompts
share a block exactly when they share the content before it. Each session draws from its
own seeded random stream, so every picker sees the same sessions.

`PrefixWorkload` is the sessions; the virtual-time runner (`simulator/runner.py`) routes as
the gateway does: `lanes.classify` picks the pool and the ledger's `plan` ranks its
replicas, on the ledger's load, engine gauges scraped every SCRAPE_INTERVAL_S, and the
ledger's prefix index. A picker is a picking
configuration (`picker_settings`), the very one `--mode live` gives the gateway: `none` is
the default scorers without prefixAffinity, `laneway` the defaults, `sticky` the
sessionHash scorer alone (every session on one replica, blind to load: an oracle for hits).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from laneway.api import Lane
from laneway.routing.picker import PickingSettings
from laneway.simulator.profiles import Profile
from laneway.simulator.replicas import Request
from laneway.simulator.runner import VirtualCluster, Workload
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import CHUNKED_LONG, LONG_CONTEXT, SCRAPE_INTERVAL_S, SimPool

PickerName = Literal["none", "laneway", "sticky"]
PICKERS: tuple[PickerName, ...] = ("none", "laneway", "sticky")


def picker_settings(picker: PickerName, base: PickingSettings) -> PickingSettings:
    """The gateway's picking configuration that each picker stands for."""
    if picker == "laneway":
        return base
    if picker == "none":
        return dataclasses.replace(base, weights={**base.weights, "prefixAffinity": 0})
    return dataclasses.replace(base, weights={**dict.fromkeys(base.weights, 0), "sessionHash": 1})


@dataclass(frozen=True)
class PrefixScenario:
    interactive_replicas: int = 4
    batch_replicas: int = 2
    apps: int = 4  # applications, each with its own system prompt
    system_prompt_tokens: int = 1000
    chat_sessions: int = 96  # concurrent; a finished session is replaced by a new one
    turns: tuple[int, int] = (3, 8)
    message_tokens: tuple[int, int] = (50, 200)
    output_tokens: tuple[int, int] = (50, 250)
    think_time_s: tuple[float, float] = (1.0, 5.0)
    document_sessions: int = 8
    document_tokens: int = 32768
    questions: int = 4
    question_tokens: tuple[int, int] = (50, 150)
    answer_tokens: tuple[int, int] = (128, 256)
    duration_s: float = 60.0
    seed: int = 0

    def pools(self) -> tuple[SimPool, SimPool]:
        """The chat (interactive) and document (batch) pools, as InferencePool templates."""
        return (
            SimPool(
                name="chat",
                lane=Lane.INTERACTIVE,
                max_prompt_tokens=None,
                max_context_tokens=CHAT_CONTEXT,
                replicas=self.interactive_replicas,
                engine=CHAT_ENGINE,
            ),
            SimPool(
                name="documents",
                lane=Lane.BATCH,
                max_prompt_tokens=None,
                max_context_tokens=LONG_CONTEXT,
                replicas=self.batch_replicas,
                engine=DOCUMENT_ENGINE,
            ),
        )


def scenario_problems(scenario: PrefixScenario) -> list[str]:
    problems = []
    if scenario.interactive_replicas < 1 or scenario.batch_replicas < 1:
        problems.append("each lane needs at least one replica")
    if scenario.chat_sessions < 0:
        problems.append("--chat-sessions must not be negative")
    if not scenario.duration_s > 0:
        problems.append("--duration must be above 0")
    if not 1 <= scenario.document_tokens <= LONG_CONTEXT // 2:
        problems.append(f"--document-tokens must be between 1 and {LONG_CONTEXT // 2}")
    return problems


CHAT_CONTEXT = 16384
CHAT_ENGINE = SchedulerConfig(
    kind="chunked",
    token_budget=2048,
    chunk_size=1024,
    max_num_seqs=128,
    max_partial_prefills=4,
    max_context=CHAT_CONTEXT,
)
DOCUMENT_ENGINE = CHUNKED_LONG


@dataclass(frozen=True)
class PickerResult:
    picker: PickerName
    hit_rate: float  # prefix-cache hit tokens over query tokens, all replicas
    prefill_tokens: int  # prompt tokens the engines computed
    ttft_s: tuple[float, ...]  # interactive requests
    batch_makespan_s: float  # first document question to last answer
    # Per pool: its busiest replica's busy time over the pool's mean (1.0 when idle).
    pool_imbalance: tuple[tuple[str, float], ...]
    requests: int

    @property
    def load_imbalance(self) -> float:
        """The worst pool's imbalance."""
        return max((value for _, value in self.pool_imbalance), default=1.0)


def pool_imbalance(busy_s: Mapping[str, Sequence[float]]) -> tuple[tuple[str, float], ...]:
    """Each pool's busiest replica's busy seconds over the pool's mean."""
    return tuple(
        (pool, max(busy) / (sum(busy) / len(busy)) if sum(busy) > 0 else 1.0)
        for pool, busy in busy_s.items()
    )


@dataclass
class _Session:
    kind: Literal["chat", "document"]
    key: int  # unique per session: its random stream and its x-laneway-session
    rng: random.Random
    history: list[int]  # tokens every next prompt starts with
    requests_left: int


@dataclass
class _Tally:
    ttft: list[float] = field(default_factory=list)
    first_document_s: float | None = None
    last_document_s: float = 0.0
    requests: int = 0


class PrefixWorkload(Workload):
    """Chat and document sessions; a finished session is replaced by a new one."""

    def __init__(self, scenario: PrefixScenario) -> None:
        self.scenario = scenario
        self._fresh = itertools.count(1)
        self._systems = [self._tokens(scenario.system_prompt_tokens) for _ in range(scenario.apps)]
        self._sessions: list[_Session] = []
        self.tally = _Tally()

    def _tokens(self, count: int) -> list[int]:
        start = next(self._fresh)
        # Skip ahead so the next piece of content gets ids of its own.
        self._fresh = itertools.count(start + count)
        return list(range(start, start + count))

    def _new_session(
        self, cluster: VirtualCluster, kind: Literal["chat", "document"], at: float | None
    ) -> None:
        """Start a session at `at`; None: at a random moment of the first two seconds."""
        key = len(self._sessions)
        rng = random.Random(f"{self.scenario.seed}/session/{key}")
        if kind == "chat":
            system = self._systems[rng.randrange(self.scenario.apps)]
            session = _Session(kind, key, rng, list(system), rng.randint(*self.scenario.turns))
        else:
            document = self._tokens(self.scenario.document_tokens)
            session = _Session(kind, key, rng, document, self.scenario.questions)
        self._sessions.append(session)
        cluster.schedule(rng.uniform(0, 2.0) if at is None else at, key)

    def start(self, cluster: VirtualCluster) -> None:
        for _ in range(self.scenario.chat_sessions):
            self._new_session(cluster, "chat", None)
        for _ in range(self.scenario.document_sessions):
            self._new_session(cluster, "document", None)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        if now >= self.scenario.duration_s:
            return
        scenario, session = self.scenario, self._sessions[subject]
        rng = session.rng
        if session.kind == "chat":
            message = self._tokens(rng.randint(*scenario.message_tokens))
            output = rng.randint(*scenario.output_tokens)
        else:
            message = self._tokens(rng.randint(*scenario.question_tokens))
            output = rng.randint(*scenario.answer_tokens)
            if self.tally.first_document_s is None:
                self.tally.first_document_s = now
        prompt = session.history + message
        if session.kind == "chat":
            session.history = prompt  # the next turn resends it, with the answer after it
        pinned = Lane.BATCH if session.kind == "document" else None
        sent = cluster.submit(
            now,
            session.key,
            len(prompt),
            output,
            prompt_ids=prompt,
            pinned=pinned,
            session_key=str(session.key),
        )
        # Every prompt fits a pool: chat histories stay far below the chat context, and
        # scenario_problems bounds the documents.
        assert sent is not None
        session.requests_left -= 1

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        if self._sessions[request.source].kind == "chat":
            self.tally.ttft.append(now - request.arrival_s)

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        self.tally.requests += 1
        session = self._sessions[request.source]
        if session.kind == "chat":
            # The answer joins the history the next turn resends.
            session.history = session.history + self._tokens(request.output_tokens)
        else:
            self.tally.last_document_s = now
        think = session.rng.uniform(*self.scenario.think_time_s)
        if session.requests_left > 0:
            cluster.schedule(now + think, session.key)
        else:
            self._new_session(cluster, session.kind, now + think if session.kind == "chat" else now)


def run_prefix(
    scenario: PrefixScenario,
    profile: Profile,
    picker: PickerName,
    picking: PickingSettings,
) -> PickerResult:
    """One picker's run; `picking` is the gateway's configuration the pickers derive from."""
    workload = PrefixWorkload(scenario)
    cluster = VirtualCluster(
        scenario.pools(),
        profile,
        picker_settings(picker, picking),
        workload,
        duration_s=scenario.duration_s,
        tie_break=f"{scenario.seed}/picker",
        scrape_interval_s=SCRAPE_INTERVAL_S,
    )
    cluster.run()
    replicas = cluster.replicas
    queries = sum(r.core.prefix_cache.query_tokens for r in replicas)
    hits = sum(r.core.prefix_cache.hit_tokens for r in replicas)
    busy = {pool.spec.name: [replicas[i].busy_s for i in pool.replicas] for pool in cluster.pools}
    tally = workload.tally
    first = tally.first_document_s
    return PickerResult(
        picker=picker,
        hit_rate=hits / queries if queries else 0.0,
        prefill_tokens=sum(r.computed_prompt_tokens for r in replicas),
        ttft_s=tuple(tally.ttft),
        batch_makespan_s=tally.last_document_s - first if first is not None else 0.0,
        pool_imbalance=pool_imbalance(busy),
        requests=tally.requests,
    )
