"""The scenario benchmarks share their common flags: spelled, defaulted and refused alike."""

from __future__ import annotations

import pytest

from laneway.cli import main

COMMANDS = ("seed", "prefix", "autoscale")
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
