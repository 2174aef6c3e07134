"""`laneway bench chaos`: its flags and its command (the bench itself is laneway.bench.chaos)."""

from __future__ import annotations

import argparse
from typing import Any


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
    chaos.add_argument("--duration", type=float, help="seconds of load (default 60)")
    chaos.add_argument("--sessions", type=int, help="closed-loop chat sessions (default 8)")
    chaos.add_argument(
        "--documents", type=int, help="closed-loop long-document senders (default 2)"
    )
    chaos.add_argument(
        "--batch-items", type=int, help="items of the batch job (default 2.5 per second)"
    )
    chaos.add_argument(
        "--outage", type=float, help="seconds each killed process stays down (default 3)"
    )
    chaos.add_argument(
        "--kill-engine-in",
        metavar="POOL",
        help="kill the busiest engine of this pool (chat or documents; default: of any)",
    )
    chaos.add_argument(
        "--batch-lease",
        type=float,
        help="the replicas' --batch-lease: a killed replica's items are reclaimed after it "
        "(default 5)",
    )
    chaos.add_argument(
        "--settle",
        type=float,
        help="patience after the load for the batch to finish and held state to be released "
        "(default 180)",
    )
    chaos.add_argument("--seed", type=int, help="workload seed (default 0)")
    chaos.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    chaos.set_defaults(handler=run_bench_chaos)


def run_bench_chaos(args: argparse.Namespace) -> int:
    import dataclasses
    import shlex
    import sys

    from laneway.bench.chaos import QUICK, ChaosOptions, check_options, render, run_bench
    from laneway.bench.chaos import stderr_say as say
    from laneway.bench.cli import run_async
    from laneway.outputs import check_output_folder, write_json

    base = QUICK if args.quick else ChaosOptions()
    given = {
        "duration_s": args.duration,
        "sessions": args.sessions,
        "documents": args.documents,
        "batch_items": args.batch_items,
        "outage_s": args.outage,
        "engine_pool": args.kill_engine_in,
        "batch_lease_s": args.batch_lease,
        "settle_s": args.settle,
        "seed": args.seed,
    }
    options = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    check_options(options)
    check_output_folder(args.json, "--json")
    command = "laneway " + shlex.join(sys.argv[1:])
    report = run_async(run_bench(options, command, say))
    print("\n".join(render(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0 if report.goal_met else 1
