"""`laneway bench day`: flags, the run with its progress, the table, --json and --plot."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from laneway.bench.harness.flags import (
    LiveFlags,
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

if TYPE_CHECKING:
    from laneway.simulator.day import DayResult
    from laneway.simulator.profiles import Profile
    from laneway.simulator.seed import ClusterConfig

QUICK = DayScenario(trough_sessions=20, peak_sessions=120, day_s=20.0, documents=40)
# Live, real processes on a small machine: the day in miniature, 4 engines (so lending owns
# 3 and the fixed splits are 2+2 and 3+1), a shorter day and shorter documents. The start
# is quiet long enough for a lend (one per 5 s of lull) and the peak needs a second chat
# replica (48 turns each), so chat takes one back.
QUICK_LIVE = DayScenario(
    gpus=4,
    trough_sessions=10,
    peak_sessions=110,
    day_s=24.0,
    documents=96,
    document_tokens=(8192, 16384),
)
# A quarter of real-time speed: at half speed on a small shared machine the engines, the
# gateway and the clients fall behind enough that turns miss a 30 ms gap in model time.
LIVE_TIME_SCALE = 0.25
# Live, where no --configs is given: the lending configuration and the fixed splits of the
# same engines, its baselines.
LIVE_CONFIG_PREFIXES = ("fixed-", "lending")
# Needs an InferenceObjective and engine priorities that the live clients do not send.
NOT_LIVE = ("unified-priority",)
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
        f"{QUICK.documents} documents, a {QUICK.day_s:g} s day; with --mode live "
        f"{QUICK_LIVE.gpus} GPUs, {QUICK_LIVE.trough_sessions} -> "
        f"{QUICK_LIVE.peak_sessions} sessions, {QUICK_LIVE.documents} documents of "
        f"{QUICK_LIVE.document_tokens[0]}-{QUICK_LIVE.document_tokens[1]} tokens, a "
        f"{QUICK_LIVE.day_s:g} s day",
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
    # `%%`: argparse formats help with %, where a lone one breaks --help.
    add_value_flag(
        day,
        "--ramp",
        full.ramp,
        f"share of the day each ramp (trough to peak, peak to trough) takes, centred at "
        f"{RAMP_CENTRES[0] * 100:g} and {RAMP_CENTRES[1] * 100:g} %% of the day so the chat "
        "over the day stays the same; 0.2 is twice as steep as the default",
        preset=True,
    )
    day.add_argument(
        "--configs",
        help="comma-separated subset of configurations to run (default: all of them; live: "
        "the fixed splits and lending); the fixed splits are named for the GPUs they divide",
    )
    day.add_argument(
        "--stream-documents",
        action="store_true",
        help="live mode: stream the documents, so that the gateway sees each one's first "
        "token (default: sent whole, stream: false, as a Batches API item usually is)",
    )
    live = LiveFlags(
        f"live mode: engines and clients run this many times faster than real time "
        f"(default {LIVE_TIME_SCALE:g})",
        mode_help="virtual (default): discrete-event simulation; live: laneway sim engines "
        "and the real gateway over HTTP, beside the virtual run of the same day",
    )
    add_scenario_flags(
        day,
        seed=full.seed,
        seed_preset=True,
        live=live,
        plot_help="write a PNG of replicas per role",
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
    preset = (QUICK_LIVE if args.mode == "live" else QUICK) if args.quick else DayScenario()
    return overridden(preset, values)


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
    from laneway.simulator.day import day_configs, day_problems
    from laneway.simulator.profiles import PROFILES

    scenario = scenario_from(args)
    problems = day_problems(scenario)
    configs = day_configs(scenario, PROFILES[args.profile])
    names = [config.name for config in configs]
    if args.configs is not None:
        wanted = parse_names(args.configs)
    elif args.mode == "live":
        wanted = [name for name in names if name.startswith(LIVE_CONFIG_PREFIXES)]
    else:
        wanted = names
    unknown = sorted(set(wanted) - set(names))
    if unknown or not wanted:
        problems.append(
            f"--configs: unknown {', '.join(unknown) or '(none given)'}; "
            f"on {scenario.gpus} GPUs choose from {', '.join(names)}"
        )
    if args.stream_documents and args.mode != "live":
        problems.append("--stream-documents applies to --mode live only")
    not_live = sorted(set(wanted) & set(NOT_LIVE)) if args.mode == "live" else []
    if not_live:
        problems.append(
            f"--configs: {', '.join(not_live)} runs in --mode virtual only (the live clients "
            "send no InferenceObjective for the engines' priorities)"
        )
    options = scenario_options(args, problems, LIVE_TIME_SCALE)
    chosen = [config for config in configs if config.name in wanted]
    if options.mode == "live":
        from laneway.bench.day.live_report import run_live_mode

        return run_live_mode(scenario, options, chosen, stream_documents=args.stream_documents)
    results, wall_s = run_virtual_day(scenario, options.profile, chosen)
    profile = options.profile
    print(f"day, virtual time: {heading(scenario, profile)}; {wall_s:.1f} s wall")
    print()
    from laneway.bench.day.report import day_json, day_table

    print(day_table(results))
    if options.json is not None:
        write_results(options.json, day_json(scenario, profile.name, results, wall_s))
    if options.plot is not None:
        from laneway.bench.day.plot import plot_day

        title = f"day (virtual), {scenario.gpus} x {profile.name}: replicas per role"
        plot_day(results, scenario, options.plot, title)
        print(f"wrote {options.plot}", file=sys.stderr)
    return 0


def run_virtual_day(
    scenario: DayScenario, profile: Profile, configs: Sequence[ClusterConfig]
) -> tuple[list[DayResult], float]:
    """Each configuration in virtual time, its progress on stderr; and the wall time."""
    from laneway.simulator.day import run_day

    started = time.perf_counter()
    results = []
    for config in configs:
        progress = VirtualProgress("day", config.name, scenario.day_s)
        config_started = time.perf_counter()
        results.append(run_day(config, profile, scenario, progress))
        progress.done(time.perf_counter() - config_started)
    return results, time.perf_counter() - started


def heading(scenario: DayScenario, profile: Profile) -> str:
    return (
        f"{scenario.gpus} x {profile.gpu.name} ({profile.name}), "
        f"{scenario.trough_sessions} -> {scenario.peak_sessions} -> {scenario.trough_sessions} "
        f"sessions over {scenario.day_s:g} s, {scenario.documents} documents of "
        f"{scenario.document_tokens[0]}-{scenario.document_tokens[1]} tokens queued, "
        f"ramps of {scenario.ramp:g} of the day, seed {scenario.seed}"
    )
