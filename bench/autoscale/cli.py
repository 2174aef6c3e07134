"""`laneway bench autoscale`: its flags and its command, the day's table and JSON."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from laneway.bench.autoscale.day import (
    DayScenario,
    configs,
    plan,
    run_day,
    scenario_problems,
    summary,
)
from laneway.bench.autoscale.plot import plot_day
from laneway.bench.harness.flags import (
    add_scenario_flags,
    add_value_flag,
    parse_names,
    scenario_options,
    write_results,
)
from laneway.simulator.elastic import (
    ElasticResult,
)
from laneway.tables import format_table

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
