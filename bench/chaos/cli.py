"""`laneway bench chaos`: its flags and its command (the bench itself is
laneway.bench.chaos.run)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from laneway.bench.harness.flags import (
    add_json_flag,
    add_value_flag,
    overridden,
    parse_int_list,
    run_and_report,
)


def register_bench_chaos(bench: argparse._SubParsersAction[Any]) -> None:
    chaos = bench.add_parser(
        "chaos",
        help="mixed load through two gateway replicas while an engine, Redis and a replica die",
        description="Start four simulated engines, redis-server (AOF) and two gateway "
        "replicas sharing it; send chat streams, long documents and one Batches API job "
        "through both replicas for --duration seconds while, one window each, the busiest "
        "engine, redis-server and one replica are SIGKILLed and restarted. Report requests "
        "sent/ok/failed per window and why, batch items lost or done twice, what is still "
        "held at the end (slots, shared load, pending items, engine requests) and chat TTFT "
        "per window. Exits 1 when the goal (0 lost, 0 done twice, 0 held, no failure but "
        "those in flight on a killed process) is not met.",
    )
    chaos.add_argument(
        "--quick",
        action="store_true",
        help="a short run for tests: 20 s, 3 chat sessions, 1 document sender, 30 items, "
        "1.5 s outages, 90 s of patience",
    )
    add_value_flag(chaos, "--duration", 60.0, "seconds of load", preset=True)
    add_value_flag(chaos, "--sessions", 8, "closed-loop chat sessions", preset=True)
    add_value_flag(chaos, "--documents", 2, "closed-loop long-document senders", preset=True)
    chaos.add_argument(
        "--batch-items", type=int, help="items of the batch job (default 2.5 per second)"
    )
    add_value_flag(chaos, "--outage", 3.0, "seconds each killed process stays down", preset=True)
    chaos.add_argument(
        "--kill-engine-in",
        metavar="POOL",
        help="kill the busiest engine of this pool (chat or documents; default: of any)",
    )
    add_value_flag(
        chaos,
        "--batch-lease",
        5.0,
        "the replicas' --batch-lease: a killed replica's items are reclaimed after it",
        preset=True,
    )
    add_value_flag(
        chaos,
        "--settle",
        180.0,
        "patience after the load for the batch to finish and held state to be released",
        preset=True,
    )
    add_value_flag(chaos, "--seed", 0, "workload seed", preset=True)
    chaos.add_argument(
        "--flood",
        action="store_true",
        help="instead: one tenant floods at a multiple of its share (its "
        "maxConcurrentRequests) while another's chat TTFT is measured. --mode virtual "
        "(default) sweeps --flood-factors x --flood-queue on the cost model, --rounds seeds, "
        "each beside that seed's unloaded run; --mode live alternates --rounds rounds of "
        "segments (the other tenant alone, the flood at its share, at --flood-factors, and "
        "at that with each --flood-max-prompt-tokens) through two replicas on one Redis "
        "(--duration covers them all). --sessions are the other tenant's. Exits 1 unless "
        "that tenant's TTFT p99 at 10x (live: at --flood-factors) stays within 10%% of its "
        "unloaded run, without a token cap or with one, and none of its requests is refused",
    )
    chaos.add_argument(
        "--mode",
        choices=("virtual", "live"),
        help="with --flood: virtual (default), in virtual time on the simulator's cost "
        "model; live, real processes over HTTP",
    )
    chaos.add_argument(
        "--flood-queue",
        metavar="N[,N...]",
        help="with --flood: the flooding tenant's maxQueuedRequests, comma-separated in "
        "virtual mode (default 8,40; live: one, default 8); past it its requests get 429 "
        "and come back after Retry-After",
    )
    chaos.add_argument(
        "--flood-factors",
        metavar="N[,N...]",
        help="with --flood: the flood's senders in shares, comma-separated in virtual mode "
        "(default 2,5,10,20; live: one, default 10)",
    )
    add_value_flag(
        chaos,
        "--flood-share",
        4,
        "with --flood: the flooding tenant's maxConcurrentRequests",
        preset=True,
    )
    chaos.add_argument(
        "--flood-prompt-tokens",
        metavar="LOW,HIGH",
        help="with --flood: the flooding tenant's prompt lengths, drawn "
        "uniformly (default: the other tenant's, 200,800)",
    )
    chaos.add_argument(
        "--flood-max-prompt-tokens",
        metavar="N[,N...]",
        help="with --flood: the flooding tenant's maxConcurrentPromptTokens, each swept "
        "beside the runs without one (live: a segment each, of a flood tenant of its own; "
        "default: none)",
    )
    chaos.add_argument(
        "--flood-control",
        action="store_true",
        default=None,
        help="with --flood --mode live: one segment more, the flood at --flood-factors "
        "from a tenant whose tokensPerMinute every request exceeds, so the gateway refuses "
        "each before any engine work: what the flood's refused requests cost the other "
        "tenant on the machine's shared CPUs; not counted for the goal",
    )
    chaos.add_argument(
        "--pool-slots",
        type=int,
        metavar="N",
        help="with --flood --mode virtual: the chat pool's maxConcurrentRequests per "
        "endpoint, its engines' seats too (default 256: only the flood's caps bind)",
    )
    chaos.add_argument(
        "--rounds",
        type=int,
        help="with --flood: seeds in virtual mode (default 3), rounds of segments live (default 3)",
    )
    add_json_flag(chaos)
    chaos.set_defaults(handler=run_bench_chaos)


def run_bench_chaos(args: argparse.Namespace) -> int:
    if args.flood:
        return _run_flood(args)
    flood_only = (
        "mode",
        "flood_queue",
        "flood_factors",
        "flood_share",
        "flood_prompt_tokens",
        "flood_max_prompt_tokens",
        "flood_control",
        "pool_slots",
        "rounds",
    )
    given = [name for name in flood_only if getattr(args, name) is not None]
    if given:
        from laneway.errors import UsageError

        flag = "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag} goes with --flood")
    from laneway.bench.chaos.options import QUICK, ChaosOptions, check_options
    from laneway.bench.chaos.report import render
    from laneway.bench.chaos.run import run_bench
    from laneway.bench.chaos.run import stderr_say as say

    options = overridden(
        QUICK if args.quick else ChaosOptions(),
        {
            "duration_s": args.duration,
            "sessions": args.sessions,
            "documents": args.documents,
            "batch_items": args.batch_items,
            "outage_s": args.outage,
            "engine_pool": args.kill_engine_in,
            "batch_lease_s": args.batch_lease,
            "settle_s": args.settle,
            "seed": args.seed,
        },
    )
    check_options(options)
    return run_and_report(
        lambda command: run_bench(options, command, say),
        render,
        args.json,
        succeeded=lambda report: report.goal_met,
    )


def _run_flood(args: argparse.Namespace) -> int:
    from laneway.errors import UsageError

    queues = parse_int_list(args.flood_queue or "", "--flood-queue")
    factors = parse_int_list(args.flood_factors or "", "--flood-factors")
    if any(queue < 1 for queue in queues):
        raise UsageError(f"--flood-queue must be at least 1, got {args.flood_queue}")
    if any(factor < 1 for factor in factors):
        raise UsageError(f"--flood-factors must be at least 1, got {args.flood_factors}")
    positive = (
        ("--flood-share", args.flood_share),
        ("--rounds", args.rounds),
        ("--pool-slots", args.pool_slots),
    )
    for flag, value in positive:
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    prompts = parse_int_list(args.flood_prompt_tokens or "", "--flood-prompt-tokens")
    if prompts and (len(prompts) != 2 or not 1 <= prompts[0] <= prompts[1]):
        raise UsageError(
            f"--flood-prompt-tokens must be LOW,HIGH with 1 <= LOW <= HIGH, got "
            f"{args.flood_prompt_tokens}"
        )
    caps = parse_int_list(args.flood_max_prompt_tokens or "", "--flood-max-prompt-tokens")
    if any(cap < 1 for cap in caps):
        raise UsageError(
            f"--flood-max-prompt-tokens must be at least 1 each, got {args.flood_max_prompt_tokens}"
        )
    if args.mode == "live":
        if args.pool_slots is not None:
            raise UsageError("--pool-slots goes with --mode virtual")
        return _run_flood_live(args, queues, factors, prompts, caps)
    if args.flood_control:
        raise UsageError("--flood-control goes with --mode live")
    from laneway.bench.chaos.flood_virtual import (
        VirtualFloodOptions,
        render,
        run_sweep,
        stderr_say,
    )
    from laneway.simulator.flood_experiment import FloodScenario

    quick = VirtualFloodOptions(
        scenario=FloodScenario(duration_s=30.0), factors=(10.0,), queues=(8,), rounds=1
    )
    base = quick if args.quick else VirtualFloodOptions()
    scenario = overridden(
        base.scenario,
        {
            "duration_s": args.duration,
            "sessions": args.sessions,
            "seed": args.seed,
            "flood_share": args.flood_share,
            "flood_prompt_tokens": (prompts[0], prompts[1]) if prompts else None,
        },
    )
    options = overridden(
        base,
        {
            "scenario": scenario,
            "factors": tuple(float(f) for f in factors) or None,
            "queues": queues or None,
            "rounds": args.rounds,
            "pool_slots": args.pool_slots,
            "max_prompt_tokens": caps or None,
        },
    )
    return run_and_report(
        lambda command: run_sweep(options, command, stderr_say),
        render,
        args.json,
        succeeded=lambda report: report.goal_met,
    )


def _run_flood_live(
    args: argparse.Namespace,
    queues: tuple[int, ...],
    factors: tuple[int, ...],
    prompts: tuple[int, ...],
    caps: tuple[int, ...],
) -> int:
    from laneway.bench.chaos.flood import FloodOptions, render, run_flood, stderr_say
    from laneway.errors import UsageError

    if len(queues) > 1 or len(factors) > 1:
        raise UsageError("--mode live runs one --flood-queue and one --flood-factors")
    base = FloodOptions()
    if args.quick:
        base = FloodOptions(scenario=replace(base.scenario, duration_s=20.0, sessions=3))
    scenario = overridden(
        base.scenario,
        {
            "duration_s": args.duration,
            "sessions": args.sessions,
            "seed": args.seed,
            "flood_queue": queues[0] if queues else None,
            "flood_factor": float(factors[0]) if factors else None,
            "flood_share": args.flood_share,
            "flood_prompt_tokens": (prompts[0], prompts[1]) if prompts else None,
        },
    )
    options = overridden(
        base,
        {
            "scenario": scenario,
            "rounds": args.rounds,
            "max_prompt_tokens": caps or None,
            "control": args.flood_control,
        },
    )
    return run_and_report(
        lambda command: run_flood(options, command, stderr_say),
        render,
        args.json,
        succeeded=lambda report: report.goal_met,
    )
