"""The bench commands share their common flags: spelled, defaulted, refused and reported
alike (laneway.bench.harness.flags)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from laneway.bench.harness.flags import (
    add_int_list_flag,
    add_value_flag,
    overridden,
    parse_int_list,
    parse_names,
    run_and_report,
)
from laneway.cli import main
from laneway.errors import UsageError

COMMANDS = ("seed", "prefix", "autoscale")
EVERY_BENCH = (*COMMANDS, "gateway", "redis", "hostile", "counts", "chaos")
LIVE = ("seed", "prefix")


@pytest.mark.parametrize(
    ("command", "flag"),
    [("seed", "--json"), ("seed", "--plot"), ("prefix", "--json"), ("autoscale", "--json"),
     ("autoscale", "--plot")],
)  # fmt: skip
def test_every_scenario_bench_refuses_an_output_folder_that_is_missing(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", command, flag, "/nonexistent-dir/x.out"]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: the folder of /nonexistent-dir/x.out does not exist" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", LIVE)
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--time-scale", "2"], "--time-scale applies to --mode live only"),
        (["--mode", "live", "--time-scale", "0"], "--time-scale must be above 0, got 0.0"),
    ],
)
def test_the_live_commands_check_the_time_scale_alike(
    command: str, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", command, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_scenario_bench_names_its_shared_flags_and_defaults(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "workload random seed (default 0)" in text
    assert "hardware/model profile of every simulated GPU (default h200-llama3-8b)" in text
    assert "--json PATH write the results as JSON" in text


def test_an_unknown_profile_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main(["bench", command, "--profile", "b200"])
        assert exited.value.code == 2
        assert "invalid choice: 'b200'" in capsys.readouterr().err


def test_every_bench_writes_json_under_one_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for command in EVERY_BENCH:
        with pytest.raises(SystemExit):
            main(["bench", command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--json PATH write the results as JSON" in text, command


def test_a_value_flag_takes_its_defaults_type_and_names_the_default() -> None:
    parser = argparse.ArgumentParser()
    add_value_flag(parser, "--tokens", 131_072, "prompt tokens")
    add_value_flag(parser, "--minutes", 0.5, "length")
    add_value_flag(parser, "--gpus", 8, "GPUs", preset=True)
    helps = {action.dest: action.help for action in parser._actions}
    # An int is shown whole, not as 1.31072e+05; a float without trailing zeros.
    assert helps["tokens"] == "prompt tokens (default 131072)"
    assert helps["minutes"] == "length (default 0.5)"
    assert helps["gpus"] == "GPUs (default 8)"
    args = parser.parse_args(["--minutes", "2"])
    assert (args.tokens, args.minutes, args.gpus) == (131_072, 2.0, None)
    assert isinstance(args.minutes, float)
    with pytest.raises(SystemExit):
        parser.parse_args(["--tokens", "1.5"])


@dataclass(frozen=True)
class Preset:
    gpus: int = 8
    seed: int = 0


def test_only_the_flags_given_override_a_preset() -> None:
    assert overridden(Preset(gpus=4), {"gpus": None, "seed": 7}) == Preset(gpus=4, seed=7)


def test_comma_lists_parse_and_a_bad_one_names_its_flag() -> None:
    parser = argparse.ArgumentParser()
    add_int_list_flag(parser, "--edges", (4096, 32768), "edges in tokens")
    args = parser.parse_args([])
    assert parse_int_list(args.edges, "--edges") == (4096, 32768)
    assert parse_int_list("1, 50,,200", "--concurrency") == (1, 50, 200)
    with pytest.raises(UsageError, match="--concurrency must be comma-separated integers"):
        parse_int_list("1,many", "--concurrency")
    assert parse_names(" base, spike_factor=1.6,,") == ["base", "spike_factor=1.6"]


@dataclass(frozen=True)
class Outcome:
    met: bool

    def to_json(self) -> dict[str, bool]:
        return {"met": self.met}


@pytest.mark.parametrize("met", [True, False])
def test_run_and_report_prints_writes_and_exits_by_the_goal(
    met: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def run(command: str) -> Outcome:
        assert command.startswith("laneway ")
        return Outcome(met)

    path = tmp_path / "out.json"
    code = run_and_report(run, lambda o: [f"met: {o.met}"], path, succeeded=lambda o: o.met)
    assert code == (0 if met else 1)
    assert capsys.readouterr().out == f"met: {met}\n"
    assert json.loads(path.read_text()) == {"met": met}
    # A command that runs without an event loop reports the same way.
    assert run_and_report(lambda _: Outcome(met), lambda o: ["done"], None) == 0
