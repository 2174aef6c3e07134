"""`laneway bench chaos`: its flags and its command (the bench itself is
laneway.bench.chaos.run)."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.bench.harness.flags import add_json_flag, add_value_flag, overridden, run_and_report


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
        help="instead: one tenant floods at 10x its share (its maxConcurrentRequests) while "
        "another's chat TTFT is measured, alternating segments at its share and flooding, "
        "through two replicas on one Redis; --duration covers them all, --sessions are the "
        "other tenant's. Exits 1 unless that tenant's TTFT p99 in the flood segments stays "
        "within 10%% of the baseline ones' and none of its requests is refused",
    )
    chaos.add_argument(
        "--flood-queue",
        type=int,
        metavar="N",
        help="with --flood: the flooding tenant's maxQueuedRequests (default 8); past it "
        "its requests get 429 and come back after Retry-After",
    )
    add_json_flag(chaos)
    chaos.set_defaults(handler=run_bench_chaos)


def run_bench_chaos(args: argparse.Namespace) -> int:
    if args.flood:
        return _run_flood(args)
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
    from laneway.bench.chaos.flood import FloodOptions, render, run_flood, stderr_say
    from laneway.errors import UsageError

    if args.flood_queue is not None and args.flood_queue < 1:
        raise UsageError(f"--flood-queue must be at least 1, got {args.flood_queue}")
    quick = FloodOptions(duration_s=20.0, sessions=3)
    options = overridden(
        quick if args.quick else FloodOptions(),
        {
            "duration_s": args.duration,
            "sessions": args.sessions,
            "seed": args.seed,
            "flood_queue": args.flood_queue,
        },
    )
    return run_and_report(
        lambda command: run_flood(options, command, stderr_say),
        render,
        args.json,
        succeeded=lambda report: report.goal_met,
    )
