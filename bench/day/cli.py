"""`laneway bench day`: flags, the run with its progress, the table, --json and --plot."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from laneway.bench.harness.flags import (
    add_scenario_flags,
    add_value_flag,
    overridden,
    parse_names,
    scenario_options,
    write_results,
)
from laneway.bench.harness.progress import VirtualProgress
from laneway.errors import UsageError
from laneway.simulator.day import RAMP_CENTRES, DayScenario

QUICK = DayScenario(trough_sessions=20, peak_sessions=120, day_s=20.0, documents=40)
CONFIG_NAMES = (
    "unified-chunked",
    "unified-priority",
    "split",
    "laneway",
    "fixed-3+5",
    "fixed-4+4",
    "fixed-5+3",
    "lending",
)


def register_bench_day(bench: argparse._SubParsersAction[Any]) -> None:
    full = DayScenario()
    day = bench.add_parser(
        "day",
        help="a compressed day: chat trough -> peak -> trough and a Batches backlog, "
        "one cluster, eight configurations (lending among them)",
        description="Run a compressed day on one cluster in virtual time: closed-loop chat "
        "sessions ramping from a trough to a peak and back, and a backlog of long documents "
        "queued at the start, under unified-chunked (FCFS), unified-priority (engine priority "
        "scheduling, documents behind chat), the seed's split, today's "
        "laneway, fixed chat+batch splits of one engine configuration that serves both, and "
        "laneway lending (the same engines, idle chat replicas lent to batch and taken back "
        "when chat needs them). Prints one row per configuration; --json and --plot save "
        "the results and the replicas per role over the day.",
    )
    day.add_argument(
        "--quick",
        action="store_true",
        help=f"a short variant: {QUICK.trough_sessions} -> {QUICK.peak_sessions} sessions, "
        f"{QUICK.documents} documents, a {QUICK.day_s:g} s day",
    )
    add_value_flag(day, "--gpus", full.gpus, "GPUs, one replica each", preset=True)
    add_value_flag(day, "--trough", full.trough_sessions, "sessions at the trough", preset=True)
    add_value_flag(day, "--peak", full.peak_sessions, "sessions at the peak", preset=True)
    add_value_flag(day, "--day", full.day_s, "virtual seconds the day lasts", preset=True)
    add_value_flag(day, "--documents", full.documents, "documents queued", preset=True)
    low, high = full.document_tokens
    day.add_argument(
        "--doc-tokens",
        metavar="MIN-MAX",
        help=f"each document's prompt tokens, drawn between MIN and MAX (default {low}-{high}; "
        "MIN-MIN for one length)",
    )
    add_value_flag(
        day,
        "--ramp",
        full.ramp,
        f"share of the day each ramp (trough to peak, peak to trough) takes, centred at "
        f"{RAMP_CENTRES[0]:.0%} and {RAMP_CENTRES[1]:.0%} of the day so the chat over the day "
        "stays the same; 0.2 is twice as steep as the default",
        preset=True,
    )
    day.add_argument(
        "--configs",
        default=",".join(CONFIG_NAMES),
        help="comma-separated subset of configurations to run",
    )
    add_scenario_flags(
        day, seed=full.seed, seed_preset=True, plot_help="write a PNG of replicas per role"
    )
    day.set_defaults(handler=run_day_bench)


def scenario_from(args: argparse.Namespace) -> DayScenario:
    values = {
        "gpus": args.gpus,
        "trough_sessions": args.trough,
        "peak_sessions": args.peak,
        "day_s": args.day,
        "documents": args.documents,
        "document_tokens": None if args.doc_tokens is None else parse_doc_tokens(args.doc_tokens),
        "ramp": args.ramp,
        "seed": args.seed,
    }
    return overridden(QUICK if args.quick else DayScenario(), values)


def parse_doc_tokens(text: str) -> tuple[int, int]:
    """`32768-65536` -> (32768, 65536); a UsageError for anything but two whole numbers
    (their bounds are `day_problems`')."""
    low, dash, high = text.strip().partition("-")
    if dash and low.strip().isdigit() and high.strip().isdigit():
        return int(low), int(high)
    raise UsageError(
        f"--doc-tokens must be MIN-MAX, two whole numbers of prompt tokens such as "
        f"32768-65536, got {text!r}"
    )


def run_day_bench(args: argparse.Namespace) -> int:
    from laneway.bench.day.report import day_json, day_table
    from laneway.simulator.day import day_configs, day_problems, run_day

    scenario = scenario_from(args)
    problems = day_problems(scenario)
    wanted = parse_names(args.configs)
    unknown = sorted(set(wanted) - set(CONFIG_NAMES))
    if unknown or not wanted:
        problems.append(
            f"--configs: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(CONFIG_NAMES)}"
        )
    options = scenario_options(args, problems)
    profile = options.profile
    started = time.perf_counter()
    results = []
    for config in day_configs(scenario, profile):
        if config.name not in wanted:
            continue
        progress = VirtualProgress("day", config.name, scenario.day_s)
        config_started = time.perf_counter()
        results.append(run_day(config, profile, scenario, progress))
        progress.done(time.perf_counter() - config_started)
    wall_s = time.perf_counter() - started
    print(
        f"day, virtual time: {scenario.gpus} x {profile.gpu.name} ({profile.name}), "
        f"{scenario.trough_sessions} -> {scenario.peak_sessions} -> {scenario.trough_sessions} "
        f"sessions over {scenario.day_s:g} s, {scenario.documents} documents of "
        f"{scenario.document_tokens[0]}-{scenario.document_tokens[1]} tokens queued, "
        f"ramps of {scenario.ramp:g} of the day, seed {scenario.seed}; {wall_s:.1f} s wall"
    )
    print()
    print(day_table(results))
    if options.json is not None:
        write_results(options.json, day_json(scenario, profile.name, results, wall_s))
    if options.plot is not None:
        from laneway.bench.day.plot import plot_day

        title = f"day (virtual), {scenario.gpus} x {profile.name}: replicas per role"
        plot_day(results, scenario, options.plot, title)
        print(f"wrote {options.plot}", file=sys.stderr)
    return 0
