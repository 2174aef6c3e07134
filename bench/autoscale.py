"""`laneway bench autoscale`: a compressed day of traffic on static peak-sized pools and on
laneway's elastic pools (the operator's decision, `laneway.autoscale`), same GPU budget.

The day: chat arrives as a Poisson process whose rate follows a diurnal curve (trough at
midnight, peak at midday, peak/trough set by --peak-to-trough), and batch jobs arrive in
bursts during working hours (each a set of 64k-token documents at once). Static pools are
sized for the peak with the seed's capacity rule; the elastic pools may use at most as many.
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
from laneway.errors import UsageError
from laneway.outputs import check_output_folder, write_json
from laneway.simulator.elastic import (
    COLD_START_S,
    Arrival,
    ElasticPool,
    ElasticResult,
    diurnal_rate,
    poisson_arrivals,
    run_elastic,
)
from laneway.simulator.profiles import DEFAULT_PROFILE, PROFILES, Profile
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
    day_s: float = 7200.0  # the compressed day
    peak_rps: float = 12.0  # chat requests per second at midday
    peak_to_trough: float = 4.0
    jobs: int = 4  # batch jobs over the day
    documents_per_job: int = 8
    batch_replicas: int = 4  # the static batch pool (a job's documents in parallel)
    cold_start_s: float = COLD_START_S
    seed: int = 0


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
    return problems


def arrivals(day: DayScenario) -> list[Arrival]:
    rng = random.Random(f"{day.seed}/day")
    trough = day.peak_rps / day.peak_to_trough
    chat = poisson_arrivals(
        rng, lambda t: diurnal_rate(t, day.day_s, day.peak_rps, trough), day.peak_rps, day.day_s
    )
    found = [Arrival(at, rng.randint(*PROMPT_TOKENS), rng.randint(*OUTPUT_TOKENS)) for at in chat]
    for _ in range(day.jobs):
        at = rng.uniform(*JOB_WINDOW) * day.day_s
        found += [
            # Batches API items: the dispatcher pins them to the batch lane.
            Arrival(at, DOCUMENT_TOKENS, DOCUMENT_OUTPUT_TOKENS, Lane.BATCH)
            for _ in range(day.documents_per_job)
        ]
    return sorted(found, key=lambda a: a.at_s)


@dataclass(frozen=True)
class Plan:
    interactive_engine: SchedulerConfig
    batch_engine: SchedulerConfig
    interactive_replicas: int  # peak-sized
    interactive_target: int  # in-flight requests per replica, by Little's law at the plan


def plan(day: DayScenario, profile: Profile) -> Plan:
    """Size the interactive pool for the peak with the seed's rule (a session per mean think
    time is one request per second each), and derive the elastic target from it."""
    budget = tbt_token_budget(profile, INTERACTIVE_DECODE_BATCH, REALTIME_MAX_PROMPT)
    think = (1.0, 5.0)
    sessions = math.ceil(day.peak_rps * sum(think) / 2)
    peak = SeedScenario(gpus=1_000, sessions=sessions, think_time_s=think)
    replicas = interactive_replicas(peak, profile, budget)
    # Little's law at the planned load: a replica's share of the peak rate times a request's
    # time in the engine, priced at the TBT target per output token (an upper bound).
    duration_s = sum(OUTPUT_TOKENS) / 2 * TBT_SLO_S
    target = max(1, math.floor(day.peak_rps / replicas * duration_s))
    interactive = SchedulerConfig(
        "chunked", budget, budget, INTERACTIVE_DECODE_BATCH, INTERACTIVE_DECODE_BATCH,
        REALTIME_MAX_CONTEXT,
    )  # fmt: skip
    batch = SchedulerConfig("chunked", 2048, 1024, 256, 64, LONG_CONTEXT)
    return Plan(interactive, batch, replicas, target)


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
        scale_down_window_s=300,
    )
    chat, batch = sized.interactive_engine, sized.batch_engine
    chat_range = REALTIME_MAX_PROMPT  # the seed's realtime lane: longer prompts go to batch
    return {
        "static": (
            ElasticPool("interactive", True, chat, sized.interactive_replicas, None, chat_range),
            ElasticPool("batch", False, batch, day.batch_replicas, None),
        ),
        "elastic": (
            ElasticPool(
                "interactive", True, chat, sized.interactive_replicas, chat_policy, chat_range
            ),
            ElasticPool("batch", False, batch, 0, batch_policy),
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
    parser.add_argument(
        "--day-minutes",
        type=float,
        default=default.day_s / 60,
        help=f"length of the compressed day (default {default.day_s / 60:g})",
    )
    parser.add_argument(
        "--peak-rps",
        type=float,
        default=default.peak_rps,
        help=f"chat requests per second at midday (default {default.peak_rps:g})",
    )
    parser.add_argument(
        "--peak-to-trough",
        type=float,
        default=default.peak_to_trough,
        help=f"peak over trough chat rate (default {default.peak_to_trough:g})",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=default.jobs,
        help=f"batch jobs in working hours (default {default.jobs})",
    )
    parser.add_argument(
        "--documents-per-job",
        type=int,
        default=default.documents_per_job,
        help=f"64k-token documents per job (default {default.documents_per_job})",
    )
    parser.add_argument(
        "--batch-replicas",
        type=int,
        default=default.batch_replicas,
        help=f"static batch pool size, the elastic maximum (default {default.batch_replicas})",
    )
    parser.add_argument(
        "--cold-start",
        type=float,
        default=default.cold_start_s,
        help="seconds from adding a replica to its serving: model load, "
        f"compile, CUDA graph capture (default {default.cold_start_s:g}, "
        "vLLM with Llama-3-8B)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="hardware/model profile of every simulated GPU",
    )
    parser.add_argument("--seed", type=int, default=default.seed, help="workload random seed")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--plot", help="write replicas and demand over the day to this PNG")
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
        seed=args.seed,
    )
    problems = scenario_problems(day)
    if problems:
        raise UsageError("; ".join(problems))
    check_output_folder(args.json, "--json")
    check_output_folder(args.plot, "--plot")
    profile = PROFILES[args.profile]
    sized = plan(day, profile)
    trace = arrivals(day)
    results: dict[str, ElasticResult] = {}
    started = time.perf_counter()
    for name, pools in configs(day, sized).items():
        print(f"{name}: simulating {len(trace)} requests over {day.day_s:g} s", file=sys.stderr)
        results[name] = run_elastic(
            pools, profile, trace, day.day_s, (TTFT_SLO_S, TBT_SLO_S), day.cold_start_s
        )
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
    saved = 1 - summaries["elastic"]["gpu_hours"] / summaries["static"]["gpu_hours"]
    print(
        f"autoscale, virtual time: {profile.name}, day {day.day_s / 60:g} min, chat peak "
        f"{day.peak_rps:g} rps (/{day.peak_to_trough:g} at night), {day.jobs} jobs x "
        f"{day.documents_per_job} documents, interactive peak {sized.interactive_replicas} + "
        f"batch {day.batch_replicas} replicas, cold start {day.cold_start_s:g} s; "
        f"{wall_s:.1f} s wall"
    )
    print()
    header = ["config", "GPU-h", "SLO met", "TTFT p99 ms", "batch done", "batch p99 s"]
    print("\n".join(format_table(header, rows)))
    print(f"\nelastic uses {saved:.1%} fewer GPU-hours than static")
    if args.json is not None:
        document = {
            "scenario": {**vars(day), "profile": profile.name, "wall_s": round(wall_s, 1)},
            "configs": summaries,
            "elastic_decisions": {
                pool.name: list(trace_.reasons)
                for pool, trace_ in zip(
                    configs(day, sized)["elastic"], results["elastic"].traces, strict=True
                )
            },
        }
        write_json(args.json, document)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot is not None:
        plot_day(results, day, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
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
        demand = ax.twinx()
        demand.plot(hours, elastic.demand, color="tab:orange", alpha=0.6, linewidth=0.8)
        demand.set_ylabel("requests queued + in flight", color="tab:orange")
        ax.legend(loc="upper left")
    axes[1].set_xlabel("hour of the compressed day")
    figure.suptitle("laneway bench autoscale: replicas per lane and demand")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
