"""`laneway bench redis`: its flags and its command (the bench is laneway.bench.redis.run)."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.bench.harness.flags import (
    add_json_flag,
    add_level_flags,
    add_value_flag,
    parse_int_list,
    run_and_report,
)


def register_bench_redis(bench: argparse._SubParsersAction[Any]) -> None:
    redis = bench.add_parser(
        "redis",
        help="what the Redis state layer costs per request, against in-memory state",
        description="Measure, in one run, the per-request latency that Redis-backed state "
        "(tenant limits, shared endpoint load) adds: end to end through two gateways that "
        "differ only in --redis-url, and for the state operations alone. Starts a "
        "throwaway redis-server unless --redis-url is given.",
    )
    add_level_flags(
        redis,
        (1, 32, 128),
        "requests per level through each gateway (default max(300, 4 x concurrency))",
    )
    add_value_flag(
        redis, "--state-ops", 3000, "requests' worth of state operations per level and backend"
    )
    redis.add_argument(
        "--redis-url",
        help="use this Redis (its current database is flushed) instead of starting one",
    )
    add_value_flag(redis, "--seed", 0, "prompt seed")
    add_json_flag(redis)
    redis.set_defaults(handler=run_bench_redis)


def run_bench_redis(args: argparse.Namespace) -> int:
    from laneway.bench.redis.run import BenchOptions, check_options, render, run_bench
    from laneway.gateway.state.redis_store import redis_settings

    options = BenchOptions(
        concurrency=parse_int_list(args.concurrency, "--concurrency"),
        requests=args.requests,
        state_ops=args.state_ops,
        redis_url=args.redis_url,
        seed=args.seed,
    )
    check_options(options)
    if args.redis_url is not None:
        redis_settings(args.redis_url)  # a UsageError for a malformed URL
    return run_and_report(lambda command: run_bench(options, command), render, args.json)
