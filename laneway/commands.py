"""Command-line entry points that span components: `laneway demo` and `laneway bench gateway`."""

from __future__ import annotations

import argparse
from typing import Any


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `demo`."""
    demo = commands.add_parser(
        "demo",
        help="simulated pools + the gateway on this machine, a mixed workload, a live table",
        description="Start two interactive and two batch simulated engines and the gateway "
        "on localhost (no files needed), send chat sessions and a few long documents through "
        "it, and show per-lane TTFT/TBT percentiles and where requests went. With --serve, "
        "keep everything running afterwards for curl or an OpenAI client, until Ctrl-C.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    demo.add_argument(
        "--duration",
        type=float,
        default=40.0,
        help="seconds during which chat sessions send turns (default 40)",
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
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from laneway.demo import DemoOptions, check_options
    from laneway.demo import run_demo as demo
    from laneway.procs import ChildError

    options = DemoOptions(
        host=args.host,
        port=args.port,
        duration_s=args.duration,
        sessions=args.sessions,
        long_documents=args.long_documents,
        time_scale=args.time_scale,
        seed=args.seed,
        serve=args.serve,
    )
    check_options(options)
    try:
        return asyncio.run(demo(options))
    except ChildError as error:
        print(f"laneway demo: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("laneway demo: stopped; the gateway and every engine have shut down", file=sys.stderr)
        return 0 if options.serve else 130
