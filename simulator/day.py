"""The compressed day (`laneway bench day`) in virtual time: chat sessions ramping from a
trough to a peak and back while a Batches backlog of long documents waits, on one fixed
cluster, under the configurations that share it differently (issue 26).

Chat: closed-loop sessions as in the seed experiment (`seed.py`: prompts, answers and think
times); session `i` takes turns while the day's session count is above `i`, so the active
count follows the curve: a ramp up centred at 20 % of the day and one down centred at 80 %,
each taking `ramp` of the day (0.4 by default: up over the first 40 %, the peak held to
60 %, down to the end), the trough before and after them and the peak between. Centring
the ramps keeps the day's session-seconds whatever their steepness: `ramp` 0.2 is twice as
steep with the same chat over the day. Documents: all queued at the start, each of a length
drawn between the scenario's bounds, with distinct token ids (no two share a prefix), each
naming the batch InferenceObjective (`DOCUMENT_OBJECTIVE_PRIORITY`). The run stops at the
day's end: what finished by then counts, and so do the document tokens prefilled so far.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

from laneway.api import Lane, SchedulingPolicy
from laneway.simulator.profiles import Profile
from laneway.simulator.recompute import covered
from laneway.simulator.replicas import Request
from laneway.simulator.runner import ProgressCallback, VirtualCluster, Workload
from laneway.simulator.seed import (
    CHUNKED_LONG,
    LENDING,
    LONG_CONTEXT,
    SCRAPE_INTERVAL_S,
    TBT_SLO_S,
    TTFT_SLO_S,
    ClusterConfig,
    SeedScenario,
    seed_configs,
    shared_engine_pools,
    unified_pool,
)
from laneway.stats import percentile

DOCUMENTS = -1  # the event subject that queues the backlog; sessions are numbered from 0
SAMPLE = -2  # the event subject that samples the replicas' roles
SAMPLES = 120  # role samples over the day
# The documents' InferenceObjective (higher more important; chat names none, 0), as a
# deployment of the Gateway API Inference Extension marks batch work below chat. The EPP
# turns it into engine level 1 (`gateway/epp/stream.py`: the tenant's 0 less -1), which a
# priority-scheduled vLLM admits after chat's 0; laneway's own gateway gives the same level
# to a batch tenant whose tenants entry has `priority: 1`. The Batches dispatcher's
# `x-laneway-lane: batch` alone would not: an interactive pool does not honour a batch pin,
# so the queue class stays the pool's lane and the level chat's (`laneway.routing.lanes`).
# A pool that does not schedule by priority is sent no `priority`, so elsewhere it is moot.
DOCUMENT_OBJECTIVE_PRIORITY = -1
# The unified pool with vLLM `--scheduling-policy priority`: the documents wait behind every
# waiting chat turn, but a document already running keeps its chunk of every step (vLLM
# schedules running requests before waiting ones and preempts only for KV it cannot
# allocate, never for a waiting request's priority).
UNIFIED_PRIORITY = dataclasses.replace(CHUNKED_LONG, scheduling_policy=SchedulingPolicy.PRIORITY)
RAMP_CENTRES = (0.2, 0.8)  # of the day: where the ramp up and the ramp down are half done
# On 8 GPUs: the fixed splits of the lending engines give chat 3, 4 and 5 replicas, and
# the lender owns 5 (the borrower keeps the other 3); a smaller or larger cluster keeps
# these shares of its GPUs (`chat_splits`), so a live run's scaled-down cluster is the same
# day in miniature.
FIXED_SPLIT_SHARES = (3 / 8, 4 / 8, 5 / 8)
LENDING_CHAT_SHARE = 5 / 8
MIN_GPUS = 4  # the smallest cluster whose every split leaves each lane a replica


def _share_of(gpus: int, share: float) -> int:
    return math.floor(gpus * share + 0.5)  # half up: 2.5 of 4 GPUs is 3


def chat_splits(gpus: int) -> tuple[tuple[int, ...], int]:
    """The fixed splits' chat replicas (distinct, ascending) and the lender's own, on `gpus`."""
    fixed = tuple(sorted({_share_of(gpus, share) for share in FIXED_SPLIT_SHARES}))
    return fixed, _share_of(gpus, LENDING_CHAT_SHARE)


@dataclass(frozen=True)
class DayScenario:
    gpus: int = 8
    trough_sessions: int = 50
    peak_sessions: int = 300
    day_s: float = 180.0
    documents: int = 600
    document_tokens: tuple[int, int] = (32768, 65536)
    document_output_tokens: int = 256
    ramp: float = 0.4  # of the day each ramp takes, centred at `RAMP_CENTRES`
    seed: int = 0
    chat: SeedScenario = field(default_factory=SeedScenario)  # its turns and think times

    def sessions_at(self, t: float) -> int:
        """Active sessions at `t`: trough, a ramp to the peak, the peak, a ramp down, trough."""
        x, (up, down), half = t / self.day_s, RAMP_CENTRES, self.ramp / 2
        rise = (x - (up - half)) / self.ramp if x < 0.5 else ((down + half) - x) / self.ramp
        rise = min(1.0, max(0.0, rise))
        return round(self.trough_sessions + (self.peak_sessions - self.trough_sessions) * rise)


def day_problems(scenario: DayScenario) -> list[str]:
    problems = []
    if scenario.gpus < MIN_GPUS:
        problems.append(
            f"--gpus must be at least {MIN_GPUS} (the fixed splits give chat 3/8 to 5/8 of "
            "the replicas and batch the rest, each at least one)"
        )
    if not 0 <= scenario.trough_sessions <= scenario.peak_sessions:
        problems.append("--trough must be between 0 and --peak")
    if scenario.peak_sessions < 1:
        problems.append("--peak must be at least 1")
    if not scenario.day_s > 0:
        problems.append("--day must be above 0")
    if not 0 <= scenario.documents <= 1024:  # the gateway's line holds 1,024 per pool
        problems.append("--documents must be between 0 and 1024")
    (low, high), most = scenario.document_tokens, LONG_CONTEXT - scenario.document_output_tokens
    if not 2049 <= low <= high <= most:
        problems.append(
            f"--doc-tokens {low}-{high}: MIN-MAX must lie within 2049-{most} (the engines' "
            f"{LONG_CONTEXT}-token context less {scenario.document_output_tokens} output "
            "tokens), MIN at most MAX"
        )
    if not 0 < scenario.ramp <= 2 * RAMP_CENTRES[0]:
        problems.append(
            f"--ramp must be above 0 and at most {2 * RAMP_CENTRES[0]:g} (the share of the "
            f"day each ramp takes, centred at {RAMP_CENTRES[0]:.0%} and {RAMP_CENTRES[1]:.0%})"
        )
    return problems


def day_configs(scenario: DayScenario, profile: Profile) -> tuple[ClusterConfig, ...]:
    gpus = scenario.gpus
    fixed_chat, chat = chat_splits(gpus)
    seed = {
        c.name: c
        for c in seed_configs(SeedScenario(gpus=gpus, sessions=scenario.peak_sessions), profile)
    }

    fixed = tuple(
        ClusterConfig(
            name=f"fixed-{k}+{gpus - k}",
            summary=f"{k} chat + {gpus - k} batch, one engine config (768 budget, 128k context)",
            pools=shared_engine_pools(gpus, k),
        )
        for k in fixed_chat
    )
    return (
        ClusterConfig(
            name="unified-chunked",
            summary=f"{gpus} mixed replicas, chunked (2048 budget, 1024 chunks), FCFS",
            pools=(unified_pool(gpus, CHUNKED_LONG),),
        ),
        ClusterConfig(
            name="unified-priority",
            summary=f"{gpus} mixed replicas, chunked (2048 budget, 1024 chunks), engine "
            "priority scheduling, documents at level 1 behind chat's 0",
            pools=(unified_pool(gpus, UNIFIED_PRIORITY),),
        ),
        seed["split"],
        seed["laneway"],
        *fixed,
        ClusterConfig(
            name="lending",
            summary=f"{chat} chat lending idle replicas to {gpus - chat} batch, the same engines",
            pools=shared_engine_pools(gpus, chat, LENDING),
        ),
    )


@dataclass(frozen=True)
class RoleSample:
    at_s: float
    chat: int  # replicas taking chat turns
    batch: int  # replicas taking documents (the batch pool's own and any lent)
    draining: int  # neither: draining their last chat turns before they are lent


@dataclass(frozen=True)
class DayResult:
    config: ClusterConfig
    turns_started: int  # chat turns the gateway took during the day
    turns_completed: int
    # Turns unfinished at the day's end that had missed the SLO already (no first token
    # within TTFT, or a gap over TBT); the others are judged by neither side.
    turns_missed_unfinished: int
    turns_in_slo: int
    ttft_s: tuple[float, ...]
    tbt_s: tuple[float, ...]
    document_tokens_prefilled: int
    documents_completed: int
    gpu_busy: float  # of the GPUs' time over the day
    reclaim_ms: tuple[float, ...]
    recomputed_tokens: int  # document prompt tokens prefilled twice
    roles: tuple[RoleSample, ...]

    @property
    def in_slo_share(self) -> float | None:
        judged = self.turns_completed + self.turns_missed_unfinished
        return self.turns_in_slo / judged if judged else None

    @property
    def recomputed_share(self) -> float:
        total = self.document_tokens_prefilled + self.recomputed_tokens
        return self.recomputed_tokens / total if total else 0.0

    def p99_ms(self, values: tuple[float, ...]) -> float | None:
        return percentile(values, 99) * 1000 if values else None


@dataclass
class _Tally:
    ttft: list[float] = field(default_factory=list)
    tbt: list[float] = field(default_factory=list)
    turns_started: int = 0
    turns_completed: int = 0
    turns_in_slo: int = 0
    documents_completed: int = 0
    document_tokens: int = 0
    recomputed: int = 0
    roles: list[RoleSample] = field(default_factory=list)


class DayWorkload(Workload):
    def __init__(self, scenario: DayScenario) -> None:
        self.scenario = scenario
        self.sessions = [
            random.Random(f"{scenario.seed}/session/{i}") for i in range(scenario.peak_sessions)
        ]
        self.documents = random.Random(f"{scenario.seed}/documents")
        self.tally = _Tally()

    def start(self, cluster: VirtualCluster) -> None:
        spread = self.scenario.chat.session_start_spread_s
        for index, rng in enumerate(self.sessions):
            cluster.schedule(rng.uniform(0, spread), index)
        cluster.schedule(0.0, DOCUMENTS)
        for sample in range(SAMPLES + 1):
            cluster.schedule(sample * self.scenario.day_s / SAMPLES, SAMPLE)

    def on_event(self, cluster: VirtualCluster, now: float, subject: int) -> None:
        scenario, chat = self.scenario, self.scenario.chat
        if subject == DOCUMENTS:
            next_id = 0
            for _ in range(scenario.documents):
                tokens = self.documents.randint(*scenario.document_tokens)
                ids = range(next_id, next_id + tokens)  # distinct ids: no shared prefix
                next_id += tokens
                cluster.submit(
                    now,
                    DOCUMENTS,
                    tokens,
                    scenario.document_output_tokens,
                    prompt_ids=ids,
                    objective_priority=DOCUMENT_OBJECTIVE_PRIORITY,
                )
            return
        if subject == SAMPLE:
            self.tally.roles.append(_roles(cluster, now))
            return
        if now >= scenario.day_s:
            return
        rng = self.sessions[subject]
        if subject >= scenario.sessions_at(now):  # not active yet, or no longer
            cluster.schedule(now + rng.uniform(*chat.think_time_s), subject)
            return
        prompt, output = rng.randint(*chat.prompt_tokens), rng.randint(*chat.output_tokens)
        if cluster.submit(now, subject, prompt, output) is None:
            self._next_turn(cluster, now, subject)
        else:
            self.tally.turns_started += 1

    def _next_turn(self, cluster: VirtualCluster, now: float, session: int) -> None:
        think = self.sessions[session].uniform(*self.scenario.chat.think_time_s)
        cluster.schedule(now + think, session)

    def on_first_token(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        if request.source != DOCUMENTS:
            self.tally.ttft.append(now - request.arrival_s)

    def on_token_gap(
        self, cluster: VirtualCluster, now: float, request: Request, gap_s: float
    ) -> None:
        if request.source != DOCUMENTS:
            self.tally.tbt.append(gap_s)

    def on_finished(self, cluster: VirtualCluster, now: float, request: Request) -> None:
        tally = self.tally
        if request.source == DOCUMENTS:
            tally.documents_completed += 1
            tally.document_tokens += request.prompt_tokens
            tally.recomputed += request.spans.recomputed_tokens
            return
        assert request.first_token_s is not None
        tally.turns_completed += 1
        tally.turns_in_slo += (
            request.first_token_s - request.arrival_s <= TTFT_SLO_S
            and request.max_gap_s <= TBT_SLO_S
        )
        self._next_turn(cluster, now, request.source)


def _roles(cluster: VirtualCluster, now: float) -> RoleSample:
    pools = cluster.ledger.pools()
    chat = sum(len(p.endpoints) for p in pools if p.spec.lane is Lane.INTERACTIVE)
    batch = sum(len(p.endpoints) for p in pools if p.spec.lane is Lane.BATCH)
    return RoleSample(
        at_s=now, chat=chat, batch=batch, draining=len(cluster.replicas) - chat - batch
    )


def run_day(
    config: ClusterConfig,
    profile: Profile,
    scenario: DayScenario,
    on_progress: ProgressCallback | None = None,
) -> DayResult:
    workload = DayWorkload(scenario)
    cluster = VirtualCluster(
        config.pools,
        profile,
        config.picking,
        workload,
        duration_s=scenario.day_s,
        tie_break=f"{scenario.seed}/picker",
        scrape_interval_s=SCRAPE_INTERVAL_S,
        on_progress=on_progress,
        drain_limit_s=0.0,
        lend_after_s=config.lend_after_s,
    )
    cluster.run()
    tally = workload.tally
    # Documents still running at the day's end: what their engines prefilled so far.
    prefilled, recomputed = tally.document_tokens, tally.recomputed
    missed = 0
    for request in cluster.requests.values():
        if request.source != DOCUMENTS:
            first = scenario.day_s if request.first_token_s is None else request.first_token_s
            missed += first - request.arrival_s > TTFT_SLO_S or request.max_gap_s > TBT_SLO_S
        else:
            spans = request.spans
            done = [*spans.ended, *([spans.current] if spans.current else [])]
            prefilled += covered(done, 0, request.prompt_tokens)
            recomputed += spans.recomputed_tokens
    busy = sum(min(r.busy_s, scenario.day_s) for r in cluster.replicas)
    return DayResult(
        config=config,
        turns_started=tally.turns_started,
        turns_completed=tally.turns_completed,
        turns_missed_unfinished=missed,
        turns_in_slo=tally.turns_in_slo,
        ttft_s=tuple(tally.ttft),
        tbt_s=tuple(tally.tbt),
        document_tokens_prefilled=prefilled,
        documents_completed=tally.documents_completed,
        gpu_busy=busy / (len(cluster.replicas) * scenario.day_s),
        reclaim_ms=tuple(cluster.reclaim_ms),
        recomputed_tokens=recomputed,
        roles=tuple(tally.roles),
    )
