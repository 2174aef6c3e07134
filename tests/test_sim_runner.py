"""The one virtual-time runner: every experiment is deterministic under its seed, a
workload hears each request's progress, and a drained replica serves out its requests
before it gives its GPU back."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest

from laneway.api import Lane
from laneway.ledger import FirstToken, Sent
from laneway.routing.picker import PickingSettings
from laneway.simulator.elastic import Arrival, ElasticPool, run_elastic
from laneway.simulator.prefix_experiment import PrefixScenario, run_prefix
from laneway.simulator.profiles import PROFILES
from laneway.simulator.replicas import Request
from laneway.simulator.runner import Scaler, VirtualCluster, Workload
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import (
    CHUNKED_LONG,
    LONG_CONTEXT,
    SEED_PICKING,
    SeedScenario,
    SimPool,
    seed_configs,
)
from laneway.simulator.seed_experiment import run_virtual
from laneway.simulator.trace import run_trace

H200 = PROFILES["h200-llama3-8b"]
ENGINE = SchedulerConfig(
    kind="chunked",
    token_budget=2048,
    chunk_size=1024,
    max_num_seqs=64,
    max_partial_prefills=4,
    max_context=8192,
)
POOL = SimPool(
    name="chat",
    lane=Lane.INTERACTIVE,
    max_prompt_tokens=None,
    max_context_tokens=8192,
    replicas=2,
    engine=ENGINE,
)
SEED = SeedScenario(gpus=4, sessions=24, long_requests=3, long_tokens=16384, duration_s=8.0)
PREFIX = PrefixScenario(
    interactive_replicas=2, batch_replicas=1, chat_sessions=12, document_sessions=2,
    document_tokens=4096, duration_s=6.0,
)  # fmt: skip


def seed_run(seed: int) -> object:
    scenario = dataclasses.replace(SEED, seed=seed)
    return run_virtual(seed_configs(scenario, H200)[3], H200, scenario)


def prefix_run(seed: int) -> object:
    scenario = dataclasses.replace(PREFIX, seed=seed)
    return run_prefix(scenario, H200, "laneway", PickingSettings())


def elastic_run(seed: int) -> object:
    # The trace is the seed here: the autoscale experiment draws it from its own seed.
    arrivals = [
        Arrival(at_s=0.05 * i + 0.01 * seed, prompt_tokens=300 + 37 * i % 500, output_tokens=40)
        for i in range(200)
    ]
    pool = ElasticPool(name="chat", interactive=True, engine=ENGINE, replicas=2, policy=None)
    return run_elastic([pool], H200, arrivals, 10.0)


@pytest.mark.parametrize("run", [seed_run, prefix_run, elastic_run])
def test_same_seed_same_result_other_seed_other_result(run: Callable[[int], object]) -> None:
    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert first != other


@dataclasses.dataclass
class Heard:
    first: dict[str, float] = dataclasses.field(default_factory=dict)
    gaps: dict[str, int] = dataclasses.field(default_factory=dict)
    finished: dict[str, float] = dataclasses.field(default_factory=dict)


class ClosedLoop(Workload):
    """Two sessions, three turns each, one second of thought between turns."""

    def __init__(self) -> None:
        self.heard = Heard()
        self.turns = [0, 0]
        self.sent: list[Request] = []

    def start(self, cluster: VirtualCluster) -> None:
        cluster.schedule(0.0, 0)
        cluster.schedule(0.0, 1)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        self.turns[subject] += 1
        request = cluster.submit(now, subject, 500, 20)
        assert request is not None
        self.sent.append(request)

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        self.heard.first[request.request_id] = now

    def on_token_gap(
        self, cluster: VirtualCluster, now: float, request: Request, gap_s: float
    ) -> None:
        self.heard.gaps[request.request_id] = self.heard.gaps.get(request.request_id, 0) + 1
        assert gap_s > 0

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        self.heard.finished[request.request_id] = now
        if self.turns[request.source] < 3:
            cluster.schedule(now + 1.0, request.source)


def test_a_closed_loop_workload_hears_every_token_and_sends_the_next_turn() -> None:
    workload = ClosedLoop()
    cluster = VirtualCluster(
        [POOL], H200, SEED_PICKING, workload,
        duration_s=10.0, tie_break="test", scrape_interval_s=0.25,
    )  # fmt: skip
    cluster.run()
    heard = workload.heard
    assert len(workload.sent) == 6
    assert not cluster.requests  # everything finished
    for request in workload.sent:
        rid = request.request_id
        assert request.arrival_s < heard.first[rid] < heard.finished[rid]
        assert heard.gaps[rid] == request.output_tokens - 1
    # Each next turn left one second of thought after the previous answer.
    for session in (0, 1):
        turns = [r for r in workload.sent if r.source == session]
        for before, after in itertools.pairwise(turns):
            assert after.arrival_s == pytest.approx(heard.finished[before.request_id] + 1.0)


class DrainFirst(Scaler):
    interval_s = 0.5

    def __init__(self) -> None:
        self.drained: int | None = None
        self.drained_at = 0.0

    def decide(self, cluster: VirtualCluster, now: float) -> None:
        busy = [i for i in cluster.serving(0) if cluster.load(i).in_flight]
        if self.drained is None and busy:
            self.drained, self.drained_at = busy[0], now
            cluster.drain(now, busy[0])


class Stream(Workload):
    """A request every 0.1 s for 4 s."""

    def __init__(self) -> None:
        self.sent: list[Request] = []

    def start(self, cluster: VirtualCluster) -> None:
        for index in range(40):
            cluster.schedule(0.1 * index, index)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        request = cluster.submit(now, subject, 800, 200)
        assert request is not None
        self.sent.append(request)


def test_a_drained_replica_finishes_its_requests_takes_no_more_and_then_lets_go() -> None:
    workload, scaler = Stream(), DrainFirst()
    cluster = VirtualCluster(
        [POOL], H200, SEED_PICKING, workload,
        duration_s=4.0, tie_break="test", scrape_interval_s=None, scaler=scaler,
    )  # fmt: skip
    cluster.run()
    assert scaler.drained is not None
    drained = cluster.replicas[scaler.drained]
    assert drained.released_s is not None
    on_it = [r for r in workload.sent if r.replica == scaler.drained]
    assert on_it
    assert all(r.arrival_s <= scaler.drained_at for r in on_it)  # nothing new after it
    assert all(r.last_token_s is not None for r in on_it)
    assert drained.released_s == max(r.last_token_s or 0.0 for r in on_it)
    assert not cluster.requests


def test_the_runner_feeds_each_batch_replica_as_its_prefills_end() -> None:
    """A backlog of documents on two batch replicas: no replica ever holds more prompts
    awaiting their first token than its engine's step budget prefills (plus the next), each
    first token sends the next document, and every document completes."""
    docs = SimPool(
        name="batch",
        lane=Lane.BATCH,
        max_prompt_tokens=None,
        max_context_tokens=LONG_CONTEXT,
        replicas=2,
        engine=CHUNKED_LONG,  # 2,048-token budget, 1,024-token chunks: three per replica
    )
    arrivals = [
        Arrival(at_s=0.0, prompt_tokens=20000 + 1000 * i, output_tokens=64) for i in range(10)
    ]
    ledger, cluster = run_trace([docs], arrivals, PROFILES["h200-llama3-8b"], SEED_PICKING)
    awaiting: dict[str, set[int]] = {}
    most = 0
    fed_at_first_token = 0
    for step in ledger.steps:
        answer = step.answer
        if isinstance(answer, Sent):
            waiting = awaiting.setdefault(answer.endpoint.url, set())
            waiting.add(step.ticket)
            most = max(most, len(waiting))
        elif isinstance(answer, FirstToken):
            for waiting in awaiting.values():
                waiting.discard(step.ticket)
            fed_at_first_token += len(answer.wakes.granted)
    assert most == 3
    assert fed_at_first_token == len(arrivals) - 6  # the first six went at once
    assert [log.status for log in cluster.logs] == [200] * len(arrivals)
