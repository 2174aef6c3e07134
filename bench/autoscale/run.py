"""`laneway bench autoscale`: a compressed day of traffic on static peak-sized pools and on
laneway's elastic pools (the operator's decision, `laneway.autoscale`), same GPU budget.

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

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laneway.api import Lane
from laneway.autoscale import ScalePolicy, ScaleSignal
from laneway.bench.harness.flags import (
    add_scenario_flags,
    add_value_flag,
    parse_names,
    scenario_options,
    write_results,
)
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
    INTERACTIVE_DECODE_BATCH,
    LONG_CONTEXT,
    REALTIME_MAX_CONTEXT,
    REALTIME_MAX_PROMPT,
    TBT_SLO_S,
    TTFT_SLO_S,
    SeedScenario,
    interactive_replicas,
    tbt_token_budget,
)
from laneway.stats import percentile
from laneway.tables import format_table

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
    slo = (TTFT_SLO_S, TBT_SLO_S)
    result = run_elastic([pool], profile, trace, CALIBRATION_S, slo)
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
    interactive = SchedulerConfig(
        kind="chunked",
        token_budget=budget,
        chunk_size=budget,
        max_num_seqs=INTERACTIVE_DECODE_BATCH,
        max_partial_prefills=INTERACTIVE_DECODE_BATCH,
        max_context=REALTIME_MAX_CONTEXT,
    )
    batch = SchedulerConfig(
        kind="chunked",
        token_budget=2048,
        chunk_size=1024,
        max_num_seqs=256,
        max_partial_prefills=64,
        max_context=LONG_CONTEXT,
    )
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


CONFIG_CHOICES = ("static,elastic", "static", "elastic")


def register_bench_autoscale(bench: argparse._SubParsersAction[Any]) -> None:
    default = DayScenario()
    parser = bench.add_parser(
        "autoscale",
        help="a compressed day: static peak-sized pools vs laneway's elastic pools",
        description="Simulate a compressed day in virtual time (diurnal chat, batch jobs in "
        "bursts) on static pools sized for the peak and on elastic pools driven by the "
        "operator's scaling decision, with replica cold starts. Prints GPU-hours, interactive "
        "SLO attainment and batch completion; --json and --plot save results.",
    )
    add_value_flag(parser, "--day-minutes", default.day_s / 60, "length of the compressed day")
    add_value_flag(parser, "--peak-rps", default.peak_rps, "chat requests per second at midday")
    add_value_flag(parser, "--peak-to-trough", default.peak_to_trough, "peak over trough chat rate")
    add_value_flag(parser, "--jobs", default.jobs, "batch jobs in working hours")
    add_value_flag(
        parser, "--documents-per-job", default.documents_per_job, "64k-token documents per job"
    )
    add_value_flag(
        parser,
        "--batch-replicas",
        default.batch_replicas,
        "static batch pool size, the elastic maximum",
    )
    add_value_flag(
        parser,
        "--cold-start",
        default.cold_start_s,
        "seconds from adding a replica to its serving: model load, compile, CUDA graph "
        "capture; vLLM with Llama-3-8B",
    )
    add_scenario_flags(
        parser,
        seed=default.seed,
        plot_help="write replicas and demand over the day to this PNG",
    )
    add_value_flag(
        parser,
        "--spike-factor",
        default.spike_factor,
        "multiply the chat rate by this during a sudden spike; 1: no spike",
    )
    add_value_flag(
        parser,
        "--spike-at",
        default.spike_at,
        "when the spike starts, as a fraction of the day",
    )
    add_value_flag(parser, "--spike-minutes", default.spike_s / 60, "how long the spike lasts")
    add_value_flag(
        parser,
        "--headroom",
        default.headroom,
        "share of one replica's measured in-flight load kept free for growth during a cold "
        "start: the interactive target per replica",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="run cells that each change one knob (chat peak, cold start, ramp, spike, "
        "headroom) of this day instead, and print where elastic wins and loses",
    )
    parser.add_argument(
        "--configs",
        default=CONFIG_CHOICES[0],
        help="which configurations to run: static,elastic (default), or one of them, e.g. "
        "elastic when the static run of the same day is already known",
    )
    parser.add_argument(
        "--sweep-only",
        default="",
        metavar="CELLS",
        help="with --sweep: only these cells, by label, comma-separated "
        "(e.g. base,spike_factor=1.6); a machine short of CPU runs the sweep in parts",
    )
    parser.set_defaults(handler=run_bench_autoscale)  # fmt: skip


def run_bench_autoscale(args: argparse.Namespace) -> int:
    day = DayScenario(
        day_s=args.day_minutes * 60,
        peak_rps=args.peak_rps,
        peak_to_trough=args.peak_to_trough,
        jobs=args.jobs,
        documents_per_job=args.documents_per_job,
        batch_replicas=args.batch_replicas,
        cold_start_s=args.cold_start,
        spike_factor=args.spike_factor,
        spike_at=args.spike_at,
        spike_s=args.spike_minutes * 60,
        headroom=args.headroom,
        seed=args.seed,
    )
    problems = scenario_problems(day)
    if args.configs not in CONFIG_CHOICES:
        problems.append(f"--configs {args.configs}: one of {', '.join(CONFIG_CHOICES)}")
    if args.plot is not None and args.configs != CONFIG_CHOICES[0]:
        problems.append("--plot draws both configurations: drop --configs")
    if args.sweep and args.plot is not None:
        problems.append("--sweep draws no plot: drop --plot")
    options = scenario_options(args, problems)
    if args.sweep:
        return _run_sweep(day, args.profile, parse_names(args.sweep_only), options.json)
    profile = options.profile
    sized = plan(day, profile)
    results: dict[str, ElasticResult] = {}
    started = time.perf_counter()
    for name in args.configs.split(","):
        print(f"{name}: simulating {day.day_s:g} s of traffic", file=sys.stderr)
        results[name] = run_day(day, profile, sized, name)
    wall_s = time.perf_counter() - started
    summaries = {name: summary(result, day) for name, result in results.items()}
    rows = [
        [
            name,
            f"{s['gpu_hours']:.2f}",
            f"{s['interactive']['slo_attainment']:.2%}",
            f"{s['interactive']['ttft_ms']['p99']:.0f}",
            f"{s['batch']['completed']}/{s['batch']['submitted']}",
            f"{s['batch']['p99_completion_s']:.0f}",
        ]
        for name, s in summaries.items()
    ]
    print(
        f"autoscale, virtual time: {profile.name}, day {day.day_s / 60:g} min, chat peak "
        f"{day.peak_rps:g} rps (/{day.peak_to_trough:g} at night), {day.jobs} jobs x "
        f"{day.documents_per_job} documents, interactive peak {sized.interactive_replicas} + "
        f"batch {day.batch_replicas} replicas, cold start {day.cold_start_s:g} s; "
        f"{wall_s:.1f} s wall"
    )
    spike = (
        f"; a x{day.spike_factor:g} spike for {day.spike_s / 60:g} min at hour "
        f"{day.spike_at * 24:g}"
        if day.spike_factor > 1
        else ""
    )
    print(
        f"elastic interactive: {sized.interactive_target} requests in flight per replica "
        f"({sized.in_flight_at_plan:.1f} at {sized.replica_rps:.1f} rps per replica, less "
        f"{day.headroom:.0%} headroom), {sized.night_replicas} at midnight{spike}"
    )
    print()
    header = ["config", "GPU-h", "SLO met", "TTFT p99 ms", "batch done", "batch p99 s"]
    print("\n".join(format_table(header, rows)))
    if len(summaries) == 2:
        saved = 1 - summaries["elastic"]["gpu_hours"] / summaries["static"]["gpu_hours"]
        print(f"\nelastic uses {saved:.1%} fewer GPU-hours than static")
    if args.json is not None:
        document = {
            "scenario": {**vars(day), "profile": profile.name, "wall_s": round(wall_s, 1)},
            "interactive_sizing": {
                "static_replicas": sized.interactive_replicas,
                "replica_rps": round(sized.replica_rps, 2),
                "in_flight_at_plan": round(sized.in_flight_at_plan, 2),
                "target_per_replica": sized.interactive_target,
                "night_replicas": sized.night_replicas,
            },
            "configs": summaries,
            "elastic_decisions": {
                pool.name: list(trace_.reasons)
                for pool, trace_ in zip(
                    configs(day, sized)["elastic"], results["elastic"].traces, strict=True
                )
            }
            if "elastic" in results
            else {},
        }
        write_results(args.json, document)
    if args.plot is not None:
        plot_day(results, day, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def run_day(day: DayScenario, profile: Profile, sized: Plan, name: str) -> ElasticResult:
    """One configuration ("static" or "elastic") over the day."""
    slo = (TTFT_SLO_S, TBT_SLO_S)
    pools = configs(day, sized)[name]
    return run_elastic(pools, profile, arrivals(day), day.day_s, slo, day.cold_start_s)


def simulate(day: DayScenario, profile_name: str, name: str) -> dict[str, Any]:
    """One configuration's summary, the elastic one with its interactive target."""
    profile = PROFILES[profile_name]
    sized = plan(day, profile)
    found = summary(run_day(day, profile, sized, name), day)
    if name == "elastic":
        found["interactive"]["target_per_replica"] = sized.interactive_target
    return found


def _run_sweep(base: DayScenario, profile: str, only: list[str], json_path: Path | None) -> int:
    from laneway.bench.autoscale.sweep import run_sweep, sweep_json, sweep_table

    started = time.perf_counter()
    print(f"autoscale sweep: {profile}, in parallel processes", file=sys.stderr)
    results = run_sweep(base, profile, only)
    wall_s = time.perf_counter() - started
    print(
        f"autoscale sweep, virtual time: {profile}; base: day {base.day_s / 60:g} min, chat "
        f"peak {base.peak_rps:g} rps (/{base.peak_to_trough:g}), cold start "
        f"{base.cold_start_s:g} s, headroom {base.headroom:g}; {wall_s:.1f} s wall"
    )
    print()
    print(sweep_table(results))
    if json_path is not None:
        write_results(json_path, {"profile": profile, "cells": sweep_json(results)})
    return 0


def plot_day(results: dict[str, ElasticResult], day: DayScenario, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for row, lane in enumerate(("interactive", "batch")):
        ax = axes[row]
        elastic = results["elastic"].traces[row]
        static = results["static"].traces[row]
        hours = [t / day.day_s * 24 for t in elastic.at_s]
        ax.step(hours, elastic.replicas, where="post", label="elastic replicas", color="tab:blue")
        ax.step([t / day.day_s * 24 for t in static.at_s], static.replicas, where="post",
                label="static replicas", color="tab:gray", linestyle="--")  # fmt: skip
        ax.set_ylabel(f"{lane} replicas")
        ax.set_ylim(bottom=0)
        demand = ax.twinx()
        demand.plot(hours, elastic.demand, color="tab:orange", alpha=0.6, linewidth=0.8)
        demand.set_ylabel("requests queued + in flight", color="tab:orange")
        ax.legend(loc="upper left")
    axes[1].set_xlabel("hour of the compressed day")
    figure.suptitle("laneway bench autoscale: replicas per lane and demand")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
