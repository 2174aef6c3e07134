"""The harness's commands: `laneway demo` and `laneway bench gateway|redis|seed|prefix`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from laneway.bench.autoscale.run import register_bench_autoscale
from laneway.bench.chaos.cli import register_bench_chaos
from laneway.bench.counts.cli import register_bench_counts
from laneway.bench.harness.flags import (
    add_json_flag,
    add_level_flags,
    add_value_flag,
    parse_int_list,
    run_and_report,
    run_async,
)
from laneway.bench.prefix.cli import register_bench_prefix
from laneway.bench.seed.cli import register_bench_seed


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `demo` and the benchmarks."""
    register_demo(commands)
    register_bench_gateway(bench)
    register_bench_redis(bench)
    register_bench_hostile(bench)
    register_bench_seed(bench)
    register_bench_autoscale(bench)
    register_bench_prefix(bench)
    register_bench_counts(bench)
    register_bench_chaos(bench)


def register_demo(commands: argparse._SubParsersAction[Any]) -> None:
    demo = commands.add_parser(
        "demo",
        help="simulated pools + the gateway on this machine, a mixed workload, a live table",
        description="Start two interactive and two batch simulated engines and the gateway "
        "on localhost (no files needed), send chat sessions and a few long documents through "
        "it, and show per-lane TTFT/TBT percentiles, where requests went and a verdict against "
        "the SLOs. With --serve, keep everything running afterwards for curl or an OpenAI "
        "client, until Ctrl-C (with --duration 0: at once, without the workload).",
    )
    demo.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    add_value_flag(demo, "--port", 8080, "gateway port")
    demo.add_argument(
        "--duration",
        type=float,
        default=40.0,
        help="seconds during which chat sessions send turns (default 40); 0 with --serve: "
        "serve at once, without the workload",
    )
    add_value_flag(demo, "--sessions", 16, "chat sessions")
    add_value_flag(demo, "--long-documents", 4, "32k-98k-token documents")
    add_value_flag(
        demo,
        "--time-scale",
        1.0,
        "run the engines this many times faster than real time; latencies are reported in "
        "simulated time",
    )
    add_value_flag(demo, "--seed", 0, "workload seed")
    demo.add_argument(
        "--serve", action="store_true", help="keep serving after the workload, until Ctrl-C"
    )
    demo.add_argument(
        "--redis-url",
        default=os.environ.get("LANEWAY_REDIS_URL"),
        help="give the gateway shared state in this Redis (default $LANEWAY_REDIS_URL; "
        "unset: in memory)",
    )
    demo.set_defaults(handler=run_demo)


def register_bench_gateway(bench: argparse._SubParsersAction[Any]) -> None:
    gateway = bench.add_parser(
        "gateway",
        help="the gateway's own overhead: direct to an engine vs through the gateway",
        description="Start a simulated engine (zero service time unless --engine-profile) and a "
        "gateway in front of it; "
        "at each concurrency send the same streamed requests direct and through the gateway "
        "and report the added latency (P50/P99), requests/s and requests/s per gateway core; "
        "then time the routing of a 128k-token prompt, bounds-decided and exactly counted.",
    )
    add_level_flags(
        gateway,
        (1, 50, 200, 500),
        "requests per level and path (default max(400, 8 x concurrency))",
    )
    add_value_flag(gateway, "--prompt-tokens", 200, "prompt tokens of each request")
    add_value_flag(gateway, "--output-tokens", 16, "output tokens of each request")
    add_value_flag(
        gateway, "--classify-tokens", 131_072, "length of the long prompt whose routing is timed"
    )
    gateway.add_argument(
        "--engine-profile",
        default="zero",
        metavar="PROFILE",
        help="the simulated engine's hardware profile (laneway sim --profile): zero (the "
        "default) answers at once, so the gateway sets the pace; h200-llama3-8b paces "
        "tokens as that engine would",
    )
    gateway.add_argument(
        "--own-core",
        action="store_true",
        help="pin the gateway to a CPU of its own and the client and engines to the others",
    )
    add_value_flag(
        gateway,
        "--engines",
        1,
        "simulated engines, all behind the gateway; the direct path takes them in turn",
    )
    add_value_flag(
        gateway,
        "--think-ms",
        0.0,
        "each client's mean think time before each request, exponentially distributed, so "
        "that arrivals are independent as chat users' are; 0: the next as soon as one ends",
    )
    gateway.add_argument(
        "--against",
        metavar="PEERS",
        help="instead: laneway beside these routers (sglang-router, vllm-router, python-floor, "
        "laneway@DIR: laneway installed in DIR; "
        "comma-separated) on 4 engines, each pinned to one CPU, non-streaming and streaming",
    )
    gateway.add_argument(
        "--peers-venv",
        default=".peers",
        metavar="DIR",
        help="virtual environment the peers are installed into on demand (default .peers)",
    )
    add_value_flag(gateway, "--clients", 64, "with --against: concurrent clients")
    add_value_flag(
        gateway,
        "--rounds",
        2,
        "with --against: rounds per router and mode, the routers' order reversed in every "
        "other one; more, shorter rounds spread the machine's drift over the routers",
    )
    gateway.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="with --against: sample laneway's rounds with py-spy (installed into "
        "--peers-venv), write the collapsed stacks into DIR (created) and print the functions "
        "with their share of laneway's CPU per request",
    )
    add_json_flag(gateway)
    gateway.set_defaults(handler=run_bench_gateway)


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


def register_bench_hostile(bench: argparse._SubParsersAction[Any]) -> None:
    hostile = bench.add_parser(
        "hostile",
        help="/healthz latency while hostile request bodies arrive",
        description="Start a simulated engine and a gateway; probe /healthz on the quiet "
        "gateway, then while senders post bodies shaped to cost the gateway work (huge "
        "prompt lists, a megabytes-long role, many tiny messages, deep nesting, huge "
        "integers), all shapes together and each alone; report the probe's latency per "
        "phase against the quiet one.",
    )
    add_value_flag(hostile, "--seconds", 5.0, "length of each phase")
    add_value_flag(hostile, "--senders", 3, "concurrent hostile senders")
    add_json_flag(hostile)
    hostile.set_defaults(handler=run_bench_hostile)


def run_bench_hostile(args: argparse.Namespace) -> int:
    from laneway.bench.hostile.run import render, run_bench
    from laneway.errors import UsageError

    if args.seconds <= 0 or args.senders < 1:
        raise UsageError("--seconds must be positive and --senders at least 1")
    return run_and_report(
        lambda command: run_bench(args.seconds, args.senders, command), render, args.json
    )


def run_demo(args: argparse.Namespace) -> int:
    import sys

    from laneway.bench.demo.run import DemoOptions, check_options
    from laneway.bench.demo.run import run_demo as demo

    options = DemoOptions(
        host=args.host,
        port=args.port,
        duration_s=args.duration,
        sessions=args.sessions,
        long_documents=args.long_documents,
        time_scale=args.time_scale,
        seed=args.seed,
        serve=args.serve,
        redis_url=args.redis_url,
    )
    check_options(options)
    try:
        return run_async(demo(options))
    except KeyboardInterrupt:
        print("laneway demo: stopped; the gateway and every engine have shut down", file=sys.stderr)
        return 0 if options.serve else 130


def run_bench_gateway(args: argparse.Namespace) -> int:
    from laneway.bench.gateway.run import BenchOptions, check_options, render, run_bench
    from laneway.errors import UsageError

    if args.against:
        return run_bench_against(args)
    if args.profile is not None:
        raise UsageError("--profile profiles laneway beside its peers: it needs --against")
    options = BenchOptions(
        concurrency=parse_int_list(args.concurrency, "--concurrency"),
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        classify_tokens=args.classify_tokens,
        own_core=args.own_core,
        engine_profile=args.engine_profile,
        engines=args.engines,
        think_ms=args.think_ms,
    )
    check_options(options)
    return run_and_report(lambda command: run_bench(options, command), render, args.json)


def run_bench_against(args: argparse.Namespace) -> int:
    from laneway.bench.gateway.peers import (
        AgainstOptions,
        check_against,
        parse_peers,
        render_against,
        run_against,
    )

    options = AgainstOptions(
        peers=parse_peers(args.against),
        venv=Path(args.peers_venv).absolute(),
        concurrency=args.clients,
        requests=AgainstOptions.requests if args.requests is None else args.requests,
        prompt_tokens=args.prompt_tokens,
        rounds=args.rounds,
        profile_dir=None if args.profile is None else args.profile.absolute(),
    )
    check_against(options)
    return run_and_report(lambda command: run_against(options, command), render_against, args.json)


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
