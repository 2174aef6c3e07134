"""The harness's commands: `laneway demo` and `laneway bench gateway|redis|seed|prefix`."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from laneway.bench.autoscale import register_bench_autoscale
from laneway.bench.chaos_cli import register_bench_chaos
from laneway.bench.counts_cli import register_bench_counts
from laneway.bench.prefix_cli import register_bench_prefix
from laneway.bench.seed_cli import register_bench_seed

T = TypeVar("T")


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
    demo.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    demo.add_argument(
        "--duration",
        type=float,
        default=40.0,
        help="seconds during which chat sessions send turns (default 40); 0 with --serve: "
        "serve at once, without the workload",
    )
    demo.add_argument("--sessions", type=int, default=16, help="chat sessions (default 16)")
    demo.add_argument(
        "--long-documents", type=int, default=4, help="32k-98k-token documents (default 4)"
    )
    demo.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run the engines this many times faster than real time; latencies are "
        "reported in simulated time (default 1.0)",
    )
    demo.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
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
        description="Start a zero-service-time simulated engine and a gateway in front of it; "
        "at each concurrency send the same streamed requests direct and through the gateway "
        "and report the added latency (P50/P99), requests/s and requests/s per gateway core; "
        "then time the routing of a 128k-token prompt, bounds-decided and exactly counted.",
    )
    gateway.add_argument(
        "--concurrency",
        default="1,50,200,500",
        help="comma-separated concurrent streams per level (default 1,50,200,500)",
    )
    gateway.add_argument(
        "--requests",
        type=int,
        help="requests per level and path (default: max(400, 8 x concurrency))",
    )
    gateway.add_argument("--prompt-tokens", type=int, default=200, help="(default 200)")
    gateway.add_argument("--output-tokens", type=int, default=16, help="(default 16)")
    gateway.add_argument(
        "--classify-tokens",
        type=int,
        default=131_072,
        help="length of the long prompt whose routing is timed (default 131072)",
    )
    gateway.add_argument(
        "--own-core",
        action="store_true",
        help="pin the gateway to a CPU of its own and the client and engine to the others",
    )
    gateway.add_argument(
        "--against",
        metavar="PEERS",
        help="instead: laneway beside these routers (sglang-router, vllm-router; comma-"
        "separated) on 4 engines, each router pinned to one CPU, non-streaming and streaming",
    )
    gateway.add_argument(
        "--peers-venv",
        default=".peers",
        metavar="DIR",
        help="virtual environment the peers are installed into on demand (default .peers)",
    )
    gateway.add_argument(
        "--clients",
        type=int,
        default=64,
        help="with --against: concurrent clients (default 64)",
    )
    gateway.add_argument("--json", metavar="PATH", help="also write the results as JSON")
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
    hostile.add_argument(
        "--seconds", type=float, default=5.0, help="length of each phase (default 5)"
    )
    hostile.add_argument(
        "--senders", type=int, default=3, help="concurrent hostile senders (default 3)"
    )
    hostile.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    hostile.set_defaults(handler=run_bench_hostile)


def run_bench_hostile(args: argparse.Namespace) -> int:
    import sys

    from laneway.bench.hostile import render, run_bench
    from laneway.errors import UsageError
    from laneway.outputs import check_output_folder, write_json

    if args.seconds <= 0 or args.senders < 1:
        raise UsageError("--seconds must be positive and --senders at least 1")
    check_output_folder(args.json, "--json")
    command = " ".join(["laneway", *sys.argv[1:]])
    report = run_async(run_bench(args.seconds, args.senders, command))
    print("\n".join(render(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), where SIGTERM (a container stopping, say) acts as Ctrl-C does.

    Like asyncio's own Ctrl-C handling, it cancels the main task, so every `finally` and
    context manager (the children's shutdown above all) runs; then KeyboardInterrupt.
    """
    import asyncio

    async def cancelled_by_sigterm() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(cancelled_by_sigterm())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def run_demo(args: argparse.Namespace) -> int:
    import sys

    from laneway.bench.demo import DemoOptions, check_options
    from laneway.bench.demo import run_demo as demo

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
    import shlex
    import sys

    from laneway.bench.gateway import (
        BenchOptions,
        check_options,
        parse_concurrency,
        render,
        run_bench,
    )
    from laneway.outputs import check_output_folder, write_json

    if args.against:
        return run_bench_against(args)
    options = BenchOptions(
        concurrency=parse_concurrency(args.concurrency),
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        classify_tokens=args.classify_tokens,
        own_core=args.own_core,
    )
    check_options(options)
    check_output_folder(args.json, "--json")
    command = "laneway " + shlex.join(sys.argv[1:])
    report = run_async(run_bench(options, command))
    print("\n".join(render(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0


def run_bench_against(args: argparse.Namespace) -> int:
    import shlex
    import sys
    from pathlib import Path

    from laneway.bench.peers import (
        AgainstOptions,
        check_against,
        parse_peers,
        render_against,
        run_against,
    )
    from laneway.outputs import check_output_folder, write_json

    options = AgainstOptions(
        peers=parse_peers(args.against),
        venv=Path(args.peers_venv).absolute(),
        concurrency=args.clients,
        requests=args.requests or AgainstOptions.requests,
        prompt_tokens=args.prompt_tokens,
    )
    check_against(options)
    check_output_folder(args.json, "--json")
    command = "laneway " + shlex.join(sys.argv[1:])
    report = run_async(run_against(options, command))
    print("\n".join(render_against(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0


def run_bench_redis(args: argparse.Namespace) -> int:
    import sys

    from laneway.bench.gateway import parse_concurrency
    from laneway.bench.redis import BenchOptions, check_options, render, run_bench
    from laneway.gateway.state.redis_store import redis_settings
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
