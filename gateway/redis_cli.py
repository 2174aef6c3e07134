"""Command-line parts of the state layer: its flags on `laneway gateway`, `laneway bench redis`.

Kept light (argparse only): the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

TENANTS_ENV = "LANEWAY_TENANTS_FILE"
BATCH_CONCURRENCY = 8  # batch items one replica runs in the batch lane at once
BATCH_LEASE_S = 30.0  # silence after which another replica takes over a replica's items
MAX_FILE_BYTES = 100 * 1024 * 1024


def add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    """The state layer's flags on `laneway gateway` (beside --redis-url, declared there)."""
    parser.add_argument(
        "--tenants",
        metavar="PATH",
        default=os.environ.get(TENANTS_ENV),
        help="API keys and limits per tenant: a YAML file, or a directory such as a mounted "
        f"Secret; turns auth on (default ${TENANTS_ENV}; unset: no auth)",
    )
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=BATCH_CONCURRENCY,
        metavar="N",
        help="batch items this replica runs in the batch lane at once "
        f"(default {BATCH_CONCURRENCY})",
    )
    parser.add_argument(
        "--batch-lease",
        type=float,
        default=BATCH_LEASE_S,
        metavar="SECONDS",
        help="silence after which another replica takes over a replica's batch items "
        f"(default {BATCH_LEASE_S:g})",
    )
    parser.add_argument(
        "--max-file-bytes",
        type=int,
        default=MAX_FILE_BYTES,
        metavar="BYTES",
        help=f"largest batch input file accepted (default {MAX_FILE_BYTES})",
    )


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `bench redis`."""
    redis = bench.add_parser(
        "redis",
        help="what the Redis state layer costs per request, against in-memory state",
        description="Measure, in one run, the per-request latency that Redis-backed state "
        "(tenant limits, shared endpoint load) adds: end to end through two gateways that "
        "differ only in --redis-url, and for the state operations alone. Starts a "
        "throwaway redis-server unless --redis-url is given.",
    )
    redis.add_argument(
        "--concurrency",
        default="1,32,128",
        help="comma-separated concurrency levels (default 1,32,128)",
    )
    redis.add_argument(
        "--requests",
        type=int,
        help="requests per level through each gateway (default max(300, 4 x concurrency))",
    )
    redis.add_argument(
        "--state-ops",
        type=int,
        default=3000,
        help="requests' worth of state operations per level and backend (default 3000)",
    )
    redis.add_argument(
        "--redis-url",
        help="use this Redis (its current database is flushed) instead of starting one",
    )
    redis.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    redis.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    redis.set_defaults(handler=run_bench_redis)


def run_bench_redis(args: argparse.Namespace) -> int:
    import sys

    from laneway.benchgw import parse_concurrency
    from laneway.commands import run_async
    from laneway.gateway.redis_bench import BenchOptions, check_options, render, run_bench
    from laneway.gateway.redis_state import redis_settings
    from laneway.outputs import check_output_folder, write_json

    options = BenchOptions(
        concurrency=parse_concurrency(args.concurrency),
        requests=args.requests,
        state_ops=args.state_ops,
        redis_url=args.redis_url,
        seed=args.seed,
    )
    check_options(options)
    if args.redis_url is not None:
        redis_settings(args.redis_url)  # a UsageError for a malformed URL
    check_output_folder(args.json, "--json")
    command = " ".join(["laneway", *sys.argv[1:]])
    report = run_async(run_bench(options, command))
    print("\n".join(render(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0
