"""The `laneway` command: one subcommand per job, each registered by its component.

Each component module exposes `register(commands, bench)` and keeps its heavy imports
inside the handler, so `laneway --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from laneway import __version__
from laneway.errors import ChildError, UsageError

COMPONENT_CLIS = (
    "laneway.simulator.cli",
    "laneway.gateway.cli",
    "laneway.operator.cli",
    "laneway.bench.cli",
)

CommandHandler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="laneway",
        description="Lanes for LLM inference: an interactive/batch gateway, an operator "
        "for InferencePools, and an engine simulator.",
    )
    parser.add_argument("--version", action="version", version=f"laneway {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = commands.add_parser(
        "bench", help="benchmarks that print a table and can write JSON"
    )
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for module_name in COMPONENT_CLIS:
        importlib.import_module(module_name).register(commands, bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: CommandHandler = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"laneway {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ChildError as error:
        print(f"laneway {args.command}: error: a child process failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"laneway {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
