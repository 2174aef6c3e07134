"""`laneway bench gateway --against ... --profile DIR` (bench/gateway/profile.py): py-spy's
collapsed stacks read into each function's share of the samples, and py-spy itself sampling a real
process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from laneway.bench.gateway.profile import (
    FrameShare,
    Sampler,
    frame_name,
    render_profiles,
    summarize,
)
from laneway.cli import main

STACKS = "\n".join(
    [
        "main (laneway/cli.py:104);Runner.run (asyncio/runners.py:118) 50",
        "main (laneway/cli.py:104);Runner.run (asyncio/runners.py:118);"
        "handle_completion (gateway/serving/proxy.py:216);_route (gateway/serving/proxy.py:300) 30",
        "main (laneway/cli.py:104);Runner.run (asyncio/runners.py:118);"
        "handle_completion (gateway/serving/proxy.py:219);_route (gateway/serving/proxy.py:301);"
        "_route (gateway/serving/proxy.py:340) 20",
        "a line py-spy never writes",
        "",
    ]
)


def share_of(frames: Sequence[FrameShare], name: str) -> tuple[float, float]:
    for frame in frames:
        if frame.frame == name:
            return frame.inclusive, frame.own
    raise AssertionError(f"{name} is not in the summary")


def test_lines_of_one_function_count_as_one_and_a_recursive_stack_once() -> None:
    profile = summarize(STACKS, "non-streaming", 0.4, "/tmp/x.txt")
    assert profile.samples == 100
    frames = profile.frames
    assert share_of(frames, "main (laneway/cli.py)") == (1.0, 0.0)
    assert share_of(frames, "Runner.run (asyncio/runners.py)") == (1.0, 0.5)
    assert share_of(frames, "handle_completion (gateway/serving/proxy.py)") == (0.5, 0.0)
    # On two stacks, once twice deep: half the samples, not 0.7.
    assert share_of(frames, "_route (gateway/serving/proxy.py)") == (0.5, 0.5)
    assert [f.inclusive for f in frames] == sorted((f.inclusive for f in frames), reverse=True)


def test_only_the_most_inclusive_are_kept() -> None:
    frames = summarize(STACKS, "streaming", None, "-", top=2).frames
    assert {f.frame for f in frames} == {"main (laneway/cli.py)", "Runner.run (asyncio/runners.py)"}


def test_frame_names_lose_their_line_number_only() -> None:
    assert (
        frame_name(" _route (gateway/serving/proxy.py:300)") == "_route (gateway/serving/proxy.py)"
    )
    assert frame_name("<module> (<frozen runpy>)") == "<module> (<frozen runpy>)"


def test_the_table_gives_each_share_of_the_cpu_per_request() -> None:
    profile = summarize(STACKS, "non-streaming", 0.4, "/tmp/x.txt")
    lines = render_profiles((profile,))
    assert "non-streaming: 100 samples" in lines[1]
    row = next(line for line in lines if line.startswith("handle_completion"))
    # 50 % inclusive of 0.4 ms, none of it its own.
    assert row.split()[-4:] == ["50.0%", "0.0%", "0.2000", "0.0000"]


SPINNER = textwrap.dedent(
    """
    def spin_for_the_sampler():
        total = 0
        while True:
            for n in range(100_000):
                total += n * n

    print("spinning", flush=True)
    spin_for_the_sampler()
    """
)


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "spinning"
    yield process
    process.kill()
    process.wait()
    process.stdout.close()


def test_py_spy_samples_a_running_process_into_collapsed_stacks(
    spinner: subprocess.Popen[str], tmp_path: Path
) -> None:
    py_spy = Path(sys.executable).parent / "py-spy"
    sampler = Sampler(py_spy, spinner.pid, tmp_path / "stacks.txt")
    time.sleep(1.5)
    collapsed = sampler.stop()
    profile = summarize(collapsed, "spin", None, str(tmp_path / "stacks.txt"))
    assert profile.samples > 10
    inclusive, _ = share_of(profile.frames, "spin_for_the_sampler (<string>)")
    assert inclusive > 0.9


def test_profile_needs_the_peers_beside_laneway(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gateway", "--profile", "/tmp"]) == 2
    assert (
        "--profile profiles laneway beside its peers: it needs --against" in capsys.readouterr().err
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--against needs 2 CPUs")
def test_a_profile_folder_that_cannot_be_made_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.touch()
    assert main(["bench", "gateway", "--against", "python-floor", "--profile", f"{blocker}/x"]) == 2
    err = capsys.readouterr().err
    assert f"--profile: cannot create {blocker}/x: Not a directory" in err
    assert "Traceback" not in err
