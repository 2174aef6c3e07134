"""The prefix-affinity experiment in virtual time: multi-turn chat and document sessions on
engines with automatic prefix caching, under three endpoint pickers on the same GPUs.

Prompts are synthetic token streams, so both caches see real prefixes: a chat turn sends
its application's system prompt, the whole history and a new message (the assistant's
answers join the history); a document session asks several questions of one long
document, one after another, in the batch lane. Token ids are fresh integers per piece of
content, so two prompts share a block exactly when they share the content before it.

Pickers: `none` ranks with the gateway's default scorers without prefix affinity; `laneway`
adds the prefixAffinity scorer fed by a `PrefixIndex` as the gateway keeps it; `sticky` sends
every session to the replica its first request got (an oracle for hit rate, blind to load).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.picker import rank, scorers_from_weights
from laneway.routing.prefix_index import (
    PrefixIndex,
    PrefixSettings,
    chain_hashes,
    estimated_cached_tokens,
)
from laneway.routing.scorers import EndpointView
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import KV_BLOCK_TOKENS, SchedulerConfig
from laneway.simulator.seed import LONG_CONTEXT

PickerName = Literal["none", "laneway", "sticky"]
PICKERS: tuple[PickerName, ...] = ("none", "laneway", "sticky")
# Prose runs about four characters per token: the gateway's index blocks, in tokens.
CHARS_PER_TOKEN = 4


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


def scenario_problems(scenario: PrefixScenario) -> list[str]:
    problems = []
    if scenario.interactive_replicas < 1 or scenario.batch_replicas < 1:
        problems.append("each lane needs at least one replica")
    if not scenario.duration_s > 0:
        problems.append("--duration must be above 0")
    if not 1 <= scenario.document_tokens <= LONG_CONTEXT // 2:
        problems.append(f"--document-tokens must be between 1 and {LONG_CONTEXT // 2}")
    return problems


CHAT_CONTEXT = 16384
CHAT_ENGINE = SchedulerConfig("chunked", 2048, 1024, 128, 4, CHAT_CONTEXT)
DOCUMENT_ENGINE = SchedulerConfig("chunked", 2048, 1024, 256, 64, LONG_CONTEXT)


@dataclass(frozen=True)
class PickerResult:
    picker: PickerName
    hit_rate: float  # prefix-cache hit tokens over query tokens, all replicas
    prefill_tokens: int  # prompt tokens the engines computed
    ttft_s: tuple[float, ...]  # interactive requests
    batch_makespan_s: float  # first document question to last answer
    load_imbalance: float  # worst lane's busiest replica busy time over the lane's mean
    requests: int


@dataclass
class _Session:
    kind: Literal["chat", "document"]
    key: int  # unique per session: the sticky picker's key
    history: list[int]  # tokens every next prompt starts with
    requests_left: int
    replica: int = -1  # sticky: where its first request went


@dataclass
class _Replica:
    core: EngineCore
    in_flight: int = 0
    prefill_tokens: int = 0  # sent, first token not back
    busy_s: float = 0.0
    computed_prompt_tokens: int = 0


@dataclass
class _Request:
    session: int
    prompt: list[int]
    output_tokens: int
    arrival_s: float


@dataclass
class _Tally:
    ttft: list[float] = field(default_factory=list)
    first_document_s: float | None = None
    last_document_s: float = 0.0
    requests: int = 0


class PrefixCluster:
    def __init__(
        self,
        scenario: PrefixScenario,
        profile: Profile,
        picker: PickerName,
        weights: Mapping[str, int],
        prefix: PrefixSettings,
    ) -> None:
        self.scenario, self.picker, self.prefix = scenario, picker, prefix
        self._rng = random.Random(f"{scenario.seed}/prefix")
        self._fresh = itertools.count(1)
        self._systems = [self._tokens(scenario.system_prompt_tokens) for _ in range(scenario.apps)]
        chat = [
            _Replica(EngineCore(profile, CHAT_ENGINE)) for _ in range(scenario.interactive_replicas)
        ]
        batch = [
            _Replica(EngineCore(profile, DOCUMENT_ENGINE)) for _ in range(scenario.batch_replicas)
        ]
        self._replicas = chat + batch
        self._lanes = {
            "chat": list(range(len(chat))),
            "document": list(range(len(chat), len(self._replicas))),
        }
        no_affinity = {**weights, "prefixAffinity": 0}
        self._profile = scorers_from_weights(
            "scored", weights if picker == "laneway" else no_affinity
        )
        self._index = PrefixIndex(prefix.capacity_blocks)
        self._sessions: list[_Session] = []
        self._requests: dict[str, _Request] = {}
        self._stepping: dict[int, StepOutcome] = {}  # replica -> the step it is running
        self._events: list[tuple[float, int, str, int]] = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._tally = _Tally()

    def _tokens(self, count: int) -> list[int]:
        start = next(self._fresh)
        # Skip ahead so the next piece of content gets ids of its own.
        self._fresh = itertools.count(start + count)
        return list(range(start, start + count))

    # -- workload ------------------------------------------------------------------------

    def _new_chat(self, now: float) -> None:
        low, high = self.scenario.turns
        system = self._systems[self._rng.randrange(self.scenario.apps)]
        self._add_session(
            now, _Session("chat", len(self._sessions), list(system), self._rng.randint(low, high))
        )

    def _new_document(self, now: float) -> None:
        document = self._tokens(self.scenario.document_tokens)
        self._add_session(
            now, _Session("document", len(self._sessions), document, self.scenario.questions)
        )

    def _add_session(self, now: float, session: _Session) -> None:
        self._sessions.append(session)
        self._push(now, "send", session.key)

    def _push(self, at: float, kind: str, subject: int) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject))

    def run(self) -> PickerResult:
        scenario = self.scenario
        for _ in range(scenario.chat_sessions):
            self._new_chat(self._rng.uniform(0, 2.0))
        for _ in range(scenario.document_sessions):
            self._new_document(self._rng.uniform(0, 2.0))
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if kind == "send":
                self._send(now, self._sessions[subject])
            else:
                self._finish_step(now, subject)
        return self._result()

    def _send(self, now: float, session: _Session) -> None:
        if now >= self.scenario.duration_s:
            return
        if session.kind == "chat":
            message = self._tokens(self._rng.randint(*self.scenario.message_tokens))
            output = self._rng.randint(*self.scenario.output_tokens)
        else:
            message = self._tokens(self._rng.randint(*self.scenario.question_tokens))
            output = self._rng.randint(*self.scenario.answer_tokens)
            if self._tally.first_document_s is None:
                self._tally.first_document_s = now
        prompt = session.history + message
        if session.kind == "chat":
            session.history = prompt  # the next turn resends it, with the answer after it
        replica_index = self._pick(session, prompt)
        replica = self._replicas[replica_index]
        request_id = f"r{next(self._ids)}"
        replica.core.submit(request_id, len(prompt), output, block_hashes(prompt, KV_BLOCK_TOKENS))
        self._requests[request_id] = _Request(session.key, prompt, output, now)
        replica.in_flight += 1
        replica.prefill_tokens += len(prompt)
        session.requests_left -= 1
        if replica_index not in self._stepping:
            self._start_step(now, replica_index)

    # -- picking ---------------------------------------------------------------------------

    def _pick(self, session: _Session, prompt: list[int]) -> int:
        candidates = self._lanes[session.kind]
        if self.picker == "sticky" and session.replica >= 0:
            return session.replica
        hashes: tuple[int, ...] = ()
        cached: dict[int, int | None] = {}
        if self.picker == "laneway":
            hashes = self._index_hashes(prompt)
            matched = self._index.matched_blocks(hashes)
            cached = {
                i: estimated_cached_tokens(matched.get(str(i), 0), len(hashes), len(prompt))
                for i in candidates
            }
        views = [self._view(i, cached.get(i)) for i in candidates]
        chosen = int(rank(views, self._profile, self._rng)[0].url)
        if hashes:
            self._index.record(str(chosen), hashes)
        session.replica = chosen
        return chosen

    def _index_hashes(self, prompt: list[int]) -> tuple[int, ...]:
        """The gateway's index blocks over the prompt (its text blocks, here in tokens)."""
        size = self.prefix.block_chars // CHARS_PER_TOKEN
        blocks = min(len(prompt) // size, self.prefix.max_blocks)
        return chain_hashes(
            hash(tuple(prompt[i : i + size])) for i in range(0, blocks * size, size)
        )

    def _view(self, index: int, cached: int | None) -> EndpointView:
        replica = self._replicas[index]
        core = replica.core
        engine = EngineMetrics(len(core.waiting), len(core.running), core.kv_usage)
        return EndpointView(
            str(index),
            replica.in_flight,
            replica.prefill_tokens,
            engine,
            cached_prompt_tokens=cached,
        )

    # -- engines ---------------------------------------------------------------------------

    def _start_step(self, now: float, index: int) -> None:
        replica = self._replicas[index]
        outcome = replica.core.step()
        if outcome is None:
            return
        replica.busy_s += outcome.duration_s
        replica.computed_prompt_tokens += sum(chunk.tokens for chunk in outcome.work.prefill)
        self._stepping[index] = outcome
        self._push(now + outcome.duration_s, "step_done", index)

    def _finish_step(self, now: float, index: int) -> None:
        replica = self._replicas[index]
        outcome = self._stepping.pop(index)
        for request_id in outcome.first_tokens:
            request = self._requests[request_id]
            replica.prefill_tokens -= len(request.prompt)
            if self._sessions[request.session].kind == "chat":
                self._tally.ttft.append(now - request.arrival_s)
        for request_id in outcome.finished:
            request = self._requests.pop(request_id)
            replica.in_flight -= 1
            self._tally.requests += 1
            session = self._sessions[request.session]
            if session.kind == "chat":
                # The answer joins the history the next turn resends.
                session.history = session.history + self._tokens(request.output_tokens)
            else:
                self._tally.last_document_s = now
            self._next(now, session)
        self._start_step(now, index)

    def _next(self, now: float, session: _Session) -> None:
        if session.requests_left > 0:
            self._push(now + self._rng.uniform(*self.scenario.think_time_s), "send", session.key)
        elif session.kind == "chat":
            self._new_chat(now + self._rng.uniform(*self.scenario.think_time_s))
        else:
            self._new_document(now)

    def _result(self) -> PickerResult:
        queries = sum(r.core.prefix_cache.query_tokens for r in self._replicas)
        hits = sum(r.core.prefix_cache.hit_tokens for r in self._replicas)
        imbalance = 1.0
        for lane in self._lanes.values():
            busy = [self._replicas[i].busy_s for i in lane]
            mean = sum(busy) / len(busy)
            if mean > 0:
                imbalance = max(imbalance, max(busy) / mean)
        first = self._tally.first_document_s
        return PickerResult(
            picker=self.picker,
            hit_rate=hits / queries if queries else 0.0,
            prefill_tokens=sum(r.computed_prompt_tokens for r in self._replicas),
            ttft_s=tuple(self._tally.ttft),
            batch_makespan_s=self._tally.last_document_s - first if first is not None else 0.0,
            load_imbalance=imbalance,
            requests=self._tally.requests,
        )


def run_prefix(
    scenario: PrefixScenario,
    profile: Profile,
    picker: PickerName,
    weights: Mapping[str, int],
    prefix: PrefixSettings,
) -> PickerResult:
    return PrefixCluster(scenario, profile, picker, weights, prefix).run()
