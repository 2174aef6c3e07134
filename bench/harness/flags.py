"""The shapes every `laneway bench` command shares, so that each is spelled, defaulted,
refused and reported the same way everywhere and a command declares only what is its own.

Every command: `add_json_flag`; `add_value_flag` for a number whose help names its default
(--seed too), and `overridden` to lay the given ones over a preset; `add_int_list_flag` with
`parse_int_list`, and `parse_names`, for comma-separated values; `add_level_flags` for the
concurrency levels a load benchmark steps through. At the end, `run_and_report`
(check --json's folder, run, print the table, write the JSON), or `write_results` for a
command that prints its own tables. `run_async` runs a command's main coroutine as Ctrl-C
and SIGTERM expect.

The scenario benchmarks (`seed`, `prefix`, `autoscale`) add their own scenario flags, then
`add_scenario_flags` for the shared ones; `scenario_options(args, problems)` folds the
command's own problems with those of the shared flags into one UsageError, checks the output
folders before the run, and returns what the shared flags chose.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from laneway.errors import UsageError
from laneway.outputs import check_output_folder, write_json
from laneway.simulator.profiles import DEFAULT_PROFILE, PROFILES, Profile

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")
Mode = Literal["virtual", "live"]
MODES: tuple[Mode, ...] = ("virtual", "live")


# -- every command ------------------------------------------------------------------------


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")


def add_value_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    default: float,
    what: str,
    *,
    preset: bool = False,
) -> None:
    """A flag taking one number of `default`'s type, its help ending in the default. With
    `preset`, the flag stays None unless given, so that a preset (`--quick`) may fill it;
    the help then names the full run's value.

    The help names the default itself, where laneway's help formatter would not see a
    preset's, and would show a float's as 30.0."""
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    parser.add_argument(
        flag,
        type=type(default),
        default=None if preset else default,
        help=f"{what} (default {shown})",
    )


def add_int_list_flag(
    parser: argparse.ArgumentParser, flag: str, default: Sequence[int], what: str
) -> None:
    """A comma-separated list of integers, which `parse_int_list` reads (after argparse, so
    that a bad list is one line naming the flag), its help ending in the default."""
    listed = ",".join(map(str, default))
    parser.add_argument(flag, default=listed, help=f"comma-separated {what} (default {listed})")


def add_level_flags(parser: argparse.ArgumentParser, levels: Sequence[int], requests: str) -> None:
    """--concurrency, the levels a load benchmark steps through (`parse_int_list` reads
    them), and --requests, how many at each; `requests` is its help, the default included."""
    add_int_list_flag(parser, "--concurrency", levels, "concurrent requests per level")
    parser.add_argument("--requests", type=int, help=requests)


def overridden(base: D, values: Mapping[str, object]) -> D:
    """`base` (a preset or the full run) with the values of the flags that were given."""
    return dataclasses.replace(base, **{k: v for k, v in values.items() if v is not None})


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """`1, 50,200` -> (1, 50, 200); a UsageError naming `flag` for anything else."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None


def parse_names(text: str) -> list[str]:
    """`a, b,,c` -> ["a", "b", "c"]."""
    return [name.strip() for name in text.split(",") if name.strip()]


class Report(Protocol):
    def to_json(self) -> Any: ...


R = TypeVar("R", bound=Report)


def run_and_report(
    run: Callable[[str], Coroutine[Any, Any, R] | R],
    render: Callable[[R], Iterable[str]],
    json_path: Path | None,
    succeeded: Callable[[R], bool] = lambda _: True,
) -> int:
    """Check --json's folder, run the benchmark (told its own command line, which its
    report records), print the report's table and write its JSON if asked. Exit 0, or 1
    where the report says the run did not meet its goal."""
    check_output_folder(json_path, "--json")
    outcome = run("laneway " + shlex.join(sys.argv[1:]))
    report = run_async(outcome) if isinstance(outcome, Coroutine) else outcome
    print("\n".join(render(report)))
    if json_path is not None:
        write_results(json_path, report.to_json())
    return 0 if succeeded(report) else 1


def write_results(path: Path, document: Any) -> None:
    write_json(path, document)
    print(f"wrote {path}", file=sys.stderr)


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


# -- the scenario benchmarks ----------------------------------------------------------------


@dataclass(frozen=True)
class LiveFlags:
    """The help of --mode and --time-scale, for a command that has a live mode."""

    time_scale_help: str  # its default included
    mode_help: str = "virtual (default): discrete-event simulation; live: real processes"


@dataclass(frozen=True)
class ScenarioOptions:
    mode: Mode
    profile: Profile
    json: Path | None
    plot: Path | None
    time_scale: float  # live mode's; the default where the command has no live mode


def add_scenario_flags(
    parser: argparse.ArgumentParser,
    *,
    seed: int,
    seed_preset: bool = False,
    live: LiveFlags | None = None,
    plot_help: str | None = None,
) -> None:
    """--seed, --profile, --json, and where asked --mode/--time-scale and --plot.

    `seed_preset` leaves --seed unset unless given, for commands whose presets carry their
    own seed; `seed` is the default the help names.
    """
    add_value_flag(parser, "--seed", seed, "workload random seed", preset=seed_preset)
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="hardware/model profile of every simulated GPU",
    )
    if live is not None:
        parser.add_argument("--mode", choices=MODES, default="virtual", help=live.mode_help)
        parser.add_argument("--time-scale", type=float, help=live.time_scale_help)
    add_json_flag(parser)
    if plot_help is not None:
        parser.add_argument("--plot", type=Path, metavar="PATH", help=plot_help)


def scenario_options(
    args: argparse.Namespace, problems: list[str], default_time_scale: float = 1.0
) -> ScenarioOptions:
    """The shared flags' choices; a UsageError naming every bad flag, the command's own
    `problems` first, or an output folder that does not exist."""
    values: dict[str, Any] = vars(args)
    mode: Mode = values.get("mode", "virtual")
    given_scale: float | None = values.get("time_scale")
    time_scale = default_time_scale if given_scale is None else given_scale
    problems = list(problems)
    if given_scale is not None and mode == "virtual":
        problems.append("--time-scale applies to --mode live only")
    if not time_scale > 0:
        problems.append(f"--time-scale must be above 0, got {given_scale}")
    if problems:
        raise UsageError("; ".join(problems))
    plot: Path | None = values.get("plot")
    check_output_folder(args.json, "--json")
    check_output_folder(plot, "--plot")
    return ScenarioOptions(
        mode=mode, profile=PROFILES[args.profile], json=args.json, plot=plot, time_scale=time_scale
    )
