"""The `laneway` command: one subcommand per job, each registered by its component.

Each component module exposes `register(commands, bench)` and keeps its heavy imports
inside the handler, so `laneway --help` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import signal
import sys
from collections.abc import Callable, Sequence

from laneway import __version__
from laneway.errors import ChildError, UsageError

COMPONENT_CLIS = (
    "laneway.simulator.cli",
    "laneway.gateway.cli",
    "laneway.gateway.epp.cli",
    "laneway.operator.cli",
    "laneway.bench.cli",
)

CommandHandler = Callable[[argparse.Namespace], int]


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless its text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and bool(
            action.option_strings
        )
        if shown and "default" not in text:
            text = f"{text} (default %(default)s)".strip()
        return text


class LanewayParser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)command's own parser, the deepest one `args` went through."""
    while True:
        choices = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not choices:
            return parser
        name = getattr(args, choices[0].dest, None)
        if name not in choices[0].choices:
            return parser
        parser = choices[0].choices[name]


def unknown_arguments(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """'unrecognized arguments: ...', with the closest option when a flag looks mistyped."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    options = [o for action in parser._actions for o in action.option_strings]
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=")[0], options, n=1)
            if close:
                return f"{message}; did you mean {close[0]}?"
    return message


def build_parser() -> argparse.ArgumentParser:
    parser = LanewayParser(
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
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started by a parent that ignores Ctrl-C (a shell's background job, nohup): Python
        # then leaves SIGINT ignored, and neither KeyboardInterrupt nor asyncio.run's own
        # handler would ever stop us.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = chosen_parser(parser, args)
        command.error(unknown_arguments(command, extras))
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
