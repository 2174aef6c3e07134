"""The prefix-affinity experiment in virtual time: multi-turn chat and document sessions on
engines with automatic prefix caching, under three pickers on the same GPUs.

Prompts are synthetic token streams, so both caches see real prefixes: a chat turn sends
its application's system prompt, the whole history and a new message (the assistant's
answers join the history); a document session asks several questions of one long
document, one after another, pinned to the batch lane (as a client does with the
`x-laneway-lane` header). Token ids are fresh integers per piece of content, so two prompts
share a block exactly when they share the content before it. Each session draws from its
own seeded random stream, so every picker sees the same sessions.

Routing is the gateway's own (as in `simulator/runner.py`): `lanes.classify` picks the pool
and `plan.make_plan` ranks its replicas, fed from the runner's accounting, engine gauges
scraped every SCRAPE_INTERVAL_S, and the gateway's prefix index. A picker is a picking
configuration (`picker_settings`), the very one `--mode live` gives the gateway: `none` is
the default scorers without prefixAffinity, `laneway` the defaults, `sticky` the
sessionHash scorer alone (every session on one replica, blind to load: an oracle for hits).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from laneway.api import Lane
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.picker import PickingSettings
from laneway.routing.plan import make_plan
from laneway.routing.prefix_index import PrefixIndex, chain_hashes, estimated_cached_tokens
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PrefillRate
from laneway.simulator.engine import EngineCore, StepOutcome
from laneway.simulator.prefix_cache import block_hashes
from laneway.simulator.profiles import Profile
from laneway.simulator.scheduler import KV_BLOCK_TOKENS, SchedulerConfig
from laneway.simulator.seed import LONG_CONTEXT, PUBLIC_MODEL, SCRAPE_INTERVAL_S, SimPool
from laneway.tokens import TokenBounds

PickerName = Literal["none", "laneway", "sticky"]
PICKERS: tuple[PickerName, ...] = ("none", "laneway", "sticky")
# Prose runs about four characters per token: the gateway's index blocks, in tokens.
CHARS_PER_TOKEN = 4


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
            SimPool("chat", Lane.INTERACTIVE, None, CHAT_CONTEXT, self.interactive_replicas,
                    CHAT_ENGINE),
            SimPool("documents", Lane.BATCH, None, LONG_CONTEXT, self.batch_replicas,
                    DOCUMENT_ENGINE),
        )  # fmt: skip


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
CHAT_ENGINE = SchedulerConfig("chunked", 2048, 1024, 128, 4, CHAT_CONTEXT)
DOCUMENT_ENGINE = SchedulerConfig("chunked", 2048, 1024, 256, 64, LONG_CONTEXT)


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
class _Replica:
    url: str  # its name in its InferencePool's endpoints
    core: EngineCore
    in_flight: int = 0
    prefill_tokens: int = 0  # the routed prompts' estimates, first token not back
    busy_s: float = 0.0
    computed_prompt_tokens: int = 0
    rate: PrefillRate = field(default_factory=PrefillRate)
    scraped: EngineMetrics | None = None  # the gauges as last scraped; None before


@dataclass
class _Request:
    session: int
    replica: str
    prompt_tokens: int
    output_tokens: int
    prefill_estimate: int  # what routing added to the replica's prefill backlog (uncached part)
    backlog_tokens: int  # the backlog it joined there, its own prompt included
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
        picking: PickingSettings,
    ) -> None:
        self.scenario, self.picker = scenario, picker
        settings = picker_settings(picker, picking)
        self._profile = settings.profile()
        self._prefix = settings.prefix
        self._affinity = any(s.name == "prefixAffinity" for s in self._profile)
        self._index = PrefixIndex(settings.prefix.capacity_blocks)
        self._tie_break = random.Random(f"{scenario.seed}/picker")
        self._fresh = itertools.count(1)
        self._systems = [self._tokens(scenario.system_prompt_tokens) for _ in range(scenario.apps)]
        self._replicas: dict[str, _Replica] = {}
        self._lanes: dict[str, list[str]] = {}
        self._pools = []
        for pool in scenario.pools():
            urls = [f"http://{pool.name}-{index}.virtual" for index in range(pool.replicas)]
            for url in urls:
                self._replicas[url] = _Replica(url, EngineCore(profile, pool.engine))
            self._lanes[pool.name] = urls
            self._pools.append(pool.inference_pool(urls))
        self._sessions: list[_Session] = []
        self._requests: dict[str, _Request] = {}
        self._stepping: dict[str, StepOutcome] = {}  # replica -> the step it is running
        self._events: list[tuple[float, int, str, str]] = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._tally = _Tally()

    def _tokens(self, count: int) -> list[int]:
        start = next(self._fresh)
        # Skip ahead so the next piece of content gets ids of its own.
        self._fresh = itertools.count(start + count)
        return list(range(start, start + count))

    # -- workload ------------------------------------------------------------------------

    def _new_session(self, kind: Literal["chat", "document"], at: float | None) -> None:
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
        self._push(rng.uniform(0, 2.0) if at is None else at, "send", str(key))

    def _push(self, at: float, kind: str, subject: str) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject))

    def run(self) -> PickerResult:
        for _ in range(self.scenario.chat_sessions):
            self._new_session("chat", None)
        for _ in range(self.scenario.document_sessions):
            self._new_session("document", None)
        self._push(0.0, "scrape", "")
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if kind == "send":
                self._send(now, self._sessions[int(subject)])
            elif kind == "scrape":
                self._scrape(now)
            else:
                self._finish_step(now, subject)
        return self._result()

    def _send(self, now: float, session: _Session) -> None:
        if now >= self.scenario.duration_s:
            return
        scenario, rng = self.scenario, session.rng
        if session.kind == "chat":
            message = self._tokens(rng.randint(*scenario.message_tokens))
            output = rng.randint(*scenario.output_tokens)
        else:
            message = self._tokens(rng.randint(*scenario.question_tokens))
            output = rng.randint(*scenario.answer_tokens)
            if self._tally.first_document_s is None:
                self._tally.first_document_s = now
        prompt = session.history + message
        if session.kind == "chat":
            session.history = prompt  # the next turn resends it, with the answer after it
        request_id = f"r{next(self._ids)}"
        request = self._route(now, session, prompt, output)
        replica = self._replicas[request.replica]
        replica.core.submit(request_id, len(prompt), output, block_hashes(prompt, KV_BLOCK_TOKENS))
        self._requests[request_id] = request
        replica.in_flight += 1
        replica.prefill_tokens += request.prefill_estimate
        session.requests_left -= 1
        if request.replica not in self._stepping:
            self._start_step(now, request.replica)

    # -- routing: the gateway's, step for step -------------------------------------------

    def _route(self, now: float, session: _Session, prompt: list[int], output: int) -> _Request:
        pinned = Lane.BATCH if session.kind == "document" else None
        tokens = TokenBounds(len(prompt), len(prompt))
        route = classify(RouteRequest(PUBLIC_MODEL, tokens, output, pinned), self._pools)
        # Every prompt fits a pool: chat histories stay far below the chat context, and
        # scenario_problems bounds the documents.
        assert isinstance(route, Route), route
        hashes = self._index_hashes(prompt) if self._affinity else ()
        matched = self._index.matched_blocks(hashes) if hashes else {}
        replicas = [self._replicas[url] for url in route.pool.endpoints]
        views = [
            EndpointView(
                r.url,
                r.in_flight,
                r.prefill_tokens,
                r.scraped,
                cached_prompt_tokens=estimated_cached_tokens(
                    matched.get(r.url, 0), len(hashes), route.prefill_tokens
                )
                if hashes
                else None,
                session_key=str(session.key),
            )
            for r in replicas
        ]
        rates = {r.url: r.rate for r in replicas}
        best = make_plan(route, views, rates, self._profile, self._tie_break).endpoints[0]
        if hashes:
            self._index.record(best.url, hashes)
        return _Request(
            session.key,
            best.url,
            len(prompt),
            output,
            best.prefill_tokens,
            best.backlog_tokens,
            now,
        )

    def _index_hashes(self, prompt: list[int]) -> tuple[int, ...]:
        """The gateway's index blocks over the prompt (its text blocks, here in tokens)."""
        size = self._prefix.block_chars // CHARS_PER_TOKEN
        blocks = min(len(prompt) // size, self._prefix.max_blocks)
        return chain_hashes(
            hash(tuple(prompt[i : i + size])) for i in range(0, blocks * size, size)
        )

    def _scrape(self, now: float) -> None:
        for replica in self._replicas.values():
            core = replica.core
            replica.scraped = EngineMetrics(len(core.waiting), len(core.running), core.kv_usage)
        if self._events:  # anything left to happen: keep scraping until the run drains
            self._push(now + SCRAPE_INTERVAL_S, "scrape", "")

    # -- engines ---------------------------------------------------------------------------

    def _start_step(self, now: float, url: str) -> None:
        replica = self._replicas[url]
        outcome = replica.core.step()
        if outcome is None:
            return
        replica.busy_s += outcome.duration_s
        replica.computed_prompt_tokens += sum(chunk.tokens for chunk in outcome.work.prefill)
        self._stepping[url] = outcome
        self._push(now + outcome.duration_s, "step_done", url)

    def _finish_step(self, now: float, url: str) -> None:
        replica = self._replicas[url]
        outcome = self._stepping.pop(url)
        for request_id in outcome.first_tokens:
            request = self._requests[request_id]
            replica.prefill_tokens -= request.prefill_estimate
            replica.rate = replica.rate.observed(
                request.backlog_tokens, (now - request.arrival_s) * 1000
            )
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
        self._start_step(now, url)

    def _next(self, now: float, session: _Session) -> None:
        think = session.rng.uniform(*self.scenario.think_time_s)
        if session.requests_left > 0:
            self._push(now + think, "send", str(session.key))
        else:
            self._new_session(session.kind, now + think if session.kind == "chat" else now)

    def _result(self) -> PickerResult:
        replicas = self._replicas.values()
        queries = sum(r.core.prefix_cache.query_tokens for r in replicas)
        hits = sum(r.core.prefix_cache.hit_tokens for r in replicas)
        busy = {
            pool: [self._replicas[url].busy_s for url in urls] for pool, urls in self._lanes.items()
        }
        first = self._tally.first_document_s
        return PickerResult(
            picker=self.picker,
            hit_rate=hits / queries if queries else 0.0,
            prefill_tokens=sum(r.computed_prompt_tokens for r in replicas),
            ttft_s=tuple(self._tally.ttft),
            batch_makespan_s=self._tally.last_document_s - first if first is not None else 0.0,
            pool_imbalance=pool_imbalance(busy),
            requests=self._tally.requests,
        )


def run_prefix(
    scenario: PrefixScenario,
    profile: Profile,
    picker: PickerName,
    picking: PickingSettings,
) -> PickerResult:
    """One picker's run; `picking` is the gateway's configuration the pickers derive from."""
    return PrefixCluster(scenario, profile, picker, picking).run()
