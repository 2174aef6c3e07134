"""The `laneway` command itself: usage errors name the subcommand, every option explains itself."""

from __future__ import annotations

import argparse
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from laneway.bench.harness.procs import laneway_argv
from laneway.cli import build_parser

LOCAL_CONFIG = Path(__file__).parents[1] / "manifests" / "examples" / "gateway-local.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(laneway_argv(*args), capture_output=True, text=True, timeout=120)


def test_a_mistyped_flag_shows_the_subcommands_usage_and_the_closest_flag() -> None:
    result = run("demo", "--prot", "9000")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: laneway demo ")
    assert result.stderr.splitlines()[-1] == (
        "laneway demo: error: unrecognized arguments: --prot 9000; did you mean --port?"
    )


def test_a_nested_benchmark_names_itself_too() -> None:
    result = run("bench", "seed", "--quik")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: laneway bench seed ")
    assert result.stderr.splitlines()[-1].endswith("did you mean --quick?")


def options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, f"{path} {name}")
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield path, action


def test_every_option_has_help_and_shows_its_default() -> None:
    parser = build_parser()
    for path, action in options(parser, "laneway"):
        flag = action.option_strings[-1]
        assert action.help, f"{path} {flag} has no help text"
    demo_help = " ".join(run("demo", "--help").stdout.split())
    assert "gateway port (default 8080)" in demo_help
    seed_help = " ".join(run("bench", "seed", "--help").stdout.split())
    assert "hardware/model profile of every simulated GPU (default h200-llama3-8b)" in seed_help


@pytest.mark.parametrize("command", ["sim", "gateway"])
def test_a_taken_port_is_one_line_that_says_what_to_do(command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--config", str(LOCAL_CONFIG)] if command == "gateway" else []
        result = run(command, *extra, "--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"laneway {command}: error: cannot listen on 127.0.0.1:{port} (address already in use); "
        "pick another with --port"
    )
