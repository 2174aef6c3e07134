"""`laneway bench seed`: the seed experiment, in virtual time or live."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
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
from laneway.bench.harness.fronts import ENVOY_LANEWAY, FRONTS, GATEWAY
from laneway.bench.harness.progress import VirtualProgress
from laneway.errors import UsageError
from laneway.ledger import LedgerSettings
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import CONFIG_NAMES, SeedScenario

if TYPE_CHECKING:
    from laneway.bench.seed.sweep import Cell

QUICK = SeedScenario(
    gpus=4, sessions=16, long_requests=2, long_tokens=16384, duration_s=8.0, burst_at_s=2.0
)
QUICK_TIME_SCALE = 2.0
# Half real-time speed: at full speed eight engines, the gateway and the load generator on
# a small machine fall behind, and the tokens they time arrive bunched.
LIVE_TIME_SCALE = 0.5


def register_bench_seed(bench: argparse._SubParsersAction[Any]) -> None:
    full = SeedScenario()
    seed = bench.add_parser(
        "seed",
        help="the seed experiment: interactive sessions plus a long-prompt burst, 5 configurations",
        description="Run the seed experiment (200 interactive sessions and a burst of 20 "
        "64k-token requests on 8 GPUs) under five configurations: unified-full, "
        "unified-chunked, split, laneway and lending (laneway's division on one engine "
        "configuration for both lanes, idle chat replicas lent to batch). --mode virtual "
        "simulates it in virtual time; --mode live runs it over HTTP through laneway gateway "
        "and laneway sim processes and puts it beside the virtual run. Prints tables; --json "
        "and --plot save results.",
    )
    seed.add_argument(
        "--quick",
        action="store_true",
        help=f"a short variant: {QUICK.gpus} GPUs, {QUICK.sessions} sessions, "
        f"{QUICK.long_requests} x {QUICK.long_tokens} tokens, {QUICK.duration_s:g} s, "
        f"time scale {QUICK_TIME_SCALE:g}",
    )
    add_value_flag(seed, "--gpus", full.gpus, "GPUs, one replica each", preset=True)
    add_value_flag(
        seed, "--sessions", full.sessions, "closed-loop interactive sessions", preset=True
    )
    add_value_flag(
        seed, "--long-requests", full.long_requests, "long requests in the burst", preset=True
    )
    add_value_flag(
        seed, "--long-tokens", full.long_tokens, "prompt tokens of each long request", preset=True
    )
    add_value_flag(seed, "--duration", full.duration_s, "seconds sessions start turns", preset=True)
    seed.add_argument(
        "--configs",
        default=",".join(CONFIG_NAMES),
        help="comma-separated subset of configurations to run",
    )
    add_value_flag(
        seed,
        "--lend-after",
        LedgerSettings.lend_after_s,
        "seconds of chat demand below the lending pool's replicas before one more is lent "
        "(the gateway's spec.lending.lendAfterMillis)",
    )
    seed.add_argument(
        "--picking",
        choices=("seed", "gateway"),
        default="seed",
        help="endpoint picking: seed (default: the seed's prompt-token profile) or gateway "
        "(the gateway's default weights, prefixAffinity included)",
    )
    seed.add_argument(
        "--sweep",
        action="store_true",
        help="virtual mode: run the configurations over a grid, one knob at a time (long "
        "burst 5/20/40, sessions 100/200/300, long prompts 32k/64k/128k) and print each "
        "cell's SLOs and makespan ratios to unified-full and split",
    )
    seed.add_argument(
        "--fronts",
        default=GATEWAY,
        help="live mode: comma-separated, what the clients send to, each configuration run "
        f"through each in turn on engines of its own: {GATEWAY} (the standalone gateway, "
        f"default) and {ENVOY_LANEWAY} (a real Envoy with `laneway epp` as its endpoint "
        "picker); with both, a table of their lanes and SLO verdicts side by side",
    )
    live = LiveFlags(
        "live mode: engines and generator run this many times faster than real time "
        f"(default {LIVE_TIME_SCALE:g}, or {QUICK_TIME_SCALE:g} with --quick)"
    )
    add_scenario_flags(
        seed,
        seed=full.seed,
        seed_preset=True,
        live=live,
        plot_help="write a PNG of TBT/TTFT over time",
    )
    seed.set_defaults(handler=run_seed)


def scenario_from(args: argparse.Namespace) -> SeedScenario:
    return overridden(
        QUICK if args.quick else SeedScenario(),
        {
            "seed": args.seed,
            "gpus": args.gpus,
            "sessions": args.sessions,
            "long_requests": args.long_requests,
            "long_tokens": args.long_tokens,
            "duration_s": args.duration,
        },
    )


def run_seed(args: argparse.Namespace) -> int:
    from laneway.bench.seed.report import against_unified_full, seed_table, summarize
    from laneway.simulator.seed import scenario_problems, seed_configs
    from laneway.simulator.seed_experiment import RunResult, run_virtual

    scenario = scenario_from(args)
    problems = scenario_problems(scenario)
    if args.sweep and args.mode != "virtual":
        problems.append("--sweep runs in --mode virtual only")
    if args.sweep and args.plot is not None:
        problems.append("--sweep draws no plot: drop --plot")
    if not args.lend_after >= 0:
        problems.append("--lend-after must not be negative")
    if args.sweep and args.picking != "seed":
        problems.append("--sweep runs the seed's picking only: drop --picking")
    fronts = parse_names(args.fronts)
    bad_fronts = sorted(set(fronts) - set(FRONTS))
    if bad_fronts or not fronts:
        problems.append(
            f"--fronts: unknown {', '.join(bad_fronts) or '(none given)'}; "
            f"choose from {', '.join(FRONTS)}"
        )
    elif args.mode != "live" and fronts != [GATEWAY]:
        problems.append("--fronts applies to --mode live only")
    args.fronts = list(dict.fromkeys(fronts))
    wanted = parse_names(args.configs)
    unknown = sorted(set(wanted) - set(CONFIG_NAMES))
    if unknown or not wanted:
        problems.append(
            f"--configs: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(CONFIG_NAMES)}"
        )
    options = scenario_options(args, problems, QUICK_TIME_SCALE if args.quick else LIVE_TIME_SCALE)
    time_scale = options.time_scale

    profile = options.profile
    if args.sweep:
        return _run_sweep(scenario, profile, wanted, args.json, args.lend_after)
    configs = [
        dataclasses.replace(c, lend_after_s=args.lend_after)
        for c in seed_configs(scenario, profile)
        if c.name in wanted
    ]
    if args.picking == "gateway":
        from laneway.routing.picker import PickingSettings

        configs = [dataclasses.replace(c, picking=PickingSettings()) for c in configs]
    started = time.perf_counter()
    results: list[RunResult] = []
    for config in configs:
        progress = VirtualProgress("seed", config.name, scenario.duration_s)
        config_started = time.perf_counter()
        results.append(run_virtual(config, profile, scenario, progress))
        progress.done(time.perf_counter() - config_started)
    wall_s = time.perf_counter() - started
    summaries = against_unified_full([summarize(result, scenario) for result in results])
    heading = (
        f"{scenario.gpus} x {profile.gpu.name} ({profile.name}), {scenario.sessions} sessions, "
        f"{scenario.long_requests} x {scenario.long_tokens}-token requests at "
        f"t={scenario.burst_at_s:g} s, {scenario.duration_s:g} s, seed {scenario.seed}"
    )
    if args.mode == "live":
        from laneway.bench.seed.live_report import run_live_mode

        return run_live_mode(args, scenario, profile, configs, results, time_scale, heading)

    print(f"seed experiment, virtual time: {heading}; {wall_s:.1f} s wall")
    print()
    print(seed_table(summaries))
    if args.json is not None:
        from laneway.bench.seed.report import seed_json

        write_results(args.json, seed_json(scenario, profile.name, summaries, wall_s))
    if args.plot is not None:
        from laneway.bench.seed.plot import plot_seed

        title = f"seed experiment (virtual), {scenario.gpus} x {profile.name}, seed {scenario.seed}"
        plot_seed([("virtual", results)], scenario, args.plot, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _run_sweep(
    base: SeedScenario,
    profile: Profile,
    wanted: Sequence[str],
    json_path: Path | None,
    lend_after_s: float,
) -> int:
    from laneway.bench.seed.report import ConfigSummary, against_unified_full, summarize
    from laneway.bench.seed.sweep import sweep_cells, sweep_json, sweep_table
    from laneway.simulator.seed import scenario_problems, seed_configs
    from laneway.simulator.seed_experiment import run_virtual

    started = time.perf_counter()
    done: list[tuple[Cell, list[ConfigSummary]]] = []
    for cell in sweep_cells(base):
        problems = scenario_problems(cell.scenario)
        if problems:
            raise UsageError(f"sweep cell {cell.label}: " + "; ".join(problems))
        summaries = []
        for config in seed_configs(cell.scenario, profile):
            if config.name not in wanted:
                continue
            print(f"seed sweep: {cell.label:<20} {config.name}", file=sys.stderr, flush=True)
            config = dataclasses.replace(config, lend_after_s=lend_after_s)
            summaries.append(summarize(run_virtual(config, profile, cell.scenario), cell.scenario))
        done.append((cell, against_unified_full(summaries)))
    wall_s = time.perf_counter() - started
    print(
        f"seed experiment sweep, virtual time: {base.gpus} x {profile.gpu.name} "
        f"({profile.name}), base {base.sessions} sessions, {base.long_requests} x "
        f"{base.long_tokens}-token requests, seed {base.seed}; {wall_s:.1f} s wall"
    )
    print()
    print(sweep_table(done))
    if json_path is not None:
        document = {
            "scenario": "seed-sweep",
            "mode": "virtual",
            "seed": base.seed,
            "profile": profile.name,
            "wall_s": round(wall_s, 2),
            "cells": sweep_json(done),
        }
        write_results(json_path, document)
    return 0
