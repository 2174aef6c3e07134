"""The seed experiment in virtual time: closed-loop interactive sessions and a burst of long
requests on one of the seed's cluster configurations (`seed.py`), run by the virtual-time
runner (`runner.py`) with the configuration's picking settings and the gateway's scrape
interval.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from laneway.simulator.profiles import Profile
from laneway.simulator.replicas import Request
from laneway.simulator.runner import ProgressCallback, VirtualCluster, Workload
from laneway.simulator.seed import (
    SCRAPE_INTERVAL_S,
    TBT_SLO_S,
    TTFT_SLO_S,
    ClusterConfig,
    SeedScenario,
)

# The event subject of the long-request burst; sessions are numbered from 0.
LONG_REQUEST = -1


@dataclass(frozen=True)
class RunResult:
    config: ClusterConfig
    ttft_s: tuple[float, ...]  # per interactive request that got a first token
    ttft_at_s: tuple[float, ...]  # when each of those requests arrived
    tbt_s: tuple[float, ...]  # every gap between consecutive interactive tokens
    tbt_at_s: tuple[float, ...]  # when each of those gaps ended
    interactive_completed: int
    interactive_rejected: int  # no pool could hold them
    batch_finished_at_s: tuple[float, ...]
    batch_tokens: int  # prompt + output tokens of the completed batch requests
    batch_submitted: int
    gpu_busy_s: float  # summed over replicas
    end_s: float  # when the last event other than a scrape happened
    # Completed interactive turns whose TTFT and every gap met the seed's SLO.
    interactive_within_slo: int = 0


@dataclass
class _Tally:
    ttft: list[float] = field(default_factory=list)
    ttft_at: list[float] = field(default_factory=list)
    tbt: list[float] = field(default_factory=list)
    tbt_at: list[float] = field(default_factory=list)
    interactive_completed: int = 0
    interactive_rejected: int = 0
    interactive_within_slo: int = 0
    batch_finished_at: list[float] = field(default_factory=list)
    batch_tokens: int = 0


class SeedWorkload(Workload):
    """Sessions that send a turn, wait for its answer and think before the next; at
    `burst_at_s` every long request at once. A batch request's source is LONG_REQUEST."""

    def __init__(self, scenario: SeedScenario) -> None:
        self.scenario = scenario
        self.sessions = [
            random.Random(f"{scenario.seed}/session/{index}") for index in range(scenario.sessions)
        ]
        self.tally = _Tally()

    def start(self, cluster: VirtualCluster) -> None:
        scenario = self.scenario
        for index, rng in enumerate(self.sessions):
            cluster.schedule(rng.uniform(0, scenario.session_start_spread_s), index)
        for _ in range(scenario.long_requests):
            cluster.schedule(scenario.burst_at_s, LONG_REQUEST)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        scenario = self.scenario
        if subject == LONG_REQUEST:
            cluster.submit(now, LONG_REQUEST, scenario.long_tokens, scenario.long_output_tokens)
            return
        if now >= scenario.duration_s:
            return
        rng = self.sessions[subject]
        prompt = rng.randint(*scenario.prompt_tokens)
        output = rng.randint(*scenario.output_tokens)
        if cluster.submit(now, subject, prompt, output) is None:
            self.tally.interactive_rejected += 1
            self._next_turn(cluster, now, subject)

    def _next_turn(self, cluster: VirtualCluster, now: float, session: int) -> None:
        cluster.schedule(now + self.sessions[session].uniform(*self.scenario.think_time_s), session)

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        if request.source != LONG_REQUEST:
            self.tally.ttft.append(now - request.arrival_s)
            self.tally.ttft_at.append(request.arrival_s)

    def on_token_gap(
        self, cluster: VirtualCluster, now: float, request: Request, gap_s: float
    ) -> None:
        if request.source != LONG_REQUEST:
            self.tally.tbt.append(gap_s)
            self.tally.tbt_at.append(now)

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        tally = self.tally
        if request.source == LONG_REQUEST:
            tally.batch_finished_at.append(now)
            tally.batch_tokens += request.prompt_tokens + request.output_tokens
            return
        assert request.first_token_s is not None
        tally.interactive_completed += 1
        tally.interactive_within_slo += (
            request.first_token_s - request.arrival_s <= TTFT_SLO_S
            and request.max_gap_s <= TBT_SLO_S
        )
        self._next_turn(cluster, now, request.source)


def run_virtual(
    config: ClusterConfig,
    profile: Profile,
    scenario: SeedScenario,
    on_progress: ProgressCallback | None = None,
) -> RunResult:
    workload = SeedWorkload(scenario)
    cluster = VirtualCluster(
        config.pools,
        profile,
        config.picking,
        workload,
        duration_s=scenario.duration_s,
        tie_break=f"{scenario.seed}/picker",
        scrape_interval_s=SCRAPE_INTERVAL_S,
        on_progress=on_progress,
        lend_after_s=config.lend_after_s,
    )
    cluster.run()
    tally = workload.tally
    return RunResult(
        config=config,
        ttft_s=tuple(tally.ttft),
        ttft_at_s=tuple(tally.ttft_at),
        tbt_s=tuple(tally.tbt),
        tbt_at_s=tuple(tally.tbt_at),
        interactive_completed=tally.interactive_completed,
        interactive_rejected=tally.interactive_rejected,
        batch_finished_at_s=tuple(tally.batch_finished_at),
        batch_tokens=tally.batch_tokens,
        batch_submitted=scenario.long_requests,
        gpu_busy_s=sum(replica.busy_s for replica in cluster.replicas),
        end_s=cluster.last_work_s,
        interactive_within_slo=tally.interactive_within_slo,
    )
