"""`laneway demo`: its flags and its command (the demo itself is laneway.bench.demo.run)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from laneway.bench.harness.flags import (
    add_value_flag,
    run_async,
)


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
    demo.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default="sim",
        help="sim (default): simulated engines; vllm: one real vLLM server per lane, of a "
        "tiny model, where scripts/install-vllm.sh installed it (minutes to start, ~10 GB)",
    )
    demo.set_defaults(handler=run_demo)


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
        engine=args.engine,
    )
    check_options(options)
    try:
        return run_async(demo(options))
    except KeyboardInterrupt:
        print("laneway demo: stopped; the gateway and every engine have shut down", file=sys.stderr)
        return 0 if options.serve else 130
