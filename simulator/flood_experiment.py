"""The flood experiment in virtual time: `laneway bench chaos --flood`'s workload on the
virtual runner, so the goal is judged on the cost model with no machine noise.

Two tenants share the demo's chat pool (two replicas, whole-prompt prefill). `steady` runs
closed-loop chat sessions with think time and no caps; `flood` has `maxConcurrentRequests`
`flood_share` and `maxQueuedRequests` `flood_queue` (and `maxConcurrentPromptTokens`
`flood_max_prompt_tokens` where set), and `flood_factor x flood_share`
senders with no think time, each refused request (the gateway's 429) sent again after the
gateway's Retry-After. A `flood_factor` of 0 is the steady tenant's unloaded run; 1 is the
flood tenant at its share.

The steady sessions draw their prompts and think times from generators of their own, so
every run of one seed sends the steady tenant the same turns, and two runs compare
pairwise. The ledger is the gateway's (caps, turns in the line), driven in virtual time;
the engines are the simulator's cost model. One ledger stands for the live bench's two
gateway replicas (which share the caps through Redis).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from laneway.routing.fairshare import NO_CAPS, TenantCaps
from laneway.routing.picker import PickingSettings
from laneway.simulator.profiles import Profile
from laneway.simulator.replicas import Request
from laneway.simulator.runner import VirtualCluster, Workload
from laneway.simulator.seed import SCRAPE_INTERVAL_S, SimPool

STEADY, FLOOD = "steady", "flood"


@dataclass(frozen=True)
class FloodScenario:
    duration_s: float = 300.0  # virtual seconds of load; the run then drains
    warmup_s: float = 5.0  # the steady requests sent before this are not counted
    sessions: int = 4  # the steady tenant's closed-loop chat sessions
    flood_share: int = 4  # the flood tenant's maxConcurrentRequests
    flood_factor: float = 10.0  # its senders, in shares; 0: it sends nothing
    flood_queue: int = 8  # its maxQueuedRequests
    retry_after_s: float = 1.0  # the gateway's Retry-After on a 429
    min_prompt_tokens: int = 200
    max_prompt_tokens: int = 800
    # The flood tenant's prompts; None: drawn as the steady tenant's are. Its caps count
    # requests, not tokens, so longer prompts at the same share weigh more on the engines.
    flood_prompt_tokens: tuple[int, int] | None = None
    # Its maxConcurrentPromptTokens: the cap that weighs its running prompts; None: none.
    flood_max_prompt_tokens: int | None = None
    min_output_tokens: int = 32
    max_output_tokens: int = 128
    min_think_s: float = 0.3
    max_think_s: float = 0.8
    seed: int = 0

    @property
    def flood_senders(self) -> int:
        return round(self.flood_factor * self.flood_share)

    def turn(self, rng: random.Random, *, steady: bool) -> tuple[int, int]:
        """A sender's next request: its prompt tokens and output tokens, drawn from `rng`."""
        low, high = self.min_prompt_tokens, self.max_prompt_tokens
        if not steady and self.flood_prompt_tokens is not None:
            low, high = self.flood_prompt_tokens
        return rng.randint(low, high), rng.randint(self.min_output_tokens, self.max_output_tokens)

    def think_s(self, rng: random.Random) -> float:
        """A steady session's pause before its next turn."""
        return rng.uniform(self.min_think_s, self.max_think_s)

    @property
    def caps(self) -> TenantCaps:
        return TenantCaps(
            max_running=self.flood_share,
            max_waiting=self.flood_queue,
            max_running_tokens=self.flood_max_prompt_tokens,
        )


@dataclass(frozen=True)
class FloodResult:
    scenario: FloodScenario
    steady_ttft_s: tuple[float, ...]  # each counted steady request's, in arrival order
    steady_refused: int
    flood_ok: int  # its requests that got a first token
    flood_prompt_tokens: int  # their prompt tokens: what it got prefilled
    flood_refused: int  # its 429s (caps, or the pool's line)
    flood_peak_running: int  # the most of its requests on the engines at once


@dataclass
class _Tally:
    steady_ttft: dict[str, float] = field(default_factory=dict)  # request id -> TTFT
    steady_order: list[str] = field(default_factory=list)  # counted steady ids, by arrival
    steady_refused: int = 0
    flood_ok: int = 0
    flood_prompt_tokens: int = 0
    flood_refused: int = 0
    flood_peak_running: int = 0


class FloodWorkload(Workload):
    """Sources 0 .. sessions-1 are the steady sessions, the rest the flood's senders."""

    def __init__(self, scenario: FloodScenario) -> None:
        self.scenario = scenario
        seed = scenario.seed
        self._steady = [random.Random(f"{seed}/steady/{i}") for i in range(scenario.sessions)]
        self._flood = [random.Random(f"{seed}/flood/{i}") for i in range(scenario.flood_senders)]
        self.tally = _Tally()

    def _is_steady(self, source: int) -> bool:
        return source < self.scenario.sessions

    def _rng(self, source: int) -> random.Random:
        if self._is_steady(source):
            return self._steady[source]
        return self._flood[source - self.scenario.sessions]

    def start(self, cluster: VirtualCluster) -> None:
        for source in range(self.scenario.sessions + self.scenario.flood_senders):
            # Spread over the first think time, so the sessions do not start in lockstep.
            cluster.schedule(self._rng(source).uniform(0, self.scenario.max_think_s), source)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        scenario, rng = self.scenario, self._rng(subject)
        steady = self._is_steady(subject)
        prompt, output = scenario.turn(rng, steady=steady)
        tenant, caps = (STEADY, NO_CAPS) if steady else (FLOOD, scenario.caps)
        request = cluster.submit(now, subject, prompt, output, tenant=tenant, caps=caps)
        if request is None:
            if steady:
                self.tally.steady_refused += 1
            else:
                self.tally.flood_refused += 1
            cluster.schedule(now + scenario.retry_after_s, subject)
        elif steady and now >= scenario.warmup_s:
            self.tally.steady_order.append(request.request_id)
        self._count_flood(cluster)

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        tally = self.tally
        if self._is_steady(request.source):
            tally.steady_ttft[request.request_id] = now - request.arrival_s
        else:
            tally.flood_ok += 1
            tally.flood_prompt_tokens += request.prompt_tokens
        self._count_flood(cluster)

    def _count_flood(self, cluster: VirtualCluster) -> None:
        """The flood tenant's running requests, as its cap counts them (they only rise at an
        admission or a grant, and a granted one is running still at its first token)."""
        running = cluster.ledger.tenant_count(cluster.ledger.pools()[0], FLOOD).running
        self.tally.flood_peak_running = max(self.tally.flood_peak_running, running)

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        if now >= self.scenario.duration_s:
            # The load is over: no next turn (one scheduled before, a think time or a
            # Retry-After, still goes), and the run drains.
            return
        source = request.source
        if self._is_steady(source):
            cluster.schedule(now + self.scenario.think_s(self._rng(source)), source)
        else:
            cluster.schedule(now, source)  # no think time: the flood sends again at once


def run_flood_virtual(
    scenario: FloodScenario,
    pool: SimPool,
    profile: Profile,
    picking: PickingSettings,
) -> FloodResult:
    workload = FloodWorkload(scenario)
    cluster = VirtualCluster(
        [pool],
        profile,
        picking,
        workload,
        duration_s=scenario.duration_s,
        tie_break=f"{scenario.seed}/picker",
        scrape_interval_s=SCRAPE_INTERVAL_S,
    )
    cluster.run()
    tally = workload.tally
    return FloodResult(
        scenario=scenario,
        steady_ttft_s=tuple(
            tally.steady_ttft[r] for r in tally.steady_order if r in tally.steady_ttft
        ),
        steady_refused=tally.steady_refused,
        flood_ok=tally.flood_ok,
        flood_prompt_tokens=tally.flood_prompt_tokens,
        flood_refused=tally.flood_refused,
        flood_peak_running=tally.flood_peak_running,
    )
