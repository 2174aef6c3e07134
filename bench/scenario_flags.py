"""The flags the scenario benchmarks share (`laneway bench seed`, `prefix`, `autoscale`) and
their checks, so that each is spelled, defaulted and refused the same way everywhere.

A command adds its own scenario flags, then `add_scenario_flags` for the shared ones;
`scenario_options(args, problems)` folds the command's own problems with those of the
shared flags into one UsageError, checks the output folders before the run, and returns
what the shared flags chose.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from laneway.errors import UsageError
from laneway.outputs import check_output_folder
from laneway.simulator.profiles import DEFAULT_PROFILE, PROFILES, Profile

Mode = Literal["virtual", "live"]
MODES: tuple[Mode, ...] = ("virtual", "live")


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
    seed_default: int | None,
    shown_seed: int,
    live: LiveFlags | None = None,
    plot_help: str | None = None,
) -> None:
    """--seed, --profile, --json, and where asked --mode/--time-scale and --plot.

    `seed_default` None leaves --seed unset unless given, for commands whose presets carry
    their own seed; `shown_seed` is the default the help names.
    """
    parser.add_argument(
        "--seed",
        type=int,
        default=seed_default,
        help=f"workload random seed (default {shown_seed})",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="hardware/model profile of every simulated GPU",
    )
    if live is not None:
        parser.add_argument("--mode", choices=MODES, default="virtual", help=live.mode_help)
        parser.add_argument("--time-scale", type=float, help=live.time_scale_help)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
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
    return ScenarioOptions(mode, PROFILES[args.profile], args.json, plot, time_scale)
