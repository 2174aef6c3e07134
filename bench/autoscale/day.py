"""`laneway bench autoscale`: a compressed day of traffic on static peak-sized pools and on
laneway's elastic pools (the operator's decision, `laneway.autoscale`), same GPU budget. The
day and its configurations are here (pure but for the virtual run); the command is in `cli`,
the plot in `plot`, the sweep in `sweep`.

The day: chat arrives as a Poisson process whose rate follows a diurnal curve (trough at
midnight, peak at midday, peak/trough set by --peak-to-trough), optionally with a sudden
spike (the rate multiplied for a few minutes), and batch jobs arrive in bursts during
working hours (each a set of 64k-token documents at once). Static pools are sized for the
peak with the seed's capacity rule; the elastic pools may use at most as many.

The elastic interactive pool scales on requests in flight. Its target per replica is what
a load test would give an operator: the requests one replica holds in flight at the rate
the static pool gives each replica at the peak (measured on one simulated replica, by
Little's law), less --headroom, the share kept free for the demand that arrives while a
new replica is still starting (one cold start plus one decision interval).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from laneway.api import Lane
from laneway.autoscale import ScalePolicy, ScaleSignal
from laneway.simulator.elastic import (
    COLD_START_S,
    DECISION_INTERVAL_S,
    Arrival,
    ElasticPool,
    ElasticResult,
    diurnal_rate,
    poisson_arrivals,
    run_elastic,
)
from laneway.simulator.profiles import PROFILES, Profile
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import (
    CHUNKED_LONG,
    INTERACTIVE_DECODE_BATCH,
    REALTIME_MAX_PROMPT,
    TBT_SLO_S,
    TTFT_SLO_S,
    SeedScenario,
    interactive_replicas,
    slo_interactive_engine,
    tbt_token_budget,
)
from laneway.stats import percentile

PROMPT_TOKENS = (200, 1500)
OUTPUT_TOKENS = (50, 250)
DOCUMENT_TOKENS = 65536
DOCUMENT_OUTPUT_TOKENS = 512
# Working hours, as fractions of the day, when batch jobs may arrive.
JOB_WINDOW = (0.3, 0.75)


@dataclass(frozen=True)
class DayScenario:
    day_s: float = 1800.0  # the compressed day
    peak_rps: float = 100.0  # chat requests per second at midday: five replicas' worth
    peak_to_trough: float = 4.0
    jobs: int = 3  # batch jobs over the day
    documents_per_job: int = 8
    batch_replicas: int = 4  # the static batch pool (a job's documents in parallel)
    cold_start_s: float = COLD_START_S
    # A sudden spike: the chat rate times spike_factor for spike_s from spike_at (a
    # fraction of the day); 1: none.
    spike_factor: float = 1.0
    spike_at: float = 0.25  # hour 6: halfway up the morning ramp
    spike_s: float = 300.0
    headroom: float = 0.2  # of the interactive target per replica, kept free for growth
    seed: int = 0

    def chat_rate(self, at_s: float) -> float:
        trough = self.peak_rps / self.peak_to_trough
        rate = diurnal_rate(at_s, self.day_s, self.peak_rps, trough)
        spike_from = self.spike_at * self.day_s
        if spike_from <= at_s < spike_from + self.spike_s:
            return rate * self.spike_factor
        return rate


def scenario_problems(day: DayScenario) -> list[str]:
    problems = []
    if day.day_s < 600:
        problems.append("--day-minutes must be at least 10")
    if day.peak_rps <= 0:
        problems.append("--peak-rps must be above 0")
    if day.peak_to_trough < 1:
        problems.append("--peak-to-trough must be at least 1")
    if day.jobs < 0 or day.documents_per_job < 1 or day.batch_replicas < 1:
        problems.append("--jobs must be >= 0, --documents-per-job and --batch-replicas >= 1")
    if day.cold_start_s < 0:
        problems.append("--cold-start must not be negative")
    if day.spike_factor < 1 or day.spike_s < 0 or not 0 <= day.spike_at < 1:
        problems.append(
            "--spike-factor must be at least 1, --spike-minutes not negative and --spike-at "
            "a fraction of the day in [0, 1)"
        )
    if not 0 <= day.headroom < 1:
        problems.append("--headroom must be in [0, 1)")
    return problems


def arrivals(day: DayScenario) -> list[Arrival]:
    rng = random.Random(f"{day.seed}/day")
    highest = day.peak_rps * day.spike_factor
    chat = poisson_arrivals(rng, day.chat_rate, highest, day.day_s)
    found = chat_arrivals(rng, chat)
    for _ in range(day.jobs):
        at = rng.uniform(*JOB_WINDOW) * day.day_s
        found += [
            # Batches API items: the dispatcher pins them to the batch lane.
            Arrival(
                at_s=at,
                prompt_tokens=DOCUMENT_TOKENS,
                output_tokens=DOCUMENT_OUTPUT_TOKENS,
                pinned=Lane.BATCH,
            )
            for _ in range(day.documents_per_job)
        ]
    return sorted(found, key=lambda a: a.at_s)


def chat_arrivals(rng: random.Random, times: list[float]) -> list[Arrival]:
    return [
        Arrival(
            at_s=at,
            prompt_tokens=rng.randint(*PROMPT_TOKENS),
            output_tokens=rng.randint(*OUTPUT_TOKENS),
        )
        for at in times
    ]


@dataclass(frozen=True)
class Plan:
    interactive_engine: SchedulerConfig
    batch_engine: SchedulerConfig
    interactive_replicas: int  # peak-sized
    replica_rps: float  # the chat rate each static replica serves at the peak
    in_flight_at_plan: float  # requests one replica holds in flight at that rate (measured)
    interactive_target: int  # in-flight requests per replica, less the headroom
    night_replicas: int  # what the elastic pool runs at midnight, as the night left it


# Long enough for thousands of requests at a replica's planned rate, short next to a day.
CALIBRATION_S = 120.0


def in_flight_per_replica(profile: Profile, engine: SchedulerConfig, rps: float) -> float:
    """Requests one replica holds in flight while serving `rps` of chat, by Little's law
    over a short virtual run: the load test an operator sizes a target from."""
    rng = random.Random("autoscale/calibration")
    trace = chat_arrivals(rng, poisson_arrivals(rng, lambda _: rps, rps, CALIBRATION_S))
    pool = ElasticPool(
        name="interactive",
        interactive=True,
        engine=engine,
        replicas=1,
        policy=None,
        max_prompt_tokens=REALTIME_MAX_PROMPT,
    )
    result = run_elastic([pool], profile, trace, CALIBRATION_S)
    return sum(o.finished_s - o.arrival_s for o in result.outcomes) / CALIBRATION_S


def plan(day: DayScenario, profile: Profile) -> Plan:
    """Size the interactive pool for the peak with the seed's rule (a session per mean think
    time is one request per second each), and the elastic target from one replica's load
    at the peak's rate per replica."""
    budget = tbt_token_budget(profile, INTERACTIVE_DECODE_BATCH, REALTIME_MAX_PROMPT)
    think = (1.0, 5.0)
    sessions = math.ceil(day.peak_rps * sum(think) / 2)
    peak = SeedScenario(gpus=1_000, sessions=sessions, think_time_s=think)
    replicas = interactive_replicas(peak, profile, budget)
    interactive = slo_interactive_engine(budget)
    batch = CHUNKED_LONG
    replica_rps = day.peak_rps / replicas
    in_flight = in_flight_per_replica(profile, interactive, replica_rps)
    target = max(1, math.floor(in_flight * (1 - day.headroom)))
    trough_in_flight = day.peak_rps / day.peak_to_trough / replica_rps * in_flight
    night = min(replicas, max(1, math.ceil(trough_in_flight / target)))
    return Plan(
        interactive_engine=interactive,
        batch_engine=batch,
        interactive_replicas=replicas,
        replica_rps=replica_rps,
        in_flight_at_plan=in_flight,
        interactive_target=target,
        night_replicas=night,
    )


def configs(day: DayScenario, sized: Plan) -> dict[str, tuple[ElasticPool, ...]]:
    chat_policy = ScalePolicy(
        min_replicas=1,
        max_replicas=sized.interactive_replicas,
        signal=ScaleSignal.IN_FLIGHT_REQUESTS,
        target_per_replica=sized.interactive_target,
        scale_up_window_s=0,
        scale_down_window_s=300,
        min_slo_attainment=0.99,
    )
    batch_policy = ScalePolicy(
        min_replicas=0,
        max_replicas=day.batch_replicas,
        signal=ScaleSignal.PROMPT_TOKENS,
        target_per_replica=2 * DOCUMENT_TOKENS,
        scale_up_window_s=0,
        # Rent or buy: an idle replica kept longer than it takes to start one again costs
        # more GPU time than restarting it would (a cold start and a decision interval).
        scale_down_window_s=day.cold_start_s + DECISION_INTERVAL_S,
    )
    chat, batch = sized.interactive_engine, sized.batch_engine
    chat_range = REALTIME_MAX_PROMPT  # the seed's realtime lane: longer prompts go to batch
    return {
        "static": (
            ElasticPool(
                name="interactive",
                interactive=True,
                engine=chat,
                replicas=sized.interactive_replicas,
                policy=None,
                max_prompt_tokens=chat_range,
            ),
            ElasticPool(
                name="batch",
                interactive=False,
                engine=batch,
                replicas=day.batch_replicas,
                policy=None,
            ),
        ),
        "elastic": (
            ElasticPool(
                name="interactive",
                interactive=True,
                engine=chat,
                replicas=sized.night_replicas,
                policy=chat_policy,
                max_prompt_tokens=chat_range,
            ),
            ElasticPool(
                name="batch", interactive=False, engine=batch, replicas=0, policy=batch_policy
            ),
        ),
    }


def summary(result: ElasticResult, day: DayScenario) -> dict[str, Any]:
    chat = [o for o in result.outcomes if o.pool == 0]
    batch = [o for o in result.outcomes if o.pool == 1]
    met = sum(o.ttft_s <= TTFT_SLO_S and o.max_gap_s <= TBT_SLO_S for o in chat)
    completion = [o.finished_s - o.arrival_s for o in batch]
    return {
        "gpu_hours": round(result.gpu_seconds / 3600, 3),
        "unrouted": result.unrouted,  # requests no pool took: 0 unless the pools are wrong
        "interactive": {
            "requests": len(chat),
            "slo_attainment": round(met / len(chat), 5) if chat else 1.0,
            "ttft_ms": {"p50": _ms(chat, 50), "p99": _ms(chat, 99)},
        },
        "batch": {
            "submitted": day.jobs * day.documents_per_job,
            "completed": len(batch),
            "p99_completion_s": round(percentile(completion, 99), 1) if completion else 0.0,
        },
        "unfinished": result.unfinished,
    }


def _ms(outcomes: list[Any], q: float) -> float:
    return round(percentile([o.ttft_s for o in outcomes], q) * 1000, 1) if outcomes else 0.0


def run_day(day: DayScenario, profile: Profile, sized: Plan, name: str) -> ElasticResult:
    """One configuration ("static" or "elastic") over the day."""
    pools = configs(day, sized)[name]
    return run_elastic(pools, profile, arrivals(day), day.day_s, day.cold_start_s)


def simulate(day: DayScenario, profile_name: str, name: str) -> dict[str, Any]:
    """One configuration's summary, the elastic one with its interactive target."""
    profile = PROFILES[profile_name]
    sized = plan(day, profile)
    found = summary(run_day(day, profile, sized, name), day)
    if name == "elastic":
        found["interactive"]["target_per_replica"] = sized.interactive_target
    return found
