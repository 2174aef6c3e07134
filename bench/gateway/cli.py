"""`laneway bench gateway`: its flags and its commands, direct against through the gateway
and `--against` its peers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from laneway.bench.harness.flags import (
    add_json_flag,
    add_level_flags,
    add_value_flag,
    parse_int_list,
    run_and_report,
)


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
        "envoy: Envoy alone, envoy+floor: Envoy with a pass-through Python picker on grpc.aio, "
        "envoy+floor-threads: the same on grpcio's thread-pool server, "
        "envoy+laneway: Envoy with `laneway epp`, laneway@DIR: laneway installed in DIR, "
        "envoy+laneway@DIR: Envoy with the picker installed in DIR; "
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
        help="with --against: sample laneway's rounds (and envoy+laneway's picker's) with "
        "py-spy (installed into --peers-venv), write the collapsed stacks into DIR (created) "
        "and print the functions with their share of laneway's CPU per request",
    )
    add_json_flag(gateway)
    gateway.set_defaults(handler=run_bench_gateway)


def run_bench_gateway(args: argparse.Namespace) -> int:
    from laneway.bench.gateway.config import BenchOptions, check_options
    from laneway.bench.gateway.report import render
    from laneway.bench.gateway.run import run_bench
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
